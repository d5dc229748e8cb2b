"""Launch wrappers and the autograd Function of the Triton gated delta rule (see ``kernels.py`` for the math and
the packed-document (``cu_seqlens``) design: chunk-row buffers over a ``ChunkTable`` built once per call on the
device, no host sync, and saved for the backward)."""

from __future__ import annotations

import torch
import triton

from ...common.triton import interpreting
from ...common.varlen import ChunkTable, check_packed, chunk_table
from ..naive import validate_gated_delta_inputs
from . import kernels as _k
from .config import DEFAULT_CONFIG, GatedDeltaConfig
from .support import supported

__all__ = ["triton_gated_delta"]


LOW_PRECISION = (torch.bfloat16, torch.float16)
"""Activation dtypes for which ``buffer_dtype="auto"`` stores the forward's buffers in bf16."""


def _p2(x: int) -> int:
    return triton.next_power_of_2(max(int(x), 1))


class _Tiles:
    """The launch settings of one call: ``cfg``'s tile sizes capped by the head dims K, V, its launch options, and the
    buffer dtype (``cfg.buffer_dtype``; "auto" resolves from the activations' dtype ``act``); ``n_seq``: programs per
    value tile of the sequential state kernels (``_seq_grid``), which picks their tile width (``seq_wide_grid``)."""

    def __init__(self, K: int, V: int, cfg: GatedDeltaConfig, act: torch.dtype, n_seq: int) -> None:
        kp, vp = max(16, _p2(K)), max(16, _p2(V))
        self.BK = min(cfg.par_bk, kp)
        self.BV = min(cfg.par_bv, vp)
        self.BKF = kp  # full K extent of the state kernels
        # buffer_dtype: w, u, S_n, vn storage and the state / output kernels' dot operands (kernels.py docstring)
        self.bf16 = cfg.buffer_dtype == "bf16" or (cfg.buffer_dtype == "auto" and act in LOW_PRECISION)
        # wide state tiles with bf16 buffers only: the float32 state forward's 32-wide tile at K = 128 exceeds
        # sm_90's shared memory (GatedDeltaConfig.seq_wide_grid)
        wide = (self.bf16 and cfg.seq_wide_grid > 0
                and n_seq * triton.cdiv(V, cfg.seq_wide_bv) >= cfg.seq_wide_grid)
        self.BVS = min(cfg.seq_wide_bv if wide else cfg.seqf_bv, vp)
        self.BVB = min(cfg.seq_wide_bv if wide else cfg.seqb_bv, vp)
        self.BK2 = min(cfg.bwdk_bk, kp)
        self.BV2 = min(cfg.bwdk_bv, vp)
        self.BK3 = min(cfg.fin_bk, kp)
        self.BV3 = min(cfg.fin_bv, vp)
        self.NKT = triton.cdiv(K, self.BK2)
        interp = self.interp = interpreting()
        self.prec = "ieee" if interp else "tf32"
        self.par = dict(num_warps=cfg.par_warps, num_stages=cfg.par_stages)
        self.prep = dict(num_warps=cfg.par_warps, num_stages=cfg.prep_stages)
        self.seqf = dict(num_warps=cfg.seqf_warps, num_stages=cfg.seqf_stages)
        self.seqb = dict(num_warps=cfg.seqb_warps, TILE_SCALE=cfg.seqb_scale == "tile")
        self.bwdk = dict(num_warps=cfg.bwdk_warps, num_stages=cfg.bwdk_stages)
        self.fin = dict(num_warps=cfg.fin_warps, num_stages=cfg.fin_stages)
        self.buf = torch.bfloat16 if self.bf16 else torch.float32
        self.lowp = dict(BF16=self.bf16, UPCAST=interp)  # UPCAST: the interpreter's bf16 dot is wrong (no NumPy bf16)
        # the state backward's dots: bf16 operands only with seqb_dots="bf16" and bf16 buffers (an fp32 call stays fp32)
        # (and their own pipelining stages: GatedDeltaConfig's docstring says why the two launches differ)
        seqb_bf16 = self.bf16 and cfg.seqb_dots == "bf16"
        self.seqb.update(BF16=seqb_bf16, UPCAST=interp,
                         num_stages=cfg.seqb_stages_bf16 if seqb_bf16 else cfg.seqb_stages)
        # the state backward forms dvn_local, with its bf16 dots only (GatedDeltaConfig.local_dv)
        self.local_pd = cfg.local_dv == "state_bwd" and seqb_bf16
        # bf16 operands in bwd_k and dh stored bf16, with bf16 buffers only (GatedDeltaConfig.bwdk_dots)
        self.bwdk_bf16 = cfg.bwdk_dots == "bf16" and self.bf16
        self.bwdk.update(BF16=self.bwdk_bf16, UPCAST=interp)
        self.seqb.update(DH_BF16=self.bwdk_bf16)


