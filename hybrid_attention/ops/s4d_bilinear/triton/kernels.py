"""Triton kernels of the chunked bilinear S4D readout (imported only when triton is installed); the state scan is the
one shared with the Interdomain op (``ops/common/triton/ssm_scan.py``), the math is at ``triton_s4d_bilinear``."""

from __future__ import annotations

import triton
import triton.language as tl

from ...common.triton.lowp import load_f32
from ...common.triton.ssm_scan_kernels import chunk_info

# Notation. Per (b, h) the state is X = [X^a | X^b] ∈ C^{M×2R}; a chunk of BT tokens (local index τ = t - t0) is entered
# with X0, the stored chunk-boundary state written by the shared state scan (``ssm_scan.states_fwd`` with k = a,
# v = b). Per mode m:
#     Y^a_m[τ, j] = Σ_n P_m[τ, n] X0^a[n, j] + Σ_{s<=τ} Kern[m, τ-s] a_s[j]      P_m[τ, n] = C[m, n] λ_n^{τ+1}
#     o_τ[j]      = Re Σ_m Y^a_m[τ, j] Y^b_m[τ, j]
# Tables (all complex, stored planar: a leading re/im axis of size 2, float32):
#   P  [H, 2, BT+1, M]  λ^n for n = 0..BT (the shared power table, computed in float64 on the host)
#   Cp [H, 2, M, M]     the readout C
#   Kp [H, 2, M, BT]    Kern[m, d] = Σ_n C[m, n] B_n λ_n^d (chunk-invariant impulse response of mode m)
# Every power of λ has a non-negative exponent (|λ^n| <= 1): fast modes underflow to 0, nothing overflows. Complex
# products are real-pair ``tl.dot``s (float32 operands, ``DOT_PREC``); every tile dimension is >= 16.
# DECISION: grid (chunk, b·h, channel tile of JT channels): the channel tile is the parallel axis because the readout is
# diagonal in the channel j, so channel tiles never interact. Packed documents (IS_VARLEN, B == 1; design at
# ``ssm_scan._layout``): the chunk's true start and length come from the chunk table (``chunk_info``); an empty row
# (Lj <= 0) loads no token and no state.
# Partial-buffer slot of program (i_t, i_bh = b·H + h, i_j): index ((h·NB + b)·NT + i_t)·NJ + i_j of [H, NB·NT·NJ]
# (NB = batch rows, NJ = channel tiles), each slot TAB_W = 2M² + 2M·BT + 2M floats laid out as
# [dC re | dC im ([M, M] each) | dKern re | dKern im ([M, BT] each) | d log λ re | d log λ im ([M] each)].


@triton.jit
def _mode_tables(Cp, Kp, h, m, pw_re, pw_im, ddc, causal, offs_n, mask_n, M: tl.constexpr, BT: tl.constexpr):
    """P_m[τ, n] = C[m, n] λ_n^{τ+1} as [BT, BM] re/im, and the Toeplitz tile Toe_m[τ, s] = Kern[m, τ-s] (s <= τ)."""
    c_base = Cp + h * 2 * M * M + m * M
    c_re = tl.load(c_base + offs_n, mask=mask_n, other=0.0)
    c_im = tl.load(c_base + M * M + offs_n, mask=mask_n, other=0.0)
    p_re = c_re[None, :] * pw_re - c_im[None, :] * pw_im
    p_im = c_re[None, :] * pw_im + c_im[None, :] * pw_re
    # design decision: the Toeplitz tile is read straight from the [M, BT] Kern row with a banded index (cached
    # loads) instead of a precomputed [M, BT, BT] table: BT times less table memory and table gradient.
    k_base = Kp + h * 2 * M * BT + m * BT
    t_re = tl.load(k_base + ddc, mask=causal, other=0.0)
    t_im = tl.load(k_base + M * BT + ddc, mask=causal, other=0.0)
    return p_re, p_im, t_re, t_im


