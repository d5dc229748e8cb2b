"""Host side of the Triton bilinear S4D core (``triton_s4d_bilinear``, which gives the chunk math and pipeline):
launches, the autograd rule and the ``torch.library`` registration (``hybrid_attention::s4d_bilinear_fwd`` / ``_bwd``).
"""

from __future__ import annotations

import torch
import triton

from ...common.planar import Planar, cexp_scaled, cmul
from ...common.ssm import prepare_planar_params, validate_chunk_size
from ...common.triton.eager import eager_function
from ...common.triton.hooks import NO_HOOKS, LaunchHooks
from ...common.triton.ssm_scan import (
    check_packed_state,
    op_table,
    planar,
    pow2_block,
    power_table,
    state_bwd,
    states_fwd,
)
from ...common.varlen import ChunkTable, check_cu_seqlens, chunk_table
from ..naive import validate_s4d_bilinear_inputs
from . import kernels as K
from .config import DEFAULT_CONFIG, S4DBilinearConfig

__all__ = ["triton_s4d_bilinear", "kernel_chunk", "impulse_table", "tab_partial_bytes"]


def kernel_chunk(chunk_size: int, cfg: S4DBilinearConfig = DEFAULT_CONFIG) -> int:
    """Kernel chunk length: chunk_size if it is a power of two in [16, 128], else 64, capped at ``max_chunk`` (the
    result does not depend on it beyond rounding)."""
    return min(chunk_size if chunk_size in (16, 32, 64, 128) else 64, cfg.max_chunk)


def _jt(R: int, cfg: S4DBilinearConfig) -> int:
    return min(cfg.JT, pow2_block(R))


def _tab_width(M: int, BT: int) -> int:
    """Floats per table-gradient partial slot: dC [2, M, M], dKern [2, M, BT], d log λ [2, M]."""
    return 2 * M * M + 2 * M * BT + 2 * M


def tab_partial_bytes(Bsz: int, T: int, H: int, R: int, M: int, chunk_size: int = 64,
                      cfg: S4DBilinearConfig = DEFAULT_CONFIG) -> int:
    """Size of the backward's table-gradient partial buffer for dense inputs of this shape (float32).

    The table gradients (dC, d log λ, dKern) are float32 sums over batch rows, chunks and channel tiles of per-program
    partials (no atomics): the summation order is fixed by the launch shape, so they are the same from run to run. The
    partial buffer holds H·B·NT·⌈R/JT⌉ slots of 2M² + 2M·BT + 2M floats, i.e. (2M² + 2M·BT + 2M)·4 B·⌈R/JT⌉/BT per
    token and head: 3.1 KB at M = R = 64, BT = JT = 32, so 0.41 GB at B=32, T=512, H=8 and 0.81 GB at B=16, T=2048
    (transient, freed when the backward returns).

    Memory: like the Interdomain op, the chunk-boundary states live only inside one op call (recomputed in the
    backward); autograd saves the inputs only; no per-token state is materialised (the table-gradient partials above
    are the backward's largest transient buffer).
    """
    BT = kernel_chunk(chunk_size, cfg)
    return 4 * H * Bsz * triton.cdiv(T, BT) * triton.cdiv(R, _jt(R, cfg)) * _tab_width(M, BT)


def _states(a, b, ll, bb, init, BT: int, need_final: bool, cfg: S4DBilinearConfig, hooks: LaunchHooks,
            vl: ChunkTable | None = None):
    """Chunk-entering states [B·H, NT, 2, M, 2R] (and the final state) by the shared state scan (packed: ``vl``)."""
    P = power_table(ll, BT)
    states, final = states_fwd(a, b, P, bb, init, BT, True, need_final, cfg, hooks, vl)
    return P, states, final


