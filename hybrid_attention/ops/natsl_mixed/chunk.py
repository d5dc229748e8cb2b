"""Reference form of the NAtS-L mixed op: the two branches' chunk-parallel PyTorch forms, one after the other."""

from __future__ import annotations

import torch

from ..chunk_attention.chunk import chunk_chunk_attention
from ..gated_delta.chunk import chunk_gated_delta

__all__ = ["chunk_natsl_mixed"]


def chunk_natsl_mixed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    commit: torch.Tensor | None,
    q_attn: torch.Tensor,
    k_attn: torch.Tensor,
    v_attn: torch.Tensor,
    routing: torch.Tensor,
    *,
    routing_bias: torch.Tensor | None = None,
    chunk_size: int = 64,
    group_size: int = 1,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    decay_uncommitted: bool = True,
    attn_scale: float | None = None,
    concurrent: bool = True,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``chunk_gated_delta`` then ``chunk_chunk_attention``; same contract as ``triton_natsl_mixed`` (``concurrent``
    is accepted and ignored: the PyTorch forms run on the current stream). ``cu_seqlens``: packed documents, passed
    to both forms (``ops/common/varlen.py``)."""
    o_g, S = chunk_gated_delta(q, k, v, g, beta, commit=commit, chunk_size=chunk_size, initial_state=initial_state,
                               output_final_state=output_final_state, decay_uncommitted=decay_uncommitted,
                               cu_seqlens=cu_seqlens)
    o_a = chunk_chunk_attention(q_attn, k_attn, v_attn, routing, chunk_size=chunk_size, group_size=group_size,
                                scale=attn_scale, routing_bias=routing_bias, cu_seqlens=cu_seqlens)
    return o_g, S, o_a