@triton.jit
def _mode_y(p_re, p_im, t_re, t_im, x_re, x_im, z, DOT_PREC: tl.constexpr):
    """Y_m = P_m X0 + Toe_m z (complex [BT, BM] @ [BM, JT] plus complex [BT, BT] @ real [BT, JT])."""
    y_re = tl.dot(p_re, x_re, input_precision=DOT_PREC) - tl.dot(p_im, x_im, input_precision=DOT_PREC)
    y_im = tl.dot(p_re, x_im, input_precision=DOT_PREC) + tl.dot(p_im, x_re, input_precision=DOT_PREC)
    y_re += tl.dot(t_re, z, input_precision=DOT_PREC)
    y_im += tl.dot(t_im, z, input_precision=DOT_PREC)
    return y_re, y_im


@triton.jit
def _chunk_setup(a, b, P, states, cu, ci, i_t, i_bh, i_j, T, H, R, NT, IS_VARLEN: tl.constexpr, M: tl.constexpr,
                 BT: tl.constexpr, BM: tl.constexpr, JT: tl.constexpr):  # fmt: skip
    """Loads shared by both kernels: the chunk's a, b tiles, X0^a, X0^b, the decay rows λ^{τ+1} and index tiles."""
    h = i_bh % H
    NC = 2 * R
    LP = BT + 1
    tok0, Lj = chunk_info(i_t, i_bh, H, T, cu, ci, IS_VARLEN, BT)
    offs_t = tl.arange(0, BT)
    offs_n = tl.arange(0, BM)
    offs_j = i_j * JT + tl.arange(0, JT)
    mask_t = offs_t < Lj
    mask_n = offs_n < M
    mask_j = offs_j < R
    tok = h * R + (tok0 + offs_t)[:, None] * (H * R) + offs_j[None, :]
    tmask = mask_t[:, None] & mask_j[None, :]
    za = tl.load(a + tok, mask=tmask, other=0.0).to(tl.float32)
    zb = tl.load(b + tok, mask=tmask, other=0.0).to(tl.float32)
    x_base = states + (i_bh * NT + i_t) * 2 * M * NC
    xoff = offs_n[:, None] * NC + offs_j[None, :]
    xm = (mask_n & ((offs_n * 0 + Lj) > 0))[:, None] & mask_j[None, :]  # an empty varlen row has no state
    xa_re = load_f32(x_base + xoff, xm)
    xa_im = load_f32(x_base + M * NC + xoff, xm)
    xb_re = load_f32(x_base + R + xoff, xm)
    xb_im = load_f32(x_base + M * NC + R + xoff, xm)
    ptab = P + h * 2 * LP * M
    pm = (offs_t[:, None] >= 0) & mask_n[None, :]
    pw_re = tl.load(ptab + (offs_t + 1)[:, None] * M + offs_n[None, :], mask=pm, other=0.0)
    pw_im = tl.load(ptab + LP * M + (offs_t + 1)[:, None] * M + offs_n[None, :], mask=pm, other=0.0)
    dd = offs_t[:, None] - offs_t[None, :]
    causal = dd >= 0
    ddc = tl.maximum(dd, 0)
    return (h, tok, tmask, za, zb, xoff, xm, xa_re, xa_im, xb_re, xb_im, pw_re, pw_im, causal, ddc, offs_t, offs_n,
            mask_n)  # fmt: skip


