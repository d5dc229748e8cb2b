"""Softmax attention with RoPE and a KV cache: the Transformer baseline of both papers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_attention.layers.base import (
    StaticState,
    TokenMixer,
    check_hidden,
    left_pad,
    packed_positions,
    right_align,
    rope_positions,
    row_positions,
)
from hybrid_attention.modules import RotaryEmbedding, concat_linear_weights, project_inputs
from hybrid_attention.ops.common.backend import resolve_use_kernels, validate_backend
from hybrid_attention.ops.decode_attention import decode_attention, default_num_splits
from hybrid_attention.ops.packed_attention import BACKENDS as PACKED_BACKENDS
from hybrid_attention.ops.packed_attention import packed_causal_attention


@dataclass
class KVState:
    """KV cache of one softmax layer: k, v [B, S, H, D] (RoPE already applied to k); `offset` = S tokens seen.
    pad [B] (int64) or None: after a left-padded prefill, the first pad[b] slots of row b are empty (never attended)
    and its next position is offset - pad[b]."""

    k: torch.Tensor
    v: torch.Tensor
    pad: torch.Tensor | None = None

    @property
    def offset(self) -> int:
        return self.k.shape[1]


@dataclass
class StaticKVState(StaticState):
    """Static KV cache of one softmax layer: k, v [B, H, max_len, D] (RoPE already applied to k); position p holds
    token p. key_pos [max_len] = 0..max_len-1; zero [1, 1] (the unused second key range of the split-KV kernel);
    w_qkv [3·H·D, hidden]: the q|k|v projections as one weight (modules/fused_linear.py); rope [max_len, 2, D]: the
    RoPE table (`RotaryEmbedding.table`), None without RoPE."""

    k: torch.Tensor
    v: torch.Tensor
    key_pos: torch.Tensor
    zero: torch.Tensor
    num_splits: int
    use_kernels: bool
    w_qkv: torch.Tensor | None = None
    rope: torch.Tensor | None = None

    def buffers(self) -> list[torch.Tensor]:
        return [self.k, self.v]

    def small_buffers(self) -> list[torch.Tensor]:
        return []

    def fill_random(self, length: int, generator: torch.Generator, softmax_fraction: float = 0.5) -> None:
        self.k[:, :, :length].normal_(generator=generator)
        self.v[:, :, :length].normal_(generator=generator)


class SoftmaxAttention(TokenMixer):
    """Multi-head causal softmax attention (SDPA), RoPE on q/k, no biases.

    x [B, T, hidden] -> y [B, T, hidden]. A packed prefill's state holds each document's keys right-aligned in its
    row (``KVState.pad``).

    Args:
        hidden_size: width of x and y.
        num_heads: the number of heads.
        head_dim: the width of a head (default hidden_size // num_heads).
        rope: RoPE on q and k.
        rope_theta: RoPE base.
        backend: the form of the packed (``cu_seqlens``) attention, one of ``ops.packed_attention.BACKENDS``
            ("auto": FlashAttention varlen for CUDA fp16 / bf16, else the dense-mask "reference"; "flash").
    """

    packed_states = True

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int | None = None,
        rope: bool = True,
        rope_theta: float = 10000.0,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        validate_backend(backend, type(self).__name__, PACKED_BACKENDS)
        self.backend = backend
        head_dim = head_dim or hidden_size // num_heads
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, head_dim
        inner = num_heads * head_dim
        self.q_proj = nn.Linear(hidden_size, inner, bias=False)
        self.k_proj = nn.Linear(hidden_size, inner, bias=False)
        self.v_proj = nn.Linear(hidden_size, inner, bias=False)
        self.o_proj = nn.Linear(inner, hidden_size, bias=False)
        self.rotary = RotaryEmbedding(head_dim, rope_theta) if rope else None

    def init_state(self, batch_size: int, device=None, dtype=None) -> KVState:
        shape = (batch_size, 0, self.num_heads, self.head_dim)
        dtype = dtype or self.q_proj.weight.dtype
        return KVState(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))

    def state_size(self, seq_len: int) -> int:
        return 2 * self.num_heads * self.head_dim * seq_len

    def forward(self, x: torch.Tensor, state: KVState | None = None, *, output_state: bool | None = None,
                cu_seqlens: torch.Tensor | None = None):
        check_hidden(x, self.hidden_size)
        b, t, _ = x.shape
        keep = output_state if output_state is not None else state is not None
        offset = state.offset if state is not None else 0
        z, _ = project_inputs(x, {"q": self.q_proj, "k": self.k_proj, "v": self.v_proj})  # one product
        q, k, v = (z[n].view(b, t, self.num_heads, self.head_dim) for n in "qkv")
        if cu_seqlens is not None:
            return self._forward_packed(x, q, k, v, state, keep, cu_seqlens)
        pad = state.pad if state is not None else None
        if self.rotary is not None:
            rows = row_positions(offset, pad, t, x.device)
            q, k = ((self.rotary(z, offset) if rows is None else self.rotary.at(z, rows)) for z in (q, k))
        if state is not None:
            k = torch.cat([state.k.to(k.dtype), k], dim=1)
            v = torch.cat([state.v.to(v.dtype), v], dim=1)
        qh, kh, vh = (z.transpose(1, 2) for z in (q, k, v))  # [B, H, *, D]
        if offset == 0:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        else:  # queries sit at positions offset..offset+t-1 of the key axis (bottom-right aligned causal mask)
            qpos = torch.arange(offset, offset + t, device=x.device)[:, None]
            key = torch.arange(offset + t, device=x.device)
            mask = key[None, :] <= qpos
            if pad is not None:  # [B, 1, t, S + t]: and never a row's empty leading slots
                mask = (mask[None] & (key[None, None, :] >= pad[:, None, None]))[:, None]
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        y = self.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        # k and v (views of the q|k|v product without a state or RoPE) keep only their own storage in the cache
        return y, (KVState(k.contiguous(), v.contiguous(), pad) if keep else None)

    def _forward_packed(self, x, q, k, v, state, keep: bool, cu_seqlens: torch.Tensor
                        ) -> tuple[torch.Tensor, KVState | None]:
        """Packed documents (q, k, v [1, T, H, D]): RoPE positions restart at 0 per document and a query attends
        causally inside its own document only (``packed_causal_attention``, ``self.backend``) -> (y [1, T, hidden],
        with keep the KVState [N, L, H, D] of the documents right-aligned in the longest one's width L, else None)."""
        pos = packed_positions(x, state, keep, cu_seqlens, type(self).__name__, packed_states=True)
        if self.rotary is not None:
            q, k = self.rotary.at(q, pos), self.rotary.at(k, pos)
        o = packed_causal_attention(q, k, v, cu_seqlens, backend=self.backend)  # [1, T, H, D]
        kept = KVState(right_align(k, cu_seqlens), right_align(v, cu_seqlens), left_pad(cu_seqlens)[1]) if keep \
            else None
        return self.o_proj(o.reshape(*x.shape[:2], -1)), kept

    # ---------------------------------------------------------------------------------------------------- static
    def init_static_state(self, batch_size: int, max_len: int, device=None, dtype=None, *,
                          use_kernels: bool | None = None, cache_chunks: int | None = None) -> StaticKVState:
        dtype = dtype or self.q_proj.weight.dtype
        device = torch.device(device) if device is not None else self.q_proj.weight.device
        shape = (batch_size, self.num_heads, max_len, self.head_dim)
        w_qkv, _ = concat_linear_weights([self.q_proj, self.k_proj, self.v_proj])
        return StaticKVState(
            k=torch.zeros(shape, device=device, dtype=dtype), v=torch.zeros(shape, device=device, dtype=dtype),
            key_pos=torch.arange(max_len, device=device), zero=torch.zeros(1, 1, dtype=torch.long, device=device),
            num_splits=default_num_splits(device, batch_size * self.num_heads, max_len),
            use_kernels=resolve_use_kernels(use_kernels, "decode_attention", device.type == "cuda"),
            w_qkv=w_qkv.to(device=device, dtype=dtype),
            rope=self.rotary.table(max_len, device, dtype) if self.rotary is not None else None)

    def load_static_state(self, static: StaticKVState, state: KVState) -> None:
        """Copy an eager state; a left-padded prefill's (``state.pad``) row b moves from slots pad[b].. to 0.. (row b's
        position p in slot p, the per-row layout of layers/base.py; a host sync, outside steps)."""
        if state.pad is None:
            n = state.offset
            static.k[:, :, :n].copy_(state.k.transpose(1, 2))
            static.v[:, :, :n].copy_(state.v.transpose(1, 2))
            return
        for b, p in enumerate(state.pad.tolist()):
            n = state.offset - p
            static.k[b, :, :n].copy_(state.k[b, p:].transpose(0, 1))
            static.v[b, :, :n].copy_(state.v[b, p:].transpose(0, 1))

    def step(self, x: torch.Tensor, static: StaticKVState, pos: torch.Tensor, chunk_end: bool = False) -> torch.Tensor:
        """x [B, 1, hidden] at position pos (0-d, or [B] per row) -> [B, 1, hidden]; writes K/V at pos (row b: slot
        pos[b]), attends to keys 0..pos (row b: 0..pos[b]): the split-KV kernel with `use_kernels` (reads only those
        keys), else SDPA over the whole buffer with a mask of them."""
        b = x.shape[0]
        per_row = pos.dim() == 1
        q, k, v = (z.view(b, 1, self.num_heads, self.head_dim) for z in F.linear(x, static.w_qkv).chunk(3, -1))
        if self.rotary is not None:
            q, k = (self.rotary.at_table(z, static.rope, rope_positions(pos)) for z in (q, k))
        if per_row:  # row b writes slot pos[b]
            at = pos[:, None, None, None].expand(b, self.num_heads, 1, self.head_dim)
            static.k.scatter_(2, at, k.transpose(1, 2).to(static.k.dtype))
            static.v.scatter_(2, at, v.transpose(1, 2).to(static.v.dtype))
        else:
            at = pos.reshape(1)
            static.k.index_copy_(2, at, k.transpose(1, 2).to(static.k.dtype))
            static.v.index_copy_(2, at, v.transpose(1, 2).to(static.v.dtype))
        if static.use_kernels:
            o = decode_attention(q[:, 0], static.k, static.v, (pos + 1).reshape(-1, 1), static.zero, static.zero,
                                 self.head_dim ** -0.5, static.num_splits)
        else:
            valid = static.key_pos <= (pos[:, None] if per_row else pos)  # [B, L] or [L]: keys 0..pos
            mask = valid[:, None, None, :] if per_row else valid[None, None, None, :]
            o = F.scaled_dot_product_attention(q.transpose(1, 2), static.k, static.v, attn_mask=mask)[:, :, 0]
        return self.o_proj(o.reshape(b, 1, -1))
