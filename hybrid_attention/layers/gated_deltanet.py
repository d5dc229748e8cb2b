"""Gated DeltaNet layer, equivalent to fla's `GatedDeltaNet` (the NAtS-L baseline and its hybrid partner layers)."""

from __future__ import annotations

import math
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
)
from hybrid_attention.modules import FusedInputs, RMSNorm, ShortConvolution, fuse_inputs, project_inputs
from hybrid_attention.ops.common.backend import resolve_use_kernels
from hybrid_attention.ops.gated_delta import gated_delta
from hybrid_attention.ops.gated_delta.step import gated_delta_step
from hybrid_attention.ops.gated_delta.triton import config_with_buffers
from hybrid_attention.ops.gated_norm import BACKENDS as NORM_BACKENDS
from hybrid_attention.ops.gated_norm import gated_rms_norm


def init_decay_params(a_log: torch.Tensor, dt_bias: torch.Tensor, dt_min=1e-3, dt_max=1e-1, dt_floor=1e-4) -> None:
    """Mamba/fla initialisation of the GDN decay: A ~ U(0, 16) stored as log; dt_bias = softplus⁻¹(dt)."""
    with torch.no_grad():
        a_log.copy_(torch.log(torch.empty_like(a_log).uniform_(0, 16)))
        dt = torch.exp(torch.rand_like(dt_bias) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_floor)
        dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
    a_log._no_weight_decay = True
    dt_bias._no_weight_decay = True