@triton.jit
def _readout_fwd(
    a,
    b,
    o,
    P,
    Cp,
    Kp,
    states,
    cu,
    ci,
    T,
    H,
    R,
    NT,
    IS_VARLEN: tl.constexpr,
    M: tl.constexpr,
    BT: tl.constexpr,
    BM: tl.constexpr,
    JT: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """o of one chunk and channel tile; loops over the M output modes m, each a [BT, M] @ [M, JT] state
    product (P_m X0) and a [BT, BT] @ [BT, JT] Toeplitz product (Kern_m * a), for a and for b."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_j = tl.program_id(2)
    (h, tok, tmask, za, zb, xoff, xm, xa_re, xa_im, xb_re, xb_im, pw_re, pw_im, causal, ddc, offs_t, offs_n,
     mask_n) = _chunk_setup(a, b, P, states, cu, ci, i_t, i_bh, i_j, T, H, R, NT, IS_VARLEN, M, BT, BM,
                            JT)  # fmt: skip
    acc = tl.zeros([BT, JT], dtype=tl.float32)
    # design decision: loop over the output mode m (Y_m is needed only to form the product Y^a_m Y^b_m), so no
    # [BT, M, JT] per-token state tile is ever held; the cost is M small matmul groups per program.
    for m in range(M):
        p_re, p_im, t_re, t_im = _mode_tables(Cp, Kp, h, m, pw_re, pw_im, ddc, causal, offs_n, mask_n, M, BT)
        ya_re, ya_im = _mode_y(p_re, p_im, t_re, t_im, xa_re, xa_im, za, DOT_PREC)
        yb_re, yb_im = _mode_y(p_re, p_im, t_re, t_im, xb_re, xb_im, zb, DOT_PREC)
        acc += ya_re * yb_re - ya_im * yb_im
    # round-to-nearest-even into bf16 / fp16 outputs (the GPU default, made explicit; note that the triton 3.6
    # interpreter truncates bf16 whatever the mode, so CPU dry runs show ~2x the bf16 rounding error of o)
    tl.store(o + tok, acc.to(o.dtype.element_ty, fp_downcast_rounding="rtne"), mask=tmask)


@triton.jit
def _grad_p(ga_re, ga_im, gb_re, gb_im, xa_re, xa_im, xb_re, xb_im, DOT_PREC: tl.constexpr):
    """g_{P_m} = g_{Y^a} X0^{aH} + g_{Y^b} X0^{bH}   [BT, BM]."""
    gp_re = tl.dot(ga_re, tl.trans(xa_re), input_precision=DOT_PREC)
    gp_re += tl.dot(ga_im, tl.trans(xa_im), input_precision=DOT_PREC)
    gp_re += tl.dot(gb_re, tl.trans(xb_re), input_precision=DOT_PREC)
    gp_re += tl.dot(gb_im, tl.trans(xb_im), input_precision=DOT_PREC)
    gp_im = tl.dot(ga_im, tl.trans(xa_re), input_precision=DOT_PREC)
    gp_im -= tl.dot(ga_re, tl.trans(xa_im), input_precision=DOT_PREC)
    gp_im += tl.dot(gb_im, tl.trans(xb_re), input_precision=DOT_PREC)
    gp_im -= tl.dot(gb_re, tl.trans(xb_im), input_precision=DOT_PREC)
    return gp_re, gp_im


@triton.jit
def _table_grads(gl_re, gl_im, ga_re, ga_im, gb_re, gb_im, xa_re, xa_im, xb_re, xb_im, za, zb, pw_re, pw_im, p_re,
                 p_im, tw, bidx, bok, slot, m, offs_t, offs_n, mask_n, M: tl.constexpr, BT: tl.constexpr,
                 DOT_PREC: tl.constexpr):  # fmt: skip
    """Row m of this program's dC (through P) and dKern partials, stored to its slot (layout in the module
    docstring); returns the d log λ accumulator (through P) updated with mode m's term."""
    gp_re, gp_im = _grad_p(ga_re, ga_im, gb_re, gb_im, xa_re, xa_im, xb_re, xb_im, DOT_PREC)
    # P_m[τ, n] = C[m, n] λ_n^{τ+1} (holomorphic in C): g_C[m, n] = Σ_τ conj(λ_n^{τ+1}) g_P[τ, n]
    gc_re = tl.sum(pw_re * gp_re + pw_im * gp_im, axis=0)
    gc_im = tl.sum(pw_re * gp_im - pw_im * gp_re, axis=0)
    c_off = m * M + offs_n
    tl.store(slot + c_off, gc_re, mask=mask_n)
    tl.store(slot + M * M + c_off, gc_im, mask=mask_n)
    # and g_{log λ_n} += Σ_τ (τ+1) conj(P_m[τ, n]) g_P[τ, n]  (d/d log λ of λ^{τ+1} is (τ+1) λ^{τ+1})
    gl_re += tl.sum(tw * (p_re * gp_re + p_im * gp_im), axis=0)
    gl_im += tl.sum(tw * (p_re * gp_im - p_im * gp_re), axis=0)
    # g_{Toe_m} = g_{Y^a} aᵀ + g_{Y^b} bᵀ, then dKern[m, d] = Σ_τ g_Toe[τ, τ-d] (band gather, then a column sum)
    gt_re = tl.dot(ga_re, tl.trans(za), input_precision=DOT_PREC)
    gt_re += tl.dot(gb_re, tl.trans(zb), input_precision=DOT_PREC)
    gt_im = tl.dot(ga_im, tl.trans(za), input_precision=DOT_PREC)
    gt_im += tl.dot(gb_im, tl.trans(zb), input_precision=DOT_PREC)
    gk_re = tl.sum(tl.where(bok, tl.gather(gt_re, bidx, axis=1), 0.0), axis=0)
    gk_im = tl.sum(tl.where(bok, tl.gather(gt_im, bidx, axis=1), 0.0), axis=0)
    k_off = 2 * M * M + m * BT + offs_t
    tl.store(slot + k_off, gk_re)
    tl.store(slot + M * BT + k_off, gk_im)
    return gl_re, gl_im