def _seq_grid(B: int, H: int, vl: ChunkTable | None) -> int:
    """Programs (sequence, head) of the sequential state kernels: B·H, or N_docs·H for packed documents."""
    return (vl.n_docs if vl is not None else B) * H


def _vl_ptrs(vl: ChunkTable | None, unused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cu [N + 1], indices [NT, 2], offsets [N + 1]) of the table; ``unused`` three times when not packed."""
    return (vl.cu, vl.indices, vl.offsets) if vl is not None else (unused, unused, unused)


def _launch_fwd(q, k, v, g, beta, commit, S0, scale, use_l2, decay_uncommitted, C, need_final, config,
                vl: ChunkTable | None = None):
    """vl: the ``ChunkTable`` of packed documents (None when not packed); the buffers have its NT rows."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = vl.n_rows if vl is not None else triton.cdiv(T, C)  # chunk rows (real chunks in document order, then spare)
    NM = commit.shape[1] if commit is not None else N  # rows of the commit mask (the true Nc when packed)
    Tp = N * C
    n_seq = _seq_grid(B, H, vl)
    cfg = _Tiles(K, V, config, q.dtype, n_seq)
    dev, f32 = q.device, torch.float32
    G = config.empty(B, H, Tp, device=dev, dtype=f32)
    rq = config.empty_like(G)
    rk = config.empty_like(G)
    X = config.empty(B, H, N, C, C, device=dev, dtype=f32)
    w = config.empty(B, H, Tp, K, device=dev, dtype=cfg.buf)
    u = config.empty(B, H, Tp, V, device=dev, dtype=cfg.buf)
    A_scratch = config.empty(B, H, N, C, C, device=dev, dtype=f32)
    varlen = vl is not None
    cu, ci, co = _vl_ptrs(vl, G)  # unused pointers when not packed
    _k._prep_kernel[(N, B * H)](
        q, k, v, g, beta, G, rq, rk, X, A_scratch, w, u, cu, ci, T, H, N, Tp,
        K=K, V=V, C=C, BK=cfg.BK, BV=cfg.BV, USE_L2=use_l2, EPS=1e-6, PREC=cfg.prec, VARLEN=varlen, **cfg.lowp,
        **cfg.prep,
    )
    del A_scratch
    states = config.empty(B, H, N, K, V, device=dev, dtype=cfg.buf)
    vn = config.empty(B, H, Tp, V, device=dev, dtype=cfg.buf)
    Sfin = config.empty(n_seq // H, H, K, V, device=dev, dtype=f32) if need_final else states
    _k._state_fwd_kernel[(triton.cdiv(V, cfg.BVS), n_seq)](
        k, w, u, G, rk, commit if commit is not None else G, S0 if S0 is not None else G, states, vn, Sfin,
        cu, ci, co, T, H, N, NM, Tp,
        K=K, V=V, C=C, BKF=cfg.BKF, BV=cfg.BVS, HAS_COMMIT=commit is not None, HAS_S0=S0 is not None,
        STORE_FINAL=need_final, DECAY_UNCOMMITTED=decay_uncommitted, PREC=cfg.prec, WHILE_LOOP=cfg.interp,
        VARLEN=varlen, **cfg.lowp, **cfg.seqf,
    )
    o = config.empty(B, T, H, V, device=dev, dtype=v.dtype)
    _k._output_kernel[(triton.cdiv(V, cfg.BV), N, B * H)](
        q, k, G, rq, rk, states, vn, o, cu, ci, T, H, N, Tp,
        K=K, V=V, C=C, BK=cfg.BK, BV=cfg.BV, PREC=cfg.prec, SCALE=scale, VARLEN=varlen, **cfg.lowp, **cfg.par,
    )
    saved = (G, rq, rk, X, w, states, vn)
    return o, (Sfin if need_final else None), saved


def _launch_bwd(q, k, v, beta, commit, saved, do, dSfin, scale, use_l2, decay_uncommitted, C, config,
                vl: ChunkTable | None = None):
    G, rq, rk, X, w, states, vn = saved
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = vl.n_rows if vl is not None else triton.cdiv(T, C)
    NM = commit.shape[1] if commit is not None else N
    Tp = N * C
    n_seq = _seq_grid(B, H, vl)
    cfg = _Tiles(K, V, config, q.dtype, n_seq)
    dev, f32 = q.device, torch.float32
    BH = B * H
    has_commit = commit is not None
    m_arg = commit if has_commit else G
    varlen = vl is not None
    cu, ci, co = _vl_ptrs(vl, G)

    # dvn_local [B, H, Tp, V], or scale (P⊙D)ᵀ [B, H, N, C, C] in the buffer dtype for the state backward to form it
    dvl = (config.empty(B, H, N, C, C, device=dev, dtype=cfg.buf) if cfg.local_pd
           else config.empty(B, H, Tp, V, device=dev, dtype=f32))
    dPD = config.empty(B, H, N, C, C, device=dev, dtype=f32)
    dGloc = config.empty(B, H, Tp, device=dev, dtype=f32)
    _k._bwd_local_kernel[(N, BH)](
        q, k, do, G, rq, rk, vn, dvl, dPD, dGloc, cu, ci, T, H, N, Tp,
        K=K, V=V, C=C, BK=cfg.BK, BV=cfg.BV, PREC=cfg.prec, SCALE=scale, VARLEN=varlen, LOCAL_PD=cfg.local_pd,
        **cfg.par,
    )
    dh = config.empty(B, H, N, K, V, device=dev, dtype=torch.bfloat16 if cfg.bwdk_bf16 else f32)
    dvn = config.empty(B, H, Tp, V, device=dev, dtype=f32)
    dS0 = config.empty(n_seq // H, H, K, V, device=dev, dtype=f32)
    _k._state_bwd_kernel[(triton.cdiv(V, cfg.BVB), n_seq)](
        q, k, w, do, dvl, G, rq, rk, m_arg, dSfin if dSfin is not None else G, dh, dvn, dS0, cu, ci, co,
        T, H, N, NM, Tp,
        K=K, V=V, C=C, BKF=cfg.BKF, BV=cfg.BVB, HAS_COMMIT=has_commit, HAS_DSFIN=dSfin is not None,
        DECAY_UNCOMMITTED=decay_uncommitted, PREC=cfg.prec, WHILE_LOOP=cfg.interp, SCALE=scale, VARLEN=varlen,
        LOCAL_PD=cfg.local_pd, **cfg.seqb,
    )
    del dvl
    NKT = cfg.NKT
    dqh = config.empty(B, H, Tp, K, device=dev, dtype=f32)
    dkh = config.empty_like(dqh)
    dGp = config.empty(NKT, BH, Tp, device=dev, dtype=f32)
    dbp = config.empty_like(dGp)
    dXp = config.empty(NKT, BH, N, C, C, device=dev, dtype=f32)
    scp = config.empty(NKT, BH, N, 2, device=dev, dtype=f32)
    _k._bwd_k_kernel[(NKT, N, BH)](
        q, k, do, beta, G, rq, rk, m_arg, X, states, dh, vn, dvn, dPD,
        dqh, dkh, dGp, dbp, dXp, scp, cu, ci,
        T, H, N, NM, Tp, BH,
        K=K, V=V, C=C, BK=cfg.BK2, BV=cfg.BV2, HAS_COMMIT=has_commit, PREC=cfg.prec, SCALE=scale, VARLEN=varlen,
        **cfg.bwdk,
    )
    del dh, dPD
    dq = config.empty_like(q)
    dk = config.empty_like(k)
    dv = config.empty_like(v)
    dg = config.empty(B, T, H, device=dev, dtype=f32)
    dbeta = config.empty(B, T, H, device=dev, dtype=f32)
    dm = config.empty(B, NM, H, device=dev, dtype=f32) if has_commit else None
    _k._bwd_finish_kernel[(N, BH)](
        q, k, v, beta, G, rq, rk, m_arg, X, dvn,
        dqh, dkh, dGloc, dGp, dbp, dXp, scp,
        dq, dk, dv, dg, dbeta, dm if dm is not None else dg, cu, ci,
        T, H, N, NM, Tp, BH,
        K=K, V=V, C=C, BK=cfg.BK3, BV=cfg.BV3, NKT=NKT, HAS_COMMIT=has_commit,
        DECAY_UNCOMMITTED=decay_uncommitted, USE_L2=use_l2, PREC=cfg.prec, VARLEN=varlen, **cfg.fin,
    )
    return dq, dk, dv, dg, dbeta, dm, dS0


class _TritonGatedDelta(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, commit, S0, scale, use_l2, decay_uncommitted, C, need_final, config, cu, co, ci):
        vl = ChunkTable(cu, co, ci, C) if cu is not None else None  # the three tensors of the call's chunk table
        commit_f = commit.float().contiguous() if commit is not None else None
        o, Sfin, saved = _launch_fwd(q, k, v, g, beta, commit_f, S0, scale, use_l2, decay_uncommitted, C, need_final,
                                     config, vl)
        ctx.save_for_backward(q, k, v, beta, commit_f, cu, co, ci, *saved)  # the chunk table: reused by the backward
        ctx.cfg = (scale, use_l2, decay_uncommitted, C, config)
        ctx.dtypes = (g.dtype, beta.dtype, commit.dtype if commit is not None else None,
                      S0.dtype if S0 is not None else None)
        if Sfin is None:
            return o
        return o, Sfin

    @staticmethod
    def backward(ctx, do, dSfin=None):
        q, k, v, beta, commit_f, cu, co, ci, *saved = ctx.saved_tensors
        scale, use_l2, decay_uncommitted, C, config = ctx.cfg
        vl = ChunkTable(cu, co, ci, C) if cu is not None else None
        g_dt, b_dt, m_dt, s_dt = ctx.dtypes
        dq, dk, dv, dg, dbeta, dm, dS0 = _launch_bwd(
            q, k, v, beta, commit_f, tuple(saved), do.contiguous(),
            dSfin.contiguous() if dSfin is not None else None, scale, use_l2, decay_uncommitted, C, config, vl,
        )
        return (dq, dk, dv, dg.to(g_dt), dbeta.to(b_dt), dm.to(m_dt) if m_dt is not None else None,
                dS0.to(s_dt) if s_dt is not None else None, None, None, None, None, None, None, None, None, None)


def triton_gated_delta(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    commit: torch.Tensor | None = None,
    chunk_size: int = 64,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm: bool = True,
    decay_uncommitted: bool = True,
    config: GatedDeltaConfig = DEFAULT_CONFIG,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Triton gated delta rule with per-chunk commit mask; same contract as ``naive_gated_delta``.

    Shapes: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]``; commit ``[B, ceil(T/C), H]``;
    initial_state ``[B, H, K, V]``. Returns ``(o [B, T, H, V] in v.dtype, final_state float32 or None)``.
    ``cu_seqlens [N + 1]``: packed documents (B == 1, ``ops/common/varlen.py``): commit ``[1, Nc, H]`` with
    ``Nc = Σ ceil(len_i / C)``, initial_state and final_state ``[N, H, K, V]``. No host sync: the ``ChunkTable`` is
    built on the device (``varlen.chunk_table``); a device ``cu_seqlens`` is checked for dtype and shape only and
    commit for Nc within its bounds (``varlen.check_packed``), a CPU one fully.
    Activations may be bf16/fp16/fp32; all state and gate math runs in fp32. Differentiable in every input,
    including ``commit`` (dm_n = ⟨dS_end(n), ΔS_n⟩, plus (Γ_n - 1)⟨dS_end(n), S_start(n)⟩ when not
    ``decay_uncommitted``) and ``initial_state``. ``config``: the launch settings (``config.py``).
    """
    if cu_seqlens is None:
        validate_gated_delta_inputs(q, k, v, g, beta, commit, chunk_size, initial_state)
    else:
        validate_gated_delta_inputs(q, k, v, g, beta, None, chunk_size, None)
        n_docs = check_packed(cu_seqlens, q, chunk_size, {"commit": commit}, initial_state)
        _, _, H, K = q.shape
        V = v.shape[-1]
        if commit is not None and (commit.dim() != 3 or commit.shape[2] != H):
            raise ValueError(f"commit must be [1, Nc, H] = {(1, commit.shape[1], H)} with cu_seqlens, "
                             f"got {tuple(commit.shape)}")
        if initial_state is not None and tuple(initial_state.shape) != (n_docs, H, K, V):
            raise ValueError(f"initial_state must be [N, H, K, V] = {(n_docs, H, K, V)} with cu_seqlens, "
                             f"got {tuple(initial_state.shape)}")
    if not supported(q, v, chunk_size):
        raise ValueError("triton_gated_delta: unsupported inputs (need CUDA or TRITON_INTERPRET=1, not float64, "
                         "chunk_size in {16, 32, 64, 128}, K <= 256, K <= 32 at chunk 128)")
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else float(scale)
    if T == 0:
        o = v.new_zeros(B, 0, H, V)
        if not output_final_state:
            return o, None
        S = (initial_state.float().clone() if initial_state is not None
             else torch.zeros(B, H, K, V, device=q.device, dtype=torch.float32))
        return o, S
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    vl = chunk_table(cu_seqlens, T, chunk_size, q.device) if cu_seqlens is not None else None  # device ops only
    S0 = initial_state.contiguous() if initial_state is not None else None
    args = (q, k, v, g, beta, commit, S0)
    need_grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in args)
    if need_grad:
        tabs = (vl.cu, vl.offsets, vl.indices) if vl is not None else (None, None, None)
        out = _TritonGatedDelta.apply(q, k, v, g, beta, commit, S0, scale, use_qk_l2norm, decay_uncommitted,
                                      chunk_size, output_final_state, config, *tabs)
        if output_final_state:
            return out[0], out[1]
        return out, None
    commit_f = commit.float().contiguous() if commit is not None else None
    o, Sfin, _ = _launch_fwd(q, k, v, g, beta, commit_f, S0, scale, use_qk_l2norm, decay_uncommitted, chunk_size,
                             output_final_state, config, vl)
    return o, Sfin