def _fwd_impl(
    a, b, ll, bb, cc, kk, init, cu, co, ci, chunk_size: int, need_final: bool, *,
    cfg: S4DBilinearConfig = DEFAULT_CONFIG, hooks: LaunchHooks = NO_HOOKS,
):
    Bsz, T, H, R = a.shape
    M = ll.shape[-1]
    BT = kk.shape[-1]
    vl = op_table(T, cu, co, ci, BT)
    o = cfg.empty(Bsz, T, H, R, device=a.device, dtype=a.dtype)
    if T == 0:
        fin = init.clone() if init is not None else a.new_zeros(Bsz, H, 2, M, 2 * R, dtype=torch.float32)
        return o, (fin if need_final else a.new_empty(0, dtype=torch.float32))
    P, states, final = _states(a, b, ll, bb, init, BT, need_final, cfg, hooks, vl)
    NT = triton.cdiv(T, BT) if vl is None else vl.n_rows
    JT = _jt(R, cfg)
    cu_p, ci_p = (a, a) if vl is None else (vl.cu, vl.indices)
    K._readout_fwd[(NT, Bsz * H, triton.cdiv(R, JT))](
        a, b, o, P, cc, kk, states, cu_p, ci_p, T, H, R, NT, IS_VARLEN=vl is not None,
        M=M, BT=BT, BM=pow2_block(M), JT=JT, DOT_PREC=cfg.prec(), num_warps=cfg.warps_fwd, num_stages=cfg.stages,
    )  # fmt: skip
    n_seq = Bsz if vl is None else vl.n_docs
    fin = final.view(n_seq, H, 2, M, 2 * R) if need_final else a.new_empty(0, dtype=torch.float32)
    return o, fin


def _bwd_impl(
    a, b, ll, bb, cc, kk, init, cu, co, ci, do, dfinal, chunk_size: int, *,
    cfg: S4DBilinearConfig = DEFAULT_CONFIG, hooks: LaunchHooks = NO_HOOKS,
):
    Bsz, T, H, R = a.shape
    M = ll.shape[-1]
    BT = kk.shape[-1]
    NC = 2 * R
    dev = a.device
    f32 = torch.float32
    if T == 0:
        dinit = a.new_empty(0, dtype=f32)
        if init is not None:
            dinit = dfinal.clone() if dfinal is not None else torch.zeros_like(init)
        z = torch.zeros_like
        return z(a), z(b), z(ll), z(bb), z(cc), z(kk), dinit
    vl = op_table(T, cu, co, ci, BT)
    n_seq = Bsz if vl is None else vl.n_docs
    cu_p, ci_p = (a, a) if vl is None else (vl.cu, vl.indices)
    P, states, _ = _states(a, b, ll, bb, init, BT, False, cfg, hooks, vl)
    do = do.contiguous()
    NT = triton.cdiv(T, BT) if vl is None else vl.n_rows
    JT = _jt(R, cfg)
    da = cfg.empty(Bsz, T, H, R, device=dev)
    db = cfg.empty(Bsz, T, H, R, device=dev)
    dx = cfg.empty(Bsz * H, NT, 2, M, NC, device=dev)
    NJ = triton.cdiv(R, JT)
    # Table-gradient partials: one slot per (chunk, batch row, channel tile) program, grouped by head (the slot
    # layout beside the kernels in kernels.py), summed below by one reduction (memory: ``tab_partial_bytes``).
    tab = cfg.empty(H, Bsz * NT * NJ, _tab_width(M, BT), device=dev)
    for part in (1, 2) if cfg.bwd_split else (0,):
        K._readout_bwd[(NT, Bsz * H, NJ)](
            a, b, do, da, db, P, cc, kk, states, dx, tab, cu_p, ci_p, T, H, R, NT, IS_VARLEN=vl is not None,
            M=M, BT=BT, BM=pow2_block(M), JT=JT, DOT_PREC=cfg.prec(), PART=part, num_warps=cfg.warps_bwd,
            num_stages=cfg.stages,
        )  # fmt: skip
    tab = tab.sum(dim=1)  # [H, TAB_W]
    c_end = 2 * M * M
    # (clones: the op's outputs may not be views of one another)
    dC = tab[:, :c_end].reshape(H, 2, M, M).clone()
    dK = tab[:, c_end : c_end + 2 * M * BT].reshape(H, 2, M, BT).clone()
    dll = tab[:, c_end + 2 * M * BT :].reshape(H, 2, M)  # (a fresh tensor once the carry part is added below)
    # The shared state path (the common host helpers, with (k, v) = (a, b), following the shared ``fuse_dz``
    # setting): reverse adjoint scan over the chunk-boundary states (d initial_state, the λ^L-carry part of d log λ)
    # and the state-carry gradient, added to da / db in place, with the input-path parts of dB and d log λ.
    dinit = cfg.empty(n_seq * H, 2, M, NC, device=dev) if init is not None else a.new_empty(1, dtype=f32)
    dbb, dll_carry = state_bwd(a, b, da, db, P, bb, states, dx, dfinal, dinit, init is not None, BT, cfg, hooks, vl)
    del states
    dll = dll + dll_carry
    dinit_out = dinit.view(n_seq, H, 2, M, NC) if init is not None else a.new_empty(0, dtype=f32)
    return da.to(a.dtype), db.to(b.dtype), dll, dbb, dC, dK, dinit_out


