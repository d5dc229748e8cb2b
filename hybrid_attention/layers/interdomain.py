"""Interdomain Attention (arXiv 2605.24330, §2.2), its ablations and the S4D-only controls, all on one S4D core per
head (`S4DCoreMixer`)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_attention.layers.base import (
    StaticState,
    TokenMixer,
    check_hidden,
    copy_conv_states,
    left_pad,
    packed_positions,
    rope_positions,
    row_positions,
)
from hybrid_attention.modules import (
    FusedInputs,
    HeadRMSNorm,
    RotaryEmbedding,
    S4DCore,
    ShortConvolution,
    fuse_inputs,
    l2_normalize,
)
from hybrid_attention.ops.common.backend import resolve_use_kernels
from hybrid_attention.ops.interdomain import interdomain
from hybrid_attention.ops.interdomain.naive import safe_divide
from hybrid_attention.ops.interdomain.readout import DEFAULT_READOUT, readout_product, validate_readout
from hybrid_attention.ops.interdomain.triton import HAS_TRITON
from hybrid_attention.ops.s4d import s4d
from hybrid_attention.ops.s4d_bilinear import s4d_bilinear

if HAS_TRITON:
    from hybrid_attention.ops.interdomain.triton.decode import decode_params, interdomain_decode_op

# ε of the ℓ2 norm inside ξ (the paper does not give it; fla's l2norm uses the same value).
FEATURE_EPS = 1e-6

CONTRACTIONS = ("linear", "bilinear")


@dataclass
class InterdomainState:
    """Decode state of one Interdomain / S4D layer.

    ssm: [B, H, M, R+D(+1)] complex raw S4D state X (before C); conv: last K-1 inputs of each ShortConv, by branch
    name ("q", "k", "a", "b"), [B, channels, K-1]; offset: tokens seen so far (the RoPE position of the next token);
    pad [B] (int64) or None: after a left-padded prefill, row b's next position is offset - pad[b].
    """

    ssm: torch.Tensor
    conv: dict[str, torch.Tensor] = field(default_factory=dict)
    offset: int = 0
    pad: torch.Tensor | None = None


@dataclass
class InterdomainStaticState(StaticState):
    """Static decode buffers of one Interdomain / S4D layer: ssm [B, H, M, R+D(+1)] complex (InterdomainState), conv
    by branch name; the discretised S4D parameters λ = exp(log λ), B̄ [H, M] and C [H, M, M] in the state's complex
    dtype (computed once: the weights are frozen while serving); kernel_params: `decode_params` of the fused Triton
    step, or None when it is not used (it covers the query readout with a complex64 state); ssm_real: the fused
    step's view of ssm as float32 [..., 2] (`torch.view_as_real`, same storage: the registered op mutates a real
    tensor, see ops/interdomain/triton/decode.decode_params). inputs: the step's branch projections (in `proj` order;
    the convolved branches lead it) and their convolutions fused (modules/fused_linear.py); conv holds views of its
    conv state."""

    ssm: torch.Tensor
    conv: dict[str, torch.Tensor]
    lam: torch.Tensor
    b_bar: torch.Tensor
    c: torch.Tensor
    kernel_params: tuple | None = None
    ssm_real: torch.Tensor | None = None
    rope: torch.Tensor | None = None  # [max_len, 2, head_dim]: the RoPE table (`RotaryEmbedding.table`) or None
    inputs: FusedInputs | None = None

    def buffers(self) -> list[torch.Tensor]:
        return [self.ssm, *self.conv.values()]

    def fill_random(self, length: int, generator: torch.Generator, softmax_fraction: float = 0.5) -> None:
        self.ssm.normal_(std=0.1, generator=generator)
        for buf in self.conv.values():
            buf.normal_(generator=generator)


class S4DCoreMixer(TokenMixer):
    """A token mixer on one complex diagonal S4D core per head (``S4DCore``), the base of Interdomain Attention and
    of the S4D-only controls. x [B, T, hidden] -> y [B, T, hidden].

    It holds what they share: the branch projections and short convolutions, the key / value RMSNorms with biases,
    the core's parameters and input gain, the read of the state (the query readout, or the linear / bilinear
    contraction), the output map, and the eager, packed and static decode paths (arguments: ``__init__``).
    State size: 2·H·M·(R+d_h) real numbers per sequence, independent of the sequence length. A packed prefill's
    per-document states are the rows of the batched state (positions per row in ``InterdomainState.pad``).
    """

    packed_states = True

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int | None = None,
        state_size: int = 64,
        conv_size: int = 4,
        rope: bool = True,
        rope_theta: float = 10000.0,
        query_readout: bool = True,
        dual_input: bool = True,
        denominator: bool = False,
        readout: str = DEFAULT_READOUT,
        contraction: str = "linear",
        output_gate: bool = False,
        chunk_size: int = 64,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        norm_eps: float = 1e-6,
        backend: str = "auto",
        conv_backend: str = "auto",
    ) -> None:
        """Build the branches, the S4D core and the read of the state; the defaults give the full layer.

        Args:
            hidden_size: d, the width of x [B, T, d] and y [B, T, d].
            num_heads: H, the number of heads (one S4D core each).
            head_dim: d_h = R, the width of a head (default hidden_size // num_heads).
            state_size: M, the complex state dimension of each head's S4D core.
            conv_size: kernel width of the causal depthwise short convolutions.
            rope: RoPE on q and on the key half (k, or a with generic inputs).
            rope_theta: RoPE base.
            query_readout: read the state through the query (False: no W_Q, read by ``contraction``).
            dual_input: inputs k, v with ξ on k (False: generic inputs [a; b] = [W_a x; W_b x], each with its
                ShortConv and its N+b norm, no ξ on a).
            denominator: divide by the normaliser read(ξ(q), U, η), the ideal Nadaraya–Watson readout; needs
                query_readout. On the GPU the quotient amplifies the Triton op's tf32 rounding: with the hermitian /
                real readouts o is within ~1e-2 of float64 and some gradients ~2e-2 (H200, T = 1000; transpose
                ~1e-3; without the denominator ≤ 4.3e-3).
            readout: the complex-to-real product of the query readout, "transpose" Re(ξ(q)ᵀUᵀΓ), "hermitian"
                Re(ξ(q)ᵀU^HΓ) or "real" Re(Uξ(q))ᵀRe(Γ) (``ops/interdomain/readout.py`` decides the default).
            contraction: the read without a query, "linear" (the paper's control): y_t = Re(w_hᵀ C_h X_t) ∈
                R^{R+d_h} per head with a learned w_h ∈ R^M (+H·M parameters), then one output map R^{H(R+d_h)} → R^d
                standing for C_out and W_O together (``ops.s4d``, an FFT convolution: linear in the input); or
                "bilinear": Re(diag(UᵀΓ)) per head, an H3-style product of the two filtered halves, then C_out ∈
                R^{d×d} and W_O (``ops.s4d_bilinear``).
            output_gate: gate the heads' output, σ(W_g x) ⊙ o.
            chunk_size: chunk length of the chunk-parallel op.
            dt_min: lower end of the S4D step sizes' log-uniform initialisation.
            dt_max: upper end of the S4D step sizes' log-uniform initialisation.
            norm_eps: epsilon of the key / value RMSNorms.
            backend: form of the op, one of the backends of ``ops.interdomain`` (query readout), ``ops.s4d``
                (linear contraction) or ``ops.s4d_bilinear`` ("auto", "reference", "naive", "triton", ...).
            conv_backend: form of the short convolutions on the branches (``ShortConvolution``'s backend): "auto"
                (default: "triton" for CUDA inputs, else "reference"), "reference", "triton" (``ops/causal_conv``)
                or "fla" (fla's kernel, optional).
        """
        super().__init__()
        if denominator and not query_readout:
            raise ValueError("denominator=True needs query_readout=True (η is read through the query)")
        validate_readout(readout)
        if contraction not in CONTRACTIONS:
            raise ValueError(f"contraction must be one of {', '.join(CONTRACTIONS)}, got {contraction!r}")
        head_dim = head_dim or hidden_size // num_heads
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, head_dim
        self.feature_dim = head_dim  # R = d_h: ξ acts elementwise
        self.state_dim = state_size  # M
        self.query_readout, self.dual_input = query_readout, dual_input
        self.denominator, self.output_gate = denominator, output_gate
        self.readout = readout  # used by the query readout only
        self.contraction = None if query_readout else contraction  # used without a query only
        self.chunk_size, self.backend = chunk_size, backend
        inner = num_heads * head_dim
        key, val = ("k", "v") if dual_input else ("a", "b")
        self.key_name, self.val_name = key, val

        self.proj = nn.ModuleDict()
        self.convs = nn.ModuleDict()
        if query_readout:
            self.proj["q"] = nn.Linear(hidden_size, inner, bias=False)
            self.convs["q"] = ShortConvolution(inner, conv_size, backend=conv_backend)
        self.proj[key] = nn.Linear(hidden_size, inner, bias=False)
        self.proj[val] = nn.Linear(hidden_size, inner, bias=False)
        self.convs[key] = ShortConvolution(inner, conv_size, backend=conv_backend)
        if not dual_input:  # generic inputs: both halves are convolved (Fig. 3c/d); v is not in the full layer
            self.convs[val] = ShortConvolution(inner, conv_size, backend=conv_backend)
        self.key_norm = HeadRMSNorm(num_heads, head_dim, eps=norm_eps, bias=True)
        self.value_norm = HeadRMSNorm(num_heads, head_dim, eps=norm_eps, bias=True)
        self.ssm = S4DCore(num_heads, state_size, channels=2 * head_dim, dt_min=dt_min, dt_max=dt_max)
        linear = self.contraction == "linear"
        # linear contraction: w_h ∈ R^M per head, y = Re(w_hᵀ C_h X) ∈ R^{2 d_h}; N(0, 1/M) keeps y at the state's scale
        self.contraction_w = nn.Parameter(torch.randn(num_heads, state_size) / state_size**0.5) if linear else None
        self.c_out = nn.Linear(inner, inner, bias=False) if self.contraction == "bilinear" else None
        out_width = 2 * inner if linear else inner  # [y^k; y^v] per head with the linear contraction
        self.g_proj = nn.Linear(hidden_size, out_width, bias=False) if output_gate else None
        self.o_proj = nn.Linear(out_width, hidden_size, bias=False)
        self.rotary = RotaryEmbedding(head_dim, rope_theta) if rope else None

    # ----------------------------------------------------------------------------------------------------------------
    def _channels(self) -> int:
        return self.feature_dim + self.head_dim + (1 if self.denominator else 0)

    def init_state(self, batch_size: int, device=None, dtype=None) -> InterdomainState:
        dtype = dtype or self.o_proj.weight.dtype
        cdtype = torch.complex128 if dtype == torch.float64 else torch.complex64
        ssm = torch.zeros(batch_size, self.num_heads, self.state_dim, self._channels(), device=device, dtype=cdtype)
        conv = {name: c.init_state(batch_size, device=device, dtype=dtype) for name, c in self.convs.items()}
        return InterdomainState(ssm=ssm, conv=conv, offset=0)

    def state_size(self, seq_len: int) -> int:
        """2·H·M·(R+d_h) real numbers (complex state counted as 2 reals; conv buffers of K-1 tokens excluded)."""
        return 2 * self.num_heads * self.state_dim * (self.feature_dim + self.head_dim)

    def _branch(self, name: str, x: torch.Tensor, state: InterdomainState | None, new_conv: dict, keep: bool,
                cu_seqlens: torch.Tensor | None = None):
        """Projection (+ ShortConv if the branch has one, restarting at each packed document), split into heads:
        [B, T, H, d_h]. The branches keep one product each: one fused product of the three (``project_inputs``, as the
        GDN, NAtS-L and softmax layers run) made the compiled `small` interdomain and s4d steps slower
        (benchmarks/README.md, the fused input projections rows)."""
        z = self.proj[name](x)
        if name in self.convs:
            z, new_conv[name] = self.convs[name](z, state.conv.get(name) if state else None, output_final_state=keep,
                                                 cu_seqlens=cu_seqlens)
            # the eager convolution returns a transposed view ([B, D, T] storage): one copy here, so that the
            # elementwise glue after it (RoPE, ξ, norms) and its gradients share one layout instead of running
            # strided (the CPU training step, benchmarks/README.md)
            z = z.contiguous()
        return z.view(*x.shape[:2], self.num_heads, self.head_dim)

    def _rope(self, z: torch.Tensor, offset: int, pos: torch.Tensor | None = None) -> torch.Tensor:
        """RoPE at positions offset.., or at the positions pos when given ([T]: packed documents, [B, T]: per row)."""
        if self.rotary is None:
            return z
        return self.rotary(z, offset) if pos is None else self.rotary.at(z, pos)

    @staticmethod
    def _feature_map(z: torch.Tensor) -> torch.Tensor:
        """ξ = SiLU then ℓ2 per head (Eq. 10: ℓ2 norm, not squared)."""
        return l2_normalize(F.silu(z), FEATURE_EPS)

    def _input_gain(self, key: torch.Tensor, val: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z = B ⊙ [k̃; ṽ]: the per-channel input gain of the S4D core on [..., R] / [..., D] inputs."""
        g = self.ssm.input_gain().to(key.dtype)
        return key * g[: self.feature_dim], val * g[self.feature_dim :]

    def _ssm_params(self) -> tuple:
        """(log λ, B̄, C) for the core op as ``Planar`` (real, imaginary) pairs, which every core op takes (no complex
        op in the compiled training graph: inductor runs every complex op as an unfused eager kernel)."""
        return self.ssm.planar()

    def _core(self, q, key, val, log_lam, b_bar, c, init, keep: bool, cu_seqlens: torch.Tensor | None = None):
        """The S4D core and its readout on [B, T, H, *] inputs -> (o [B, T, H, D or R+D], final state)."""
        kw = dict(initial_state=init, output_final_state=keep, chunk_size=self.chunk_size, backend=self.backend,
                  cu_seqlens=cu_seqlens)
        if self.query_readout:
            return interdomain(q, key, val, log_lam, b_bar, c, denominator=self.denominator, readout=self.readout, **kw)
        if self.contraction == "linear":
            return s4d(key, val, log_lam, b_bar, c, self.contraction_w, **kw)
        return s4d_bilinear(key, val, log_lam, b_bar, c, **kw)

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """[B, T, H, *] core output -> [B, T, hidden]: C_out (bilinear contraction), the optional gate, W_O."""
        o = o.reshape(*x.shape[:2], -1)
        if self.c_out is not None:
            o = self.c_out(o)
        if self.g_proj is not None:
            o = torch.sigmoid(self.g_proj(x)) * o  # σ gate as written in the paper's equation (off by default)
        return self.o_proj(o)

    def forward(self, x: torch.Tensor, state: InterdomainState | None = None, *, output_state: bool | None = None,
                cu_seqlens: torch.Tensor | None = None):
        check_hidden(x, self.hidden_size)
        keep = output_state if output_state is not None else state is not None
        offset = state.offset if state is not None else 0
        pad = state.pad if state is not None else None
        if cu_seqlens is None:
            pos = row_positions(offset, pad, x.shape[1], x.device)
        else:
            pos = packed_positions(x, state, keep, cu_seqlens, type(self).__name__, packed_states=True)
        new_conv: dict[str, torch.Tensor] = {}
        cu = cu_seqlens

        key = self._rope(self._branch(self.key_name, x, state, new_conv, keep, cu), offset, pos)
        if self.dual_input:
            key = self._feature_map(key)
        key, val = self._input_gain(self.key_norm(key), self.value_norm(self._branch(self.val_name, x, state, new_conv,
                                                                                      keep, cu)))
        q = self._feature_map(self._rope(self._branch("q", x, state, new_conv, keep, cu), offset, pos)) \
            if self.query_readout else None
        o, ssm = self._core(q, key, val, *self._ssm_params(), state.ssm if state is not None else None, keep, cu)
        y = self._output(o, x)
        offset = offset + x.shape[1]
        if keep and cu_seqlens is not None:  # row b = document b, right-aligned in the longest one's width
            offset, pad = left_pad(cu_seqlens)
        new_state = InterdomainState(ssm=ssm, conv=new_conv, offset=offset, pad=pad) if keep else None
        return y, new_state

    # ---------------------------------------------------------------------------------------------------- static
    def init_static_state(self, batch_size: int, max_len: int, device=None, dtype=None, *,
                          use_kernels: bool | None = None, cache_chunks: int | None = None) -> InterdomainStaticState:
        st = self.init_state(batch_size, device=device, dtype=dtype)
        core = self.ssm
        if core.log_dt.dtype not in (torch.float32, torch.float64):
            # bf16 / fp16 weights: complex tensors need float32 parts, so discretise a float32 copy of the (small)
            # S4D parameters; the state is complex64 for these models anyway (init_state).
            core = copy.deepcopy(core).float()
        with torch.no_grad():
            log_lam, b_bar, c = core()
            cdt = st.ssm.dtype
            names = list(self.proj)
            conv_names = [n for n in names if n in self.convs]
            if names[:len(conv_names)] != conv_names:
                raise AssertionError(f"convolved branches {conv_names} must lead the projections {names}")
            inputs, views = fuse_inputs([self.proj[n] for n in names], [self.convs[n] for n in conv_names],
                                        [st.conv[n] for n in conv_names], st.ssm.device, st.conv[names[0]].dtype)
            static = InterdomainStaticState(ssm=st.ssm, conv=dict(zip(conv_names, views)),
                                            lam=torch.exp(log_lam.to(cdt)), b_bar=b_bar.to(cdt), c=c.to(cdt),
                                            inputs=inputs,
                                            rope=None if self.rotary is None else
                                            self.rotary.table(max_len, st.ssm.device, st.conv[names[0]].dtype))
            use_kernels = resolve_use_kernels(use_kernels, "interdomain_decode", st.ssm.is_cuda)
            if use_kernels and self.query_readout and st.ssm.dtype == torch.complex64:
                if not HAS_TRITON:
                    raise RuntimeError("use_kernels=True needs the 'triton' package (the fused Interdomain step)")
                static.kernel_params = decode_params(log_lam, b_bar, c, self.readout)
                static.ssm_real = torch.view_as_real(st.ssm)
        return static

    def load_static_state(self, static: InterdomainStaticState, state: InterdomainState) -> None:
        """Copy an eager state (a left-padded prefill's too: its rows are per-row states already; their positions
        are the caller's per-row `pos`, layers/base.py)."""
        static.ssm.copy_(state.ssm)
        copy_conv_states(static.conv, state.conv)

    def step(self, x: torch.Tensor, static: InterdomainStaticState, pos: torch.Tensor,
             chunk_end: bool = False) -> torch.Tensor:
        """x [B, 1, hidden] at position pos (RoPE; 0-d, or [B] per row) -> [B, 1, hidden]; the S4D state and conv
        states advance in place."""
        b = x.shape[0]
        br = self._branches_step(x, static)
        key, q = br[self.key_name], br.get("q")
        if self.rotary is not None:
            key = self.rotary.at_table(key, static.rope, rope_positions(pos))
            q = self.rotary.at_table(q, static.rope, rope_positions(pos)) if q is not None else None
        if self.dual_input:
            key = self._feature_map(key)
        key, val = self._input_gain(self.key_norm(key), self.value_norm(br[self.val_name]))
        if q is not None:
            q = self._feature_map(q)[:, 0]
        o = self._core_step(q, key[:, 0], val[:, 0], static).to(x.dtype)
        return self._output(o.view(b, 1, *o.shape[1:]), x)

    def _branches_step(self, x: torch.Tensor, static: InterdomainStaticState) -> dict[str, torch.Tensor]:
        """x [B, 1, hidden] -> every branch (`_branch` for one token) as [B, 1, H, d_h], by name: one GEMV for all
        projections, one convolution over the convolved ones (their states advance in place)."""
        b = x.shape[0]
        return {name: t.view(b, 1, self.num_heads, self.head_dim)
                for name, t in zip(self.proj, static.inputs(x[:, 0]), strict=True)}

    def _core_step(self, q: torch.Tensor | None, key: torch.Tensor, val: torch.Tensor,
                   static: InterdomainStaticState) -> torch.Tensor:
        """One token of the S4D core and its readout on q, key [B, H, R] / val [B, H, D] inputs (q None without the
        query readout); static.ssm is updated in place. -> [B, H, D] (linear contraction: [B, H, R+D])."""
        if static.kernel_params is not None:
            lam, bb, kk, readout = static.kernel_params
            return interdomain_decode_op(q, key, val, lam, bb, kk, static.ssm_real, self.denominator, readout)
        r, d = key.shape[-1], val.shape[-1]
        ssm = static.ssm
        rdt = torch.float64 if ssm.dtype == torch.complex128 else torch.float32
        parts = [key, val] + ([torch.ones_like(val[..., :1])] if self.denominator else [])
        z = torch.cat([p.to(rdt) for p in parts], -1).to(ssm.dtype)  # [B, H, R+D(+1)]
        ssm.mul_(static.lam[None, :, :, None]).add_(static.b_bar[None, :, :, None] * z[:, :, None, :])
        y = torch.einsum("hmn,bhnc->bhmc", static.c, ssm)
        if self.contraction == "linear":  # S4D-only control: Re(wᵀ C X) over all R+D channels
            return torch.einsum("hm,bhmc->bhc", self.contraction_w.to(y.real.dtype).to(y.dtype), y).real
        u, gam = y[..., :r], y[..., r:]
        if q is None:  # bilinear S4D mixer: Re(diag(Uᵀ Γ))
            return (u * gam).sum(-2).real
        o = readout_product(u, q.to(rdt).to(ssm.dtype), gam, self.readout)  # [B, H, D(+1)]
        return safe_divide(o[..., :d], o[..., d:]) if self.denominator else o


class InterdomainAttention(S4DCoreMixer):
    """Interdomain Attention token mixer. x [B, T, hidden] -> y [B, T, hidden].

    Data flow per token (the full layer, all flags at their defaults):

        q = W_Q x, k = W_K x, v = W_V x                                 (no biases)
        q, k <- ShortConv_4(q), ShortConv_4(k)                          (causal depthwise, before the head split)
        ξ(q) = ℓ2(SiLU(RoPE(q))), ξ(k) = ℓ2(SiLU(RoPE(k)))              (per head, over R = d_h)
        k̃ = RMSNorm_h(ξ(k)) + b^k_h,  ṽ = RMSNorm_h(v) + b^v_h          (per-head gains and biases, "B-side" norm)
        z = B ⊙ [k̃_t; ṽ_t]                                              (per-channel input gain B, modules/s4d.py)
        X_t = Λ ⊙ X_{t-1} + B̄ z_tᵀ,  U = C X[:, :R], Γ = C X[:, R:]      (one complex S4D per head, S4DCore)
        o_t = read(ξ(q_t), U_t, Γ_t)                                    (no η denominator, no output norm)
        y = W_O concat_h(o)                                             (optionally gated: σ(W_g x) ⊙ o)

    The flags of ``__init__`` (query_readout, dual_input, rope, denominator) give the paper's 125M mechanism cube
    (Table 4). State size: 2·H·M·(R+d_h) real numbers per sequence, independent of the sequence length. A packed
    prefill's per-document states are the rows of the batched state (positions per row in ``InterdomainState.pad``).
    """


class S4DMixer(S4DCoreMixer):
    """The S4D-only control (§3): generic inputs [a; b], a learned contraction *linear* in the state instead of the
    query, no RoPE by default; the same S4D core and therefore the same state size as InterdomainAttention.
    x [B, T, hidden] -> y [B, T, hidden].

    Args:
        hidden_size: d, the width of x and y.
        num_heads: H, the number of heads (one S4D core each).
        head_dim: d_h, the width of a head (default hidden_size // num_heads).
        **kwargs: the other arguments of ``S4DCoreMixer`` (state_size, conv_size, rope (default False), rope_theta,
            output_gate, chunk_size, dt_min, dt_max, norm_eps, backend, conv_backend); query_readout, dual_input and
            denominator must be False and contraction must be this class's ``CONTRACTION``.
    """

    CONTRACTION = "linear"

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int | None = None, **kwargs) -> None:
        kwargs.setdefault("rope", False)
        name = type(self).__name__
        for flag in ("query_readout", "dual_input", "denominator"):
            if kwargs.get(flag):
                raise ValueError(f"{name} has no query and generic inputs; {flag}=True is not allowed")
            kwargs.pop(flag, None)
        if kwargs.pop("contraction", self.CONTRACTION) != self.CONTRACTION:
            raise ValueError(f"{name} has contraction={self.CONTRACTION!r}; use the other S4D mixer for the other one")
        kwargs.pop("readout", None)  # no query: the readout flag does not apply
        super().__init__(hidden_size, num_heads, head_dim, query_readout=False, dual_input=False,
                         contraction=self.CONTRACTION, **kwargs)


class S4DBilinearMixer(S4DMixer):
    """A multiplicative S4D-only mixer, the `s4d_bilinear` baseline: the same inputs and core as `s4d`, read by
    Re(diag(UᵀΓ)) (a product of the two filtered halves, H3-style), then C_out and W_O.

    Args: hidden_size, num_heads, head_dim and **kwargs as for ``S4DMixer``, with contraction "bilinear".
    """

    CONTRACTION = "bilinear"
