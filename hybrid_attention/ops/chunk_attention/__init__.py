"""Chunk-routed causal softmax attention: the NAtS-L softmax branch.

Public op: ``chunk_attention(q, k, v, routing, *, chunk_size=64, group_size=1, scale=None, routing_bias=None)``.
See ``naive.py`` for the definition (own chunk causally, plus every earlier chunk routed to softmax for the head's
decision group).
"""

from __future__ import annotations

import torch

from .chunk import chunk_chunk_attention
from .flex import FLEX_AVAILABLE, build_chunk_block_mask, flex_chunk_attention
from .naive import naive_chunk_attention

__all__ = [
    "chunk_attention",
    "chunk_chunk_attention",
    "naive_chunk_attention",
    "flex_chunk_attention",
    "build_chunk_block_mask",
    "FLEX_AVAILABLE",
    "BACKENDS",
]

BACKENDS = ("auto", "reference", "naive", "flex")


def chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    routing: torch.Tensor,
    *,
    chunk_size: int = 64,
    group_size: int = 1,
    scale: float | None = None,
    routing_bias: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Chunk attention. q, k ``[B, T, Hs, Dk]``, v ``[B, T, Hs, Dv]``, routing / routing_bias ``[B, N, Hs // G]``.

    Returns ``o [B, T, Hs, Dv]``. backend: ``"auto"`` / ``"reference"`` -> the memory-lean chunk loop (exact,
    differentiable everywhere); ``"naive"`` -> dense T×T oracle; ``"flex"`` -> FlexAttention (inference on GPU;
    its backward does not run on CPU).

    Decision: ``"auto"`` stays on the reference form for now; it is the only form whose backward runs on every
    device. A GPU kernel will be selected here once it exists.
    """
    if backend in ("auto", "reference"):
        fn = chunk_chunk_attention
    elif backend == "naive":
        fn = naive_chunk_attention
    elif backend == "flex":
        fn = flex_chunk_attention
    else:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return fn(q, k, v, routing, chunk_size=chunk_size, group_size=group_size, scale=scale, routing_bias=routing_bias)
