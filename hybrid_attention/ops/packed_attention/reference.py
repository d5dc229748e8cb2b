"""Reference form of packed causal attention: one SDPA over the whole packed row with a block-diagonal causal mask.

Exact (float64 agrees with per-document SDPA to rounding) and sync-free, but O(T²) in time and memory over all
documents at once, and a boolean mask keeps SDPA off its flash kernel: the oracle and the CPU form, not the GPU
training path (``flash.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.varlen import document_ids

__all__ = ["reference_packed_causal_attention"]


def reference_packed_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                      cu_seqlens: torch.Tensor) -> torch.Tensor:
    """q, k, v ``[1, T, H, D]``, cu_seqlens ``[N + 1]`` -> o ``[1, T, H, D]``: query t attends to the keys
    s <= t of its own document (mask ``[T, T]``: same document id and s <= t), scale 1 / sqrt(D)."""
    T = q.shape[1]
    doc = document_ids(cu_seqlens.to(q.device), T)  # [T], device ops only (no host read of the offsets)
    idx = torch.arange(T, device=q.device)
    mask = (doc[:, None] == doc[None, :]) & (idx[None, :] <= idx[:, None])  # [T, T]
    o = F.scaled_dot_product_attention(*(z.transpose(1, 2) for z in (q, k, v)), attn_mask=mask)  # [1, H, T, D]
    return o.transpose(1, 2)
