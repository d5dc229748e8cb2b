"""Static-buffer, one-token decode steps of every token mixer (the building blocks of `StaticDecoder`).

Each `Static*` class wraps one layer of a loaded model and owns preallocated state buffers sized by `max_length`:

    st = StaticSoftmax(layer, batch_size, max_length, device, dtype, use_kernels)
    st.load(eager_state)                        # copy the state of the layer's normal prefill into the buffers
    y = st.step(x [B, 1, hidden], pos, final)   # one token; pos: 0-d long device tensor (its position)

`step` reads and writes only the buffers, in place: no `.item()`, no host sync, no shape that depends on a tensor
value and no Python branch on one, so a whole-model step can be captured in a CUDA graph. The only host-side input is
`final` (NAtS-L: this token completes a chunk), which the host knows from the position it keeps itself.

Design decisions (named once, here):
- The layers themselves are reused for everything that is already graph-safe (projections, ShortConvolution with a
  state, norms, NAtS-L `_route` / `_fuse`); only the state handling is re-written against static buffers. The layers'
  weights must not change after the wrapper is built (SSM parameters and the fused kernels' constants are cached).
- RoPE takes its position from the device tensor (`rope_at`), with the same float64 angle math as `RotaryEmbedding`.
- Attention over the static K/V buffers: with `use_kernels`, the split-KV Triton kernel of `decode_attention.py`,
  which reads only the valid keys (lengths from device tensors) and spreads them over many programs; otherwise SDPA
  over the whole buffer with a boolean mask of the valid keys (cost of `max_length` keys whatever the length).
- NAtS-L compacted cache: slot j of decision head h holds that head's j-th softmax-typed chunk, filled slots are
  those with j < n_kept[b, h] (a device counter). At a chunk end the finished chunk is written, for every (row,
  head), at slot n_kept and n_kept is then increased only where the chunk is softmax-typed: a GDN-typed chunk's write
  lands in a slot that stays invalid and is overwritten by the next kept chunk. One spare slot makes that write always
  in range. The capacity (`natsl_cache_chunks`, default: every chunk of max_length) may be set lower, e.g. to an
  expected softmax fraction; keeping more chunks than that sets the device flag `overflow` (outputs are then not
  guaranteed). Both GDN outcomes (commit, decayed rollback) are computed and selected with `torch.where`.
- The chunk buffer of the current chunk lives behind the compacted cache in the same tensor ([cache | chunk]), so the
  attention of a step is one call over one buffer (two key ranges), without a per-step concatenation of the cache.
- NAtS-L routing at a chunk end: the layer's own router (`_route`), or its forced routing; a forced softmax fraction
  needs the chunk number, taken from the device position (`StaticNatsL._chunk_types`).
- Fused Triton steps (`ops/gated_delta/triton/decode.py`, `ops/interdomain/triton/decode.py`) are used when
  `use_kernels` (CUDA by default) and the state is float32 / complex64; otherwise the plain PyTorch math below, which
  is the token-by-token definition of the naive ops with T = 1.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from hybrid_attention.layers.gated_deltanet import GatedDeltaNet, GDNState, gdn_decay
from hybrid_attention.layers.interdomain import InterdomainAttention, InterdomainState
from hybrid_attention.layers.natsl import GDN, SOFTMAX, NatsLAttention, NatsLState
from hybrid_attention.layers.softmax import KVState, SoftmaxAttention
from hybrid_attention.modules import RotaryEmbedding
from hybrid_attention.ops.gated_delta.naive import l2norm
from hybrid_attention.ops.interdomain.naive import safe_divide
from hybrid_attention.ops.interdomain.readout import readout_product
from hybrid_attention.serving.decode_attention import decode_attention, default_num_splits


def rope_at(rotary: RotaryEmbedding, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """RoPE of x [B, 1, H, D] at the position held by the 0-d device tensor pos (same math as RotaryEmbedding)."""
    inv_freq = 1.0 / (rotary.theta ** (torch.arange(0, rotary.dim, 2, device=x.device, dtype=torch.float64)
                                       / rotary.dim))
    ang = pos.to(torch.float64).reshape(1, 1) * inv_freq[None, :]  # [1, D/2], float64 like the eager table
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(cdt)[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(cdt)[None, :, None, :]
    xf = x.to(cdt)
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


def gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     S: torch.Tensor, use_kernels: bool) -> torch.Tensor:
    """One gated-delta token: q, k [B, H, K]; v [B, H, V]; g, beta [B, H]; S [B, H, K, V] updated in place.
    Returns o [B, H, V] in v.dtype (scale K^-1/2, q/k ℓ2-normalised: the layers' settings)."""
    if use_kernels and S.dtype == torch.float32:
        from hybrid_attention.ops.gated_delta.triton.decode import triton_gated_delta_step

        o, _ = triton_gated_delta_step(q, k, v, g.float(), beta.float(), S)
        return o
    dt = S.dtype
    qn, kn = l2norm(q.to(dt)), l2norm(k.to(dt))
    S.mul_(g.to(dt).exp()[..., None, None])
    u = beta.to(dt)[..., None] * (v.to(dt) - torch.einsum("bhkv,bhk->bhv", S, kn))
    S.add_(kn[..., :, None] * u[..., None, :])
    return (q.shape[-1] ** -0.5 * torch.einsum("bhkv,bhk->bhv", S, qn)).to(v.dtype)


class _StaticConvs:
    """ShortConvolution states [B, channels, K-1] by branch name, advanced in place through the layer's convs.
    `.conv` (the same dict) lets the object stand in for an eager state in the layers' projection helpers."""

    def __init__(self, convs, batch_size: int, device, dtype) -> None:
        self.convs = convs
        self.state = {n: c.init_state(batch_size, device=device, dtype=dtype) for n, c in convs.items()}
        self.conv = self.state

    def load(self, conv: dict[str, torch.Tensor]) -> None:
        for n, buf in self.state.items():
            buf.copy_(conv[n])

    def commit(self, new_conv: dict[str, torch.Tensor]) -> None:
        for n, new in new_conv.items():
            self.state[n].copy_(new)

    def buffers(self) -> list[torch.Tensor]:
        return list(self.state.values())


class StaticMixer:
    """Common interface. `buffers()`: every static tensor; `small_buffers()`: those a step changes irreversibly
    (recurrent states, counters), snapshotted around CUDA-graph warm-up; the large caches are only written at the
    current cursor, which the real step overwrites before anything reads it."""

    def load(self, state, length: int) -> None:
        raise NotImplementedError

    def step(self, x: torch.Tensor, pos: torch.Tensor, final: bool) -> torch.Tensor:
        raise NotImplementedError

    def fill_random(self, length: int, generator: torch.Generator, **kwargs) -> None:
        raise NotImplementedError

    def buffers(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def small_buffers(self) -> list[torch.Tensor]:
        return self.buffers()


class StaticSoftmax(StaticMixer):
    """K/V buffers [B, H, max_length, d] (RoPE already applied to K); position p holds token p."""

    def __init__(self, layer: SoftmaxAttention, batch_size: int, max_length: int, device, dtype,
                 use_kernels: bool) -> None:
        self.layer, self.max_length, self.use_kernels = layer, max_length, use_kernels
        shape = (batch_size, layer.num_heads, max_length, layer.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.key_pos = torch.arange(max_length, device=device)
        self.zero = torch.zeros(1, 1, dtype=torch.long, device=device)  # the unused second key range
        self.num_splits = default_num_splits(torch.device(device), batch_size * layer.num_heads, max_length)

    def load(self, state: KVState, length: int) -> None:
        self.k[:, :, :length].copy_(state.k.transpose(1, 2))
        self.v[:, :, :length].copy_(state.v.transpose(1, 2))

    def fill_random(self, length: int, generator: torch.Generator, **kwargs) -> None:
        self.k[:, :, :length].normal_(generator=generator)
        self.v[:, :, :length].normal_(generator=generator)

    def step(self, x: torch.Tensor, pos: torch.Tensor, final: bool) -> torch.Tensor:
        m, b = self.layer, x.shape[0]
        q = m.q_proj(x).view(b, 1, m.num_heads, m.head_dim)
        k = m.k_proj(x).view(b, 1, m.num_heads, m.head_dim)
        v = m.v_proj(x).view(b, 1, m.num_heads, m.head_dim)
        if m.rotary is not None:
            q, k = rope_at(m.rotary, q, pos), rope_at(m.rotary, k, pos)
        at = pos.reshape(1)
        self.k.index_copy_(2, at, k.transpose(1, 2).to(self.k.dtype))
        self.v.index_copy_(2, at, v.transpose(1, 2).to(self.v.dtype))
        if self.use_kernels:  # keys 0..pos
            o = decode_attention(q[:, 0], self.k, self.v, (pos + 1).reshape(1, 1), self.zero, self.zero,
                                 m.head_dim ** -0.5, self.num_splits)
        else:
            mask = (self.key_pos <= pos)[None, None, None, :]  # [1, 1, 1, L]: keys 0..pos
            o = F.scaled_dot_product_attention(q.transpose(1, 2), self.k, self.v, attn_mask=mask)[:, :, 0]
        return m.o_proj(o.reshape(b, 1, -1))

    def buffers(self) -> list[torch.Tensor]:
        return [self.k, self.v]

    def small_buffers(self) -> list[torch.Tensor]:
        return []


class StaticGDN(StaticMixer):
    """GDN state S [B, H, d_k, d_v] (float32, float64 for float64 models) and the q/k/v ShortConv states."""

    def __init__(self, layer: GatedDeltaNet, batch_size: int, max_length: int, device, dtype,
                 use_kernels: bool) -> None:
        self.layer, self.use_kernels = layer, use_kernels
        st = layer.init_state(batch_size, device=device, dtype=dtype)
        self.S = st.S
        self.convs = _StaticConvs(layer.convs, batch_size, device, dtype)

    def load(self, state: GDNState, length: int) -> None:
        self.S.copy_(state.S)
        self.convs.load(state.conv)

    def fill_random(self, length: int, generator: torch.Generator, **kwargs) -> None:
        self.S.normal_(std=0.1, generator=generator)
        for buf in self.convs.buffers():
            buf.normal_(generator=generator)

    def step(self, x: torch.Tensor, pos: torch.Tensor, final: bool) -> torch.Tensor:
        m, b = self.layer, x.shape[0]
        z = {}
        new_conv = {}
        for name, proj in (("q", m.q_proj), ("k", m.k_proj), ("v", m.v_proj)):
            z[name], new_conv[name] = m.convs[name](proj(x), self.convs.state[name], True)
        self.convs.commit(new_conv)
        beta = torch.sigmoid(m.b_proj(x).float() if x.dtype != torch.float64 else m.b_proj(x))
        g = gdn_decay(m.a_proj(x), m.A_log, m.dt_bias)
        o = gated_delta_step(z["q"].view(b, m.num_heads, m.head_dim), z["k"].view(b, m.num_heads, m.head_dim),
                             z["v"].view(b, m.num_heads, m.head_v_dim), g[:, 0], beta[:, 0], self.S,
                             self.use_kernels)
        o = m.o_norm(o.view(b, 1, m.num_heads, m.head_v_dim))
        if m.g_proj is not None:
            o = o * F.silu(m.g_proj(x).view(b, 1, m.num_heads, m.head_v_dim))
        return m.o_proj(o.reshape(b, 1, -1))

    def buffers(self) -> list[torch.Tensor]:
        return [self.S, *self.convs.buffers()]


class StaticInterdomain(StaticMixer):
    """Interdomain Attention and the S4D-only control: complex S4D state [B, H, M, R+D(+1)] and ShortConv states."""

    def __init__(self, layer: InterdomainAttention, batch_size: int, max_length: int, device, dtype,
                 use_kernels: bool) -> None:
        self.layer = layer
        st = layer.init_state(batch_size, device=device, dtype=dtype)
        self.ssm = st.ssm
        self.convs = _StaticConvs(layer.convs, batch_size, device, dtype)
        core = layer.ssm
        if core.log_dt.dtype not in (torch.float32, torch.float64):
            # bf16 / fp16 weights: complex tensors need float32 parts, so discretise a float32 copy of the (small)
            # S4D parameters; the state is complex64 for these models anyway (InterdomainAttention.init_state).
            core = copy.deepcopy(core).float()
        with torch.no_grad():  # the discretised SSM parameters, computed once (weights are frozen while serving)
            log_lam, b_bar, c = core()
            cdt = self.ssm.dtype
            self.lam, self.b_bar, self.c = torch.exp(log_lam.to(cdt)), b_bar.to(cdt), c.to(cdt)
        # The fused kernel covers the query readout with a complex64 state; S4D (no query) uses the PyTorch math.
        self.use_kernel = use_kernels and layer.query_readout and self.ssm.dtype == torch.complex64
        if self.use_kernel:
            from hybrid_attention.ops.interdomain.triton.decode import decode_params

            self.params = decode_params(log_lam, b_bar, c, layer.readout)

    def load(self, state: InterdomainState, length: int) -> None:
        self.ssm.copy_(state.ssm)
        self.convs.load(state.conv)

    def fill_random(self, length: int, generator: torch.Generator, **kwargs) -> None:
        self.ssm.normal_(std=0.1, generator=generator)
        for buf in self.convs.buffers():
            buf.normal_(generator=generator)

    def _core(self, q: torch.Tensor | None, key: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
        """One token of the S4D core on [B, H, R] / [B, H, D] inputs; the state is updated in place. -> [B, H, D]."""
        m = self.layer
        if self.use_kernel:
            from hybrid_attention.ops.interdomain.triton.decode import interdomain_decode_step

            o, _ = interdomain_decode_step(q, key, val, None, None, None, self.ssm, denominator=m.denominator,
                                           params=self.params)
            return o
        r, d = key.shape[-1], val.shape[-1]
        rdt = torch.float64 if self.ssm.dtype == torch.complex128 else torch.float32
        parts = [key, val] + ([torch.ones_like(val[..., :1])] if m.denominator else [])
        z = torch.cat([p.to(rdt) for p in parts], -1).to(self.ssm.dtype)  # [B, H, R+D(+1)]
        self.ssm.mul_(self.lam[None, :, :, None]).add_(self.b_bar[None, :, :, None] * z[:, :, None, :])
        y = torch.einsum("hmn,bhnc->bhmc", self.c, self.ssm)
        if m.contraction == "linear":  # S4D-only control: Re(wᵀ C X) over all R+D channels
            return torch.einsum("hm,bhmc->bhc", m.contraction_w.to(y.real.dtype).to(y.dtype), y).real
        u, gam = y[..., :r], y[..., r:]
        if q is None:  # bilinear S4D mixer: Re(diag(Uᵀ Γ))
            return (u * gam).sum(-2).real
        o = readout_product(u, q.to(rdt).to(self.ssm.dtype), gam, m.readout)  # [B, H, D(+1)]
        return safe_divide(o[..., :d], o[..., d:]) if m.denominator else o

    def step(self, x: torch.Tensor, pos: torch.Tensor, final: bool) -> torch.Tensor:
        m, b = self.layer, x.shape[0]
        new_conv: dict[str, torch.Tensor] = {}
        key = m._branch(m.key_name, x, self.convs, new_conv, True)
        q = m._branch("q", x, self.convs, new_conv, True) if m.query_readout else None
        if m.rotary is not None:
            key = rope_at(m.rotary, key, pos)
            q = rope_at(m.rotary, q, pos) if q is not None else None
        if m.dual_input:
            key = m._feature_map(key)
        key, val = m._input_gain(m.key_norm(key), m.value_norm(m._branch(m.val_name, x, self.convs, new_conv, True)))
        self.convs.commit(new_conv)
        if q is not None:
            q = m._feature_map(q)[:, 0]
        o = self._core(q, key[:, 0], val[:, 0]).to(x.dtype)
        return m._output(o.view(b, 1, *o.shape[1:]), x)

    def buffers(self) -> list[torch.Tensor]:
        return [self.ssm, *self.convs.buffers()]


class StaticNatsL(StaticMixer):
    """NAtS-L: compacted softmax K/V with the current chunk behind it, GDN state and chunk-start copy, Σg, routing
    inputs of the current chunk, per-(row, decision head) kept-chunk counts. See the module docstring."""

    def __init__(self, layer: NatsLAttention, batch_size: int, max_length: int, device, dtype,
                 use_kernels: bool, cache_chunks: int | None = None) -> None:
        self.layer, self.use_kernels = layer, use_kernels
        c, hs, b = layer.chunk_size, layer.num_attn_heads, batch_size
        # Capacity: kept chunks per (row, decision head); all complete chunks of max_length by default. A smaller
        # capacity (an expected softmax fraction) shortens every step's attention; exceeding it sets `overflow`.
        self.capacity = max_length // c if cache_chunks is None else cache_chunks
        self.slots = self.capacity + 1  # + 1: the always-in-range write of a GDN-typed chunk (module docstring)
        self.cap = self.slots * c
        # [B, Hs, cap + C, d]: compacted cache (cap positions) | current chunk (C positions, slot p mod C)
        self.kv_k = torch.zeros(b, hs, self.cap + c, layer.attn_head_dim, device=device, dtype=dtype)
        self.kv_v = torch.zeros(b, hs, self.cap + c, layer.attn_head_v_dim, device=device, dtype=dtype)
        self.k_cache, self.k_buf = self.kv_k[:, :, :self.cap], self.kv_k[:, :, self.cap:]
        self.v_cache, self.v_buf = self.kv_v[:, :, :self.cap], self.kv_v[:, :, self.cap:]
        self.x_buf = torch.zeros(b, c, layer.hidden_size, device=device, dtype=dtype)
        st = layer.init_state(b, device=device, dtype=dtype)
        self.S, self.S_start, self.g_sum = st.S, st.S.clone(), st.g_sum
        self.n_kept = torch.zeros(b, layer.num_heads, dtype=torch.long, device=device)
        self.overflow = torch.zeros((), dtype=torch.bool, device=device)  # more than `capacity` chunks were kept
        self.convs = _StaticConvs(layer.convs, b, device, dtype)
        self.cache_slot = torch.arange(self.cap, device=device) // c  # [cap]: slot of each cache position
        self.buf_pos = torch.arange(c, device=device)
        self.chunk_pos = torch.arange(c, device=device)
        self.buf_start = torch.full((1, 1), self.cap, dtype=torch.long, device=device)
        self.num_splits = default_num_splits(torch.device(device), b * hs, self.cap + c)

    def load(self, state: NatsLState, length: int) -> None:
        sc, lb = state.k_cache.shape[2], state.x_buf.shape[1]
        if int(state.n_kept.max()) > self.capacity:
            raise ValueError(f"the prompt's NAtS-L layer kept {int(state.n_kept.max())} chunks in a row / head, more "
                             f"than natsl_cache_chunks={self.capacity}")
        sc = min(sc, self.cap)  # the eager cache may have grown past the largest count (slots beyond it are unused)
        self.k_cache[:, :, :sc].copy_(state.k_cache)
        self.v_cache[:, :, :sc].copy_(state.v_cache)
        self.k_buf[:, :, :lb].copy_(state.k_buf.transpose(1, 2))
        self.v_buf[:, :, :lb].copy_(state.v_buf.transpose(1, 2))
        self.x_buf[:, :lb].copy_(state.x_buf)
        self.S.copy_(state.S)
        self.S_start.copy_(state.S_start)
        self.g_sum.copy_(state.g_sum)
        self.n_kept.copy_(state.n_kept)
        self.overflow.zero_()
        self.convs.load(state.conv)

    def fill_random(self, length: int, generator: torch.Generator, softmax_fraction: float = 0.5,
                    **kwargs) -> None:
        """Timing fill: random K/V and states; every (row, head) keeps round(fraction · complete chunks) chunks."""
        c = self.layer.chunk_size
        kept = round(softmax_fraction * (length // c))
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
        for buf in self.convs.buffers():
            buf.normal_(generator=generator)

    def step(self, x: torch.Tensor, pos: torch.Tensor, final: bool) -> torch.Tensor:
        m, b = self.layer, x.shape[0]
        c, hl, hs, grp = m.chunk_size, m.num_heads, m.num_attn_heads, m.group
        q, k, v, beta, g, new_conv = m._project(x, self.convs, True)
        self.convs.commit(new_conv)
        # GDN branch: every token sees the pseudo-updated state; Σg feeds the decayed rollback at the chunk end.
        o_gdn = gated_delta_step(q.view(b, hl, m.head_dim), k.view(b, hl, m.head_dim), v.view(b, hl, m.head_v_dim),
                                 g[:, 0], beta[:, 0], self.S, self.use_kernels)
        self.g_sum.add_(g[:, 0])
        # Softmax branch: this token joins the chunk buffer at slot pos mod C, then attends to the kept chunks of its
        # decision head and to the chunk's tokens up to itself.
        qs = m.q_norm(q.view(b, 1, hs, m.attn_head_dim))
        ks = m.k_norm(k.view(b, 1, hs, m.attn_head_dim))
        if m.rotary is not None:
            qs, ks = rope_at(m.rotary, qs, pos), rope_at(m.rotary, ks, pos)
        vs = v.view(b, 1, hs, m.attn_head_v_dim)
        slot = torch.remainder(pos, c)
        at = slot.reshape(1)
        self.x_buf.index_copy_(1, at, x)
        self.k_buf.index_copy_(2, at, ks.transpose(1, 2))
        self.v_buf.index_copy_(2, at, vs.transpose(1, 2))
        kept_hs = self.n_kept.repeat_interleave(grp, 1)  # [B, Hs]
        if self.use_kernels:  # keys: the cache prefix [0, kept·C) and the chunk [cap, cap + slot]
            o_sa = decode_attention(qs[:, 0], self.kv_k, self.kv_v, kept_hs * c, self.buf_start,
                                    (slot + 1).reshape(1, 1), m.attn_head_dim ** -0.5, self.num_splits)[:, None]
        else:
            cache_ok = self.cache_slot[None, None, :] < kept_hs[:, :, None]  # [B, Hs, cap]
            buf_ok = (self.buf_pos <= slot)[None, None, :].expand(b, hs, c)
            mask = torch.cat([cache_ok, buf_ok], -1)[:, :, None, :]  # [B, Hs, 1, cap + C]
            o_sa = F.scaled_dot_product_attention(qs.transpose(1, 2), self.kv_k, self.kv_v, attn_mask=mask,
                                                  scale=m.attn_head_dim ** -0.5).transpose(1, 2)
        y = m._fuse(x, q, o_gdn.reshape(b, 1, hs, m.attn_head_v_dim), o_sa)
        if final:
            self._finish_chunk(b, pos)
        return y

    def _chunk_types(self, b: int, pos: torch.Tensor) -> torch.Tensor:
        """One-hot types [B, Hn, 2] of the chunk that ends at position pos: the layer's router, or its forced
        routing. A forced softmax fraction depends on the chunk number, which is computed here from the device
        position (the layer's `_forced_routing` takes it as a Python int)."""
        m = self.layer
        fr = m.force_routing
        if isinstance(fr, (int, float)) and not isinstance(fr, bool):
            if not 0.0 <= fr <= 1.0:
                raise ValueError(f"force_routing must be None, 'softmax', 'gdn' or a fraction in [0, 1], got {fr!r}")
            n = torch.div(pos, m.chunk_size, rounding_mode="floor").to(torch.float64)  # chunk number
            sel = (torch.floor((n + 1) * fr) > torch.floor(n * fr)).expand(b, m.num_heads)  # the layer's rule
            dt = torch.float64 if self.S.dtype == torch.float64 else torch.float32
            return F.one_hot(torch.where(sel, SOFTMAX, GDN), 2).to(dt)
        return m._route(self.x_buf[:, None])[0][:, 0]

    def _finish_chunk(self, b: int, pos: torch.Tensor) -> None:
        """The C-th token of a chunk arrived: type it, commit or roll back the GDN writes, keep or drop its K/V."""
        m = self.layer
        c, hs, grp = m.chunk_size, m.num_attn_heads, m.group
        hard = self._chunk_types(b, pos)  # [B, Hn, 2]
        is_gdn = hard[..., GDN].bool()[:, :, None, None]
        decay = torch.exp(self.g_sum)[:, :, None, None] if m.decay_uncommitted else 1.0
        self.S.copy_(torch.where(is_gdn, self.S, decay * self.S_start))
        self.S_start.copy_(self.S)
        self.g_sum.zero_()
        # slot n_kept, clamped into the spare slot: only an overflow (flagged) lands on a kept chunk
        slot = self.n_kept.clamp(max=self.capacity).repeat_interleave(grp, 1)  # [B, Hs]
        dest = slot[:, :, None] * c + self.chunk_pos  # [B, Hs, C]
        self.k_cache.scatter_(2, dest[..., None].expand(b, hs, c, m.attn_head_dim), self.k_buf)
        self.v_cache.scatter_(2, dest[..., None].expand(b, hs, c, m.attn_head_v_dim), self.v_buf)
        self.n_kept.add_(hard[..., SOFTMAX].long())
        self.overflow.logical_or_((self.n_kept > self.capacity).any())

    def buffers(self) -> list[torch.Tensor]:
        return [self.kv_k, self.kv_v, self.x_buf, self.S, self.S_start, self.g_sum, self.n_kept, self.overflow,
                *self.convs.buffers()]

    def small_buffers(self) -> list[torch.Tensor]:
        return [self.S, self.S_start, self.g_sum, self.n_kept, self.overflow, *self.convs.buffers()]


# Mixer class -> static wrapper. S4DMixer is an InterdomainAttention subclass (query_readout=False).
STATIC_MIXERS: dict[type, type[StaticMixer]] = {
    SoftmaxAttention: StaticSoftmax,
    GatedDeltaNet: StaticGDN,
    InterdomainAttention: StaticInterdomain,
    NatsLAttention: StaticNatsL,
}


def static_mixer_for(layer, batch_size: int, max_length: int, device, dtype, use_kernels: bool,
                     natsl_cache_chunks: int | None = None) -> StaticMixer:
    """The static wrapper of one layer; ValueError for a mixer class without one."""
    if isinstance(layer, NatsLAttention):
        return StaticNatsL(layer, batch_size, max_length, device, dtype, use_kernels, natsl_cache_chunks)
    for cls, wrapper in STATIC_MIXERS.items():
        if isinstance(layer, cls):
            return wrapper(layer, batch_size, max_length, device, dtype, use_kernels)
    allowed = sorted(c.__name__ for c in STATIC_MIXERS)
    raise ValueError(f"mixer type {type(layer).__name__} has no static decode step; allowed mixer classes: {allowed} "
                     f"(config.layers names: softmax, gdn, interdomain, s4d, natsl)")
