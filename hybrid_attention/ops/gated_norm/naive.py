"""Reference of the gated RMSNorm: the PyTorch math of the GDN layer's output norm and swish gate (the test oracle)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.norm import rms_norm


def validate_gated_norm_inputs(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor) -> None:
    """Raise ``ValueError`` naming the argument unless gate matches x's shape and weight is [x.shape[-1]]."""
    if gate.shape != x.shape:
        raise ValueError(f"gate must have x's shape {tuple(x.shape)}, got {tuple(gate.shape)}")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must be [{x.shape[-1]}] (x's last dimension), got {tuple(weight.shape)}")


def naive_gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm(x) · weight · swish(gate)`` over the last dimension: the norm in at least float32, rounded to x's
    dtype, then the gain and the gate in x's dtype (``modules.RMSNorm`` followed by the layer's gate)."""
    validate_gated_norm_inputs(x, gate, weight)
    return rms_norm(x, eps) * weight.to(x.dtype) * F.silu(gate.to(x.dtype))
