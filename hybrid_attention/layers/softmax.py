"""Softmax attention with RoPE and a KV cache: the Transformer baseline of both papers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_attention.layers.base import TokenMixer, check_hidden
from hybrid_attention.modules import RotaryEmbedding


@dataclass
class KVState:
    """KV cache of one softmax layer: k, v [B, S, H, D] (RoPE already applied to k); `offset` = S tokens seen."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def offset(self) -> int:
        return self.k.shape[1]


class SoftmaxAttention(TokenMixer):
    """Multi-head causal softmax attention (SDPA), RoPE on q/k, no biases.

    x [B, T, hidden] -> y [B, T, hidden]; heads: num_heads × head_dim (default hidden / num_heads).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int | None = None,
        rope: bool = True,
        rope_theta: float = 10000.0,
    ) -> None:
        super().__init__()
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

    def forward(self, x: torch.Tensor, state: KVState | None = None, *, output_state: bool | None = None):
        check_hidden(x, self.hidden_size)
        b, t, _ = x.shape
        offset = state.offset if state is not None else 0
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.num_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.num_heads, self.head_dim)
        if self.rotary is not None:
            q, k = self.rotary(q, offset), self.rotary(k, offset)
        if state is not None:
            k = torch.cat([state.k.to(k.dtype), k], dim=1)
            v = torch.cat([state.v.to(v.dtype), v], dim=1)
        qh, kh, vh = (z.transpose(1, 2) for z in (q, k, v))  # [B, H, *, D]
        if offset == 0:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        else:  # queries sit at positions offset..offset+t-1 of the key axis (bottom-right aligned causal mask)
            qpos = torch.arange(offset, offset + t, device=x.device)[:, None]
            mask = torch.arange(offset + t, device=x.device)[None, :] <= qpos
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        y = self.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        keep = output_state if output_state is not None else state is not None
        return y, (KVState(k, v) if keep else None)
