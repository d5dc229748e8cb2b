"""Decode-time GEMVs with their neighbours fused in (Triton): the RMSNorm before a projection, the SwiGLU after it,
the residual add after the output projections.

    y = norm_linear(x, norm_weight, W, eps)                 # RMSNorm(x) Wᵀ                  x [B, K] -> [B, N]
    a = norm_linear(x, norm_weight, W_gate_up, eps, "swiglu")   # silu(g) * u, g|u = RMSNorm(x) Wᵀ   -> [B, N // 2]
    h, a = add_norm_linear(y, h, norm_weight, W_gate_up, eps, "swiglu")   # the same of h = h + y, also returned
    h = linear_residual(a, W_down, h)                       # h + a Wᵀ                        [B, K] -> [B, N]

At decode batch sizes (B <= 8) a step is a chain of small kernels, each with a fixed launch-and-ramp cost inside the
CUDA graph (gdn-340m on the H200 at 1.13 ms/token against a 0.16 ms weight-streaming floor, ~47 µs per
layer for ~8–10 kernels). The MLP half of a block was four of them after inductor's fusion (mixer residual add +
RMSNorm, gate|up GEMV, SiLU·mul, down GEMV; the down residual add folded into the next block's norm); here it is two.

Decisions:
- One program per block of BLOCK_N output columns, looping over K in BLOCK_K chunks, fp32 accumulation (float64 for
  float64 inputs); the B rows are handled inside the program, so the weights are read once for all of them. The
  product is a broadcast multiply and a sum over K, not tl.dot: B is tiny (tl.dot needs every dimension >= 16), and
  a GEMV is bound by the weight stream, not by arithmetic.
- The norm is the GEMV's prologue: every program re-reads the B rows of x (a few KB, L2 resident) and computes their
  mean square itself, instead of a separate norm launch and a normed copy in memory. The SwiGLU is the epilogue: a
  program owns matching gate and up columns (the decoder's gate|up weight is [gate; up], modules/mlp.py).
- `add_norm_linear` also folds the preceding residual add (h = h + mixer output) into the prologue: every program
  recomputes h for its norm and program 0 writes it out (the residual stream the down projection adds to). Without
  it the add would be one more kernel between the mixer and the MLP.
- The kernels round where the plain step rounds (the normed x, the gain product, gate, up, silu and the GEMV output
  in the input dtype), so the kernel and plain steps differ only by the order of the K sums.
- eps is a constexpr (no runtime float argument: the interpreter and the compiled launch see the same kernel).
- Inference only, no autograd; both kernels are registered custom ops (``hybrid_attention::norm_linear``,
  ``hybrid_attention::linear_residual``, with fake kernels) so that a compiled decode step traces around them, as
  ops/decode_attention does. The PyTorch forms (naive.py) define the results.
"""

from __future__ import annotations

import torch

from ..common.backend import resolve_backend
from ..common.triton import HAS_TRITON
from .naive import add_norm_linear_reference, linear_residual_reference, norm_linear_reference
from .triton import MAX_ROWS, supported
from .triton import add_norm_linear as _add_norm_linear_triton
from .triton import linear_residual as _linear_residual_triton
from .triton import norm_linear as _norm_linear_triton

__all__ = ["HAS_TRITON", "MAX_ROWS", "add_norm_linear", "add_norm_linear_reference", "linear_residual",
           "linear_residual_reference", "norm_linear",
           "norm_linear_reference", "supported"]  # MAX_ROWS and supported: re-exported from triton/support.py


def _check(op: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"{op}: x must be [B, K] and weight [N, K], got x {tuple(x.shape)}, weight "
                         f"{tuple(weight.shape)}")


def _check_norm_linear(op: str, x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                       act: str | None) -> None:
    _check(op, x, weight)
    if norm_weight.shape != (x.shape[1],):
        raise ValueError(f"{op}: norm_weight must be [K={x.shape[1]}], got {tuple(norm_weight.shape)}")
    if act not in (None, "swiglu"):
        raise ValueError(f"{op}: act must be None or 'swiglu', got {act!r}")
    if act == "swiglu" and weight.shape[0] % 2:
        raise ValueError(f"{op}: act='swiglu' needs an even N (gate | up), got N={weight.shape[0]}")


def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, eps: float,
                act: str | None = None, backend: str = "auto", block_n: int | None = None) -> torch.Tensor:
    """RMSNorm(x) Wᵀ with an optional SwiGLU: x [B, K], norm_weight [K], weight [N, K] -> [B, N] (act None) or
    [B, N // 2] (act "swiglu": silu(y[:, :N/2]) * y[:, N/2:]). backend: "reference" | "triton" | "auto" (triton
    on supported CUDA inputs). block_n: the kernel's column block (default: a heuristic, ``triton/kernel.py``)."""
    _check_norm_linear("norm_linear", x, norm_weight, weight, act)
    name = resolve_backend(backend, "norm_linear", lambda: supported(x, weight))
    if name == "reference":
        return norm_linear_reference(x, norm_weight, weight, eps, act)
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"norm_linear: the triton backend takes B <= {MAX_ROWS} rows, got {x.shape[0]}")
    return _norm_linear_triton(x, norm_weight, weight.contiguous(), float(eps), act, block_n)


def add_norm_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                    eps: float, act: str | None = None, backend: str = "auto",
                    block_n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual and `norm_linear(h, ...)` in one launch: x, residual [B, K] -> (h [B, K], y)."""
    if residual.shape != x.shape:
        raise ValueError(f"add_norm_linear: residual must be x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    _check_norm_linear("add_norm_linear", x, norm_weight, weight, act)
    name = resolve_backend(backend, "add_norm_linear", lambda: supported(x, residual, weight))
    if name == "reference":
        return add_norm_linear_reference(x, residual, norm_weight, weight, eps, act)
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"add_norm_linear: the triton backend takes B <= {MAX_ROWS} rows, got {x.shape[0]}")
    return _add_norm_linear_triton(x, residual, norm_weight, weight.contiguous(), float(eps), act, block_n)


def linear_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, backend: str = "auto",
                    block_n: int | None = None) -> torch.Tensor:
    """residual + x Wᵀ: x [B, K], weight [N, K], residual [B, N] -> [B, N]. backend as `norm_linear`."""
    _check("linear_residual", x, weight)
    if residual.shape != (x.shape[0], weight.shape[0]):
        raise ValueError(f"linear_residual: residual must be [B, N] = {(x.shape[0], weight.shape[0])}, got "
                         f"{tuple(residual.shape)}")
    name = resolve_backend(backend, "linear_residual", lambda: supported(x, weight))
    if name == "reference":
        return linear_residual_reference(x, weight, residual)
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"linear_residual: the triton backend takes B <= {MAX_ROWS} rows, got {x.shape[0]}")
    return _linear_residual_triton(x, weight.contiguous(), residual, block_n)
