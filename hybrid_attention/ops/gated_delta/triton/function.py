"""Launch wrappers and the autograd Function of the Triton gated delta rule (see ``kernels.py`` for the math)."""

from __future__ import annotations

import torch
import triton

from ...common.triton import interpreting
from ..naive import validate_gated_delta_inputs
from . import kernels as _k
from .support import supported

__all__ = ["triton_gated_delta", "LAUNCH", "POISON"]


POISON = False  # tests / benchmarks: fill every kernel-written buffer with NaN first (unwritten elements show up)


def _empty(*shape, device, dtype) -> torch.Tensor:
    if POISON:
        return torch.full(shape, float("nan"), device=device, dtype=dtype)
    return torch.empty(*shape, device=device, dtype=dtype)


def _empty_like(x: torch.Tensor) -> torch.Tensor:
    return _empty(*x.shape, device=x.device, dtype=x.dtype)


def _p2(x: int) -> int:
    return triton.next_power_of_2(max(int(x), 1))


# Launch configuration on the GPU (tile sizes are capped by the head dims). Chosen from sm_90 compiles on the CPU
# machine (ptxas -v: no or small spills at 8 warps); the benchmark may override entries to compare variants.
LAUNCH = {
    "par_bk": 64, "par_bv": 64, "par_warps": 8, "par_stages": 1,  # prep, output, bwd_local
    # state_fwd (grid: V / seqf_bv x B*H). H200: 16/4 beat 32/8 and 64/8; 16 with 8 warps hit an illegal memory
    # access in run 2 (a codegen issue of that tile/warp combination, not a kernel indexing bug): do not use it.
    "seqf_bv": 16, "seqf_warps": 4, "seqf_stages": 1,
    "seqb_bv": 16, "seqb_warps": 8, "seqb_stages": 1,  # state_bwd
    "bwdk_bk": 64, "bwdk_bv": 32, "bwdk_warps": 8, "bwdk_stages": 1,
    "fin_bk": 32, "fin_bv": 32, "fin_warps": 8, "fin_stages": 1,
}


class _Cfg:
    """Tile sizes and launch options (one fixed configuration; no autotuning so the interpreter runs it as is)."""

    def __init__(self, K: int, V: int, C: int) -> None:
        L = LAUNCH
        kp, vp = max(16, _p2(K)), max(16, _p2(V))
        self.BK = min(L["par_bk"], kp)
        self.BV = min(L["par_bv"], vp)
        self.BKF = kp  # full K extent of the state kernels
        self.BVS = min(L["seqf_bv"], vp)
        self.BVB = min(L["seqb_bv"], vp)
        self.BK2 = min(L["bwdk_bk"], kp)
        self.BV2 = min(L["bwdk_bv"], vp)
        self.BK3 = min(L["fin_bk"], kp)
        self.BV3 = min(L["fin_bv"], vp)
        self.NKT = triton.cdiv(K, self.BK2)
        interp = self.interp = interpreting()
        self.prec = "ieee" if interp else "tf32"
        self.par = dict(num_warps=L["par_warps"], num_stages=L["par_stages"])
        self.seqf = dict(num_warps=L["seqf_warps"], num_stages=L["seqf_stages"])
        self.seqb = dict(num_warps=L["seqb_warps"], num_stages=L["seqb_stages"])
        self.bwdk = dict(num_warps=L["bwdk_warps"], num_stages=L["bwdk_stages"])
        self.fin = dict(num_warps=L["fin_warps"], num_stages=L["fin_stages"])


