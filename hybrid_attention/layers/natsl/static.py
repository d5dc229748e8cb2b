"""The static decode step of NAtS-L (the `step` part of the layer contract, layers/base.py) over preallocated buffers:
`NatsLStaticState` holds the buffers and the compacted-cache layout, `NatsLStaticStep` (a mixin of `NatsLAttention`,
in its own file to keep layer.py readable) names the step's decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from hybrid_attention.layers.base import StaticState, copy_conv_states, rope_positions
from hybrid_attention.layers.gated_deltanet import gdn_decay
from hybrid_attention.modules import FusedInputs, fuse_inputs
from hybrid_attention.ops.common.backend import resolve_use_kernels
from hybrid_attention.ops.decode_attention import decode_attention, default_num_splits
from hybrid_attention.ops.gated_delta.step import gated_delta_step

if TYPE_CHECKING:
    from hybrid_attention.layers.natsl.layer import NatsLState


@dataclass
class NatsLStaticState(StaticState):
    """Static decode buffers of one NAtS-L layer (the cache layout: the decisions below).

    kv_k, kv_v     [B, Hs, cap + C, d]  compacted cache (cap = (capacity + 1)·C) | current chunk (slot p mod C)
    x_buf          [B, C, hidden]       layer inputs of the current chunk (its routing input)
    S, S_start     [B, Hl, dk, dv]      GDN state (pseudo-updated) and at the chunk start (float32 / float64)
    g_sum          [B, Hl]              Σ g over the current chunk
    n_kept         [B, Hl] long         kept chunks per (row, decision head); overflow: 0-d bool, n_kept > capacity
    conv                                ShortConv states by branch name (q, k, v, and q_s, k_s with "own_conv")
    cache_slot [cap], chunk_pos [C], buf_start [1, 1]: constant index tensors

    Decisions (named once, here):
    - Compacted cache: slot j of decision head h holds that head's j-th softmax-typed chunk; filled slots are those with
      j < n_kept[b, h] (a device counter). At a chunk end the finished chunk is written, for every (row, head), at slot
      n_kept, and n_kept is then increased only where the chunk is softmax-typed: a GDN-typed chunk's write lands in a
      slot that stays invalid and is overwritten by the next kept chunk. One spare slot makes that write always in
      range. The capacity (`cache_chunks`, default: every chunk of max_len) may be set lower, e.g. to an expected
      softmax fraction; keeping more chunks than that sets the device flag `overflow` (outputs are then not guaranteed).
      Both GDN outcomes (commit, decayed rollback) are computed and selected with `torch.where`.
    - The chunk buffer of the current chunk lives behind the compacted cache in the same tensor ([cache | chunk]), so
      the attention of a step is one call over one buffer (two key ranges), without a per-step concatenation of the
      cache.
    """

    kv_k: torch.Tensor
    kv_v: torch.Tensor
    x_buf: torch.Tensor
    S: torch.Tensor
    S_start: torch.Tensor
    g_sum: torch.Tensor
    n_kept: torch.Tensor
    overflow: torch.Tensor
    conv: dict[str, torch.Tensor]
    cache_slot: torch.Tensor
    chunk_pos: torch.Tensor
    buf_start: torch.Tensor
    chunk_size: int
    capacity: int
    num_splits: int
    use_kernels: bool
    # the step's projections and convolutions fused (modules/fused_linear.py; the convolved ones lead): q|k|v(|q_s|k_s
    # with attn_qk="own_conv")|a|b|g(|omega when it reads x)(|q_s|k_s with attn_qk="own", not convolved); conv's
    # branches (by name, as `NatsLAttention.convs`) are views of its conv state
    inputs: FusedInputs | None = None
    rope: torch.Tensor | None = None  # [max_len, 2, D]: the RoPE table (`RotaryEmbedding.table`), None without RoPE

    @property
    def cap(self) -> int:
        """Positions of the compacted cache: (capacity + 1)·C (one spare slot)."""
        return self.kv_k.shape[2] - self.chunk_size

    @property
    def k_cache(self) -> torch.Tensor:
        return self.kv_k[:, :, :self.cap]

    @property
    def v_cache(self) -> torch.Tensor:
        return self.kv_v[:, :, :self.cap]

    @property
    def k_buf(self) -> torch.Tensor:
        return self.kv_k[:, :, self.cap:]

    @property
    def v_buf(self) -> torch.Tensor:
        return self.kv_v[:, :, self.cap:]

    def buffers(self) -> list[torch.Tensor]:
        return [self.kv_k, self.kv_v, self.x_buf, self.S, self.S_start, self.g_sum, self.n_kept, self.overflow,
                *self.conv.values()]

    def small_buffers(self) -> list[torch.Tensor]:
        return [self.S, self.S_start, self.g_sum, self.n_kept, self.overflow, *self.conv.values()]

    def overflowed(self) -> torch.Tensor:
        return self.overflow

    def row(self, b: int) -> NatsLStaticState:
        """Row b as a batch-1 view (the per-row buffers sliced, the flag and constant index tensors shared)."""
        one = slice(b, b + 1)
        return replace(self, kv_k=self.kv_k[one], kv_v=self.kv_v[one], x_buf=self.x_buf[one], S=self.S[one],
                       S_start=self.S_start[one], g_sum=self.g_sum[one], n_kept=self.n_kept[one],
                       conv={n: t[one] for n, t in self.conv.items()},
                       inputs=None if self.inputs is None else replace(self.inputs,
                                                                       conv_state=self.inputs.conv_state[one]))

    def fill_random(self, length: int, generator: torch.Generator, softmax_fraction: float = 0.5) -> None:
        """Timing fill: random K/V and states; every (row, head) keeps round(fraction · complete chunks) chunks."""
        kept = round(softmax_fraction * (length // self.chunk_size))
        if kept > self.capacity:
            raise ValueError(f"softmax_fraction={softmax_fraction} keeps {kept} chunks, more than the capacity "
                             f"natsl_cache_chunks={self.capacity}")
        self.kv_k.normal_(generator=generator)
        self.kv_v.normal_(generator=generator)
        self.x_buf.normal_(generator=generator)
        self.S.normal_(std=0.1, generator=generator)
        self.S_start.normal_(std=0.1, generator=generator)
        self.g_sum.fill_(-0.1)
        self.n_kept.fill_(kept)
        self.overflow.zero_()
        for buf in self.conv.values():
            buf.normal_(generator=generator)


class NatsLStaticStep:
    """`init_static_state` / `load_static_state` / `step` of `NatsLAttention` (a mixin; its decisions below).

    Decisions (named once, here):
    - The chunk-end work runs only in steps called with `chunk_end=True` (the host-known flag of layers/base.py).
      Routing at a chunk end: the layer's router, or its forced routing; a forced softmax fraction needs the chunk
      number, taken from the device position.
    - Per-row positions (pos [B], prompts of different lengths; layers/base.py): each row's chunk buffer is at its own
      phase (row b writes slot pos[b] mod C and sees slots 0..pos[b] mod C of it). A step with chunk_end=True does the
      chunk-end work for every row and applies it only where (pos[b] + 1) % C == 0 (a device mask; no host sync, no
      branch): the types are masked to "GDN, not kept" for the other rows, which leaves their S untouched (the commit
      branch of the select), and S_start / g_sum are reset under the mask. The chunk copy into slot n_kept runs for
      every row: for a row not at its chunk end it lands in a slot that is not valid (>= n_kept, the spare one when
      full) and is overwritten by that row's real chunk end, so it needs no mask. Cost: the chunk-final step's work
      (router, two selects over S, the C-token K/V copy) for all B rows, on every step at which some row ends a chunk
      (up to min(B, C) of every C steps instead of 1). Chosen over graphs per pattern of ending rows (up to C + 1
      graphs, known only after the prefill) and over the chunk-end work in every step (one graph, C times the cost when
      rows agree). The load of a left-padded prefill takes one batch-1 state per row (`NatsLStaticState.row`).
    - Attention: with `use_kernels`, the split-KV Triton kernel (ops/decode_attention), which reads only the valid keys;
      otherwise SDPA over the whole buffer with a boolean mask of the valid keys. The GDN branch: `gated_delta_step`.
    """

    def step_chunk_size(self) -> int:
        return self.chunk_size

    def init_static_state(self, batch_size: int, max_len: int, device=None, dtype=None, *,
                          use_kernels: bool | None = None, cache_chunks: int | None = None) -> NatsLStaticState:
        """Capacity: kept chunks per (row, decision head), `cache_chunks` or all complete chunks of max_len; a smaller
        one (an expected softmax fraction) shortens every step's attention; exceeding it sets `overflow`."""
        c, hs, b = self.chunk_size, self.num_attn_heads, batch_size
        st = self.init_state(b, device=device, dtype=dtype)
        device, dtype = st.x_buf.device, st.x_buf.dtype
        capacity = max_len // c if cache_chunks is None else cache_chunks
        cap = (capacity + 1) * c  # + 1: the always-in-range write of a GDN-typed chunk (NatsLStaticState)
        names = tuple(self.convs)  # q, k, v(, q_s, k_s): the convolved projections come first, in this order
        inputs, views = fuse_inputs(list(self._linears().values()), [self.convs[n] for n in names],
                                    [st.conv[n] for n in names], device, dtype)
        return NatsLStaticState(
            kv_k=torch.zeros(b, hs, cap + c, self.attn_head_dim, device=device, dtype=dtype),
            kv_v=torch.zeros(b, hs, cap + c, self.attn_head_v_dim, device=device, dtype=dtype),
            x_buf=torch.zeros(b, c, self.hidden_size, device=device, dtype=dtype),
            S=st.S, S_start=st.S.clone(), g_sum=st.g_sum, n_kept=st.n_kept,
            overflow=torch.zeros((), dtype=torch.bool, device=device), conv=dict(zip(names, views)), inputs=inputs,
            cache_slot=torch.arange(cap, device=device) // c, chunk_pos=torch.arange(c, device=device),
            buf_start=torch.full((1, 1), cap, dtype=torch.long, device=device), chunk_size=c, capacity=capacity,
            num_splits=default_num_splits(device, b * hs, cap + c),
            use_kernels=resolve_use_kernels(use_kernels, "NatsLAttention.step", device.type == "cuda"),
            rope=self.rotary.table(max_len, device, dtype) if self.rotary is not None else None)

    def load_static_state(self, static: NatsLStaticState, state: NatsLState) -> None:
        """Copy a prefill state; ValueError when it keeps more chunks than the capacity (a host sync, outside steps)."""
        sc, lb = state.k_cache.shape[2], state.x_buf.shape[1]
        kept = int(state.n_kept.max())
        if kept > static.capacity:
            raise ValueError(f"the prompt's NAtS-L layer kept {kept} chunks in a row / head, more than "
                             f"natsl_cache_chunks={static.capacity}")
        # the eager cache may have more slots than the largest count (grown while decoding, or a prefill_cache="full"
        # prefill): the slots beyond it are unused and not copied
        sc = min(sc, static.cap)
        static.k_cache[:, :, :sc].copy_(state.k_cache[:, :, :sc])
        static.v_cache[:, :, :sc].copy_(state.v_cache[:, :, :sc])
        static.k_buf[:, :, :lb].copy_(state.k_buf.transpose(1, 2))
        static.v_buf[:, :, :lb].copy_(state.v_buf.transpose(1, 2))
        static.x_buf[:, :lb].copy_(state.x_buf)
        static.S.copy_(state.S)
        static.S_start.copy_(state.S_start)
        static.g_sum.copy_(state.g_sum)
        static.n_kept.copy_(state.n_kept)
        static.overflow.zero_()
        copy_conv_states(static.conv, state.conv)

    def step(self, x: torch.Tensor, static: NatsLStaticState, pos: torch.Tensor,
             chunk_end: bool = False) -> torch.Tensor:
        """x [B, 1, hidden] at position pos -> [B, 1, hidden]. pos 0-d: chunk_end = (pos + 1) % C == 0, known on the
        host; pos [B] (per row): chunk_end = some row may complete its chunk (class docstring)."""
        b = x.shape[0]
        per_row = pos.dim() == 1
        c, hl, hs, grp = self.chunk_size, self.num_heads, self.num_attn_heads, self.group
        # one GEMV for every projection of x, one convolution over the convolved ones (the state's fused weights)
        z = static.inputs(x[:, 0])  # each [B, ·], in the order of `init_static_state` (NatsLStaticState.inputs)
        n_conv = static.inputs.n_conv  # q, k, v(, q_s, k_s with "own_conv"), after their convolution
        q, k, v = (t[:, None] for t in z[:3])
        a, b_in, gate = z[n_conv:n_conv + 3]
        omega = z[n_conv + 3][:, None] if self.weights_from != "q" else None
        if self.attn_qk == "own_conv":
            q_s, k_s = z[3][:, None], z[4][:, None]
        elif self.attn_qk == "own":
            q_s, k_s = z[-2][:, None], z[-1][:, None]
        else:
            q_s, k_s = q, k
        beta = torch.sigmoid(b_in.to(torch.float64 if x.dtype == torch.float64 else torch.float32))[:, None]
        g = gdn_decay(a, self.A_log, self.dt_bias)[:, None]
        # GDN branch: every token sees the pseudo-updated state; Σg feeds the decayed rollback at the chunk end.
        o_gdn = gated_delta_step(q.view(b, hl, self.head_dim), k.view(b, hl, self.head_dim),
                                 v.view(b, hl, self.head_v_dim), g[:, 0], beta[:, 0], static.S, static.use_kernels)
        static.g_sum.add_(g[:, 0])
        # Softmax branch: this token joins the chunk buffer at slot pos mod C, then attends to the kept chunks of its
        # decision head and to the chunk's tokens up to itself.
        qs = self.q_norm(q_s.view(b, 1, hs, self.attn_head_dim))
        ks = self.k_norm(k_s.view(b, 1, hs, self.attn_head_dim))
        if self.rotary is not None:
            qs, ks = (self.rotary.at_table(t, static.rope, rope_positions(pos)) for t in (qs, ks))
        vs = v.view(b, 1, hs, self.attn_head_v_dim)
        slot = torch.remainder(pos, c)  # 0-d, or [B]: each row's place in its own chunk
        if per_row:
            static.x_buf.scatter_(1, slot[:, None, None].expand(b, 1, self.hidden_size), x)
            static.k_buf.scatter_(2, slot[:, None, None, None].expand(b, hs, 1, self.attn_head_dim),
                                  ks.transpose(1, 2))
            static.v_buf.scatter_(2, slot[:, None, None, None].expand(b, hs, 1, self.attn_head_v_dim),
                                  vs.transpose(1, 2))
        else:
            at = slot.reshape(1)
            static.x_buf.index_copy_(1, at, x)
            static.k_buf.index_copy_(2, at, ks.transpose(1, 2))
            static.v_buf.index_copy_(2, at, vs.transpose(1, 2))
        kept_hs = static.n_kept.repeat_interleave(grp, 1)  # [B, Hs]
        if static.use_kernels:  # keys: the cache prefix [0, kept·C) and the chunk [cap, cap + slot]
            o_sa = decode_attention(qs[:, 0], static.kv_k, static.kv_v, kept_hs * c, static.buf_start,
                                    (slot + 1).reshape(-1, 1), self.attn_head_dim ** -0.5, static.num_splits)[:, None]
        else:
            cache_ok = static.cache_slot[None, None, :] < kept_hs[:, :, None]  # [B, Hs, cap]
            if per_row:
                buf_ok = (static.chunk_pos[None, :] <= slot[:, None])[:, None, :].expand(b, hs, c)
            else:
                buf_ok = (static.chunk_pos <= slot)[None, None, :].expand(b, hs, c)
            mask = torch.cat([cache_ok, buf_ok], -1)[:, :, None, :]  # [B, Hs, 1, cap + C]
            o_sa = F.scaled_dot_product_attention(qs.transpose(1, 2), static.kv_k, static.kv_v, attn_mask=mask,
                                                  scale=self.attn_head_dim ** -0.5).transpose(1, 2)
        y = self._fuse(x, q, o_gdn.reshape(b, 1, hs, self.attn_head_v_dim), o_sa, gate=gate[:, None], omega=omega)
        if chunk_end:
            self._finish_static_chunk(static, pos)
        return y

    def _finish_static_chunk(self, static: NatsLStaticState, pos: torch.Tensor) -> None:
        """The C-th token of a chunk arrived: type it, commit or roll back the GDN writes, keep or drop its K/V.
        pos [B] (per row): only in the rows where (pos + 1) % C == 0 (class docstring)."""
        b = static.x_buf.shape[0]
        c, hs, grp = self.chunk_size, self.num_attn_heads, self.group
        sel = self._chunk_softmax_types(static.x_buf, torch.div(pos, c, rounding_mode="floor"))  # [B, Hn]
        ends = torch.remainder(pos + 1, c) == 0 if pos.dim() == 1 else None  # [B]: rows completing a chunk
        if ends is not None:
            sel = sel & ends[:, None]  # the other rows: "GDN" (S kept as it is), nothing kept
        is_gdn = (~sel)[:, :, None, None]
        decay = torch.exp(static.g_sum)[:, :, None, None] if self.decay_uncommitted else 1.0
        static.S.copy_(torch.where(is_gdn, static.S, decay * static.S_start))
        if ends is None:
            static.S_start.copy_(static.S)
            static.g_sum.zero_()
        else:
            static.S_start.copy_(torch.where(ends[:, None, None, None], static.S, static.S_start))
            static.g_sum.masked_fill_(ends[:, None], 0.0)
        # slot n_kept, clamped into the spare slot: only an overflow (flagged) lands on a kept chunk
        slot = static.n_kept.clamp(max=static.capacity).repeat_interleave(grp, 1)  # [B, Hs]
        dest = slot[:, :, None] * c + static.chunk_pos  # [B, Hs, C]
        static.k_cache.scatter_(2, dest[..., None].expand(b, hs, c, self.attn_head_dim), static.k_buf)
        static.v_cache.scatter_(2, dest[..., None].expand(b, hs, c, self.attn_head_v_dim), static.v_buf)
        static.n_kept.add_(sel.long())
        static.overflow.logical_or_((static.n_kept > static.capacity).any())
