"""Low-precision tensor-core operands shared by the ops' Triton kernels (imported only when triton is installed):
bf16 rounding that the CPU interpreter reproduces exactly, and one matmul entry whose precision is a constexpr."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["bf16_round", "load_f32", "mm", "store_as"]


@triton.jit
def bf16_round(x):
    """float32 tile -> float32 tile holding x rounded to the nearest bf16 (ties to even; NaN kept, so poisoned buffers
    stay visible). The interpreter's bf16 ``tl.dot`` multiplies the uint16 storage as integers and its cast truncates,
    so its bf16 path works on these values: products of two bf16 values are exact in float32, hence an "ieee" dot of
    rounded operands is the GPU's bf16 MMA with float32 accumulation up to the summation order."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def mm(a, b, PREC: tl.constexpr):
    """a @ b ([m, k] @ [k, n] -> [m, n] float32) at precision ``PREC``: a Triton ``input_precision`` name ("tf32",
    "tf32x3", "ieee") for float32 operands, "bf16" (both operands cast to bf16, float32 accumulation) or "bf16_rn" (the
    interpreter's form of "bf16", ``bf16_round``)."""
    if PREC == "bf16":
        out = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif PREC == "bf16_rn":
        out = tl.dot(bf16_round(a.to(tl.float32)), bf16_round(b.to(tl.float32)), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PREC)
    return out


@triton.jit
def load_f32(ptrs, mask):
    """A masked load (masked elements 0) widened to float32: exact for a bf16 buffer, a no-op for a float32 one."""
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_as(x, base):
    """float32 tile x as the element type of the buffer at pointer ``base``: rounded to the nearest bf16 (ties to even,
    ``bf16_round``, on the GPU and under the interpreter alike) for a bf16 buffer, x itself otherwise."""
    if base.dtype.element_ty == tl.bfloat16:
        out = bf16_round(x).to(tl.bfloat16)
    else:
        out = x
    return out
