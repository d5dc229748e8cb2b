"""Gated RMSNorm, ``rms_norm(x) · weight · swish(gate)`` over the last dimension: the output norm and gate of the Gated
DeltaNet layer in one forward and one backward kernel.

Backends: "reference" (the PyTorch math, ``naive.py``), "triton" (``hybrid_attention.ops.gated_norm.triton``) and
"auto".
"""

from __future__ import annotations

import torch

from ..common.backend import resolve_backend
from . import triton as triton_backend
from .naive import naive_gated_rms_norm, validate_gated_norm_inputs
from .triton import triton_gated_rms_norm

__all__ = ["BACKENDS", "auto_takes_triton", "gated_rms_norm", "naive_gated_rms_norm", "triton_gated_rms_norm"]

BACKENDS = ("auto", "reference", "triton")


def auto_takes_triton(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether "auto" runs the Triton op: CUDA inputs it supports, outside ``torch.compile``. In a compiled graph
    inductor fuses the reference as fast and recomputes y for the output projection's backward instead of saving it,
    which the opaque op cannot offer. DECISION: the "output RMSNorm ⊙ swish gate" rows of the GDN op section in
    benchmarks/README.md."""
    return x.is_cuda and not torch.compiler.is_compiling() and triton_backend.supported(x, weight)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                   backend: str = "auto") -> torch.Tensor:
    """``y = x / sqrt(mean(x², -1) + eps) · weight · swish(gate)``, dispatched to a backend.

    Args:
        x: ``[..., D]`` the normalised input (bf16 / fp16 / fp32; float64 on the reference backend).
        gate: ``[..., D]`` the gate's pre-activation, x's shape.
        weight: ``[D]`` the gain.
        eps: added to the mean square.
        backend: "reference" (the PyTorch math: the norm rounded to x's dtype before the gain and the gate),
            "triton" (one kernel each way, every product in float32, y rounded once; D <= ``MAX_DIM``; CPU tensors
            run under the interpreter) or "auto" (``auto_takes_triton``: "triton" for CUDA inputs it supports
            outside ``torch.compile``, else "reference").

    Returns:
        ``y [..., D]`` in x's dtype, differentiable in x, gate and weight.
    """
    validate_gated_norm_inputs(x, gate, weight)
    name = resolve_backend(backend, "gated_rms_norm", lambda: auto_takes_triton(x, weight), BACKENDS)
    fn = triton_gated_rms_norm if name == "triton" else naive_gated_rms_norm
    return fn(x, gate, weight, eps)