@triton.jit
def _readout_bwd(
    a,
    b,
    do,
    da,
    db,
    P,
    Cp,
    Kp,
    states,
    dx,
    tab,
    cu,
    ci,
    T,
    H,
    R,
    NT,
    IS_VARLEN: tl.constexpr,
    M: tl.constexpr,
    BT: tl.constexpr,
    BM: tl.constexpr,
    JT: tl.constexpr,
    DOT_PREC: tl.constexpr,
    PART: tl.constexpr,
):
    """Recomputes Y^a_m, Y^b_m and produces the chunk-local da, db, the chunk's local adjoint of X0 (for
    the shared reverse state scan), and the program's share of the table gradients dC (through P), d log λ (through P)
    and dKern, written to its own slot of the partial buffer (no atomics; the host sums the slots, ``ops.py``); by
    default in two launches (PART 1, then PART 2).

    Gradient convention (PyTorch's): for a complex w the gradient is g_w = ∂ℓ/∂Re w + i ∂ℓ/∂Im w; for a linear
    map Y = A X it is g_X = A^H g_Y and g_A = g_Y X^H; for o = Re(Y^a Y^b) it is g_{Y^a} = dO conj(Y^b).

    PART 0 computes everything; PART 1 only da, db and the X0 adjoint, PART 2 only the table gradients (design
    decision: the split form recomputes Y twice but holds fewer live tiles; compiled for sm_90 the fused form spills
    ~2.6 KB per thread at JT=32, so both are kept and the benchmark compares them).

    ``tab``: the table-gradient partial buffer [H, NB·NT·NJ, TAB_W] (slot layout above the kernels); every program
    with TAB writes its whole slot (zeros for an empty varlen row), never another program's."""
    INP: tl.constexpr = PART != 2  # da, db, X0 adjoint
    TAB: tl.constexpr = PART != 1  # dC, d log λ, dKern
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_j = tl.program_id(2)
    (h, tok, tmask, za, zb, xoff, xm, xa_re, xa_im, xb_re, xb_im, pw_re, pw_im, causal, ddc, offs_t, offs_n,
     mask_n) = _chunk_setup(a, b, P, states, cu, ci, i_t, i_bh, i_j, T, H, R, NT, IS_VARLEN, M, BT, BM,
                            JT)  # fmt: skip
    dO = tl.load(do + tok, mask=tmask, other=0.0).to(tl.float32)  # zero rows past the chunk end: no gradient there
    da_acc = tl.zeros([BT, JT], dtype=tl.float32)
    db_acc = tl.zeros([BT, JT], dtype=tl.float32)
    dxa_re = tl.zeros([BM, JT], dtype=tl.float32)
    dxa_im = tl.zeros([BM, JT], dtype=tl.float32)
    dxb_re = tl.zeros([BM, JT], dtype=tl.float32)
    dxb_im = tl.zeros([BM, JT], dtype=tl.float32)
    gl_re = tl.zeros([BM], dtype=tl.float32)
    gl_im = tl.zeros([BM], dtype=tl.float32)
    tw = (offs_t + 1).to(tl.float32)[:, None]  # d/d log λ of λ^{τ+1} is (τ+1) λ^{τ+1}
    # band index of the Toeplitz gradient: band[τ, d] = gToe[τ, τ-d] (d <= τ), summed over τ gives dKern[m, d]
    bidx = tl.maximum(offs_t[:, None] - offs_t[None, :], 0)
    bok = offs_t[None, :] <= offs_t[:, None]
    # design decision: one partial slot per program, reduced by one torch sum on the host (as the Interdomain
    # backward does), instead of float32 atomics into the [H, 2, M, M]-sized tables: every (chunk, batch row,
    # channel tile) program of a head added into the same addresses (B·NT·R/JT-fold contention).
    NB = tl.num_programs(1) // H
    NJ = tl.num_programs(2)
    slot = tab + (((h * NB + i_bh // H) * NT + i_t) * NJ + i_j) * (2 * M * M + 2 * M * BT + 2 * M)
    for m in range(M):
        p_re, p_im, t_re, t_im = _mode_tables(Cp, Kp, h, m, pw_re, pw_im, ddc, causal, offs_n, mask_n, M, BT)
        ya_re, ya_im = _mode_y(p_re, p_im, t_re, t_im, xa_re, xa_im, za, DOT_PREC)
        yb_re, yb_im = _mode_y(p_re, p_im, t_re, t_im, xb_re, xb_im, zb, DOT_PREC)
        # g_{Y^a} = dO conj(Y^b), g_{Y^b} = dO conj(Y^a)
        ga_re = dO * yb_re
        ga_im = -dO * yb_im
        gb_re = dO * ya_re
        gb_im = -dO * ya_im
        if INP:
            # da = Re(Toe^H g_{Y^a}) (a is real)
            da_acc += tl.dot(tl.trans(t_re), ga_re, input_precision=DOT_PREC)
            da_acc += tl.dot(tl.trans(t_im), ga_im, input_precision=DOT_PREC)
            db_acc += tl.dot(tl.trans(t_re), gb_re, input_precision=DOT_PREC)
            db_acc += tl.dot(tl.trans(t_im), gb_im, input_precision=DOT_PREC)
            # local adjoint of X0: P_m^H g_Y
            ptr = tl.trans(p_re)
            pti = tl.trans(p_im)
            dxa_re += tl.dot(ptr, ga_re, input_precision=DOT_PREC) + tl.dot(pti, ga_im, input_precision=DOT_PREC)
            dxa_im += tl.dot(ptr, ga_im, input_precision=DOT_PREC) - tl.dot(pti, ga_re, input_precision=DOT_PREC)
            dxb_re += tl.dot(ptr, gb_re, input_precision=DOT_PREC) + tl.dot(pti, gb_im, input_precision=DOT_PREC)
            dxb_im += tl.dot(ptr, gb_im, input_precision=DOT_PREC) - tl.dot(pti, gb_re, input_precision=DOT_PREC)
        if TAB:
            gl_re, gl_im = _table_grads(
                gl_re, gl_im, ga_re, ga_im, gb_re, gb_im, xa_re, xa_im, xb_re, xb_im, za, zb, pw_re, pw_im, p_re,
                p_im, tw, bidx, bok, slot, m, offs_t, offs_n, mask_n, M, BT, DOT_PREC,
            )  # fmt: skip
    # design decision: the chunk-local da / db are written to float32 buffers; the shared state-carry kernel
    # (_chunk_dz) then adds the state path in place.
    if INP:
        tl.store(da + tok, da_acc, mask=tmask)
        tl.store(db + tok, db_acc, mask=tmask)
        NC = 2 * R
        x_base = dx + (i_bh * NT + i_t) * 2 * M * NC
        tl.store(x_base + xoff, dxa_re, mask=xm)
        tl.store(x_base + M * NC + xoff, dxa_im, mask=xm)
        tl.store(x_base + R + xoff, dxb_re, mask=xm)
        tl.store(x_base + M * NC + R + xoff, dxb_im, mask=xm)
    if TAB:
        l_off = 2 * M * M + 2 * M * BT + offs_n
        tl.store(slot + l_off, gl_re, mask=mask_n)
        tl.store(slot + M + l_off, gl_im, mask=mask_n)
