"""Chunk-local Triton kernels of the Interdomain Attention core (imported only when triton is installed); they run
between the state scans shared with the bilinear S4D op (``ops/common/triton/ssm_scan_kernels.py``). The math is in
``ops/interdomain/chunk.py``, the host side in ``ops.py``; `_chunk_fwd` gives the notation, pipeline and packed layout,
`_decay` the overflow-free decays, `_readout_r` the three readouts. Decay / state arithmetic is float32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...common.triton.lowp import load_f32, mm, store_as
from ...common.triton.ssm_scan_kernels import chunk_info, cmul


@triton.jit
def _band(X, t_abs, offs_tc):
    """[BC, BT] tile X (rows t of one sub-chunk) -> band [BC, BC] with band[t, d] = X[t, t - d] for d <= t - b_i."""
    idx = tl.maximum(t_abs[:, None] - offs_tc[None, :], 0)
    ok = offs_tc[None, :] <= offs_tc[:, None]
    return tl.where(ok, tl.gather(X, idx, axis=1), 0.0)


@triton.jit
def _unband(Wb, t_abs, offs_tc, offs_s, BC: tl.constexpr):
    """band [BC, BC] (Wb[t, d]) -> dense [BC, BT] tile with W[t, s] = Wb[t, t - s] inside the diagonal block."""
    dd = t_abs[:, None] - offs_s[None, :]
    ok = (dd >= 0) & (dd <= offs_tc[:, None])
    return tl.where(ok, tl.gather(Wb, tl.minimum(tl.maximum(dd, 0), BC - 1), axis=1), 0.0)


# DECISION (the one-pass "real" form): r = Cᵀ x with x = Re(C p), two dots to x and two from it, on the two tiles of C
# (_real_x, _real_cx), replacing the earlier four-block form (r = [[A, Bm], [Cm, Dm]] [Re p; Im p], the blocks built on
# the host by the removed readout.real_linear_blocks: four distinct M x M tiles live). The sm_90 AOT report (aot_regs.py
# --chunk-only, triton 3.6, R = D = M = 64, L = BC = 32, spill stores per thread): forward w4 four-block 255 regs /
# 228 B, two-tile 255 / 44 B (transpose 255 / 52 B); fused backward w8 1116 B vs 844 B (transpose 832 B); split
# backward (bwd_split) value side 240 B vs 16 B (transpose 0 B), key side 232 B vs 64 B (transpose 40 B). Variants
# tried and dropped: gx recomputed on the key side of the fused backward (1180 B), the transposed tiles loaded
# transposed instead of tl.trans (forward 68 B, fused 868 B, value side 84 B). Decided by the compile report only: not
# yet timed on the device (benchmarks/interdomain_ops.py, section real_passes).
@triton.jit
def _real_x(p_re, p_im, kb, pk, km, M, DOT_PREC: tl.constexpr):
    """x = Re(C p) ([BC, BM], real) from p ([BC, BM] re, im) and the planar C at kb ([2, M, M], C[n, m] at n M + m):
    x = Re p ReCᵀ − Im p ImCᵀ (x_t[n] = Σ_m Re(C[n, m] p_t[m]))."""
    x = mm(p_re, tl.trans(tl.load(kb + pk, mask=km, other=0.0)), DOT_PREC)
    x -= mm(p_im, tl.trans(tl.load(kb + M * M + pk, mask=km, other=0.0)), DOT_PREC)
    return x


@triton.jit
def _real_cx(x, kb, pk, km, M, DOT_PREC: tl.constexpr):
    """r = Cᵀ x as rows ([BC, BM] re, im): Re r = x ReC, Im r = x ImC (r_t[m] = Σ_n C[n, m] x_t[n])."""
    r_re = mm(x, tl.load(kb + pk, mask=km, other=0.0), DOT_PREC)
    r_im = mm(x, tl.load(kb + M * M + pk, mask=km, other=0.0), DOT_PREC)
    return r_re, r_im


@triton.jit
def _readout_r(p_re, p_im, kb, offs_m, M, km, DOT_PREC: tl.constexpr):
    """r from the key-side vector p ([BC, BM] re, im) and the planar complex K at kb ([2, M, M]): r = p @ Kᵀ,
    r_t[m] = Σ_n K[m, n] p_t[n] (KT[n, m] = K[m, n]).

    Readout (ops/interdomain/readout.py): r = K p (CONJ_P False, "transpose"), K conj(p) (CONJ_P, "hermitian"), or
    r = Cᵀ Re(C p) (REAL_C, "real" in one pass, from C itself: two M x M tiles, Re C and Im C, each used in both
    orientations, as the complex product; the backward writes the per-chunk partials of dC, planar). The choice of this
    form is the DECISION above ``_real_x``.
    """
    kt_re = tl.load(kb + offs_m[None, :] * M + offs_m[:, None], mask=km, other=0.0)
    kt_im = tl.load(kb + M * M + offs_m[None, :] * M + offs_m[:, None], mask=km, other=0.0)
    r_re = mm(p_re, kt_re, DOT_PREC) - mm(p_im, kt_im, DOT_PREC)
    r_im = mm(p_re, kt_im, DOT_PREC) + mm(p_im, kt_re, DOT_PREC)
    return r_re, r_im


@triton.jit
def _chunk_fwd(
    q,
    k,
    v,
    o,
    P,
    Bp,
    Kp,
    states,
    cu,
    ci,
    T,
    H,
    M,
    R,
    D,
    NT,
    IS_VARLEN: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BR: tl.constexpr,
    BD: tl.constexpr,
    BM: tl.constexpr,
    DOT_PREC: tl.constexpr,
    LP_DOT: tl.constexpr,
    CONJ_P: tl.constexpr,
    REAL_C: tl.constexpr,
    REAL_PREC: tl.constexpr,
):
    """Outputs of one chunk. CONJ_P (the Hermitian readout): the key-side vector p_t = X^k_t q_t enters the readout
    conjugated, r = K conj(p) with K = Cᵀ conj(C) from the host (see ops/interdomain/readout.py). REAL_C (the
    "real" readout in one pass; CONJ_P False): Kp holds the planar readout matrix C itself ([H, 2, M, M]) instead of
    a planar K, and r = Cᵀ Re(C p) (``_real_x``, ``_real_cx``).

    Notation (see ``hybrid_attention/ops/interdomain/chunk.py`` for the math, ``ops.py`` for the host side). Per (b, h):
    the state is X = [X^k | X^v] in C^{M x (R+D)}; a chunk of BT tokens is entered with X0 (stored chunk-boundary
    state); P[n] = λ^n (n = 0..BT, complex, overflow-free since |λ^n| <= 1) is the per-head power table, stored planar
    (re plane, im plane) in float32 and computed on the host in float64.

    Kernels (the pipeline: common _state_fwd, then _chunk_fwd; backward: _state_fwd again, _chunk_bwd, then the common
    _state_bwd + _chunk_dz or their fused _state_bwd_dz):
      _chunk_fwd   parallel over (chunk, b·h): outputs o of one chunk from X_j and the chunk's q, k, v.
      _chunk_bwd   parallel over (chunk, b·h): recomputes the chunk forward and produces dq, the chunk-local parts of
                   dk/dv, the chunk's contribution to the adjoint of X_j, and per-chunk partial grads of K, B, log λ.

    Packed documents (IS_VARLEN, B == 1; the design is in ``ops/common/triton/ssm_scan.py``): program (row, head) takes
    its chunk's true start and length from the chunk table (``chunk_info``: cu_seqlens ``cu``, per-row (document,
    chunk in the document) ``ci``); chunks restart at each document start, so a chunk never spans two documents and the
    chunk math is unchanged; a document's last chunk is partial (rows / columns past Lj masked). Rows past the real
    chunks (the grid is a static upper bound) have Lj <= 0: they load no token and no chunk state (never written) and
    store zero partials.
    """
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    h = i_bh % H
    NC = R + D
    LP = BT + 1
    HAS_CROSS: tl.constexpr = BT > BC  # BC == BT: one sub-chunk, every decay comes from the band matmuls
    tok0, Lj = chunk_info(i_t, i_bh, H, T, cu, ci, IS_VARLEN, BT)
    offs_s = tl.arange(0, BT)
    offs_tc = tl.arange(0, BC)
    offs_r = tl.arange(0, BR)
    offs_d = tl.arange(0, BD)
    offs_m = tl.arange(0, BM)
    mask_r = offs_r < R
    mask_d = offs_d < D
    mask_m = offs_m < M
    mask_mx = mask_m & ((offs_m * 0 + Lj) > 0)  # the chunk state exists (an empty varlen row has none)
    col_ok = offs_s < Lj
    ptab = P + h * 2 * LP * M
    q_base = q + tok0 * H * R + h * R
    k_base = k + tok0 * H * R + h * R
    v_base = v + tok0 * H * D + h * D
    o_base = o + tok0 * H * D + h * D
    x_base = states + (i_bh * NT + i_t) * 2 * M * NC
    k_base_p = Kp + h * 2 * M * M  # planar K, or planar C when REAL_C

    b_re = tl.load(Bp + h * 2 * M + offs_m, mask=mask_m, other=0.0)
    b_im = tl.load(Bp + h * 2 * M + M + offs_m, mask=mask_m, other=0.0)
    am = mask_m[None, :]
    a_re = tl.load(ptab + offs_tc[:, None] * M + offs_m[None, :], mask=am, other=0.0)
    a_im = tl.load(ptab + LP * M + offs_tc[:, None] * M + offs_m[None, :], mask=am, other=0.0)

    for i in range(BT // BC):
        bi = i * BC
        t_abs = bi + offs_tc
        row_ok = t_abs < Lj
        kc = tl.load(
            k_base + offs_s[:, None] * (H * R) + offs_r[None, :], mask=col_ok[:, None] & mask_r[None, :], other=0.0
        )
        qi = tl.load(
            q_base + t_abs[:, None] * (H * R) + offs_r[None, :], mask=row_ok[:, None] & mask_r[None, :], other=0.0
        )
        causal = (offs_s[None, :] <= t_abs[:, None]) & row_ok[:, None] & col_ok[None, :]
        if LP_DOT:  # native bf16/fp16 tensor-core product (exact products, fp32 accumulation)
            S = tl.dot(qi, tl.trans(kc))
        else:  # float32 inputs, or bf16 under the interpreter (whose bf16 dot is broken in triton 3.6)
            S = mm(qi.to(tl.float32), tl.trans(kc.to(tl.float32)), DOT_PREC)
        S = tl.where(causal, S, 0.0)
        if HAS_CROSS:  # columns of earlier sub-chunks: λ^{t-s} = λ^{t-b_i} λ^{b_i-s}, both exponents >= 0
            cross = offs_s < bi
            Sx = tl.where(cross[None, :], S, 0.0)
            gm = cross[:, None] & am
            gidx = tl.where(cross, bi - offs_s, 0)
            g_re = tl.load(ptab + gidx[:, None] * M + offs_m[None, :], mask=gm, other=0.0)
            g_im = tl.load(ptab + LP * M + gidx[:, None] * M + offs_m[None, :], mask=gm, other=0.0)
            y_re = mm(Sx, g_re, DOT_PREC)
            y_im = mm(Sx, g_im, DOT_PREC)
            pt_re, pt_im = cmul(a_re, a_im, y_re, y_im)
        else:
            pt_re = tl.zeros([BC, BM], dtype=tl.float32)
            pt_im = tl.zeros([BC, BM], dtype=tl.float32)
        # diagonal block as a band matmul: Σ_d S[t, t-d] λ^d = (band(S) @ P[0:BC])[t]
        Sb = _band(S, t_abs, offs_tc)
        pt_re += mm(Sb, a_re, DOT_PREC)
        pt_im += mm(Sb, a_im, DOT_PREC)
        din_re = tl.load(ptab + (t_abs + 1)[:, None] * M + offs_m[None, :], mask=am, other=0.0)
        din_im = tl.load(ptab + LP * M + (t_abs + 1)[:, None] * M + offs_m[None, :], mask=am, other=0.0)
        xm = mask_mx[:, None] & mask_r[None, :]
        xk_re = load_f32(x_base + offs_m[:, None] * NC + offs_r[None, :], xm)
        xk_im = load_f32(x_base + M * NC + offs_m[:, None] * NC + offs_r[None, :], xm)
        qf = qi.to(tl.float32)
        u_re = mm(qf, tl.trans(xk_re), DOT_PREC)
        u_im = mm(qf, tl.trans(xk_im), DOT_PREC)
        p_re, p_im = cmul(b_re[None, :], b_im[None, :], pt_re, pt_im)
        du_re, du_im = cmul(din_re, din_im, u_re, u_im)
        p_re += du_re
        p_im += du_im
        if CONJ_P:
            p_im = -p_im
        km = mask_m[:, None] & am
        if REAL_C:
            pk = offs_m[:, None] * M + offs_m[None, :]
            x = _real_x(p_re, p_im, k_base_p, pk, km, M, REAL_PREC)
            r_re, r_im = _real_cx(x, k_base_p, pk, km, M, REAL_PREC)
        else:
            r_re, r_im = _readout_r(p_re, p_im, k_base_p, offs_m, M, km, DOT_PREC)
        rp_re, rp_im = cmul(r_re, r_im, b_re[None, :], b_im[None, :])
        if HAS_CROSS:
            ra_re, ra_im = cmul(rp_re, rp_im, a_re, a_im)
            W = mm(ra_re, tl.trans(g_re), DOT_PREC) - mm(ra_im, tl.trans(g_im), DOT_PREC)
        else:
            W = tl.zeros([BC, BT], dtype=tl.float32)
        # W[t, t-d] = Re Σ_m rp[t, m] λ_m^d = (Re(rp @ P[0:BC]ᵀ))[t, d], gathered back to [t, s]
        wb = mm(rp_re, tl.trans(a_re), DOT_PREC) - mm(rp_im, tl.trans(a_im), DOT_PREC)
        W += _unband(wb, t_abs, offs_tc, offs_s, BC)
        W = tl.where(causal, W, 0.0)
        vm = mask_mx[:, None] & mask_d[None, :]
        xv_re = load_f32(x_base + offs_m[:, None] * NC + R + offs_d[None, :], vm)
        xv_im = load_f32(x_base + M * NC + offs_m[:, None] * NC + R + offs_d[None, :], vm)
        ai_re, ai_im = cmul(r_re, r_im, din_re, din_im)
        vc = tl.load(
            v_base + offs_s[:, None] * (H * D) + offs_d[None, :], mask=col_ok[:, None] & mask_d[None, :], other=0.0
        )
        out = mm(W, vc.to(tl.float32), DOT_PREC)
        out += mm(ai_re, xv_re, DOT_PREC) - mm(ai_im, xv_im, DOT_PREC)
        tl.store(
            o_base + t_abs[:, None] * (H * D) + offs_d[None, :],
            out.to(o.dtype.element_ty),
            mask=row_ok[:, None] & mask_d[None, :],
        )


@triton.jit
def _decay(X, Xb, a_re, a_im, g_re, g_im, cross, DOT_PREC: tl.constexpr, HAS_CROSS: tl.constexpr):
    """Σ_s X[t, s] λ^{t-s} of one sub-chunk's [BC, BT] tile X (Xb = its band): the cross part a · (X[:, :b_i] @ G_i)
    when HAS_CROSS, plus band(X) @ P[0:BC]. Returns the [BC, BM] (re, im) pair.

    Overflow-free decays. Every power of λ used is λ^n with n >= 0 (|λ^n| <= 1), read from P, so fast modes
    (Re log λ << 0) underflow to 0, their exact limit, and nothing overflows; λ^{-s} is never formed.
    * Diagonal (band) part, t and s in the same block of BC rows: Σ_s S[t, s] λ^{t-s} = Σ_d S[t, t-d] λ^d, i.e. the
      "band" of S (band[t, d] = S[t, t-d], built with ``tl.gather``) times the table rows P[0:BC]: one tensor-core
      matmul. The transposed form W[t, s] = Re Σ_m r_t[m] λ_m^{t-s} is ``r @ P[0:BC]ᵀ`` gathered back to [t, s].
    * Cross part (only when BC < BT), s in an earlier block of first row b_i: λ^{t-s} = λ^{t-b_i} · λ^{b_i-s}, both
      exponents >= 0: ``S[:, :b_i] @ G_i`` (G_i[s] = λ^{b_i-s}) then a row scaling by A[t] = λ^{t-b_i}.
    The measured default is BC = BT = 32 (one band block per chunk, no cross part; benchmarks/NOTES.md).
    All decay/state arithmetic is float32 (complex as real pairs); matmuls with float32 operands use ``DOT_PREC`` (tf32
    on the GPU by default).
    """
    if HAS_CROSS:
        Xx = tl.where(cross[None, :], X, 0.0)
        y_re = mm(Xx, g_re, DOT_PREC)
        y_im = mm(Xx, g_im, DOT_PREC)
        o_re, o_im = cmul(a_re, a_im, y_re, y_im)
    else:
        o_re = tl.zeros_like(a_re)
        o_im = tl.zeros_like(a_im)
    o_re += mm(Xb, a_re, DOT_PREC)
    o_im += mm(Xb, a_im, DOT_PREC)
    return o_re, o_im


@triton.jit
def _decay_d(X, Xb, a_re, a_im, g_re, g_im, cross, gidf, tcf, dcol, DOT_PREC: tl.constexpr, HAS_CROSS: tl.constexpr):
    """Σ_s X[t, s] (t-s) λ^{t-s} ([BC, BM] re, im), as ``_decay``; (t-s) = (t-b_i) + (b_i-s) on the cross part (tcf:
    t-b_i per row, gidf: b_i-s per column), the band offset d (dcol) on the diagonal block."""
    if HAS_CROSS:
        Xx = tl.where(cross[None, :], X, 0.0)
        yd_re = mm(Xx, gidf * g_re, DOT_PREC)
        yd_im = mm(Xx, gidf * g_im, DOT_PREC)
        o_re, o_im = cmul(a_re, a_im, yd_re, yd_im)
        y_re = mm(Xx, g_re, DOT_PREC)
        y_im = mm(Xx, g_im, DOT_PREC)
        c_re, c_im = cmul(a_re, a_im, y_re, y_im)
        o_re += tcf * c_re
        o_im += tcf * c_im
    else:
        o_re = tl.zeros_like(a_re)
        o_im = tl.zeros_like(a_im)
    Xbd = Xb * dcol
    o_re += mm(Xbd, a_re, DOT_PREC)
    o_im += mm(Xbd, a_im, DOT_PREC)
    return o_re, o_im


@triton.jit
def _put(acc, x, ptrs, mask, ACC: tl.constexpr):
    """One sub-chunk's contribution x to a per-chunk output: acc + x when ACC (several sub-chunks; the store follows
    the loop), else x stored now (so no finished tile stays live through the rest of the chunk) and acc returned.
    The store takes the buffer's element type (``store_as``: a bf16 buffer rounds to nearest)."""
    if ACC:
        acc += x
    else:
        tl.store(ptrs, store_as(x, ptrs), mask=mask)
    return acc