def gdn_decay(a_x: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """g = -exp(A_log) · softplus(a_x + dt_bias), in float32 (float64 for float64 inputs). a_x: [B, T, H]."""
    dt = torch.float64 if a_x.dtype == torch.float64 else torch.float32
    return -torch.exp(a_log.to(dt)) * F.softplus(a_x.to(dt) + dt_bias.to(dt))


@dataclass
class GDNState:
    """S: [B, H, d_k, d_v] recurrent state (float32, or float64 for float64 models); conv: ShortConv states by name."""

    S: torch.Tensor
    conv: dict[str, torch.Tensor] = field(default_factory=dict)
    offset: int = 0


@dataclass
class GDNStaticState(StaticState):
    """Static decode buffers of one GDN layer: S [B, H, d_k, d_v] (float32, float64 for float64 models), conv
    [B, channels, K-1] by branch name (views of the fused conv state of `inputs`); use_kernels: the fused Triton
    step for a float32 state; inputs: the step's q|k|v|a|b(|g) projections and q|k|v convolutions fused
    (modules/fused_linear.py)."""

    S: torch.Tensor
    conv: dict[str, torch.Tensor]
    use_kernels: bool
    inputs: FusedInputs | None = None

    def buffers(self) -> list[torch.Tensor]:
        return [self.S, *self.conv.values()]

    def fill_random(self, length: int, generator: torch.Generator, softmax_fraction: float = 0.5) -> None:
        self.S.normal_(std=0.1, generator=generator)
        for buf in self.conv.values():
            buf.normal_(generator=generator)


class GatedDeltaNet(TokenMixer):
    """fla-equivalent Gated DeltaNet. x [B, T, hidden] -> y [B, T, hidden]; state H·d_k·d_v reals, flat in T.

        q, k, v = SiLU(ShortConv_4(W_q x)), SiLU(ShortConv_4(W_k x)), SiLU(ShortConv_4(W_v x))
        β = σ(W_b x),  g = -exp(A_log) · softplus(W_a x + dt_bias)          (log-decay, float32)
        o = gated_delta(q, k, v, g, β)                                      (q, k ℓ2-normalised inside, scale d_k^-1/2)
        y = W_o( RMSNorm_head(o) ⊙ swish(W_g x) )

    A_log ~ log U(0, 16); dt_bias = softplus⁻¹ of dt log-uniform in [1e-3, 1e-1] floored at 1e-4 (Mamba's recipe); both
    carry ``_no_weight_decay``. Position-free decode: a packed prefill's per-document states are the rows of the
    batched state.

    Args:
        hidden_size: width of x and y.
        num_heads: H, the number of heads.
        head_dim: d_k, the q/k width of a head.
        expand_v: d_v / d_k; head_dim · expand_v must be an integer.
        conv_size: kernel width of the causal short convolutions on q, k, v.
        use_gate: multiply the normed output by swish(W_g x) (False: no W_g).
        norm_eps: epsilon of the per-head output RMSNorm.
        chunk_size: chunk length of the chunk-parallel op.
        backend: form of the op, one of ``ops.gated_delta.BACKENDS`` ("auto", "reference", "naive", "triton").
        buffer_dtype: "auto" / "fp32" / "bf16", the chunk kernels' buffer precision (``GatedDeltaConfig``); a suite
            pins it through ``mixer_options.gdn.buffer_dtype`` so its runs keep training the same kernel.
        conv_backend: form of the short convolutions on q, k, v (``ShortConvolution``'s backend): "auto"
            (default: "triton" for CUDA inputs, else "reference"), "reference", "triton" (``ops/causal_conv``)
            or "fla" (fla's kernel, optional).
        norm_backend: form of the output RMSNorm and swish gate (``ops.gated_norm``'s backend, with ``use_gate``):
            "auto" (default: "triton", one kernel each way, for CUDA inputs outside ``torch.compile``, else
            "reference"; ``ops.gated_norm.auto_takes_triton``), "reference" or "triton".
    """

    packed_states = True

    def __init__(
        self,
        hidden_size: int,
        num_heads: int = 6,
        head_dim: int = 128,
        expand_v: float = 2.0,
        conv_size: int = 4,
        use_gate: bool = True,
        norm_eps: float = 1e-6,
        chunk_size: int = 64,
        backend: str = "auto",
        buffer_dtype: str = "auto",
        conv_backend: str = "auto",
        norm_backend: str = "auto",
    ) -> None:
        super().__init__()
        config_with_buffers(buffer_dtype)  # ValueError naming buffer_dtype and its allowed values
        if norm_backend not in NORM_BACKENDS:
            raise ValueError(f"norm_backend must be one of {', '.join(map(repr, NORM_BACKENDS))}, got {norm_backend!r}")
        self.norm_backend = norm_backend
        head_v_dim = head_dim * expand_v
        if head_v_dim != int(head_v_dim):
            raise ValueError(f"head_dim * expand_v must be an integer, got {head_dim} * {expand_v}")
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, head_dim
        self.head_v_dim = int(head_v_dim)
        self.chunk_size, self.backend = chunk_size, backend
        self.buffer_dtype = buffer_dtype  # the Triton kernels' buffer precision (ops/gated_delta/triton/config.py)
        key_dim, value_dim = num_heads * head_dim, num_heads * self.head_v_dim
        self.q_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, value_dim, bias=False)
        self.a_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.g_proj = nn.Linear(hidden_size, value_dim, bias=False) if use_gate else None
        self.convs = nn.ModuleDict({
            "q": ShortConvolution(key_dim, conv_size, "silu", conv_backend),
            "k": ShortConvolution(key_dim, conv_size, "silu", conv_backend),
            "v": ShortConvolution(value_dim, conv_size, "silu", conv_backend),
        })
        self.A_log = nn.Parameter(torch.empty(num_heads))
        self.dt_bias = nn.Parameter(torch.empty(num_heads))
        self.reset_parameters()
        self.o_norm = RMSNorm(self.head_v_dim, eps=norm_eps)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)

    def reset_parameters(self) -> None:
        init_decay_params(self.A_log, self.dt_bias)

    def init_state(self, batch_size: int, device=None, dtype=None) -> GDNState:
        dtype = dtype or self.o_proj.weight.dtype
        sdt = torch.float64 if dtype == torch.float64 else torch.float32
        S = torch.zeros(batch_size, self.num_heads, self.head_dim, self.head_v_dim, device=device, dtype=sdt)
        conv = {n: c.init_state(batch_size, device=device, dtype=dtype) for n, c in self.convs.items()}
        return GDNState(S=S, conv=conv)

    def state_size(self, seq_len: int) -> int:
        return self.num_heads * self.head_dim * self.head_v_dim

    def _linears(self) -> dict[str, nn.Linear]:
        """The projections of x by name, the convolved q, k, v first (the order of the fused decode inputs)."""
        projs = {"q": self.q_proj, "k": self.k_proj, "v": self.v_proj, "a": self.a_proj, "b": self.b_proj}
        return projs | ({"g": self.g_proj} if self.g_proj is not None else {})

    def _project(self, x: torch.Tensor, conv: dict[str, torch.Tensor] | None, keep: bool,
                 cu_seqlens: torch.Tensor | None = None):
        """x [B, T, hidden] -> q, k [B, T, H, d_k], v [B, T, H, d_v], β, g [B, T, H] (float32, float64 for float64
        inputs), the gate W_g x (None without use_gate), new conv states (empty unless keep) from `conv` (None: zeros);
        cu_seqlens: packed documents. One product, one convolution over q|k|v (``project_inputs``)."""
        b, t, _ = x.shape
        z, new_conv = project_inputs(x, self._linears(), self.convs, conv, keep, cu_seqlens=cu_seqlens)
        q = z["q"].view(b, t, self.num_heads, self.head_dim)
        k = z["k"].view(b, t, self.num_heads, self.head_dim)
        v = z["v"].view(b, t, self.num_heads, self.head_v_dim)
        beta = torch.sigmoid(z["b"].float() if x.dtype != torch.float64 else z["b"])
        g = gdn_decay(z["a"], self.A_log, self.dt_bias)
        return q, k, v, beta, g, z.get("g"), new_conv

    def _output(self, o: torch.Tensor, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """o [B, T, H, d_v] -> [B, T, hidden]: head RMSNorm, the optional swish gate (g_proj(x), or `gate`
        [B, T, H·d_v] when the caller projected it already), W_o."""
        b, t, _ = x.shape
        if self.g_proj is None:
            return self.o_proj(self.o_norm(o).reshape(b, t, -1))
        gate = (self.g_proj(x) if gate is None else gate).view(b, t, self.num_heads, self.head_v_dim)
        o = gated_rms_norm(o, gate, self.o_norm.weight, self.o_norm.eps, backend=self.norm_backend)
        return self.o_proj(o.reshape(b, t, -1))

    def forward(self, x: torch.Tensor, state: GDNState | None = None, *, output_state: bool | None = None,
                cu_seqlens: torch.Tensor | None = None):
        check_hidden(x, self.hidden_size)
        keep = output_state if output_state is not None else state is not None
        t = x.shape[1]
        if cu_seqlens is not None:  # with keep: the final states per document are the rows of the decode state
            packed_positions(x, state, keep, cu_seqlens, type(self).__name__, packed_states=True)
            t = left_pad(cu_seqlens)[0] if keep else t  # the decode state's width (a host read: prefill only)
        q, k, v, beta, g, gate, new_conv = self._project(x, state.conv if state else None, keep, cu_seqlens)
        o, S = gated_delta(q, k, v, g, beta, chunk_size=self.chunk_size, initial_state=state.S if state else None,
                           output_final_state=keep, backend=self.backend, cu_seqlens=cu_seqlens,
                           buffer_dtype=self.buffer_dtype)
        y = self._output(o, x, gate)
        return y, (GDNState(S=S, conv=new_conv, offset=(state.offset if state else 0) + t) if keep else None)

    # ---------------------------------------------------------------------------------------------------- static
    def init_static_state(self, batch_size: int, max_len: int, device=None, dtype=None, *,
                          use_kernels: bool | None = None, cache_chunks: int | None = None) -> GDNStaticState:
        st = self.init_state(batch_size, device=device, dtype=dtype)
        names = ("q", "k", "v")
        inputs, views = fuse_inputs(list(self._linears().values()), [self.convs[n] for n in names],
                                    [st.conv[n] for n in names], st.S.device, st.conv["q"].dtype)
        return GDNStaticState(S=st.S, conv=dict(zip(names, views)), inputs=inputs,
                              use_kernels=resolve_use_kernels(use_kernels, "GatedDeltaNet.step", st.S.is_cuda))

    def load_static_state(self, static: GDNStaticState, state: GDNState) -> None:
        static.S.copy_(state.S)
        copy_conv_states(static.conv, state.conv)

    def step(self, x: torch.Tensor, static: GDNStaticState, pos: torch.Tensor,
             chunk_end: bool = False) -> torch.Tensor:
        """x [B, 1, hidden] -> [B, 1, hidden]; S and the conv states advanced in place (`gated_delta_step`). One
        GEMV for all input projections and one convolution over q|k|v (the fused weights of the static state)."""
        b, h = x.shape[0], self.num_heads
        z = static.inputs(x[:, 0])  # q, k, v (after their convolution), a, b(, g), each [B, ·]
        q, k, v = z[:3]
        beta = torch.sigmoid(z[4].float() if x.dtype != torch.float64 else z[4])
        g = gdn_decay(z[3], self.A_log, self.dt_bias)
        o = gated_delta_step(q.view(b, h, self.head_dim), k.view(b, h, self.head_dim),
                             v.view(b, h, self.head_v_dim), g, beta, static.S, static.use_kernels)
        return self._output(o[:, None], x, z[5][:, None] if self.g_proj is not None else None)
