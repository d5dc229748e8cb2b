"""The NAtS-L mixed op on the Triton kernels: GDN branch (commit mask) and block-sparse softmax branch, optionally
concurrent (``triton_natsl_mixed``)."""

from __future__ import annotations

import torch

from ...chunk_attention.triton import DEFAULT_CONFIG as ATTN_DEFAULT
from ...chunk_attention.triton import ChunkAttentionConfig, triton_chunk_attention
from ...gated_delta.triton import DEFAULT_CONFIG as GDN_DEFAULT
from ...gated_delta.triton import GatedDeltaConfig, triton_gated_delta

__all__ = ["triton_natsl_mixed"]

_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SIDE_STREAMS:  # one cached stream per device (never a fresh stream per call)
        _SIDE_STREAMS[idx] = torch.cuda.Stream(device=device)
    return _SIDE_STREAMS[idx]


def triton_natsl_mixed(
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
    gdn_config: GatedDeltaConfig = GDN_DEFAULT,
    attn_config: ChunkAttentionConfig = ATTN_DEFAULT,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """GDN branch ``triton_gated_delta(q, k, v, g, beta, commit=..., config=gdn_config)`` and softmax branch
    ``triton_chunk_attention(q_attn, k_attn, v_attn, routing, routing_bias=..., config=attn_config)``; returns
    ``(o_gdn [B, T, H, V], final_state or None, o_attn [B, T, Hs, Dv])``. Shapes as in the two ops.
    ``cu_seqlens [N + 1]``: packed documents, passed to both as given; each branch builds its ``ChunkTable`` on the
    device (``ops/common/varlen.py``), so a packed call makes no device -> host sync.

    The two branches share no intermediate, and the GDN branch contains two sequential kernels (the chunk recurrence,
    forward and backward) that occupy only B·H·V/BV programs. Running the GDN branch on a side stream lets the softmax
    kernels fill the rest of the GPU meanwhile. The side stream is synchronised both ways (it waits for the caller's
    stream before starting; the caller's stream waits for it before returning), outputs made on it are recorded on the
    caller's stream, and autograd runs each branch's backward on the stream its forward used (the engine inserts the
    cross-stream waits), so the result is identical to the sequential call. Under CUDA-graph capture, under
    ``torch.compile``, on the CPU or with ``concurrent=False`` both branches run on the current stream.
    """

    def gdn():
        return triton_gated_delta(q, k, v, g, beta, commit=commit, chunk_size=chunk_size,
                                  initial_state=initial_state, output_final_state=output_final_state,
                                  decay_uncommitted=decay_uncommitted, config=gdn_config, cu_seqlens=cu_seqlens)

    def attn():
        return triton_chunk_attention(q_attn, k_attn, v_attn, routing, chunk_size=chunk_size, group_size=group_size,
                                      scale=attn_scale, routing_bias=routing_bias, config=attn_config,
                                      cu_seqlens=cu_seqlens)

    # Sequential under torch.compile too: inductor cannot functionalise ``record_stream`` (aten::record_stream has an
    # alias annotation), and stream switches inside a traced region are not ours to order there.
    # is_compiling first: Dynamo folds it to True, so a traced call never reaches the CUDA capture query (a builtin
    # that Dynamo may not trace: a graph break per call; the compiled natsl model shows 6 on the H200).
    if torch.compiler.is_compiling() or not (concurrent and q.is_cuda) or torch.cuda.is_current_stream_capturing():
        o_g, S = gdn()
        return o_g, S, attn()
    main = torch.cuda.current_stream(q.device)
    side = _side_stream(q.device)
    side.wait_stream(main)
    # Inputs made on the caller's stream are read on the side stream, in the forward and (saved for backward) in the
    # backward: recording that use keeps the caching allocator from handing their memory to the caller's stream
    # before the side stream's queued work is done, even if the caller drops its last reference early.
    for t in (q, k, v, g, beta, commit, initial_state, cu_seqlens):  # cu_seqlens: the GDN branch's chunk table
        if t is not None and t.is_cuda:
            t.record_stream(side)
    with torch.cuda.stream(side):
        o_g, S = gdn()
    o_a = attn()
    main.wait_stream(side)
    o_g.record_stream(main)
    if S is not None:
        S.record_stream(main)
    return o_g, S, o_a
