"""Dense masked-softmax reference of the NAtS-L softmax branch ("chunk attention"), the float64 test oracle, and the
helpers every form shares (validation, routing to per-head booleans, dtype policy)."""

from __future__ import annotations

import math

import torch

from ..common.varlen import per_document

__all__ = ["naive_chunk_attention", "validate_chunk_attention_inputs", "routing_to_heads", "compute_dtype"]


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float32 at least (softmax statistics are never kept in half precision), float64 if any input is float64."""
    dtype = torch.float32
    for t in tensors:
        if t is not None and t.is_floating_point():
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def validate_chunk_attention_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    routing: torch.Tensor,
    chunk_size: int,
    group_size: int,
    routing_bias: torch.Tensor | None,
    n_chunks: int | None = None,
) -> None:
    """Raise ``ValueError`` naming the offending argument and the expected shape. ``n_chunks``: the chunk count of
    packed documents (``Σ ceil(len_i / chunk_size)``, ``ops/common/varlen.py``); None = ``ceil(T / chunk_size)``."""
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, Hs, Dk], got shape {tuple(q.shape)}")
    B, T, Hs, Dk = q.shape
    if tuple(k.shape) != (B, T, Hs, Dk):
        raise ValueError(f"k must be [B, T, Hs, Dk] = {(B, T, Hs, Dk)} like q, got {tuple(k.shape)}")
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, T, Hs):
        raise ValueError(f"v must be [B, T, Hs, Dv] with [B, T, Hs] = {(B, T, Hs)}, got {tuple(v.shape)}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1 or Hs % group_size:
        raise ValueError(f"group_size must be a positive int dividing Hs = {Hs}, got {group_size!r}")
    N, Hn = math.ceil(T / chunk_size) if n_chunks is None else n_chunks, Hs // group_size
    if tuple(routing.shape) != (B, N, Hn):
        how = "ceil(T / chunk_size)" if n_chunks is None else "Σ ceil(len_i / chunk_size) (cu_seqlens)"
        raise ValueError(
            f"routing must be [B, N, Hn] = {(B, N, Hn)} with N = {how} and Hn = Hs // group_size, "
            f"got {tuple(routing.shape)}"
        )
    if routing_bias is not None and tuple(routing_bias.shape) != (B, N, Hn):
        raise ValueError(f"routing_bias must be [B, N, Hn] = {(B, N, Hn)}, got {tuple(routing_bias.shape)}")


def routing_to_heads(routing: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[B, N, Hn]`` bool/float routing -> ``[B, N, Hs]`` bool, softmax head i reading decision head i // G.

    Decision: a float routing is a hard mask thresholded at 0.5 (a straight-through one-hot ``m - sg(p) + p`` is 1 or 0
    only up to rounding, so ``== 1`` would be fragile). The routing gradient is obtained through ``routing_bias``,
    not through ``routing``.
    """
    r = routing if routing.dtype == torch.bool else routing > 0.5
    return r.repeat_interleave(group_size, dim=2)


@per_document(tokens=("q", "k", "v"), chunks=("routing", "routing_bias"), outputs="t")
def naive_chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    routing: torch.Tensor,
    *,
    chunk_size: int = 64,
    group_size: int = 1,
    scale: float | None = None,
    routing_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Chunk-routed causal softmax attention with a dense ``[T, T]`` mask.

    Shapes: q, k ``[B, T, Hs, Dk]``; v ``[B, T, Hs, Dv]``; routing and routing_bias ``[B, N, Hn]`` with
    ``N = ceil(T / chunk_size)``, ``Hn = Hs // group_size``. Returns ``o [B, T, Hs, Dv]`` in ``v.dtype``.
    Memory O(B·Hs·T²): use only as an oracle.

    Query t (chunk c(t) = t // C, softmax head i, decision head h(i) = i // group_size) attends to

        { s : c(s) = c(t), s <= t }                                  (own chunk, causal: always visible)
      ∪ { s : c(s) < c(t), routing[b, c(s), h(i)] = 1 }             (earlier chunks typed "softmax" for head group h)

    with logits ``scale * q_t·k_s + [c(s) < c(t)] * routing_bias[b, c(s), h(i)]``.
    """
    validate_chunk_attention_inputs(q, k, v, routing, chunk_size, group_size, routing_bias)
    B, T, Hs, Dk = q.shape
    dtype = compute_dtype(q, k, v, routing_bias)
    scale = Dk**-0.5 if scale is None else scale
    out_dtype = v.dtype
    q, k, v = (x.to(dtype) for x in (q, k, v))

    pos = torch.arange(T, device=q.device)
    chunk = pos // chunk_size
    own = (chunk[:, None] == chunk[None, :]) & (pos[:, None] >= pos[None, :])  # [T(query), T(key)]
    earlier = chunk[None, :] < chunk[:, None]  # key chunk strictly before query chunk
    key_routed = routing_to_heads(routing, group_size)[:, chunk].permute(0, 2, 1)[:, :, None, :]  # [B, Hs, 1, T]
    mask = own | (earlier & key_routed)  # [B, Hs, T, T]; the diagonal is always visible

    logits = scale * torch.einsum("bthd,bshd->bhts", q, k)
    if routing_bias is not None:
        bias = routing_bias.to(dtype).repeat_interleave(group_size, dim=2)[:, chunk].permute(0, 2, 1)  # [B, Hs, T]
        logits = logits + torch.where(earlier, bias[:, :, None, :], torch.zeros((), dtype=dtype, device=q.device))
    p = logits.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    o = torch.einsum("bhts,bshd->bthd", p, v)
    return o.to(out_dtype)
