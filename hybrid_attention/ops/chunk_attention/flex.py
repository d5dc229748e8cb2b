"""FlexAttention forward path for chunk attention (inference; GPU is the target), its ``BlockMask`` built directly
from the routing."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..common.order import selected_first
from .naive import routing_to_heads, validate_chunk_attention_inputs

try:  # guarded: FlexAttention is a prototype API (torch >= 2.5)
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    FLEX_AVAILABLE = True
except ImportError:  # pragma: no cover - depends on the torch build
    BlockMask = None  # type: ignore[assignment,misc]
    flex_attention = None  # type: ignore[assignment]
    FLEX_AVAILABLE = False

__all__ = ["flex_chunk_attention", "build_chunk_block_mask", "FLEX_AVAILABLE"]

_COMPILED: dict[str, Callable[..., Any]] = {}


def _flex_fn(compiled: bool) -> Callable[..., Any]:
    if not compiled:
        return flex_attention
    if "fn" not in _COMPILED:  # compile once per process; recompiles for new shapes are torch.compile's business
        _COMPILED["fn"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["fn"]


def build_chunk_block_mask(routing: torch.Tensor, seq_len: int, chunk_size: int, group_size: int = 1) -> Any:
    """``BlockMask`` over ``N·C`` (padded) positions from ``routing [B, N, Hn]``; heads = ``Hn * group_size``.

    ``mask_mod`` still expresses the full visibility rule, so any path that evaluates it (e.g. ``to_dense()``)
    agrees with the block lists; in the forward only the diagonal (partial) blocks evaluate it.
    """
    if not FLEX_AVAILABLE:
        raise RuntimeError("torch.nn.attention.flex_attention is not available in this torch build")
    C = chunk_size
    N = math.ceil(seq_len / C)
    routed = routing_to_heads(routing, group_size)  # [B, N, Hs]
    B, _, Hs = routed.shape
    device = routing.device
    blk = torch.arange(N, device=device)
    earlier = blk[None, :] < blk[:, None]  # [N(q block), N(kv block)]
    full = earlier & routed.transpose(1, 2)[:, :, None, :]  # [B, Hs, N, N]
    full_num = full.sum(-1).to(torch.int32)
    # visible kv blocks first, ascending; entries beyond full_num are not read.
    # Decision: force contiguous index tensors. `full` is built from a transposed view, so the sort output has
    # non-standard strides, and the compiled CPU flex kernel (torch 2.13) read them as if contiguous (wrong rows).
    full_num = full_num.contiguous()
    full_idx = selected_first(full).to(torch.int32)
    # Partial list: the diagonal block only. The unused tail of each index row is a permutation of the other blocks
    # (what create_block_mask produces) rather than repeated zeros, to stay on the layout flex is tested with.
    diag_num = torch.ones(B, Hs, N, dtype=torch.int32, device=device)
    not_diag = (blk[None, :] != blk[:, None]).to(torch.uint8)  # [N(q block), N(kv block)], 0 on the diagonal
    diag_idx = torch.sort(not_diag, dim=-1, stable=True).indices.to(torch.int32).expand(B, Hs, N, N).contiguous()

    routed_i = routed.to(torch.int32)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        same_chunk = (q_idx // C) == (kv_idx // C)
        return (q_idx >= kv_idx) & (same_chunk | (routed_i[b, kv_idx // C, h] > 0))

    return BlockMask.from_kv_blocks(diag_num, diag_idx, full_num, full_idx, BLOCK_SIZE=C, mask_mod=mask_mod)


def flex_chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    routing: torch.Tensor,
    *,
    chunk_size: int = 64,
    group_size: int = 1,
    scale: float | None = None,
    routing_bias: torch.Tensor | None = None,
    compiled: bool | None = None,
) -> torch.Tensor:
    """Chunk attention through FlexAttention; same contract as ``naive_chunk_attention``.

    Shapes: q, k ``[B, T, Hs, Dk]``; v ``[B, T, Hs, Dv]``; routing, routing_bias ``[B, ceil(T / C), Hs // G]``.
    Returns ``o [B, T, Hs, Dv]`` in ``q.dtype`` (flex requires q, k, v of one dtype).
    ``compiled=None`` compiles on CUDA and runs the unfused eager implementation elsewhere (tests, CPU).

    The ``BlockMask`` is built directly from ``routing`` with block size = chunk size, without evaluating a T×T
    ``mask_mod`` (``create_block_mask`` would): for query block c and softmax head i,

    * full kv blocks    = the earlier chunks n < c with routing[b, n, i // G] = 1 (no mask evaluated inside);
    * partial kv blocks = the diagonal block c only (causal mask inside).

    Cost per head is therefore ≈ ρ·T²/2 + T·C with ρ the routed ("softmax") fraction. The optional ``routing_bias`` is
    applied by a ``score_mod`` to cross-chunk pairs only. Backward works on GPU but not on CPU (torch raises
    NotImplementedError there); CPU training uses ``chunk.py``.
    """
    if not FLEX_AVAILABLE:
        raise RuntimeError("torch.nn.attention.flex_attention is not available in this torch build")
    validate_chunk_attention_inputs(q, k, v, routing, chunk_size, group_size, routing_bias)
    B, T, Hs, Dk = q.shape
    C = chunk_size
    N = math.ceil(T / C)
    scale = Dk**-0.5 if scale is None else scale
    compiled = q.is_cuda if compiled is None else compiled

    # Decision: pad to a whole number of chunks instead of relying on flex's partial-block handling. Padded keys
    # sit after every real query of the last block, so the causal rule hides them; padded queries are cut off.
    pad = N * C - T
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)).transpose(1, 2) for x in (q, k, v))  # [B, Hs, N*C, D]
    block_mask = build_chunk_block_mask(routing, T, C, group_size)

    score_mod = None
    if routing_bias is not None:
        bias = routing_bias.to(q.dtype).repeat_interleave(group_size, dim=2)  # [B, N, Hs]

        def score_mod(
            score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
        ) -> torch.Tensor:
            kc = kv_idx // C
            return torch.where(kc < q_idx // C, score + bias[b, kc, h], score)

    o = _flex_fn(compiled)(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    return o.transpose(1, 2)[:, :T]
