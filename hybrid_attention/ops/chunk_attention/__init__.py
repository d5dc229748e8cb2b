"""Chunk-routed causal softmax attention: the NAtS-L softmax branch.

Public op: ``chunk_attention(q, k, v, routing, *, chunk_size=64, group_size=1, scale=None, routing_bias=None)``.
See ``naive.py`` for the definition (own chunk causally, plus every earlier chunk routed to softmax for the head's
decision group).
"""

from __future__ import annotations

import torch

from ..common.backend import resolve_backend
from ..common.varlen import varlen_kwargs
from . import triton as triton_backend
from .chunk import chunk_chunk_attention
from .flex import FLEX_AVAILABLE, build_chunk_block_mask, flex_chunk_attention
from .naive import naive_chunk_attention
from .triton import triton_chunk_attention

__all__ = [
    "chunk_attention",
    "chunk_chunk_attention",
    "naive_chunk_attention",
    "flex_chunk_attention",
    "triton_chunk_attention",
    "build_chunk_block_mask",
    "FLEX_AVAILABLE",
    "BACKENDS",
]

BACKENDS = ("auto", "reference", "naive", "flex", "triton")
_FORMS = {"reference": chunk_chunk_attention, "naive": naive_chunk_attention, "flex": flex_chunk_attention,
          "triton": triton_chunk_attention}


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
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Chunk attention. q, k ``[B, T, Hs, Dk]``, v ``[B, T, Hs, Dv]``, routing / routing_bias ``[B, N, Hs // G]``.

    Returns ``o [B, T, Hs, Dv]``. backend: ``"reference"`` -> the memory-lean chunk loop (exact, differentiable
    everywhere); ``"naive"`` -> dense T×T oracle; ``"flex"`` -> FlexAttention (GPU; its backward does not run on
    CPU); ``"triton"`` -> the block-sparse Triton kernels of ``triton/`` (forward + backward incl. the routing-bias
    gradient; CUDA, or CPU under ``TRITON_INTERPRET=1``).

    Decision: ``"auto"`` picks the Triton kernels for CUDA inputs they support (not float64, chunk_size in
    {16, 32, 64, 128}, head dims <= 256) and the reference form otherwise.

    ``cu_seqlens [N + 1]``: packed documents (B == 1, ``ops/common/varlen.py``): no query reads another document,
    chunks restart at each document start (routing ``[1, Σ ceil(len_i / chunk_size), Hn]``); reference, naive and
    Triton forms ("auto" picks Triton for supported CUDA inputs as without ``cu_seqlens``; not "flex").
    """
    supported = lambda: q.is_cuda and triton_backend.supported(q, v, chunk_size)  # noqa: E731
    fn = _FORMS[resolve_backend(backend, "chunk_attention", supported, BACKENDS, varlen=cu_seqlens is not None,
                                 no_varlen=("flex",))]
    return fn(q, k, v, routing, chunk_size=chunk_size, group_size=group_size, scale=scale, routing_bias=routing_bias,
              **varlen_kwargs(cu_seqlens))