def _launch_fwd(q, k, v, g, beta, commit, S0, scale, use_l2, decay_uncommitted, C, need_final):
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = triton.cdiv(T, C)
    Tp = N * C
    cfg = _Cfg(K, V, C)
    dev, f32 = q.device, torch.float32
    G = _empty(B, H, Tp, device=dev, dtype=f32)
    rq = _empty_like(G)
    rk = _empty_like(G)
    X = _empty(B, H, N, C, C, device=dev, dtype=f32)
    w = _empty(B, H, Tp, K, device=dev, dtype=f32)
    u = _empty(B, H, Tp, V, device=dev, dtype=f32)
    A_scratch = _empty(B, H, N, C, C, device=dev, dtype=f32)
    _k._prep_kernel[(N, B * H)](
        q, k, v, g, beta, G, rq, rk, X, A_scratch, w, u, T, H, N, Tp,
        K=K, V=V, C=C, BK=cfg.BK, BV=cfg.BV, USE_L2=use_l2, EPS=1e-6, PREC=cfg.prec, **cfg.par,
    )
    del A_scratch
    states = _empty(B, H, N, K, V, device=dev, dtype=f32)
    vn = _empty(B, H, Tp, V, device=dev, dtype=f32)
    Sfin = _empty(B, H, K, V, device=dev, dtype=f32) if need_final else states
    _k._state_fwd_kernel[(triton.cdiv(V, cfg.BVS), B * H)](
        k, w, u, G, rk, commit if commit is not None else G, S0 if S0 is not None else G, states, vn, Sfin,
        T, H, N, Tp,
        K=K, V=V, C=C, BKF=cfg.BKF, BV=cfg.BVS, HAS_COMMIT=commit is not None, HAS_S0=S0 is not None,
        STORE_FINAL=need_final, DECAY_UNCOMMITTED=decay_uncommitted, PREC=cfg.prec, WHILE_LOOP=cfg.interp,
        **cfg.seqf,
    )
    o = _empty(B, T, H, V, device=dev, dtype=v.dtype)
    _k._output_kernel[(triton.cdiv(V, cfg.BV), N, B * H)](
        q, k, G, rq, rk, states, vn, o, T, H, N, Tp,
        K=K, V=V, C=C, BK=cfg.BK, BV=cfg.BV, PREC=cfg.prec, SCALE=scale, **cfg.par,
    )
    saved = (G, rq, rk, X, w, states, vn)
    return o, (Sfin if need_final else None), saved


def _launch_bwd(q, k, v, beta, commit, saved, do, dSfin, scale, use_l2, decay_uncommitted, C):
    G, rq, rk, X, w, states, vn = saved
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = triton.cdiv(T, C)
    Tp = N * C
    cfg = _Cfg(K, V, C)
    dev, f32 = q.device, torch.float32
    BH = B * H
    has_commit = commit is not None
    m_arg = commit if has_commit else G

    dvl = _empty(B, H, Tp, V, device=dev, dtype=f32)
    dPD = _empty(B, H, N, C, C, device=dev, dtype=f32)
    dGloc = _empty(B, H, Tp, device=dev, dtype=f32)
    _k._bwd_local_kernel[(N, BH)](
        q, k, do, G, rq, rk, vn, dvl, dPD, dGloc, T, H, N, Tp,
        K=K, V=V, C=C, BK=cfg.BK, BV=cfg.BV, PREC=cfg.prec, SCALE=scale, **cfg.par,
    )
    dh = _empty(B, H, N, K, V, device=dev, dtype=f32)
    dvn = _empty(B, H, Tp, V, device=dev, dtype=f32)
    dS0 = _empty(B, H, K, V, device=dev, dtype=f32)
    _k._state_bwd_kernel[(triton.cdiv(V, cfg.BVB), BH)](
        q, k, w, do, dvl, G, rq, rk, m_arg, dSfin if dSfin is not None else G, dh, dvn, dS0,
        T, H, N, Tp,
        K=K, V=V, C=C, BKF=cfg.BKF, BV=cfg.BVB, HAS_COMMIT=has_commit, HAS_DSFIN=dSfin is not None,
        DECAY_UNCOMMITTED=decay_uncommitted, PREC=cfg.prec, WHILE_LOOP=cfg.interp, SCALE=scale, **cfg.seqb,
    )
    del dvl
    NKT = cfg.NKT
    dqh = _empty(B, H, Tp, K, device=dev, dtype=f32)
    dkh = _empty_like(dqh)
    dGp = _empty(NKT, BH, Tp, device=dev, dtype=f32)
    dbp = _empty_like(dGp)
    dXp = _empty(NKT, BH, N, C, C, device=dev, dtype=f32)
    scp = _empty(NKT, BH, N, 2, device=dev, dtype=f32)
    _k._bwd_k_kernel[(NKT, N, BH)](
        q, k, do, beta, G, rq, rk, m_arg, X, states, dh, vn, dvn, dPD,
        dqh, dkh, dGp, dbp, dXp, scp,
        T, H, N, Tp, BH,
        K=K, V=V, C=C, BK=cfg.BK2, BV=cfg.BV2, HAS_COMMIT=has_commit, PREC=cfg.prec, SCALE=scale, **cfg.bwdk,
    )
    del dh, dPD
    dq = _empty_like(q)
    dk = _empty_like(k)
    dv = _empty_like(v)
    dg = _empty(B, T, H, device=dev, dtype=f32)
    dbeta = _empty(B, T, H, device=dev, dtype=f32)
    dm = _empty(B, N, H, device=dev, dtype=f32) if has_commit else None
    _k._bwd_finish_kernel[(N, BH)](
        q, k, v, beta, G, rq, rk, m_arg, X, dvn,
        dqh, dkh, dGloc, dGp, dbp, dXp, scp,
        dq, dk, dv, dg, dbeta, dm if dm is not None else dg,
        T, H, N, Tp, BH,
        K=K, V=V, C=C, BK=cfg.BK3, BV=cfg.BV3, NKT=NKT, HAS_COMMIT=has_commit,
        DECAY_UNCOMMITTED=decay_uncommitted, USE_L2=use_l2, PREC=cfg.prec, **cfg.fin,
    )
    return dq, dk, dv, dg, dbeta, dm, dS0