@triton.jit
def _chunk_bwd(
    q,
    k,
    v,
    do,
    dq,
    dk,
    dv,
    P,
    Bp,
    Kp,
    states,
    dxloc,
    gk_part,
    gb_part,
    gl_part,
    cu,
    ci,
    T,
    H,
    M,
    R,
    D,
    NT,
    IS_VARLEN: tl.constexpr,
    PART: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BR: tl.constexpr,
    BD: tl.constexpr,
    BM: tl.constexpr,
    DOT_PREC: tl.constexpr,
    LP_DOT: tl.constexpr,
    CONJ_P: tl.constexpr,
    REAL_C: tl.constexpr,
    REAL_PREC: tl.constexpr,
):
    """Backward of one chunk (CONJ_P: the Hermitian readout, as in _chunk_fwd; the gradient w.r.t. p is then the
    conjugate of the one w.r.t. conj(p); REAL_C: Kp is C, gk_part gets the partials of dC). PART 0 computes
    everything; PART 1 the value side (dv, the X0v columns of the local adjoint, dK, and the W / inter-chunk-readout
    terms of dB, d log λ); PART 2 the key side (dq, dk, the X0k columns, the p terms of dB, d log λ). The split halves
    the live registers (two launches instead of one spilling one)."""
    VAL: tl.constexpr = PART != 2
    KEY: tl.constexpr = PART != 1
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    h = i_bh % H
    NC = R + D
    LP = BT + 1
    HAS_CROSS: tl.constexpr = BT > BC  # BC == BT: one sub-chunk, every decay comes from the band matmuls
    tok0, Lj = chunk_info(i_t, i_bh, H, T, cu, ci, IS_VARLEN, BT)
    offs_s = tl.arange(0, BT)
    offs_tc = tl.arange(0, BC)
    offs_r = tl.arange(0, BR)
    offs_d = tl.arange(0, BD)
    offs_m = tl.arange(0, BM)
    mask_r = offs_r < R
    mask_d = offs_d < D
    mask_m = offs_m < M
    col_ok = offs_s < Lj
    am = mask_m[None, :]
    km = mask_m[:, None] & am
    xm = mask_m[:, None] & mask_r[None, :]
    vm = mask_m[:, None] & mask_d[None, :]
    mask_mx = mask_m & ((offs_m * 0 + Lj) > 0)  # the chunk state exists (an empty varlen row has none)
    xml = mask_mx[:, None] & mask_r[None, :]  # masks of the chunk-state loads
    vml = mask_mx[:, None] & mask_d[None, :]
    ptab = P + h * 2 * LP * M
    tok_r = tok0 * H * R + h * R
    tok_d = tok0 * H * D + h * D
    x_base = states + (i_bh * NT + i_t) * 2 * M * NC
    k_base_p = Kp + h * 2 * M * M  # planar K, or planar C when REAL_C

    b_re = tl.load(Bp + h * 2 * M + offs_m, mask=mask_m, other=0.0)
    b_im = tl.load(Bp + h * 2 * M + M + offs_m, mask=mask_m, other=0.0)
    a_re = tl.load(ptab + offs_tc[:, None] * M + offs_m[None, :], mask=am, other=0.0)
    a_im = tl.load(ptab + LP * M + offs_tc[:, None] * M + offs_m[None, :], mask=am, other=0.0)
    tcf = offs_tc.to(tl.float32)[:, None]
    dcol = offs_tc.to(tl.float32)[None, :]  # the offset d of a band column

    # per-chunk outputs: accumulated over the sub-chunks and stored after the loop when there are several
    # (HAS_CROSS), else stored as soon as they are final (the accumulators below are then dead)
    if VAL:
        dv_acc = tl.zeros([BT, BD], dtype=tl.float32)
        gk_re = tl.zeros([BM, BM], dtype=tl.float32)  # grad of K (of C when REAL_C), planar
        gk_im = tl.zeros([BM, BM], dtype=tl.float32)
        dxv_re = tl.zeros([BM, BD], dtype=tl.float32)
        dxv_im = tl.zeros([BM, BD], dtype=tl.float32)
    if KEY:
        dk_acc = tl.zeros([BT, BR], dtype=tl.float32)
        dxk_re = tl.zeros([BM, BR], dtype=tl.float32)
        dxk_im = tl.zeros([BM, BR], dtype=tl.float32)
    gb_re = tl.zeros([BM], dtype=tl.float32)
    gb_im = tl.zeros([BM], dtype=tl.float32)
    gl_re = tl.zeros([BM], dtype=tl.float32)
    gl_im = tl.zeros([BM], dtype=tl.float32)
    dxb = dxloc + (i_bh * NT + i_t) * 2 * M * NC
    gkb = gk_part + (i_bh * NT + i_t) * 2 * M * M
    pk = offs_m[:, None] * M + offs_m[None, :]
    px = offs_m[:, None] * NC
    pv = offs_s[:, None] * (H * D) + offs_d[None, :]
    pr = offs_s[:, None] * (H * R) + offs_r[None, :]
    cmask_r = col_ok[:, None] & mask_r[None, :]
    cmask_d = col_ok[:, None] & mask_d[None, :]

    # Order (register pressure): every tile is computed next to its uses and the cheap ones (r·B, r·Din, the
    # forward sums pt / ptD, u = q X0kᵀ) are recomputed where needed again instead of kept live.
    for i in range(BT // BC):
        bi = i * BC
        t_abs = bi + offs_tc
        row_ok = t_abs < Lj
        rmask_r = row_ok[:, None] & mask_r[None, :]
        rmask_d = row_ok[:, None] & mask_d[None, :]
        tw = (t_abs + 1).to(tl.float32)[:, None]
        kc = tl.load(k + tok_r + pr, mask=cmask_r, other=0.0)
        qi = tl.load(q + tok_r + t_abs[:, None] * (H * R) + offs_r[None, :], mask=rmask_r, other=0.0)
        qf = qi.to(tl.float32)
        causal = (offs_s[None, :] <= t_abs[:, None]) & row_ok[:, None] & col_ok[None, :]
        if LP_DOT:  # native bf16/fp16 tensor-core product (exact products, fp32 accumulation)
            S = tl.dot(qi, tl.trans(kc))
        else:  # float32 inputs, or bf16 under the interpreter (whose bf16 dot is broken in triton 3.6)
            S = mm(qf, tl.trans(kc.to(tl.float32)), DOT_PREC)
        S = tl.where(causal, S, 0.0)
        Sb = _band(S, t_abs, offs_tc)
        if HAS_CROSS:  # columns of earlier sub-chunks: λ^{t-s} = λ^{t-b_i} λ^{b_i-s}
            cross = offs_s < bi
            gm = cross[:, None] & am
            gidx = tl.where(cross, bi - offs_s, 0)
            g_re = tl.load(ptab + gidx[:, None] * M + offs_m[None, :], mask=gm, other=0.0)
            g_im = tl.load(ptab + LP * M + gidx[:, None] * M + offs_m[None, :], mask=gm, other=0.0)
            gidf = gidx.to(tl.float32)[:, None]
        else:  # placeholders of the cross terms (never read)
            cross = col_ok
            g_re = a_re
            g_im = a_im
            gidf = tcf
        din_re = tl.load(ptab + (t_abs + 1)[:, None] * M + offs_m[None, :], mask=am, other=0.0)
        din_im = tl.load(ptab + LP * M + (t_abs + 1)[:, None] * M + offs_m[None, :], mask=am, other=0.0)
        doi = tl.load(do + tok_d + t_abs[:, None] * (H * D) + offs_d[None, :], mask=rmask_d, other=0.0).to(tl.float32)

        if VAL:  # ---- forward recompute: p = B pt + Din u, r = K p (conj(p) for CONJ_P), W ----
            pt_re, pt_im = _decay(S, Sb, a_re, a_im, g_re, g_im, cross, DOT_PREC, HAS_CROSS)
            xk_re = load_f32(x_base + px + offs_r[None, :], xml)
            xk_im = load_f32(x_base + M * NC + px + offs_r[None, :], xml)
            u_re = mm(qf, tl.trans(xk_re), DOT_PREC)
            u_im = mm(qf, tl.trans(xk_im), DOT_PREC)
            p_re, p_im = cmul(b_re[None, :], b_im[None, :], pt_re, pt_im)
            du_re, du_im = cmul(din_re, din_im, u_re, u_im)
            p_re += du_re
            p_im += du_im
            if CONJ_P:
                p_im = -p_im
            if REAL_C:
                x = _real_x(p_re, p_im, k_base_p, pk, km, M, REAL_PREC)
                r_re, r_im = _real_cx(x, k_base_p, pk, km, M, REAL_PREC)
            else:
                r_re, r_im = _readout_r(p_re, p_im, k_base_p, offs_m, M, km, DOT_PREC)
            rp_re, rp_im = cmul(r_re, r_im, b_re[None, :], b_im[None, :])
            if HAS_CROSS:
                ra_re, ra_im = cmul(rp_re, rp_im, a_re, a_im)
                W = mm(ra_re, tl.trans(g_re), DOT_PREC) - mm(ra_im, tl.trans(g_im), DOT_PREC)
            else:
                W = tl.zeros([BC, BT], dtype=tl.float32)
            wb = mm(rp_re, tl.trans(a_re), DOT_PREC) - mm(rp_im, tl.trans(a_im), DOT_PREC)
            W += _unband(wb, t_abs, offs_tc, offs_s, BC)
            W = tl.where(causal, W, 0.0)
            dv_acc = _put(dv_acc, mm(tl.trans(W), doi, DOT_PREC), dv + tok_d + pv, cmask_d, HAS_CROSS)

        # ---- backward of the chunk: Fw = Σ_s dW λ^{t-s}, g_a = dO conj(X0v)ᵀ, gr = conj(Fw B) + g_a conj(Din) ----
        vc = tl.load(v + tok_d + pv, mask=cmask_d, other=0.0)
        dW = tl.where(causal, mm(doi, tl.trans(vc.to(tl.float32)), DOT_PREC), 0.0)
        dWb = _band(dW, t_abs, offs_tc)
        fw_re, fw_im = _decay(dW, dWb, a_re, a_im, g_re, g_im, cross, DOT_PREC, HAS_CROSS)
        xv_re = load_f32(x_base + px + R + offs_d[None, :], vml)
        xv_im = load_f32(x_base + M * NC + px + R + offs_d[None, :], vml)
        ga_re = mm(doi, tl.trans(xv_re), DOT_PREC)
        ga_im = -mm(doi, tl.trans(xv_im), DOT_PREC)
        fb_re, fb_im = cmul(fw_re, fw_im, b_re[None, :], b_im[None, :])
        gr_re = fb_re + ga_re * din_re + ga_im * din_im
        gr_im = -fb_im + ga_im * din_re - ga_re * din_im
        if REAL_C:  # gr = (∂ℓ/∂Re r, ∂ℓ/∂Im r); gx = ∂ℓ/∂x = gr_re ReCᵀ + gr_im ImCᵀ (x = Re(C p), r = Cᵀ x)
            gx = mm(gr_re, tl.trans(tl.load(k_base_p + pk, mask=km, other=0.0)), REAL_PREC)
            gx += mm(gr_im, tl.trans(tl.load(k_base_p + M * M + pk, mask=km, other=0.0)), REAL_PREC)
        if VAL:
            if REAL_C:  # grad C[n, m]: Re += Σ_t x[t, n] gr_re[t, m] + gx[t, n] Re p[t, m], Im: gr_im, - Im p
                xt = tl.trans(x)
                gxt = tl.trans(gx)
                gk_re = _put(
                    gk_re,
                    mm(xt, gr_re, DOT_PREC) + mm(gxt, p_re, DOT_PREC),
                    gkb + pk,
                    km,
                    HAS_CROSS,
                )
                gk_im = _put(
                    gk_im,
                    mm(xt, gr_im, DOT_PREC) - mm(gxt, p_im, DOT_PREC),
                    gkb + M * M + pk,
                    km,
                    HAS_CROSS,
                )
            else:
                # grad K += grᵀ conj(p)
                gk_re = _put(
                    gk_re,
                    mm(tl.trans(gr_re), p_re, DOT_PREC) + mm(tl.trans(gr_im), p_im, DOT_PREC),
                    gkb + pk,
                    km,
                    HAS_CROSS,
                )
                gk_im = _put(
                    gk_im,
                    mm(tl.trans(gr_im), p_re, DOT_PREC) - mm(tl.trans(gr_re), p_im, DOT_PREC),
                    gkb + M * M + pk,
                    km,
                    HAS_CROSS,
                )
            # gB += conj(Σ_t Fw r)
            fr_re, fr_im = cmul(fw_re, fw_im, r_re, r_im)
            gb_re += tl.sum(fr_re, axis=0)
            gb_im -= tl.sum(fr_im, axis=0)
            # local adjoint of X0v += conj(a)ᵀ dO, a = r Din ; g log λ += Σ_t (t+1) conj(a) g_a
            ai_re, ai_im = cmul(r_re, r_im, din_re, din_im)
            dxv_re = _put(
                dxv_re,
                mm(tl.trans(ai_re), doi, DOT_PREC),
                dxb + px + R + offs_d[None, :],
                vm,
                HAS_CROSS,
            )
            dxv_im = _put(
                dxv_im,
                -mm(tl.trans(ai_im), doi, DOT_PREC),
                dxb + M * NC + px + R + offs_d[None, :],
                vm,
                HAS_CROSS,
            )
            gl_re += tl.sum(tw * (ai_re * ga_re + ai_im * ga_im), axis=0)
            gl_im += tl.sum(tw * (ai_re * ga_im - ai_im * ga_re), axis=0)
            # g log λ += conj(Σ_t rp FwD), FwD = Σ_s dW (t-s) λ^{t-s}
            fwd_re, fwd_im = _decay_d(dW, dWb, a_re, a_im, g_re, g_im, cross, gidf, tcf, dcol, DOT_PREC, HAS_CROSS)
            rf_re, rf_im = cmul(rp_re, rp_im, fwd_re, fwd_im)
            gl_re += tl.sum(rf_re, axis=0)
            gl_im -= tl.sum(rf_im, axis=0)
        if KEY:
            # gp = gr @ conj(K) ; gS = F2(conj(gp) * B) ; g_b = gp * conj(Din)
            if REAL_C:  # g Re p = gx ReC, g Im p = -gx ImC
                gp_re, gp_im = _real_cx(gx, k_base_p, pk, km, M, REAL_PREC)
                gp_im = -gp_im
            else:
                kk_re = tl.load(k_base_p + pk, mask=km, other=0.0)
                kk_im = tl.load(k_base_p + M * M + pk, mask=km, other=0.0)
                gp_re = mm(gr_re, kk_re, DOT_PREC) + mm(gr_im, kk_im, DOT_PREC)
                gp_im = mm(gr_im, kk_re, DOT_PREC) - mm(gr_re, kk_im, DOT_PREC)
                if CONJ_P:
                    gp_im = -gp_im
            cg_re = gp_re * b_re[None, :] + gp_im * b_im[None, :]
            cg_im = gp_re * b_im[None, :] - gp_im * b_re[None, :]
            if HAS_CROSS:
                ca_re, ca_im = cmul(cg_re, cg_im, a_re, a_im)
                gS = mm(ca_re, tl.trans(g_re), DOT_PREC) - mm(ca_im, tl.trans(g_im), DOT_PREC)
            else:
                gS = tl.zeros([BC, BT], dtype=tl.float32)
            gs_band = mm(cg_re, tl.trans(a_re), DOT_PREC) - mm(cg_im, tl.trans(a_im), DOT_PREC)
            gS += _unband(gs_band, t_abs, offs_tc, offs_s, BC)
            gS = tl.where(causal, gS, 0.0)
            gbv_re = gp_re * din_re + gp_im * din_im
            gbv_im = gp_im * din_re - gp_re * din_im
            # gB += Σ_t gp conj(pt) ; g log λ += conj(B) Σ_t gp conj(ptD) (pt, ptD recomputed)
            pt_re, pt_im = _decay(S, Sb, a_re, a_im, g_re, g_im, cross, DOT_PREC, HAS_CROSS)
            gb_re += tl.sum(gp_re * pt_re + gp_im * pt_im, axis=0)
            gb_im += tl.sum(gp_im * pt_re - gp_re * pt_im, axis=0)
            ptd_re, ptd_im = _decay_d(S, Sb, a_re, a_im, g_re, g_im, cross, gidf, tcf, dcol, DOT_PREC, HAS_CROSS)
            h_re = tl.sum(gp_re * ptd_re + gp_im * ptd_im, axis=0)
            h_im = tl.sum(gp_im * ptd_re - gp_re * ptd_im, axis=0)
            gl_re += b_re * h_re + b_im * h_im
            gl_im += b_re * h_im - b_im * h_re
            xk_re = load_f32(x_base + px + offs_r[None, :], xml)
            xk_im = load_f32(x_base + M * NC + px + offs_r[None, :], xml)
            dqi = mm(gS, kc.to(tl.float32), DOT_PREC)
            dqi += mm(gbv_re, xk_re, DOT_PREC) + mm(gbv_im, xk_im, DOT_PREC)
            dq_ptrs = dq + tok_r + t_abs[:, None] * (H * R) + offs_r[None, :]
            tl.store(dq_ptrs, store_as(dqi, dq_ptrs), mask=rmask_r)
            dk_acc = _put(dk_acc, mm(tl.trans(gS), qf, DOT_PREC), dk + tok_r + pr, cmask_r, HAS_CROSS)
            dxk_re = _put(
                dxk_re,
                mm(tl.trans(gbv_re), qf, DOT_PREC),
                dxb + px + offs_r[None, :],
                xm,
                HAS_CROSS,
            )
            dxk_im = _put(
                dxk_im,
                mm(tl.trans(gbv_im), qf, DOT_PREC),
                dxb + M * NC + px + offs_r[None, :],
                xm,
                HAS_CROSS,
            )
            # g log λ += Σ_t (t+1) g_b conj(u), u = q X0kᵀ (recomputed)
            u_re = mm(qf, tl.trans(xk_re), DOT_PREC)
            u_im = mm(qf, tl.trans(xk_im), DOT_PREC)
            gl_re += tl.sum(tw * (gbv_re * u_re + gbv_im * u_im), axis=0)
            gl_im += tl.sum(tw * (gbv_im * u_re - gbv_re * u_im), axis=0)

    if HAS_CROSS:  # several sub-chunks: the accumulated per-chunk outputs
        if KEY:
            tl.store(dk + tok_r + pr, dk_acc, mask=cmask_r)
            tl.store(dxb + px + offs_r[None, :], store_as(dxk_re, dxb), mask=xm)
            tl.store(dxb + M * NC + px + offs_r[None, :], store_as(dxk_im, dxb), mask=xm)
        if VAL:
            tl.store(dv + tok_d + pv, dv_acc, mask=cmask_d)
            tl.store(dxb + px + R + offs_d[None, :], store_as(dxv_re, dxb), mask=vm)
            tl.store(dxb + M * NC + px + R + offs_d[None, :], store_as(dxv_im, dxb), mask=vm)
            tl.store(gkb + pk, store_as(gk_re, gkb), mask=km)
            tl.store(gkb + M * M + pk, store_as(gk_im, gkb), mask=km)
    pb = (i_bh * NT + i_t) * 2 * M
    tl.store(gb_part + pb + offs_m, gb_re, mask=mask_m)
    tl.store(gb_part + pb + M + offs_m, gb_im, mask=mask_m)
    tl.store(gl_part + pb + offs_m, gl_re, mask=mask_m)
    tl.store(gl_part + pb + M + offs_m, gl_im, mask=mask_m)
