"""Rotary position embedding (RoPE), rotate-half convention (Llama / HF)."""

from __future__ import annotations

import weakref

import torch
from torch import nn

# Decode tables shared by every layer of a model while any static state holds them: (dim, theta, length, device,
# dtype) -> [length, 2, dim] (one table per model, not one per layer: 128K positions x 64 dims are 64 MB in float32).
_TABLES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


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

    def table(self, length: int, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
        """cos | sin at positions 0 .. length-1, ``[length, 2, D]`` in the compute dtype of ``dtype`` inputs (float64
        for float64, else float32): the values `at` computes, precomputed for static decode steps (`at_table`).

        DECISION: a static step gathers its row of this table (a precomputed table) instead of recomputing the
        float64 angles. On the H200 the recomputation is 4 small kernels per softmax layer (96
        launches, 0.30 ms of transformer-340m's 1.38 ms of step kernels, `benchmarks/profile_decode.py`); a gather
        fuses into the rotation. One tensor per (dim, theta, length, device, dtype) is shared while referenced."""
        cdt = torch.float64 if dtype == torch.float64 else torch.float32
        device = torch.device(device)
        key = (self.dim, self.theta, length, str(device), cdt)
        table = _TABLES.get(key)
        if table is None:
            cos, sin = self._cos_sin(torch.arange(length, device=device, dtype=torch.float64), cdt)
            table = _TABLES[key] = torch.stack([cos, sin], dim=-2)  # [length, 2, D]
        return table

    def at_table(self, x: torch.Tensor, table: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """`at` through a `table` (positions pos < its length, as `at` takes them): the same values, no angle math."""
        rows = table[pos if pos.dim() == 2 else pos.reshape(-1)]  # [(B,) T, 2, D]
        return self._rotate_by(x, rows[..., 0, :].unsqueeze(-2), rows[..., 1, :].unsqueeze(-2))

    def _cos_sin(self, pos: torch.Tensor, cdt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[(B,) T, D]`` in ``cdt`` of the float64 positions pos [T] or [B, T]."""
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.dim, 2, device=pos.device, dtype=torch.float64)
                                         / self.dim))
        ang = pos[..., None] * inv_freq  # [(B,) T, D/2], float64 for exact positions
        return torch.cat([ang.cos(), ang.cos()], -1).to(cdt), torch.cat([ang.sin(), ang.sin()], -1).to(cdt)

    def _rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [B, T, H, D] rotated by the angles of the float64 positions pos [T] or [B, T]."""
        # No cached buffer: a non-persistent buffer would be left uninitialised by meta-device loading in
        # `from_pretrained`, and the table is cheap to recompute (static decode steps use `table` instead).
        cos, sin = self._cos_sin(pos, torch.float64 if x.dtype == torch.float64 else torch.float32)
        return self._rotate_by(x, cos.unsqueeze(-2), sin.unsqueeze(-2))  # [(B,) T, 1, D]

    @staticmethod
    def _rotate_by(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, H, D] rotated by cos / sin broadcastable to it ([(B,) T, 1, D]), in their dtype."""
        xf = x.to(cos.dtype)
        x1, x2 = xf.chunk(2, dim=-1)
        rot = torch.cat([-x2, x1], dim=-1)
        return (xf * cos + rot * sin).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, theta={self.theta}"
