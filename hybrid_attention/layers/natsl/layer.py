"""NAtS-L (arXiv 2602.03681): chunk-level routing between softmax attention and Gated DeltaNet inside one layer.
`NatsLAttention` is the token mixer, `NatsLState` its decode state; forcing and recording the routing live in
layers/natsl/routing.py, outside the layer and its state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_attention.layers.base import TokenMixer, check_hidden, packed_positions
from hybrid_attention.layers.gated_deltanet import gdn_decay, init_decay_params
from hybrid_attention.layers.natsl.routing import GDN, SOFTMAX, RoutingRecorder, RoutingSpec
from hybrid_attention.layers.natsl.static import NatsLStaticStep
from hybrid_attention.modules import RMSNorm, RotaryEmbedding, ShortConvolution, project_inputs, rms_norm
from hybrid_attention.ops.chunk_attention import chunk_attention
from hybrid_attention.ops.common.backend import resolve_backend
from hybrid_attention.ops.common.order import selected_first
from hybrid_attention.ops.common.varlen import chunk_layout, chunk_offsets, document_ids, positions_in_document
from hybrid_attention.ops.gated_delta import gated_delta
from hybrid_attention.ops.gated_delta.triton import config_with_buffers
from hybrid_attention.ops.natsl_mixed import BACKENDS as NATSL_MIXED_BACKENDS
from hybrid_attention.ops.natsl_mixed import natsl_mixed
from hybrid_attention.ops.natsl_mixed.triton import supported as natsl_mixed_supported


@dataclass
class NatsLState:
    """Decode state of one NAtS-L layer (all tensors per batch row b).

    conv           ShortConv states of q, k, v and, with attn_qk="own_conv", q_s, k_s (last K-1 inputs)
    x_buf          [B, L, D]       layer inputs of the current partial chunk (L = offset mod C): its type needs all C
    k_buf, v_buf   [B, L, Hs, d]   softmax K (normed, roped) / V of the partial chunk (visible to its own later tokens)
    S, S_start     [B, Hl, dk, dv] GDN state after the last token (pseudo-updated) and at the start of the chunk
    g_sum          [B, Hl]         Σ g over the partial chunk (the decay a rolled-back chunk still applies)
    k_cache, v_cache [B, Hs, Sc, d] K/V of softmax-typed chunks only, compacted per decision head (slot j of head h
                   holds that head's j-th kept chunk); valid [B, Hn, Sc/C] marks filled slots; n_kept [B, Hn]
                   (Sc/C >= the largest n_kept: more with prefill_cache="full", or after a cache grew while decoding)
    offset         tokens seen
    """

    conv: dict[str, torch.Tensor]
    x_buf: torch.Tensor
    k_buf: torch.Tensor
    v_buf: torch.Tensor
    S: torch.Tensor
    S_start: torch.Tensor
    g_sum: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    valid: torch.Tensor
    n_kept: torch.Tensor
    offset: int = 0

    def num_reals(self) -> int:
        """Real numbers held per sequence (compacted KV up to the largest kept count of any row; conv excluded)."""
        c = self.k_cache.shape[2] // self.valid.shape[-1] if self.valid.shape[-1] else 0
        kv_per_token = self.k_cache.shape[1] * (self.k_cache.shape[-1] + self.v_cache.shape[-1])
        bufs = self.x_buf[0].numel() + self.k_buf[0].numel() + self.v_buf[0].numel()
        return int(self.n_kept.max()) * c * kv_per_token + bufs + 2 * self.S[0].numel() + self.g_sum[0].numel()


class NatsLAttention(NatsLStaticStep, TokenMixer):
    """NAtS-L token mixer. x [B, T, hidden] -> y [B, T, hidden]. Static decode step: `NatsLStaticStep`
    (layers/natsl/static.py). q / k / v are shared by both branches, a router types each complete chunk of C tokens
    softmax or GDN per decision head, and a per-token learned weighting fuses the two branches' normed outputs.

    Per layer (spec natsl.md §1; shapes of the released 340M config in brackets):
        q, k, v  = SiLU(ShortConv_4(W_q x)), ... shared by both branches          [Dk = 768, Dk, Dv = 1536]
        β, g     = σ(W_b x), -exp(A_log)·softplus(W_a x + dt_bias)                 (GDN, per GDN head)
        route    : chunk n of C tokens gets, per decision head h (= GDN head), the type
                   argmax(W_s mean_{t∈n} x_t) ∈ {0: softmax, 1: GDN}, with a straight-through softmax gradient
        softmax  : heads H_s = G·H_l carved from the GDN heads' channels [12 heads, 64/128], QK-RMSNorm, no RoPE by
                   default; a query sees its own chunk causally + every earlier chunk typed softmax for its group
        GDN      : gated delta rule; every chunk is "pseudo-updated" for its own tokens, and at its end the chunk's
                   writes are kept if typed GDN, else rolled back (the start state still decays, `decay_uncommitted`)
        fusion   : per token and 128-channel slot i: y = (ω₀ RMSN(o_gdn)γ₁ + ω₁ RMSN(o_sa)γ₂) ⊙ swish(W_g x),
                   ω = softmax(W_ω q) over the 2 branches; out = W_o y

    Decisions and deviations from the official code (each named once, here):
    - Last chunk: the official code forces the last chunk to "both ops" (bookkeeping for its kernels; it inflates the
      logged softmax fraction). We never force: a complete chunk is typed as soon as it has C tokens (also at the end of
      a call), and a partial chunk gets no type until it completes (during decoding it is typed when its C-th token
      arrives). Outputs are identical; the reported fraction counts complete chunks only.
    - Gradient to the router: only the selected op's mask derivative (official default). `counterfactual_grad=True` also
      gives the unselected op its exact derivative at the current hard mask: for GDN autograd through the commit mask;
      for softmax a dense pass that includes unselected earlier chunks with weight m = 0 (the official flags for this
      are broken: misspelt / mis-wired config keys).
    - Decode never uses side streams (the official decode launches SDPA and GDN on unsynchronised new CUDA streams).
    - Continued prefill from any non-empty state, split anywhere (mid-chunk included), reproduces the full forward (the
      official cache cannot do this); batched decode with different routings per row is supported.
    - Ablations as flags (``__init__``): weights_from, separate_norms, decay_uncommitted, rope, sample, qk_norm,
      fused_outputs, attn_qk.
    - Prefill cache (host syncs): a prefill from an empty state compacts its softmax chunks into the decode
      state's cache with a fixed-size gather (no ``nonzero``). Its slot count is known on the host for forced routing;
      for the router's own routing `prefill_cache` decides: "trim" (default) reads the largest kept count from the
      device (one host sync per layer and prefill, the leanest cache), "full" gives every complete chunk a
      slot (no host sync, e.g. for CUDA-graph capture; outputs identical, decoding from it equal up to the summation
      order of the masked extra slots). Decoding keeps its one sync per completed chunk (the static step has none).
    - Packed documents (``cu_seqlens``): the training forward and backward read nothing on the host,
      device offsets included. The list of complete chunks has the static length T // C (the first rows are the
      document chunks that have C tokens, in order; a mask marks them), the per-chunk inputs of the ops the sync-free
      row count ``max_chunks(T, N, C)`` (``ops/common/varlen.py``; rows past Nc ignored): shapes from T, N and C only.
      Outputs are unchanged (gradients up to the BLAS rounding of a projection over more rows); ``sample="gumbel"``
      draws noise for the padded rows too. An attached ``RoutingRecorder`` keeps only the real chunks (one host read).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int = 6,
        head_dim: int = 128,
        expand_v: float = 2.0,
        num_attn_heads: int = 12,
        chunk_size: int = 64,
        conv_size: int = 4,
        norm_eps: float = 1e-6,
        rope: bool = False,
        rope_theta: float = 10000.0,
        qk_norm: bool = True,
        fused_outputs: str = "both",
        attn_qk: str = "shared",
        weights_from: str = "q",
        separate_norms: bool = True,
        decay_uncommitted: bool = True,
        sample: str = "argmax",
        counterfactual_grad: bool = False,
        backend: str = "auto",
        force_routing: str | float | None = None,
        prefill_cache: str = "trim",
        buffer_dtype: str = "auto",
        conv_backend: str = "auto",
    ) -> None:
        """Build the shared projections, the router, the fusion and both branches.

        Args:
            hidden_size: width of x and y.
            num_heads: GDN heads, which are also the router's decision heads.
            head_dim: d_k, the q / k width of a GDN head.
            expand_v: d_v / d_k; head_dim · expand_v must be an integer.
            num_attn_heads: softmax heads H_s = G · num_heads carved from the GDN heads' channels (a multiple of
                num_heads dividing num_heads · head_dim and its value width).
            chunk_size: C, the routing chunk length in tokens.
            conv_size: kernel width of the causal short convolutions on q, k, v.
            norm_eps: epsilon of the RMSNorms.
            rope: RoPE on the softmax branch (the paper's all-layers "NAtS-L" uses it, the Hybrid does not).
            rope_theta: RoPE base.
            qk_norm: per-head RMSNorm of the softmax q / k (False: the official ``attn_qk_norm=False``; the logits
                are then q·k/√d_ks unbounded, as in a plain softmax layer, instead of at most √d_ks in size while the
                norm weights are near 1).
            fused_outputs: "both" | "softmax" | "gdn": the fusion keeps one branch's normed output, ω unused; a
                diagnostic of whether the GDN branch's output slows the softmax branch's recall.
            attn_qk: "shared" (the GDN branch's q / k) | "own" (projections of its own, W_qs x and W_ks x with no
                short convolution or SiLU, as in a plain softmax layer; a diagnostic that removes the sharing with
                the delta-rule branch) | "own_conv" (own projections with short convolutions and SiLU of their own,
                SiLU(ShortConv_4(W_qs x)), ..., convs "q_s", "k_s", as the shared q / k have).
            weights_from: "q" | "x", the input of the fusion weights ω.
            separate_norms: one RMSNorm per branch (False: one RMSNorm of the ω-weighted sum, one scale).
            decay_uncommitted: a chunk typed softmax still decays the GDN start state (False: restores it undecayed).
            sample: "argmax" | "gumbel", how the router picks a chunk's type.
            counterfactual_grad: also give the unselected op its exact mask derivative (class docstring).
            backend: form of the mixed op, one of ``ops.natsl_mixed.BACKENDS`` ("auto", "reference", "triton").
            force_routing: None (the router decides), "softmax", "gdn" or a softmax fraction in [0, 1]
                (``RoutingSpec``).
            prefill_cache: "trim" | "full", the slots of a prefill's softmax cache (class docstring).
            buffer_dtype: "auto" / "fp32" / "bf16", the GDN branch's Triton buffer precision, as in `GatedDeltaNet`
                (pinned by a suite through ``mixer_options.natsl.buffer_dtype``).
            conv_backend: form of the short convolutions on q, k, v (``ShortConvolution``'s backend): "auto"
                (default: "triton" for CUDA inputs, else "reference"), "reference", "triton" (``ops/causal_conv``)
                or "fla" (fla's kernel, optional).
        """
        super().__init__()
        config_with_buffers(buffer_dtype)  # ValueError naming buffer_dtype and its allowed values
        if prefill_cache not in ("trim", "full"):
            raise ValueError(f"prefill_cache must be one of 'trim', 'full', got {prefill_cache!r}")
        if fused_outputs not in ("both", "softmax", "gdn"):
            raise ValueError(f"fused_outputs must be one of 'both', 'softmax', 'gdn', got {fused_outputs!r}")
        if attn_qk not in ("shared", "own", "own_conv"):
            raise ValueError(f"attn_qk must be one of 'shared', 'own', 'own_conv', got {attn_qk!r}")
        if weights_from not in ("q", "x"):
            raise ValueError(f"weights_from must be one of 'q', 'x', got {weights_from!r}")
        if sample not in ("argmax", "gumbel"):
            raise ValueError(f"sample must be one of 'argmax', 'gumbel', got {sample!r}")
        if num_attn_heads % num_heads:
            raise ValueError(f"num_attn_heads ({num_attn_heads}) must be a multiple of num_heads ({num_heads})")
        head_v_dim = head_dim * expand_v
        if head_v_dim != int(head_v_dim):
            raise ValueError(f"head_dim * expand_v must be an integer, got {head_dim} * {expand_v}")
        self.hidden_size, self.num_heads, self.head_dim, self.head_v_dim = hidden_size, num_heads, head_dim, int(
            head_v_dim)
        self.num_attn_heads = num_attn_heads
        self.group = num_attn_heads // num_heads  # G softmax heads per GDN head (= per decision head)
        key_dim, value_dim = num_heads * head_dim, num_heads * self.head_v_dim
        if key_dim % num_attn_heads or value_dim % num_attn_heads:
            raise ValueError("num_heads * head_dim (and * expand_v) must be divisible by num_attn_heads")
        self.attn_head_dim, self.attn_head_v_dim = key_dim // num_attn_heads, value_dim // num_attn_heads
        self.chunk_size, self.norm_eps = chunk_size, norm_eps
        self.weights_from, self.separate_norms = weights_from, separate_norms
        self.fused_outputs, self.attn_qk = fused_outputs, attn_qk
        self.decay_uncommitted, self.sample = decay_uncommitted, sample
        self.counterfactual_grad, self.backend = counterfactual_grad, backend
        self.buffer_dtype = buffer_dtype  # the GDN branch's Triton buffer precision (ops/gated_delta/triton/config.py)
        self.prefill_cache = prefill_cache  # the prefill state's cache slots (_prefill_capacity)
        self.routing = RoutingSpec(force_routing)  # forced chunk types (configuration; layers/natsl/routing.py)
        self.recorders: tuple[RoutingRecorder, ...] = ()  # analysis hooks, only inside RoutingRecorder.attach

        self.q_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, value_dim, bias=False)
        self.a_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.g_proj = nn.Linear(hidden_size, value_dim, bias=False)
        self.convs = nn.ModuleDict({
            "q": ShortConvolution(key_dim, conv_size, "silu", conv_backend),
            "k": ShortConvolution(key_dim, conv_size, "silu", conv_backend),
            "v": ShortConvolution(value_dim, conv_size, "silu", conv_backend),
        })
        self.A_log = nn.Parameter(torch.empty(num_heads))
        self.dt_bias = nn.Parameter(torch.empty(num_heads))
        self.omega_proj = nn.Linear(key_dim if weights_from == "q" else hidden_size, 2 * num_attn_heads, bias=False)
        self.score_proj = nn.Linear(hidden_size, 2 * num_heads, bias=False)
        # attn_qk="own" / "own_conv" (__init__ docstring): the softmax branch's q / k projections, linear in x for
        # "own", followed by their own ShortConvs + SiLU (convs "q_s", "k_s") for "own_conv" (None: "shared")
        own_qk = attn_qk in ("own", "own_conv")
        self.attn_q_proj = nn.Linear(hidden_size, key_dim, bias=False) if own_qk else None
        self.attn_k_proj = nn.Linear(hidden_size, key_dim, bias=False) if own_qk else None
        if attn_qk == "own_conv":
            self.convs["q_s"] = ShortConvolution(key_dim, conv_size, "silu", conv_backend)
            self.convs["k_s"] = ShortConvolution(key_dim, conv_size, "silu", conv_backend)
        self.qk_norm = qk_norm
        self.q_norm = RMSNorm(self.attn_head_dim, eps=norm_eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.attn_head_dim, eps=norm_eps) if qk_norm else nn.Identity()
        self.gdn_scale = nn.Parameter(torch.ones(self.attn_head_v_dim))
        self.attn_scale = nn.Parameter(torch.ones(self.attn_head_v_dim)) if separate_norms else None
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)
        self.rotary = RotaryEmbedding(self.attn_head_dim, rope_theta) if rope else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_decay_params(self.A_log, self.dt_bias)

    # ---------------------------------------------------------------------------------------------------- helpers
    def _linears(self) -> dict[str, nn.Linear]:
        """The projections of x by name (the order of the fused decode inputs): the convolved q, k, v (and the
        softmax branch's own q_s, k_s with attn_qk="own_conv") first, then a, b, the gate g, ω when it reads x, and
        the unconvolved q_s, k_s of attn_qk="own"."""
        own = {"q_s": self.attn_q_proj, "k_s": self.attn_k_proj}
        return ({"q": self.q_proj, "k": self.k_proj, "v": self.v_proj} | (own if self.attn_qk == "own_conv" else {})
                | {"a": self.a_proj, "b": self.b_proj, "g": self.g_proj}
                | ({"omega": self.omega_proj} if self.weights_from == "x" else {})
                | (own if self.attn_qk == "own" else {}))

    def _project(self, x, state, keep, cu_seqlens=None):
        """Input projections of x [B, T, hidden] as one product and one convolution (``project_inputs``) -> (z, β,
        g [B, T, Hl], new conv states by name (empty unless keep)). z by name: q, k [B, T, Hl·dk], v [B, T, Hl·dv]
        (convolved, restarting at each packed document), the softmax branch's "q_s", "k_s" [B, T, Hs·d_ks] (attn_qk
        "shared": q, k; "own": W_qs x, ...; "own_conv": SiLU(ShortConv(W_qs x)), ...), the gate "g", "omega" = W_ω x
        (weights_from="x")."""
        z, new_conv = project_inputs(x, self._linears(), self.convs, state.conv if state else None, keep,
                                     cu_seqlens=cu_seqlens)
        fdt = torch.float64 if x.dtype == torch.float64 else torch.float32
        beta = torch.sigmoid(z["b"].to(fdt))
        g = gdn_decay(z["a"], self.A_log, self.dt_bias)
        return {"q_s": z["q"], "k_s": z["k"]} | z, beta, g, new_conv

    def _attn_qk(self, q_s, k_s, offset, pos=None):
        """Softmax-branch heads of its q / k q_s, k_s [B, T, Hs·d_ks] (`_project`; with attn_qk="shared" the GDN
        branch's channels split finely): QK-RMSNorm, optional RoPE (at positions offset.., or at pos [T] for packed
        documents). [B, T, Hs, d_ks]."""
        b, t, _ = q_s.shape
        qs = self.q_norm(q_s.view(b, t, self.num_attn_heads, self.attn_head_dim))
        ks = self.k_norm(k_s.view(b, t, self.num_attn_heads, self.attn_head_dim))
        if self.rotary is not None and pos is not None:
            qs, ks = self.rotary.at(qs, pos), self.rotary.at(ks, pos)
        elif self.rotary is not None:
            qs, ks = self.rotary(qs, offset), self.rotary(ks, offset)
        return qs, ks

    def _route(self, x_chunks: torch.Tensor, first_chunk: int | torch.Tensor = 0):
        """x_chunks [B, N, C, D] complete chunks (the first one is chunk number `first_chunk` of the sequence: an int,
        or a 0-d integer device tensor in the static step) -> (hard [B, N, Hn, 2] one-hot, p [B, N, Hn, 2])."""
        logits = self.score_proj(x_chunks.mean(2)).view(*x_chunks.shape[:2], self.num_heads, 2)
        logits = logits.double() if logits.dtype == torch.float64 else logits.float()
        if self.sample == "gumbel" and self.training:
            p = F.gumbel_softmax(logits, tau=1.0, hard=False)
        else:
            p = logits.softmax(-1)
        hard = self.routing.apply(F.one_hot(p.argmax(-1), 2).to(p.dtype), first_chunk)
        return hard, p

    def _fuse(self, x, q, o_gdn, o_sa, gate=None, omega=None):
        """Per-slot fusion of the two branches, gate and output projection. o_*: [B, T, Hs, d_vs]; gate = g_proj(x),
        omega = omega_proj(x) [B, T, ·] when the caller projected them already (the fused decode step)."""
        b, t = x.shape[:2]
        if self.fused_outputs == "softmax":  # diagnostic (__init__ docstring): the softmax branch alone, no ω
            y = rms_norm(o_sa, self.norm_eps) * (self.attn_scale if self.separate_norms else self.gdn_scale)
            return self._gate_out(x, y, gate)
        if self.fused_outputs == "gdn":
            return self._gate_out(x, rms_norm(o_gdn, self.norm_eps) * self.gdn_scale, gate)
        if omega is None:
            omega = self.omega_proj(q if self.weights_from == "q" else x)
        w = omega.view(b, t, self.num_attn_heads, 2)
        w = w.float().softmax(-1).to(o_gdn.dtype) if w.dtype != torch.float64 else w.softmax(-1)
        if self.separate_norms:
            y = (w[..., 0:1] * rms_norm(o_gdn, self.norm_eps) * self.gdn_scale
                 + w[..., 1:2] * rms_norm(o_sa, self.norm_eps) * self.attn_scale)
        else:
            y = rms_norm(w[..., 0:1] * o_gdn + w[..., 1:2] * o_sa, self.norm_eps) * self.gdn_scale
        return self._gate_out(x, y, gate)

    def _gate_out(self, x, y, gate=None):
        """The output gate and projection of the fused y [B, T, Hs, d_vs]: o_proj(y ⊙ swish(gate))."""
        b, t = x.shape[:2]
        z = (self.g_proj(x) if gate is None else gate).view(b, t, self.num_attn_heads, self.attn_head_v_dim)
        return self.o_proj((y * F.silu(z)).reshape(b, t, -1))

    def _heads(self, z, h, d):
        return z.view(*z.shape[:2], h, d)

    def _chunk_softmax_types(self, x_chunk: torch.Tensor, chunk_index: int | torch.Tensor) -> torch.Tensor:
        """Types of one complete chunk x_chunk [B, C, D] (chunk number chunk_index) -> [B, Hn] bool, True = softmax:
        the router, or the forced routing."""
        return self._route(x_chunk[:, None], chunk_index)[0][:, 0, :, SOFTMAX].bool()

    # ---------------------------------------------------------------------------------------------------- state
    def init_state(self, batch_size: int, device=None, dtype=None) -> NatsLState:
        dtype = dtype or self.o_proj.weight.dtype
        sdt = torch.float64 if dtype == torch.float64 else torch.float32
        hs, dks, dvs = self.num_attn_heads, self.attn_head_dim, self.attn_head_v_dim
        z = lambda *s, dt=dtype: torch.zeros(*s, device=device, dtype=dt)  # noqa: E731
        S = z(batch_size, self.num_heads, self.head_dim, self.head_v_dim, dt=sdt)
        return NatsLState(
            conv={n: c.init_state(batch_size, device=device, dtype=dtype) for n, c in self.convs.items()},
            x_buf=z(batch_size, 0, self.hidden_size), k_buf=z(batch_size, 0, hs, dks), v_buf=z(batch_size, 0, hs, dvs),
            S=S, S_start=S.clone(), g_sum=z(batch_size, self.num_heads, dt=sdt),
            k_cache=z(batch_size, hs, 0, dks), v_cache=z(batch_size, hs, 0, dvs),
            valid=torch.zeros(batch_size, self.num_heads, 0, dtype=torch.bool, device=device),
            n_kept=torch.zeros(batch_size, self.num_heads, dtype=torch.long, device=device),
        )

    def state_size(self, seq_len: int, softmax_fraction: float | None = None) -> int:
        """Reals kept after seq_len tokens: (softmax fraction)·(complete chunks)·C·Hs·(d_ks+d_vs) for the compacted
        KV, plus 2·Hl·dk·dv (state and chunk-start copy), the partial chunk's buffers and Σg. The fraction defaults
        to 0.5, the initial expectation (a measured one: ``RoutingRecorder.fraction``)."""
        if softmax_fraction is None:
            softmax_fraction = 0.5
        c = self.chunk_size
        full, part = divmod(seq_len, c)
        kv = self.num_attn_heads * (self.attn_head_dim + self.attn_head_v_dim)
        kept_tokens = round(softmax_fraction * full) * c
        return (kept_tokens * kv + part * (self.hidden_size + kv) + 2 * self.num_heads * self.head_dim
                * self.head_v_dim + self.num_heads)

    def _append_chunks(self, st: NatsLState, k: torch.Tensor, v: torch.Tensor, sel: torch.Tensor,
                       capacity: int | None = None) -> None:
        """Append N completed chunks' softmax K/V (k, v [B, N·C, Hs, d]) to the compacted cache of every (row,
        decision head) that typed them softmax (sel [B, N, Hn] bool), in sequence order: slot j of decision head h
        holds its j-th softmax chunk. Used for all complete chunks of a prefill and for each chunk completed while
        decoding. Mutates `st` (a private copy made by forward).

        capacity None (decoding): the cache grows to the largest kept count, read from the device (one host sync per
        call, none per chunk), and the selected chunks are scattered (``nonzero``, a second one). capacity = a
        host-known bound on every (row, head)'s kept count after the call (the prefill: ``_prefill_capacity``): the
        cache gets max(its slots, capacity) slots and each slot gathers its chunk from a fixed-size stable sort of
        the selection, with no host read; the slots' contents are the same."""
        b, n, hn = sel.shape
        c, g = self.chunk_size, self.group
        dk, dv = k.shape[-1], v.shape[-1]
        sel_l = sel.long()
        kept_before = st.n_kept
        st.n_kept = st.n_kept + sel_l.sum(1)
        have = st.valid.shape[-1]
        if capacity is not None:
            need = capacity
        else:
            need = int(st.n_kept.max()) if n else have
        if need > have:
            grow = need - have
            st.k_cache = torch.cat([st.k_cache, st.k_cache.new_zeros(b, hn * g, grow * c, dk)], 2)
            st.v_cache = torch.cat([st.v_cache, st.v_cache.new_zeros(b, hn * g, grow * c, dv)], 2)
            st.valid = torch.cat([st.valid, st.valid.new_zeros(b, hn, grow)], 2)
        cap = st.valid.shape[-1]
        if capacity is not None:
            self._gather_chunks(st, k, v, sel, kept_before)
            return
        slot = kept_before[:, None, :] + sel_l.cumsum(1) - 1  # [B, N, Hn]: slot of each selected chunk
        bi, ni, hi = sel.nonzero(as_tuple=True)
        si = slot[bi, ni, hi]
        kc = st.k_cache.view(b, hn, g, cap, c, dk)  # views: the writes below land in st.k_cache / st.v_cache
        vc = st.v_cache.view(b, hn, g, cap, c, dv)
        # source [K, C, G, d] (advanced indices first), destination [K, G, C, d]
        kc[bi, hi, :, si] = k.reshape(b, n, c, hn, g, dk)[bi, ni, :, hi].transpose(1, 2)
        vc[bi, hi, :, si] = v.reshape(b, n, c, hn, g, dv)[bi, ni, :, hi].transpose(1, 2)
        st.valid[bi, hi, si] = True

    def _gather_chunks(self, st: NatsLState, k: torch.Tensor, v: torch.Tensor, sel: torch.Tensor,
                       kept_before: torch.Tensor) -> None:
        """The fixed-size form of `_append_chunks`' scatter (its cache already has room, st.n_kept updated): slot j
        of (row b, decision head h) with kept_before[b, h] <= j < st.n_kept[b, h] takes the (j - kept_before)-th
        selected chunk of sel [B, N, Hn] (a stable sort puts the selected ones first, in order), every other slot
        keeps its contents. k, v [B, N·C, Hs, d]. Shapes depend on the cache's slots only: no host read."""
        b, n, hn = sel.shape
        c, g, cap = self.chunk_size, self.group, st.valid.shape[-1]
        if n == 0 or cap == 0:
            return
        order = selected_first(sel, dim=1)  # [B, N, Hn]: selected chunks first, in order
        j = torch.arange(cap, device=sel.device)[None, :, None]  # [1, cap, 1]
        rank = j - kept_before[:, None, :]  # [B, cap, Hn]: the slot's rank among this call's selected chunks
        fill = (rank >= 0) & (j < st.n_kept[:, None, :])  # [B, cap, Hn]
        src = order.gather(1, rank.clamp(0, n - 1))  # [B, cap, Hn]: the chunk each slot takes
        for name, z in (("k_cache", k), ("v_cache", v)):
            d = z.shape[-1]
            chunks = z.reshape(b, n, c, hn, g, d)
            idx = src[:, :, None, :, None, None].expand(b, cap, c, hn, g, d)
            got = chunks.gather(1, idx).permute(0, 3, 4, 1, 2, 5)  # [B, Hn, G, cap, C, d]
            old = getattr(st, name).view(b, hn, g, cap, c, d)
            new = torch.where(fill.permute(0, 2, 1)[:, :, None, :, None, None], got.to(old.dtype), old)
            setattr(st, name, new.reshape(b, hn * g, cap * c, d))
        st.valid = st.valid | fill.permute(0, 2, 1)

    def _prefill_capacity(self, sel: torch.Tensor) -> int:
        """Cache slots of a prefill state from an empty one, whose complete chunks are typed sel [B, N_full, Hn]
        (True = softmax): forced routing -> the host-known kept count (the same for every row and head; no device
        read); else ``prefill_cache`` "trim" -> the largest kept count of any (row, head) (one host sync, the
        leanest cache), "full" -> N_full (a slot for every complete chunk; no host sync, (1 - softmax fraction) of
        the cache unused)."""
        n_full = sel.shape[1]
        forced = self.routing.forced_count(n_full)
        if forced is not None:
            return forced
        if self.prefill_cache == "full":
            return n_full
        return int(sel.sum(1).max()) if n_full and sel.numel() else 0

    # ---------------------------------------------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor, state: NatsLState | None = None, *, output_state: bool | None = None,
                cu_seqlens: torch.Tensor | None = None):
        check_hidden(x, self.hidden_size)
        keep = output_state if output_state is not None else state is not None
        if cu_seqlens is not None:  # packed documents: chunks restart at each document start, routing per document
            pos = packed_positions(x, state, keep, cu_seqlens, type(self).__name__)
            return self._forward_parallel(x, state, keep, cu_seqlens, pos)
        if state is not None and state.offset > 0:
            return self._forward_continue(x, state)
        return self._forward_parallel(x, state, keep)

    def _complete_chunks(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None):
        """The complete chunks of x [B, T, D] (per document with cu_seqlens: chunks restart at each document start).

        Returns (x_full [B, N_full, C, D], valid, R, place): ``place(vals [B, N_full, Hn], fill) -> [B, R, Hn]`` puts
        the values of the complete chunks at their chunk rows (chunk order) and ``fill`` at the others (partial
        chunks get no type; so do the spare rows). Dense: N_full = T // C, R = ceil(T / C), valid None (every row of
        x_full is a chunk). Packed (no host read of the offsets): the shapes come from T, N and C alone,
        N_full = T // C (the most complete chunks T tokens hold) and R = ``max_chunks(T, N, C)`` (the sync-free row
        count the ops accept, ``ops/common/varlen.py``); valid [N_full] bool marks the rows of x_full that are
        complete chunks (the first ones, in order; the others hold tokens of no meaning and get no type)."""
        b, t, d = x.shape
        c = self.chunk_size
        if cu_seqlens is None:
            n_full, n_all = t // c, -(-t // c)
            return (x[:, : n_full * c].reshape(b, n_full, c, d), None, n_all,
                    lambda vals, fill: F.pad(vals, (0, 0, 0, n_all - n_full), value=fill))
        starts, lens = chunk_layout(cu_seqlens, c, t)  # [R] each: device ops, spare rows of length 0
        n_rows, n_full = starts.numel(), t // c
        complete = lens == c  # [R]
        seen = complete.long().cumsum(0)  # [R]: complete chunks up to and including each row
        # row of the j-th complete chunk (j < the true count; else clamped: a spare entry of x_full)
        src = torch.searchsorted(seen, torch.arange(1, n_full + 1, device=x.device)).clamp_(max=n_rows - 1)
        valid = torch.arange(n_full, device=x.device) < seen[-1]  # [N_full]
        pos = (starts[src][:, None] + torch.arange(c, device=x.device)).clamp_(max=t - 1)  # [N_full, C]
        x_full = x[:, pos]  # [B, N_full, C, D]
        rank = (seen - 1).clamp_(0, max(n_full - 1, 0))  # [R]: each complete row's entry of x_full

        def place(vals: torch.Tensor, fill: float) -> torch.Tensor:
            if n_full == 0:  # no complete chunk: every row gets `fill` (pad keeps vals in the graph: zero grads)
                return F.pad(vals, (0, 0, 0, n_rows), value=fill)
            got = vals[:, rank]  # [B, R, Hn]
            return torch.where(complete[None, :, None], got, torch.full_like(got, fill))

        return x_full, valid, n_rows, place

    def _forward_parallel(self, x, state, keep, cu_seqlens=None, pos=None):
        """From an empty state: whole-sequence chunk ops (training path). Builds the decode state if `keep`.
        cu_seqlens / pos: packed documents (no state) and each token's position in its document."""
        b, t, _ = x.shape
        c, hl, hs = self.chunk_size, self.num_heads, self.num_attn_heads
        z, beta, g, new_conv = self._project(x, state, keep, cu_seqlens)
        q, k, v = z["q"], z["k"], z["v"]
        x_full, valid, _, place = self._complete_chunks(x, cu_seqlens)
        n_full = x_full.shape[1]
        hard, p = self._route(x_full)
        for rec in self.recorders:
            rec.record_pass(self, hard[..., SOFTMAX], valid)
        # Straight-through masks: value = the hard choice; gradient = d/dp of the op's mask derivative, kept only
        # for the selected op unless counterfactual_grad.
        st_grad = p - p.detach()
        if not self.counterfactual_grad:
            st_grad = st_grad * hard
        m = hard + st_grad  # [B, N_full, Hn, 2]
        # partial chunks: no type (no later query of their document); commit 1 / routing 0 are inert
        commit = place(m[..., GDN], 1.0)
        route_sa = place(hard[..., SOFTMAX], 0.0)
        bias = place(m[..., SOFTMAX] - m[..., SOFTMAX].detach(), 0.0)

        qg, kg = self._heads(q, hl, self.head_dim), self._heads(k, hl, self.head_dim)
        vg = self._heads(v, hl, self.head_v_dim)
        qs, ks = self._attn_qk(z["q_s"], z["k_s"], 0, pos)
        vs = self._heads(v, hs, self.attn_head_v_dim)
        gdn_kw = dict(chunk_size=c, decay_uncommitted=self.decay_uncommitted, backend=self.backend,
                      buffer_dtype=self.buffer_dtype)
        varlen = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        o_sa = None
        if keep:  # state at the start of the partial chunk = final state of the complete chunks
            nc = n_full * c
            o1, S_full = gated_delta(qg[:, :nc], kg[:, :nc], vg[:, :nc], g[:, :nc], beta[:, :nc],
                                     commit=commit[:, :n_full], output_final_state=True, **gdn_kw)
            o2, S = gated_delta(qg[:, nc:], kg[:, nc:], vg[:, nc:], g[:, nc:], beta[:, nc:], initial_state=S_full,
                                output_final_state=True, **gdn_kw)
            o_gdn = torch.cat([o1, o2], 1)
        elif cu_seqlens is None and self._concurrent_branches(qg, vg, qs, vs):
            # DECISION: on CUDA with the Triton kernels, the two branches run on two synchronised streams
            # (ops/natsl_mixed/triton/; identical results, 16K: 6.3 vs 7.4 ms forward+backward on the H200).
            o_gdn, _, o_sa = natsl_mixed(qg, kg, vg, g, beta, commit, qs, ks, vs, route_sa, routing_bias=bias,
                                         chunk_size=c, group_size=self.group,
                                         decay_uncommitted=self.decay_uncommitted, buffer_dtype=self.buffer_dtype)
        else:
            o_gdn, _ = gated_delta(qg, kg, vg, g, beta, commit=commit, **gdn_kw, **varlen)

        if o_sa is None and self.counterfactual_grad and self.training:
            o_sa = self._dense_counterfactual_attention(qs, ks, vs, place(m[..., SOFTMAX], 0.0), cu_seqlens)
        elif o_sa is None:
            o_sa = chunk_attention(qs, ks, vs, route_sa, chunk_size=c, group_size=self.group, routing_bias=bias,
                                   backend=self.backend, **varlen)
        y = self._fuse(x, q, o_gdn.reshape(b, t, hs, self.attn_head_v_dim), o_sa, z["g"], z.get("omega"))
        if not keep:
            return y, None
        st = self.init_state(b, device=x.device, dtype=x.dtype)
        nc = n_full * c
        st.conv, st.offset = new_conv, t
        # copies: a slice of the partial chunk would keep the whole sequence's tensors alive in the state
        st.x_buf, st.k_buf, st.v_buf = (u[:, nc:].contiguous() for u in (x, ks, vs))
        st.S, st.S_start, st.g_sum = S, S_full, g[:, nc:].sum(1)
        sel = hard[..., SOFTMAX].bool()  # [B, N_full, Hn]
        self._append_chunks(st, ks[:, :nc], vs[:, :nc], sel, capacity=self._prefill_capacity(sel))
        return y, st

    def _concurrent_branches(self, qg: torch.Tensor, vg: torch.Tensor, qs: torch.Tensor, vs: torch.Tensor) -> bool:
        """Whether the no-state path runs both branches through `natsl_mixed`: both Triton ops supporting the shapes
        (``natsl_mixed``'s ``supported``), not the (dense, analysis-only) counterfactual gradient, and backend
        "triton" (on the CPU: the interpreter, one stream) or "auto" with CUDA inputs (``resolve_backend``, the rule
        ``natsl_mixed`` itself applies to "auto"). Other backend names ("naive") run the two ops separately."""
        if self.counterfactual_grad and self.training or self.backend not in NATSL_MIXED_BACKENDS:
            return False
        if not natsl_mixed_supported(qg, vg, qs, vs, self.chunk_size):  # both Triton ops (and triton imports)
            return False
        return resolve_backend(self.backend, "natsl_mixed", qg.is_cuda, NATSL_MIXED_BACKENDS) == "triton"

    def _dense_counterfactual_attention(self, qs, ks, vs, m_chunk, cu_seqlens=None):
        """Dense softmax with multiplicative key weights: 1 inside the query's own chunk (causal), m ∈ {0, 1} (with
        its straight-through gradient, m_chunk [B, N, Hn] over all chunks) for keys of earlier chunks (of the same
        document with cu_seqlens). Forward-identical to chunk_attention; the gradient reaches every earlier chunk,
        unselected ones included (their would-be Σ dS). O(T²) memory: analysis only."""
        t, d, c = qs.shape[1], qs.shape[-1], self.chunk_size
        pos = torch.arange(t, device=qs.device)
        chunk, doc = pos // c, torch.zeros_like(pos)
        if cu_seqlens is not None:  # chunk numbers over all documents (they restart at each document start)
            doc = document_ids(cu_seqlens, t)
            chunk = positions_in_document(cu_seqlens, t) // c + chunk_offsets(cu_seqlens, c)[doc]
        same = (chunk[:, None] == chunk[None, :]) & (pos[:, None] >= pos[None, :])  # [T, T]
        earlier = (chunk[:, None] > chunk[None, :]) & (doc[:, None] == doc[None, :])
        m_key = m_chunk[:, chunk].repeat_interleave(self.group, dim=-1).permute(0, 2, 1)  # [B, Hs, T]
        weight = same.to(qs.dtype) + earlier.to(qs.dtype) * m_key[:, :, None, :]  # [B, Hs, T, T]
        s = torch.einsum("bthd,bshd->bhts", qs, ks) * d**-0.5
        s = s.masked_fill(~(same | earlier), float("-inf"))
        e = torch.exp(s - s.amax(-1, keepdim=True)) * weight
        return torch.einsum("bhts,bshd->bthd", e / e.sum(-1, keepdim=True), vs)

    def _forward_continue(self, x, state: NatsLState):
        """From a non-empty state: chunk-aligned segments (decode, continued prefill at any split)."""
        b, t, _ = x.shape
        c, hl, hs = self.chunk_size, self.num_heads, self.num_attn_heads
        st = NatsLState(**{**state.__dict__})  # shallow copy; tensors below are replaced, never written in place
        st.k_cache, st.v_cache, st.valid, st.n_kept = (state.k_cache.clone(), state.v_cache.clone(),
                                                       state.valid.clone(), state.n_kept.clone())
        z, beta, g, st.conv = self._project(x, state, True)
        q, k, v = z["q"], z["k"], z["v"]
        qs_all, ks_all = self._attn_qk(z["q_s"], z["k_s"], state.offset)
        vs_all = self._heads(v, hs, self.attn_head_v_dim)
        qg, kg = self._heads(q, hl, self.head_dim), self._heads(k, hl, self.head_dim)
        vg = self._heads(v, hl, self.head_v_dim)
        o_gdn, o_sa = [], []
        i = 0
        while i < t:
            filled = st.offset % c
            n = min(c - filled, t - i)
            sl = slice(i, i + n)
            og, st.S = gated_delta(qg[:, sl], kg[:, sl], vg[:, sl], g[:, sl], beta[:, sl], chunk_size=c,
                                   initial_state=st.S, output_final_state=True, backend=self.backend,
                                   buffer_dtype=self.buffer_dtype)
            o_gdn.append(og)
            st.g_sum = st.g_sum + g[:, sl].sum(1)
            o_sa.append(self._attend_cached(st, qs_all[:, sl], ks_all[:, sl], vs_all[:, sl]))
            st.x_buf = torch.cat([st.x_buf, x[:, sl]], 1)
            st.k_buf = torch.cat([st.k_buf, ks_all[:, sl]], 1)
            st.v_buf = torch.cat([st.v_buf, vs_all[:, sl]], 1)
            st.offset += n
            i += n
            if filled + n == c:  # the chunk is complete: type it, commit or roll back, keep or free its KV
                hard, _ = self._route(st.x_buf[:, None], first_chunk=st.offset // c - 1)
                hard = hard[:, 0]  # [B, Hn, 2]
                is_gdn = hard[..., GDN].bool()[:, :, None, None]
                decay = torch.exp(st.g_sum)[:, :, None, None] if self.decay_uncommitted else 1.0
                st.S = torch.where(is_gdn, st.S, decay * st.S_start)
                st.S_start, st.g_sum = st.S, torch.zeros_like(st.g_sum)
                sel = hard[..., SOFTMAX].bool()
                for rec in self.recorders:
                    rec.record_chunk(self, sel[:, None])
                self._append_chunks(st, st.k_buf, st.v_buf, sel[:, None])
                st.x_buf, st.k_buf, st.v_buf = st.x_buf[:, :0], st.k_buf[:, :0], st.v_buf[:, :0]
        o_gdn = torch.cat(o_gdn, 1).reshape(b, t, hs, self.attn_head_v_dim)
        y = self._fuse(x, q, o_gdn, torch.cat(o_sa, 1), z["g"], z.get("omega"))
        return y, st

    def _attend_cached(self, st: NatsLState, qs, ks, vs):
        """Queries of one chunk segment [B, n, Hs, d] over: the compacted softmax KV (valid slots of the query's
        decision head), the chunk's earlier tokens (k_buf) and the segment itself causally."""
        b, n, hs, d = qs.shape
        c = self.chunk_size
        keys = torch.cat([st.k_cache.transpose(1, 2), st.k_buf, ks], 1)  # [B, Sc+L+n, Hs, d]
        vals = torch.cat([st.v_cache.transpose(1, 2), st.v_buf, vs], 1)
        sc, lb = st.k_cache.shape[2], st.k_buf.shape[1]
        cache_ok = st.valid.repeat_interleave(self.group, 1).repeat_interleave(c, 2)  # [B, Hs, Sc]
        cache_ok = cache_ok[:, :, None, :].expand(b, hs, n, sc)
        buf_ok = torch.ones(b, hs, n, lb, dtype=torch.bool, device=qs.device)
        seg_ok = torch.ones(n, n, dtype=torch.bool, device=qs.device).tril().expand(b, hs, n, n)
        mask = torch.cat([cache_ok, buf_ok, seg_ok], -1)
        o = F.scaled_dot_product_attention(qs.transpose(1, 2), keys.transpose(1, 2), vals.transpose(1, 2),
                                           attn_mask=mask, scale=d**-0.5)
        return o.transpose(1, 2)
