"""Normalisation layers.

All norms compute in float32 (or float64 when the input is float64) and cast back to the input dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from hybrid_attention.ops.common.norm import rms_norm


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with a learned gain (initialised to 1).

    x: [..., dim] -> [..., dim]
    """

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = rms_norm(x, self.eps)
        return y * self.weight.to(y.dtype) if self.weight is not None else y

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class HeadRMSNorm(nn.Module):
    """Per-head RMSNorm with a per-head gain and an optional per-head additive bias.

    x: [B, T, H, D] -> [B, T, H, D];  y[..., h, :] = rms_norm(x[..., h, :]) * weight[h] + bias[h]
    """

    def __init__(self, num_heads: int, dim: int, eps: float = 1e-6, bias: bool = False) -> None:
        super().__init__()
        self.num_heads, self.dim, self.eps = num_heads, dim, eps
        self.weight = nn.Parameter(torch.ones(num_heads, dim))
        self.bias = nn.Parameter(torch.zeros(num_heads, dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = rms_norm(x, self.eps) * self.weight.to(x.dtype)
        return y + self.bias.to(x.dtype) if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, dim={self.dim}, eps={self.eps}, bias={self.bias is not None}"


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x**2, -1) + eps) over the last dimension (the DeltaNet / fla convention), in at least float32."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)