class _TritonGatedDelta(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, commit, S0, scale, use_l2, decay_uncommitted, C, need_final):
        commit_f = commit.float().contiguous() if commit is not None else None
        o, Sfin, saved = _launch_fwd(q, k, v, g, beta, commit_f, S0, scale, use_l2, decay_uncommitted, C, need_final)
        ctx.save_for_backward(q, k, v, beta, commit_f, *saved)
        ctx.cfg = (scale, use_l2, decay_uncommitted, C)
        ctx.dtypes = (g.dtype, beta.dtype, commit.dtype if commit is not None else None,
                      S0.dtype if S0 is not None else None)
        if Sfin is None:
            return o
        return o, Sfin

    @staticmethod
    def backward(ctx, do, dSfin=None):
        q, k, v, beta, commit_f, *saved = ctx.saved_tensors
        scale, use_l2, decay_uncommitted, C = ctx.cfg
        g_dt, b_dt, m_dt, s_dt = ctx.dtypes
        dq, dk, dv, dg, dbeta, dm, dS0 = _launch_bwd(
            q, k, v, beta, commit_f, tuple(saved), do.contiguous(),
            dSfin.contiguous() if dSfin is not None else None, scale, use_l2, decay_uncommitted, C,
        )
        return (dq, dk, dv, dg.to(g_dt), dbeta.to(b_dt), dm.to(m_dt) if m_dt is not None else None,
                dS0.to(s_dt) if s_dt is not None else None, None, None, None, None, None)


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Triton gated delta rule with per-chunk commit mask; same contract as ``naive_gated_delta``.

    Shapes: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]``; commit ``[B, ceil(T/C), H]``;
    initial_state ``[B, H, K, V]``. Returns ``(o [B, T, H, V] in v.dtype, final_state float32 or None)``.
    Activations may be bf16/fp16/fp32; all state and gate math runs in fp32. Differentiable in every input,
    including ``commit`` (dm_n = ⟨dS_end(n), ΔS_n⟩, plus (Γ_n - 1)⟨dS_end(n), S_start(n)⟩ when not
    ``decay_uncommitted``) and ``initial_state``.
    """
    validate_gated_delta_inputs(q, k, v, g, beta, commit, chunk_size, initial_state)
    if not supported(q, v, chunk_size):
        raise ValueError("triton_gated_delta: unsupported inputs (need CUDA or TRITON_INTERPRET=1, not float64, "
                         "chunk_size in {16, 32, 64, 128}, K <= 256)")
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
    S0 = initial_state.contiguous() if initial_state is not None else None
    args = (q, k, v, g, beta, commit, S0)
    need_grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in args)
    if need_grad:
        out = _TritonGatedDelta.apply(q, k, v, g, beta, commit, S0, scale, use_qk_l2norm, decay_uncommitted,
                                      chunk_size, output_final_state)
        if output_final_state:
            return out[0], out[1]
        return out, None
    commit_f = commit.float().contiguous() if commit is not None else None
    o, Sfin, _ = _launch_fwd(q, k, v, g, beta, commit_f, S0, scale, use_qk_l2norm, decay_uncommitted, chunk_size,
                             output_final_state)
    return o, Sfin

