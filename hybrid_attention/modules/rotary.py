"""Rotary position embedding (RoPE), rotate-half convention (Llama / HF)."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Applies RoPE to [B, T, H, D] tensors at absolute positions offset .. offset+T-1 (`forward`, host int offset)
    or at positions held by a device tensor (`at`, for static decode steps: no host sync).

    The angle table is computed on the fly in float64 (no length limit, so length-extrapolation sweeps work).
    """

    def __init__(self, dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"RoPE dim must be even, got {dim}")
        self.dim, self.theta = dim, theta

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x [B, T, H, D] at positions offset .. offset+T-1 -> same shape and dtype."""
        pos = torch.arange(offset, offset + x.shape[1], device=x.device, dtype=torch.float64)
        return self._rotate(x, pos)

    def at(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [B, T, H, D] at the T positions of the integer device tensor pos ([T], or 0-d when T = 1, or [B, T]:
        positions per row) -> same shape and dtype; the same float64 angle math as `forward` (equal results at equal
        positions)."""
        return self._rotate(x, (pos if pos.dim() == 2 else pos.reshape(-1)).to(torch.float64))

    def _rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [B, T, H, D] rotated by the angles of the float64 positions pos [T] or [B, T]."""
        # No cached buffer: a non-persistent buffer would be left uninitialised by meta-device loading in
        # `from_pretrained`, and the table is cheap to recompute.
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.dim, 2, device=x.device, dtype=torch.float64) / self.dim))
        ang = pos[..., None] * inv_freq  # [(B,) T, D/2], float64 for exact positions
        cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(cdt).unsqueeze(-2)  # [(B,) T, 1, D]
        sin = torch.cat([ang.sin(), ang.sin()], -1).to(cdt).unsqueeze(-2)
        xf = x.to(cdt)
        x1, x2 = xf.chunk(2, dim=-1)
        rot = torch.cat([-x2, x1], dim=-1)
        return (xf * cos + rot * sin).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, theta={self.theta}"