# ----------------------------------------------------------------------------------------------------------------------
# torch.library registration (real planar tensors only at the boundary; fake impls for tracing)


@torch.library.custom_op("hybrid_attention::s4d_bilinear_fwd", mutates_args=())
def s4d_bilinear_fwd_op(
    a: torch.Tensor,
    b: torch.Tensor,
    ll: torch.Tensor,
    bb: torch.Tensor,
    cc: torch.Tensor,
    kk: torch.Tensor,
    init: torch.Tensor | None,
    cu: torch.Tensor | None,
    co: torch.Tensor | None,
    ci: torch.Tensor | None,
    chunk_size: int,
    need_final: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _fwd_impl(a, b, ll, bb, cc, kk, init, cu, co, ci, chunk_size, need_final)


@s4d_bilinear_fwd_op.register_fake
def _(a, b, ll, bb, cc, kk, init, cu, co, ci, chunk_size, need_final):
    Bsz, T, H, R = a.shape
    M = ll.shape[-1]
    n_seq = Bsz if cu is None else cu.shape[0] - 1
    o = a.new_empty(Bsz, T, H, R)
    fin = a.new_empty(n_seq, H, 2, M, 2 * R, dtype=torch.float32) if need_final else a.new_empty(0, dtype=torch.float32)
    return o, fin


@torch.library.custom_op("hybrid_attention::s4d_bilinear_bwd", mutates_args=())
def s4d_bilinear_bwd_op(
    a: torch.Tensor,
    b: torch.Tensor,
    ll: torch.Tensor,
    bb: torch.Tensor,
    cc: torch.Tensor,
    kk: torch.Tensor,
    init: torch.Tensor | None,
    cu: torch.Tensor | None,
    co: torch.Tensor | None,
    ci: torch.Tensor | None,
    do: torch.Tensor,
    dfinal: torch.Tensor | None,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd_impl(a, b, ll, bb, cc, kk, init, cu, co, ci, do, dfinal, chunk_size)


@s4d_bilinear_bwd_op.register_fake
def _(a, b, ll, bb, cc, kk, init, cu, co, ci, do, dfinal, chunk_size):
    dinit = torch.empty_like(init) if init is not None else a.new_empty(0, dtype=torch.float32)
    e = torch.empty_like
    return e(a), e(b), e(ll), e(bb), e(cc), e(kk), dinit


def _setup_context(ctx, inputs, output):
    a, b, ll, bb, cc, kk, init, cu, co, ci, chunk_size, need_final = inputs
    ctx.save_for_backward(a, b, ll, bb, cc, kk, init, cu, co, ci)
    ctx.chunk_size = chunk_size
    ctx.need_final = need_final
    ctx.has_init = init is not None


def _grads(ctx, do, dfinal, bwd):
    """Gradients of the forward op's inputs from (do, dfinal), computed by ``bwd`` (the registered backward op, or
    the eager path's ``_bwd_impl`` with its config)."""
    a, b, ll, bb, cc, kk, init, cu, co, ci = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(a)
    if not ctx.need_final or (dfinal is not None and dfinal.numel() == 0):
        dfinal = None
    da, db, dll, dbb, dcc, dkk, dinit = bwd(
        a, b, ll, bb, cc, kk, init if ctx.has_init else None, cu, co, ci, do, dfinal, ctx.chunk_size
    )
    return da, db, dll, dbb, dcc, dkk, (dinit if ctx.has_init else None), None, None, None, None, None


def _backward(ctx, do, dfinal):
    return _grads(ctx, do, dfinal, s4d_bilinear_bwd_op)


s4d_bilinear_fwd_op.register_autograd(_backward, setup_context=_setup_context)
_EagerS4DBilinear = eager_function(_fwd_impl, _bwd_impl, _setup_context, _grads)


# ----------------------------------------------------------------------------------------------------------------------
# public function


def impulse_table(log_lam: torch.Tensor | Planar, B: torch.Tensor | Planar, C: torch.Tensor | Planar,
                  BT: int) -> Planar:
    """Kern[h, m, d] = Σ_n C[h, m, n] B[h, n] λ[h, n]^d for d = 0..BT-1, ``Planar`` float32 [H, M, BT]
    (differentiable), from complex tensors or ``Planar`` pairs.

    Real arithmetic in float64 (no complex op, so a compiled graph fuses it; exponents d >= 0: |λ^d| <= 1, no
    overflow), rounded once to float32."""
    ll, Bp, Cp = prepare_planar_params(log_lam, B, C, torch.float64)
    d = torch.arange(BT, device=ll.device, dtype=torch.float64)
    pr, pi = cexp_scaled(ll.map(lambda t: t[:, None, :]), d[None, :, None])  # λ^d [H, BT, M]
    gr, gi = cmul(Bp.re[:, None, :], Bp.im[:, None, :], pr, pi)  # B_n λ_n^d [H, BT, N]
    kr = torch.einsum("hmn,hdn->hmd", Cp.re, gr) - torch.einsum("hmn,hdn->hmd", Cp.im, gi)
    ki = torch.einsum("hmn,hdn->hmd", Cp.re, gi) + torch.einsum("hmn,hdn->hmd", Cp.im, gr)
    return Planar(kr.float(), ki.float())


def triton_s4d_bilinear(
    a: torch.Tensor,
    b: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    config: S4DBilinearConfig | None = None,
    hooks: LaunchHooks | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Bilinear S4D core on Triton kernels (same contract as ``chunk_s4d_bilinear``).

    Shapes: a, b ``[B, T, H, R]`` real (bf16 / fp16 / fp32; float64 is refused: use backend "reference");
    log_lam, B ``[H, M]`` complex; C ``[H, M, M]`` complex (or each a ``Planar`` pair: then no complex op runs
    before the kernels unless a state is passed in or returned); initial_state ``[B, H, M, 2R]`` complex. Returns
    ``o [B, T, H, R]`` in ``a.dtype`` and the final state (complex64) or ``None``. State and decay math is float32;
    ``chunk_size`` selects the kernel chunk length when it is a power of two in [16, 128] (else 64, capped by the
    ``max_chunk`` setting); the result does not depend on it beyond rounding. Differentiable in every tensor input.
    ``config`` (an ``S4DBilinearConfig``) and ``hooks`` (``LaunchHooks``) are for benchmarks and tests: given either,
    the kernels run eagerly with them instead of through the registered op (which always runs ``DEFAULT_CONFIG``).
    ``cu_seqlens [N + 1]``: packed documents (a, b ``[1, T, H, R]``; initial / final states ``[N, H, M, 2R]``), as
    in ``triton_interdomain`` (no host sync; the shared chunk-table design of ``ops/common/triton/ssm_scan.py``).

    Math (same contract as ``chunk_s4d_bilinear``; definition in ``naive.py``). Per (batch, head),
    z_t = [a_t ; b_t] ∈ R^{2R}, X_t = λ ⊙ X_{t-1} + B z_tᵀ ∈ C^{M×2R}, o_t[j] = Re Σ_m (C X^a_t)[m, j] (C X^b_t)[m, j].
    For a chunk [t0, t0 + L) entered with state X0 and local index τ = t - t0 ∈ [0, L):

        X_t = λ^{τ+1} ⊙ X0 + Σ_{s<=τ} λ^{τ-s} B z_sᵀ
        Y^a_t[m, j] = (C X^a_t)[m, j] = Σ_n P[m, τ, n] X0^a[n, j] + Σ_{s<=τ} Kern[m, τ-s] a_s[j]
          with P[m, τ, n] = C[m, n] λ_n^{τ+1}   and   Kern[m, d] = Σ_n C[m, n] B_n λ_n^d,
        o_t[j] = Re Σ_m Y^a_t[m, j] Y^b_t[m, j].

    Both tables are chunk-invariant. Pipeline (forward):
      1. X0 of every chunk by the forward state scan shared with the Interdomain op (``states_fwd`` in
         ``hybrid_attention.ops.common.triton.ssm_scan``) with (k, v) = (a, b).
      2. ``_readout_fwd`` (this package): per (chunk, b·h, channel tile), o from X0, the chunk's a, b and the tables.
    Backward (real loss ℓ, PyTorch's complex gradient convention g_w = ∂ℓ/∂Re w + i ∂ℓ/∂Im w):
      g_{Y^a} = dO conj(Y^b), g_{Y^b} = dO conj(Y^a)  (from o = Re(Y^a Y^b)); then, in ``_readout_bwd``,
      da_local = Re(Toe^H g_{Y^a}) (Toe[τ, s] = Kern[m, τ-s], s <= τ), dX0_local = P^H g_Y, g_P = g_Y X0^H and
      g_Toe = g_Y zᵀ, with g_P folded into dC and d log λ inside the kernel and g_Toe into dKern (band sums), each
      program's share written to its own slot of a partial buffer and the slots summed by one torch reduction; then the
      shared reverse state scan ``_state_bwd`` (total adjoint of every chunk-boundary state, d initial_state, the
      λ^L-carry part of d log λ) and the shared state-carry kernel ``_chunk_dz`` (state-path part of da, db and of dB,
      d log λ), called through the shared host helper ``state_bwd`` (the fused variant ``_state_bwd_dz`` when the
      config's ``fuse_dz`` is on).
    The launch configuration is a frozen ``S4DBilinearConfig`` (``config.py``) passed as an argument: the registered
    ops run ``DEFAULT_CONFIG``; ``triton_s4d_bilinear(..., config=..., hooks=...)`` runs another one eagerly
    (``common.triton.eager``; benchmarks, tests).
    Kern is built from (log λ, B, C) with differentiable torch ops outside the registered op, so autograd carries dKern
    to d log λ, dB and dC.
    """
    if cu_seqlens is None:
        validate_s4d_bilinear_inputs(a, b, log_lam, B, C, initial_state)
    else:
        validate_s4d_bilinear_inputs(a, b, log_lam, B, C, None)
        n_docs = check_cu_seqlens(cu_seqlens, a.shape[1], a.shape[0])
        check_packed_state(initial_state, n_docs)
        if initial_state is not None:
            validate_s4d_bilinear_inputs(a.expand(n_docs, *a.shape[1:]), b.expand(n_docs, *b.shape[1:]), log_lam, B,
                                         C, initial_state)
    validate_chunk_size(chunk_size)
    if any(t.dtype == torch.float64 for t in (a, b)):
        raise ValueError("the triton backend computes in float32; use backend='reference' for float64 inputs")
    dt = a.dtype
    a = a.contiguous()
    b = b.to(dt).contiguous()
    BT = kernel_chunk(chunk_size, config or DEFAULT_CONFIG)
    ll = planar(log_lam, 1).contiguous()
    bb = planar(B, 1).contiguous()
    cc = planar(C, 1).contiguous()
    kk = planar(impulse_table(log_lam, B, C, BT), 1).contiguous()
    init = planar(initial_state, 2).contiguous() if initial_state is not None else None
    vl = chunk_table(cu_seqlens, a.shape[1], BT, a.device) if cu_seqlens is not None else None
    tab = (None, None, None) if vl is None else (vl.cu, vl.offsets, vl.indices)
    args = (a, b, ll, bb, cc, kk, init, *tab, chunk_size, output_final_state)
    if config is None and hooks is None:
        o, fin = s4d_bilinear_fwd_op(*args)
    else:
        o, fin = _EagerS4DBilinear.apply(config or DEFAULT_CONFIG, hooks or NO_HOOKS, *args)
    final = torch.complex(fin[:, :, 0], fin[:, :, 1]) if output_final_state else None
    return o, final
