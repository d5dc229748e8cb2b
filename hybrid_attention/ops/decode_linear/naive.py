"""The PyTorch definitions of `norm_linear`, `add_norm_linear` and `linear_residual` (the test oracles): exactly the
plain decode step's modules (modules/norm.py `RMSNorm`, `F.linear`, modules/mlp.py's SwiGLU),
with their rounding points."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hybrid_attention.ops.common.norm import rms_norm


def norm_linear_reference(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, eps: float,
                          act: str | None = None) -> torch.Tensor:
    """x [B, K], norm_weight [K], weight [N, K] -> y [B, N] (act None) or [B, N // 2] (act "swiglu":
    silu(y[:, :N/2]) * y[:, N/2:]), where y = RMSNorm(x) Wᵀ as `RMSNorm.forward` computes the norm (in at least
    float32, cast back to x.dtype, then times the gain in x.dtype)."""
    h = rms_norm(x, eps) * norm_weight.to(x.dtype)
    y = F.linear(h, weight)
    if act is None:
        return y
    if act != "swiglu":
        raise ValueError(f"norm_linear: act must be None or 'swiglu', got {act!r}")
    g, u = y.chunk(2, -1)
    return F.silu(g) * u


def add_norm_linear_reference(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                              weight: torch.Tensor, eps: float,
                              act: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual (x, residual [B, K]) and `norm_linear_reference(h, ...)`: (h [B, K], y)."""
    h = x + residual
    return h, norm_linear_reference(h, norm_weight, weight, eps, act)


def linear_residual_reference(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """x [B, K], weight [N, K], residual [B, N] -> residual + x Wᵀ [B, N] (the product rounded to x.dtype first, as
    ``h + down_proj(a)`` rounds it)."""
    return residual + F.linear(x, weight)
