"""The PyTorch definition of `decode_attention` (the test oracle)."""

from __future__ import annotations

import torch


def decode_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, len1: torch.Tensor,
                               start2: torch.Tensor, len2: torch.Tensor, scale: float) -> torch.Tensor:
    """The definition of `decode_attention` in PyTorch (masked softmax over the whole buffer). Same shapes."""
    L = k.shape[2]
    idx = torch.arange(L, device=k.device)
    ok = (idx < len1[..., None]) | ((idx >= start2[..., None]) & (idx < (start2 + len2)[..., None]))  # [B, H, L]
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = torch.einsum("bhd,bhld->bhl", q.to(cdt), k.to(cdt)) * scale
    p = s.masked_fill(~ok, float("-inf")).softmax(-1)
    return torch.einsum("bhl,bhld->bhd", p, v.to(cdt)).to(v.dtype)
