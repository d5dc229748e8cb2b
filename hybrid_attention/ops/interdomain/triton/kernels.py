"""Triton kernels of the chunked Interdomain Attention core (imported only when triton is installed).

Notation (see ``hybrid_attention/ops/interdomain/chunk.py`` for the math, ``ops.py`` for the host side). Per (b, h):
the state is X = [X^k | X^v] in C^{M x (R+D)}; a chunk of BT tokens is entered with X0 (stored chunk-boundary state);
P[n] = λ^n (n = 0..BT, complex, overflow-free since |λ^n| <= 1) is the per-head power table, stored planar
(re plane, im plane) in float32 and computed on the host in float64.

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

Kernels:
  _state_fwd   sequential over chunks, parallel over (channel block, mode block, b·h): stores every chunk-entering
               state X_j and the final state. X_{j+1} = λ^L ⊙ X_j + Σ_s B λ^{L-1-s} z_sᵀ (one matmul per chunk).
  _chunk_fwd   parallel over (chunk, b·h): outputs o of one chunk from X_j and the chunk's q, k, v.
  _chunk_bwd   parallel over (chunk, b·h): recomputes the chunk forward and produces dq, the chunk-local parts of
               dk/dv, the chunk's contribution to the adjoint of X_j, and per-chunk partial grads of K, B, log λ.
  _state_bwd   sequential (reverse) over chunks: adjoint state scan dX_{j} = conj(λ^L) dX_{j+1} + local_j, written
               in place; partial grad of log λ through the λ^L carry.
  _chunk_dz    parallel over (chunk, b·h, channel block): the state-carry part of dk/dv and of the B / log λ grads.
  _state_bwd_dz  (``fuse_dz=True``) _state_bwd and _chunk_dz in one sequential launch over (channel block, b·h),
               each program holding all M modes: the carry part of dk/dv/B/log λ is produced while dXe_j is in
               registers, so the adjoint buffer is read once and never written back.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _state_in(ptab, b_re, b_im, Lj, offs_m, offs_s, mask_m, M, BT: tl.constexpr):
    """Input matrix of a chunk of Lj tokens, E[m, s] = B_m λ_m^{Lj-1-s} (zero for s >= Lj), and λ^{Lj}."""
    LP = BT + 1
    ms = offs_s < Lj
    n = tl.where(ms, Lj - 1 - offs_s, 0)
    pm = mask_m[:, None] & ms[None, :]
    p_re = tl.load(ptab + n[None, :] * M + offs_m[:, None], mask=pm, other=0.0)
    p_im = tl.load(ptab + LP * M + n[None, :] * M + offs_m[:, None], mask=pm, other=0.0)
    e_re = b_re[:, None] * p_re - b_im[:, None] * p_im
    e_im = b_re[:, None] * p_im + b_im[:, None] * p_re
    l_re = tl.load(ptab + Lj * M + offs_m, mask=mask_m, other=0.0)
    l_im = tl.load(ptab + LP * M + Lj * M + offs_m, mask=mask_m, other=0.0)
    return e_re, e_im, l_re, l_im


@triton.jit
def _load_z(k_base, v_base, j, Lj, H, R, D, offs_c, offs_s, is_k, is_v, BT: tl.constexpr):
    """The chunk's [k | v] channels of this channel block as float32 [BT, BCH] (rows >= Lj zero)."""
    rows = j * BT + offs_s
    ms = offs_s < Lj
    zk = tl.load(k_base + rows[:, None] * (H * R) + offs_c[None, :], mask=ms[:, None] & is_k[None, :], other=0.0)
    zv = tl.load(v_base + rows[:, None] * (H * D) + (offs_c - R)[None, :], mask=ms[:, None] & is_v[None, :], other=0.0)
    return zk.to(tl.float32) + zv.to(tl.float32)


@triton.jit
def _state_fwd_step(
    j, n_full, x_re, x_im, z, e_re, e_im, l_re, l_im, k_base, v_base, states, i_bh, H, M, R, D, NT, offs_c, offs_s,
    is_k, is_v, st_off, st_mask, STORE_STATES: tl.constexpr, BT: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Full chunk j: store X_j, X_{j+1} = λ^BT ⊙ X_j + E z_j; z_{j+1} is loaded here, one step ahead (the loop
    carries it), so the load latency overlaps this step's matmul and stores."""
    NC = R + D
    z_next = _load_z(k_base, v_base, j + 1, tl.where(j + 1 < n_full, BT, 0), H, R, D, offs_c, offs_s, is_k, is_v, BT)
    if STORE_STATES:
        s_base = states + (i_bh * NT + j) * 2 * M * NC
        tl.store(s_base + st_off, x_re, mask=st_mask)
        tl.store(s_base + M * NC + st_off, x_im, mask=st_mask)
    dx_re = tl.dot(e_re, z, input_precision=DOT_PREC)
    dx_im = tl.dot(e_im, z, input_precision=DOT_PREC)
    nx_re = l_re[:, None] * x_re - l_im[:, None] * x_im + dx_re
    nx_im = l_re[:, None] * x_im + l_im[:, None] * x_re + dx_im
    return nx_re, nx_im, z_next


@triton.jit
def _state_fwd(
    k,
    v,
    P,
    Bp,
    init,
    states,
    final,
    T,
    H,
    M,
    R,
    D,
    NT,
    HAS_INIT: tl.constexpr,
    STORE_STATES: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    USE_WHILE: tl.constexpr,
    BT: tl.constexpr,
    BMS: tl.constexpr,
    BCH: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_m = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    b = i_bh // H
    h = i_bh % H
    NC = R + D
    LP = BT + 1
    offs_m = i_m * BMS + tl.arange(0, BMS)
    offs_c = i_c * BCH + tl.arange(0, BCH)
    offs_s = tl.arange(0, BT)
    mask_m = offs_m < M
    mask_c = offs_c < NC
    is_k = offs_c < R
    is_v = (offs_c >= R) & mask_c
    st_off = offs_m[:, None] * NC + offs_c[None, :]
    st_mask = mask_m[:, None] & mask_c[None, :]
    ptab = P + h * 2 * LP * M
    b_re = tl.load(Bp + h * 2 * M + offs_m, mask=mask_m, other=0.0)
    b_im = tl.load(Bp + h * 2 * M + M + offs_m, mask=mask_m, other=0.0)
    k_base = k + b * T * H * R + h * R
    v_base = v + b * T * H * D + h * D
    if HAS_INIT:
        x_re = tl.load(init + i_bh * 2 * M * NC + st_off, mask=st_mask, other=0.0)
        x_im = tl.load(init + i_bh * 2 * M * NC + M * NC + st_off, mask=st_mask, other=0.0)
    else:
        x_re = tl.zeros([BMS, BCH], dtype=tl.float32)
        x_im = tl.zeros([BMS, BCH], dtype=tl.float32)
    # every full chunk has the same input matrix E and carry λ^BT: computed once, outside the loop
    e_re, e_im, l_re, l_im = _state_in(ptab, b_re, b_im, BT, offs_m, offs_s, mask_m, M, BT)
    n_full = T // BT
    z = _load_z(k_base, v_base, 0, tl.where(n_full > 0, BT, 0), H, R, D, offs_c, offs_s, is_k, is_v, BT)
    if USE_WHILE:  # the interpreter cannot run `range` over a runtime bound with numpy >= 2.3
        j = 0
        while j < n_full:
            x_re, x_im, z = _state_fwd_step(
                j, n_full, x_re, x_im, z, e_re, e_im, l_re, l_im, k_base, v_base, states, i_bh, H, M, R, D, NT,
                offs_c, offs_s, is_k, is_v, st_off, st_mask, STORE_STATES, BT, DOT_PREC,
            )  # fmt: skip
            j += 1
    else:
        for j in range(n_full):
            x_re, x_im, z = _state_fwd_step(
                j, n_full, x_re, x_im, z, e_re, e_im, l_re, l_im, k_base, v_base, states, i_bh, H, M, R, D, NT,
                offs_c, offs_s, is_k, is_v, st_off, st_mask, STORE_STATES, BT, DOT_PREC,
            )  # fmt: skip
    if n_full < NT:  # partial last chunk
        L_last = T - n_full * BT
        e_re, e_im, l_re, l_im = _state_in(ptab, b_re, b_im, L_last, offs_m, offs_s, mask_m, M, BT)
        z = _load_z(k_base, v_base, n_full, L_last, H, R, D, offs_c, offs_s, is_k, is_v, BT)
        if STORE_STATES:
            s_base = states + (i_bh * NT + n_full) * 2 * M * NC
            tl.store(s_base + st_off, x_re, mask=st_mask)
            tl.store(s_base + M * NC + st_off, x_im, mask=st_mask)
        dx_re = tl.dot(e_re, z, input_precision=DOT_PREC)
        dx_im = tl.dot(e_im, z, input_precision=DOT_PREC)
        nx_re = l_re[:, None] * x_re - l_im[:, None] * x_im + dx_re
        nx_im = l_re[:, None] * x_im + l_im[:, None] * x_re + dx_im
        x_re = nx_re
        x_im = nx_im
    if STORE_FINAL:
        tl.store(final + i_bh * 2 * M * NC + st_off, x_re, mask=st_mask)
        tl.store(final + i_bh * 2 * M * NC + M * NC + st_off, x_im, mask=st_mask)


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


@triton.jit
def _cmul(a_re, a_im, b_re, b_im):
    return a_re * b_re - a_im * b_im, a_re * b_im + a_im * b_re


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
    T,
    H,
    M,
    R,
    D,
    NT,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BR: tl.constexpr,
    BD: tl.constexpr,
    BM: tl.constexpr,
    DOT_PREC: tl.constexpr,
    LP_DOT: tl.constexpr,
    CONJ_P: tl.constexpr,
):
    """Outputs of one chunk. CONJ_P (the Hermitian readout): the key-side vector p_t = X^k_t q_t enters the readout
    conjugated, r = K conj(p) with K = Cᵀ conj(C) from the host (see ops/interdomain/readout.py)."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    b = i_bh // H
    h = i_bh % H
    NC = R + D
    LP = BT + 1
    HAS_CROSS: tl.constexpr = BT > BC  # BC == BT: one sub-chunk, every decay comes from the band matmuls
    t0 = i_t * BT
    Lj = tl.minimum(BT, T - t0)
    offs_s = tl.arange(0, BT)
    offs_tc = tl.arange(0, BC)
    offs_r = tl.arange(0, BR)
    offs_d = tl.arange(0, BD)
    offs_m = tl.arange(0, BM)
    mask_r = offs_r < R
    mask_d = offs_d < D
    mask_m = offs_m < M
    col_ok = offs_s < Lj
    ptab = P + h * 2 * LP * M
    q_base = q + b * T * H * R + h * R + t0 * H * R
    k_base = k + b * T * H * R + h * R + t0 * H * R
    v_base = v + b * T * H * D + h * D + t0 * H * D
    o_base = o + b * T * H * D + h * D + t0 * H * D
    x_base = states + (i_bh * NT + i_t) * 2 * M * NC
    k_base_p = Kp + h * 2 * M * M

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
            S = tl.dot(qi.to(tl.float32), tl.trans(kc.to(tl.float32)), input_precision=DOT_PREC)
        S = tl.where(causal, S, 0.0)
        if HAS_CROSS:  # columns of earlier sub-chunks: λ^{t-s} = λ^{t-b_i} λ^{b_i-s}, both exponents >= 0
            cross = offs_s < bi
            Sx = tl.where(cross[None, :], S, 0.0)
            gm = cross[:, None] & am
            gidx = tl.where(cross, bi - offs_s, 0)
            g_re = tl.load(ptab + gidx[:, None] * M + offs_m[None, :], mask=gm, other=0.0)
            g_im = tl.load(ptab + LP * M + gidx[:, None] * M + offs_m[None, :], mask=gm, other=0.0)
            y_re = tl.dot(Sx, g_re, input_precision=DOT_PREC)
            y_im = tl.dot(Sx, g_im, input_precision=DOT_PREC)
            pt_re, pt_im = _cmul(a_re, a_im, y_re, y_im)
        else:
            pt_re = tl.zeros([BC, BM], dtype=tl.float32)
            pt_im = tl.zeros([BC, BM], dtype=tl.float32)
        # diagonal block as a band matmul: Σ_d S[t, t-d] λ^d = (band(S) @ P[0:BC])[t]
        Sb = _band(S, t_abs, offs_tc)
        pt_re += tl.dot(Sb, a_re, input_precision=DOT_PREC)
        pt_im += tl.dot(Sb, a_im, input_precision=DOT_PREC)
        din_re = tl.load(ptab + (t_abs + 1)[:, None] * M + offs_m[None, :], mask=am, other=0.0)
        din_im = tl.load(ptab + LP * M + (t_abs + 1)[:, None] * M + offs_m[None, :], mask=am, other=0.0)
        xm = mask_m[:, None] & mask_r[None, :]
        xk_re = tl.load(x_base + offs_m[:, None] * NC + offs_r[None, :], mask=xm, other=0.0)
        xk_im = tl.load(x_base + M * NC + offs_m[:, None] * NC + offs_r[None, :], mask=xm, other=0.0)
        qf = qi.to(tl.float32)
        u_re = tl.dot(qf, tl.trans(xk_re), input_precision=DOT_PREC)
        u_im = tl.dot(qf, tl.trans(xk_im), input_precision=DOT_PREC)
        p_re, p_im = _cmul(b_re[None, :], b_im[None, :], pt_re, pt_im)
        du_re, du_im = _cmul(din_re, din_im, u_re, u_im)
        p_re += du_re
        p_im += du_im
        if CONJ_P:
            p_im = -p_im
        km = mask_m[:, None] & am
        # KT[n, m] = K[m, n] so that r = p @ KT, r_t[m] = Σ_n K[m, n] p_t[n]
        kt_re = tl.load(k_base_p + offs_m[None, :] * M + offs_m[:, None], mask=km, other=0.0)
        kt_im = tl.load(k_base_p + M * M + offs_m[None, :] * M + offs_m[:, None], mask=km, other=0.0)
        r_re = tl.dot(p_re, kt_re, input_precision=DOT_PREC) - tl.dot(p_im, kt_im, input_precision=DOT_PREC)
        r_im = tl.dot(p_re, kt_im, input_precision=DOT_PREC) + tl.dot(p_im, kt_re, input_precision=DOT_PREC)
        rp_re, rp_im = _cmul(r_re, r_im, b_re[None, :], b_im[None, :])
        if HAS_CROSS:
            ra_re, ra_im = _cmul(rp_re, rp_im, a_re, a_im)
            W = tl.dot(ra_re, tl.trans(g_re), input_precision=DOT_PREC) - tl.dot(
                ra_im, tl.trans(g_im), input_precision=DOT_PREC
            )
        else:
            W = tl.zeros([BC, BT], dtype=tl.float32)
        # W[t, t-d] = Re Σ_m rp[t, m] λ_m^d = (Re(rp @ P[0:BC]ᵀ))[t, d], gathered back to [t, s]
        wb = tl.dot(rp_re, tl.trans(a_re), input_precision=DOT_PREC) - tl.dot(
            rp_im, tl.trans(a_im), input_precision=DOT_PREC
        )
        W += _unband(wb, t_abs, offs_tc, offs_s, BC)
        W = tl.where(causal, W, 0.0)
        vm = mask_m[:, None] & mask_d[None, :]
        xv_re = tl.load(x_base + offs_m[:, None] * NC + R + offs_d[None, :], mask=vm, other=0.0)
        xv_im = tl.load(x_base + M * NC + offs_m[:, None] * NC + R + offs_d[None, :], mask=vm, other=0.0)
        ai_re, ai_im = _cmul(r_re, r_im, din_re, din_im)
        vc = tl.load(
            v_base + offs_s[:, None] * (H * D) + offs_d[None, :], mask=col_ok[:, None] & mask_d[None, :], other=0.0
        )
        out = tl.dot(W, vc.to(tl.float32), input_precision=DOT_PREC)
        out += tl.dot(ai_re, xv_re, input_precision=DOT_PREC) - tl.dot(ai_im, xv_im, input_precision=DOT_PREC)
        tl.store(
            o_base + t_abs[:, None] * (H * D) + offs_d[None, :],
            out.to(o.dtype.element_ty),
            mask=row_ok[:, None] & mask_d[None, :],
        )


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
    T,
    H,
    M,
    R,
    D,
    NT,
    PART: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BR: tl.constexpr,
    BD: tl.constexpr,
    BM: tl.constexpr,
    DOT_PREC: tl.constexpr,
    LP_DOT: tl.constexpr,
    CONJ_P: tl.constexpr,
):
    """Backward of one chunk (CONJ_P: the Hermitian readout, as in _chunk_fwd; the gradient w.r.t. p is then the
    conjugate of the one w.r.t. conj(p)). PART 0 computes everything; PART 1 the value side (dv, the X0v columns of the
    local adjoint, dK, and the W / inter-chunk-readout terms of dB, d log λ); PART 2 the key side (dq, dk, the X0k
    columns, the p terms of dB, d log λ). The split halves the live registers (two launches instead of one spilling
    one)."""
    VAL: tl.constexpr = PART != 2
    KEY: tl.constexpr = PART != 1
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    b = i_bh // H
    h = i_bh % H
    NC = R + D
    LP = BT + 1
    HAS_CROSS: tl.constexpr = BT > BC  # BC == BT: one sub-chunk, every decay comes from the band matmuls
    t0 = i_t * BT
    Lj = tl.minimum(BT, T - t0)
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
    ptab = P + h * 2 * LP * M
    tok_r = b * T * H * R + h * R + t0 * H * R
    tok_d = b * T * H * D + h * D + t0 * H * D
    x_base = states + (i_bh * NT + i_t) * 2 * M * NC
    k_base_p = Kp + h * 2 * M * M

    b_re = tl.load(Bp + h * 2 * M + offs_m, mask=mask_m, other=0.0)
    b_im = tl.load(Bp + h * 2 * M + M + offs_m, mask=mask_m, other=0.0)
    a_re = tl.load(ptab + offs_tc[:, None] * M + offs_m[None, :], mask=am, other=0.0)
    a_im = tl.load(ptab + LP * M + offs_tc[:, None] * M + offs_m[None, :], mask=am, other=0.0)
    tcf = offs_tc.to(tl.float32)[:, None]
    dcol = offs_tc.to(tl.float32)[None, :]  # the offset d of a band column

    if VAL:
        dv_acc = tl.zeros([BT, BD], dtype=tl.float32)
        gk_re = tl.zeros([BM, BM], dtype=tl.float32)
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

    for i in range(BT // BC):
        bi = i * BC
        t_abs = bi + offs_tc
        row_ok = t_abs < Lj
        rmask_r = row_ok[:, None] & mask_r[None, :]
        rmask_d = row_ok[:, None] & mask_d[None, :]
        tw = (t_abs + 1).to(tl.float32)[:, None]
        kc = tl.load(
            k + tok_r + offs_s[:, None] * (H * R) + offs_r[None, :], mask=col_ok[:, None] & mask_r[None, :], other=0.0
        )
        qi = tl.load(q + tok_r + t_abs[:, None] * (H * R) + offs_r[None, :], mask=rmask_r, other=0.0)
        qf = qi.to(tl.float32)
        causal = (offs_s[None, :] <= t_abs[:, None]) & row_ok[:, None] & col_ok[None, :]
        if LP_DOT:  # native bf16/fp16 tensor-core product (exact products, fp32 accumulation)
            S = tl.dot(qi, tl.trans(kc))
        else:  # float32 inputs, or bf16 under the interpreter (whose bf16 dot is broken in triton 3.6)
            S = tl.dot(qf, tl.trans(kc.to(tl.float32)), input_precision=DOT_PREC)
        S = tl.where(causal, S, 0.0)
        # ---- forward recompute: pt = Σ_s S λ^{t-s} (and ptd = Σ_s S (t-s) λ^{t-s} for the key side) ----
        if HAS_CROSS:
            cross = offs_s < bi
            Sx = tl.where(cross[None, :], S, 0.0)
            gm = cross[:, None] & am
            gidx = tl.where(cross, bi - offs_s, 0)
            g_re = tl.load(ptab + gidx[:, None] * M + offs_m[None, :], mask=gm, other=0.0)
            g_im = tl.load(ptab + LP * M + gidx[:, None] * M + offs_m[None, :], mask=gm, other=0.0)
            gidf = gidx.to(tl.float32)[:, None]
            y_re = tl.dot(Sx, g_re, input_precision=DOT_PREC)
            y_im = tl.dot(Sx, g_im, input_precision=DOT_PREC)
            pt_re, pt_im = _cmul(a_re, a_im, y_re, y_im)
            if KEY:
                yd_re = tl.dot(Sx, gidf * g_re, input_precision=DOT_PREC)
                yd_im = tl.dot(Sx, gidf * g_im, input_precision=DOT_PREC)
                ptd_re, ptd_im = _cmul(a_re, a_im, yd_re, yd_im)
                ptd_re += tcf * pt_re
                ptd_im += tcf * pt_im
        else:
            pt_re = tl.zeros([BC, BM], dtype=tl.float32)
            pt_im = tl.zeros([BC, BM], dtype=tl.float32)
            if KEY:
                ptd_re = tl.zeros([BC, BM], dtype=tl.float32)
                ptd_im = tl.zeros([BC, BM], dtype=tl.float32)
        Sb = _band(S, t_abs, offs_tc)
        pt_re += tl.dot(Sb, a_re, input_precision=DOT_PREC)
        pt_im += tl.dot(Sb, a_im, input_precision=DOT_PREC)
        if KEY:
            Sbd = Sb * dcol
            ptd_re += tl.dot(Sbd, a_re, input_precision=DOT_PREC)
            ptd_im += tl.dot(Sbd, a_im, input_precision=DOT_PREC)
        din_re = tl.load(ptab + (t_abs + 1)[:, None] * M + offs_m[None, :], mask=am, other=0.0)
        din_im = tl.load(ptab + LP * M + (t_abs + 1)[:, None] * M + offs_m[None, :], mask=am, other=0.0)
        xk_re = tl.load(x_base + offs_m[:, None] * NC + offs_r[None, :], mask=xm, other=0.0)
        xk_im = tl.load(x_base + M * NC + offs_m[:, None] * NC + offs_r[None, :], mask=xm, other=0.0)
        u_re = tl.dot(qf, tl.trans(xk_re), input_precision=DOT_PREC)
        u_im = tl.dot(qf, tl.trans(xk_im), input_precision=DOT_PREC)
        if VAL:
            p_re, p_im = _cmul(b_re[None, :], b_im[None, :], pt_re, pt_im)
            du_re, du_im = _cmul(din_re, din_im, u_re, u_im)
            p_re += du_re
            p_im += du_im
            if CONJ_P:
                p_im = -p_im
            kt_re = tl.load(k_base_p + offs_m[None, :] * M + offs_m[:, None], mask=km, other=0.0)
            kt_im = tl.load(k_base_p + M * M + offs_m[None, :] * M + offs_m[:, None], mask=km, other=0.0)
            r_re = tl.dot(p_re, kt_re, input_precision=DOT_PREC) - tl.dot(p_im, kt_im, input_precision=DOT_PREC)
            r_im = tl.dot(p_re, kt_im, input_precision=DOT_PREC) + tl.dot(p_im, kt_re, input_precision=DOT_PREC)
            rp_re, rp_im = _cmul(r_re, r_im, b_re[None, :], b_im[None, :])
            if HAS_CROSS:
                ra_re, ra_im = _cmul(rp_re, rp_im, a_re, a_im)
                W = tl.dot(ra_re, tl.trans(g_re), input_precision=DOT_PREC) - tl.dot(
                    ra_im, tl.trans(g_im), input_precision=DOT_PREC
                )
            else:
                W = tl.zeros([BC, BT], dtype=tl.float32)
            wb = tl.dot(rp_re, tl.trans(a_re), input_precision=DOT_PREC) - tl.dot(
                rp_im, tl.trans(a_im), input_precision=DOT_PREC
            )
            W += _unband(wb, t_abs, offs_tc, offs_s, BC)
            W = tl.where(causal, W, 0.0)
            ai_re, ai_im = _cmul(r_re, r_im, din_re, din_im)

        # ---- backward of the chunk ----
        vc = tl.load(
            v + tok_d + offs_s[:, None] * (H * D) + offs_d[None, :], mask=col_ok[:, None] & mask_d[None, :], other=0.0
        )
        doi = tl.load(do + tok_d + t_abs[:, None] * (H * D) + offs_d[None, :], mask=rmask_d, other=0.0).to(tl.float32)
        dW = tl.where(causal, tl.dot(doi, tl.trans(vc.to(tl.float32)), input_precision=DOT_PREC), 0.0)
        if VAL:
            dv_acc += tl.dot(tl.trans(W), doi, input_precision=DOT_PREC)
        # Fw = Σ_s dW λ^{t-s} (and FwD = Σ_s dW (t-s) λ^{t-s} for the value side)
        if HAS_CROSS:
            dWx = tl.where(cross[None, :], dW, 0.0)
            fy_re = tl.dot(dWx, g_re, input_precision=DOT_PREC)
            fy_im = tl.dot(dWx, g_im, input_precision=DOT_PREC)
            fw_re, fw_im = _cmul(a_re, a_im, fy_re, fy_im)
            if VAL:
                fyd_re = tl.dot(dWx, gidf * g_re, input_precision=DOT_PREC)
                fyd_im = tl.dot(dWx, gidf * g_im, input_precision=DOT_PREC)
                fwd_re, fwd_im = _cmul(a_re, a_im, fyd_re, fyd_im)
                fwd_re += tcf * fw_re
                fwd_im += tcf * fw_im
        else:
            fw_re = tl.zeros([BC, BM], dtype=tl.float32)
            fw_im = tl.zeros([BC, BM], dtype=tl.float32)
            if VAL:
                fwd_re = tl.zeros([BC, BM], dtype=tl.float32)
                fwd_im = tl.zeros([BC, BM], dtype=tl.float32)
        dWb = _band(dW, t_abs, offs_tc)
        fw_re += tl.dot(dWb, a_re, input_precision=DOT_PREC)
        fw_im += tl.dot(dWb, a_im, input_precision=DOT_PREC)
        if VAL:
            dWbd = dWb * dcol
            fwd_re += tl.dot(dWbd, a_re, input_precision=DOT_PREC)
            fwd_im += tl.dot(dWbd, a_im, input_precision=DOT_PREC)
        xv_re = tl.load(x_base + offs_m[:, None] * NC + R + offs_d[None, :], mask=vm, other=0.0)
        xv_im = tl.load(x_base + M * NC + offs_m[:, None] * NC + R + offs_d[None, :], mask=vm, other=0.0)
        # g_a = dO conj(X0v)^T ; gr = conj(Fw * B) + g_a * conj(Din)
        ga_re = tl.dot(doi, tl.trans(xv_re), input_precision=DOT_PREC)
        ga_im = -tl.dot(doi, tl.trans(xv_im), input_precision=DOT_PREC)
        fb_re, fb_im = _cmul(fw_re, fw_im, b_re[None, :], b_im[None, :])
        gr_re = fb_re + ga_re * din_re + ga_im * din_im
        gr_im = -fb_im + ga_im * din_re - ga_re * din_im
        if VAL:
            # grad K += gr^T conj(p) ; local adjoint of X0v += conj(a)^T dO
            gk_re += tl.dot(tl.trans(gr_re), p_re, input_precision=DOT_PREC) + tl.dot(
                tl.trans(gr_im), p_im, input_precision=DOT_PREC
            )
            gk_im += tl.dot(tl.trans(gr_im), p_re, input_precision=DOT_PREC) - tl.dot(
                tl.trans(gr_re), p_im, input_precision=DOT_PREC
            )
            dxv_re += tl.dot(tl.trans(ai_re), doi, input_precision=DOT_PREC)
            dxv_im -= tl.dot(tl.trans(ai_im), doi, input_precision=DOT_PREC)
            # gB += conj(Σ_t Fw r) ; g log λ += conj(Σ_t rp FwD) + Σ_t (t+1) conj(a) g_a
            fr_re, fr_im = _cmul(fw_re, fw_im, r_re, r_im)
            gb_re += tl.sum(fr_re, axis=0)
            gb_im -= tl.sum(fr_im, axis=0)
            rf_re, rf_im = _cmul(rp_re, rp_im, fwd_re, fwd_im)
            gl_re += tl.sum(rf_re, axis=0)
            gl_im -= tl.sum(rf_im, axis=0)
            gl_re += tl.sum(tw * (ai_re * ga_re + ai_im * ga_im), axis=0)
            gl_im += tl.sum(tw * (ai_re * ga_im - ai_im * ga_re), axis=0)
        if KEY:
            # gp = gr @ conj(K) ; gS = F2(conj(gp) * B) ; g_b = gp * conj(Din)
            kk_re = tl.load(k_base_p + offs_m[:, None] * M + offs_m[None, :], mask=km, other=0.0)
            kk_im = tl.load(k_base_p + M * M + offs_m[:, None] * M + offs_m[None, :], mask=km, other=0.0)
            gp_re = tl.dot(gr_re, kk_re, input_precision=DOT_PREC) + tl.dot(gr_im, kk_im, input_precision=DOT_PREC)
            gp_im = tl.dot(gr_im, kk_re, input_precision=DOT_PREC) - tl.dot(gr_re, kk_im, input_precision=DOT_PREC)
            if CONJ_P:
                gp_im = -gp_im
            cg_re = gp_re * b_re[None, :] + gp_im * b_im[None, :]
            cg_im = gp_re * b_im[None, :] - gp_im * b_re[None, :]
            if HAS_CROSS:
                ca_re, ca_im = _cmul(cg_re, cg_im, a_re, a_im)
                gS = tl.dot(ca_re, tl.trans(g_re), input_precision=DOT_PREC) - tl.dot(
                    ca_im, tl.trans(g_im), input_precision=DOT_PREC
                )
            else:
                gS = tl.zeros([BC, BT], dtype=tl.float32)
            gs_band = tl.dot(cg_re, tl.trans(a_re), input_precision=DOT_PREC) - tl.dot(
                cg_im, tl.trans(a_im), input_precision=DOT_PREC
            )
            gS += _unband(gs_band, t_abs, offs_tc, offs_s, BC)
            gS = tl.where(causal, gS, 0.0)
            gbv_re = gp_re * din_re + gp_im * din_im
            gbv_im = gp_im * din_re - gp_re * din_im
            dqi = tl.dot(gS, kc.to(tl.float32), input_precision=DOT_PREC)
            dqi += tl.dot(gbv_re, xk_re, input_precision=DOT_PREC) + tl.dot(gbv_im, xk_im, input_precision=DOT_PREC)
            tl.store(dq + tok_r + t_abs[:, None] * (H * R) + offs_r[None, :], dqi, mask=rmask_r)
            dk_acc += tl.dot(tl.trans(gS), qf, input_precision=DOT_PREC)
            dxk_re += tl.dot(tl.trans(gbv_re), qf, input_precision=DOT_PREC)
            dxk_im += tl.dot(tl.trans(gbv_im), qf, input_precision=DOT_PREC)
            # gB += Σ_t gp conj(pt) ; g log λ += conj(B) Σ_t gp conj(ptD) + Σ_t (t+1) g_b conj(u)
            gb_re += tl.sum(gp_re * pt_re + gp_im * pt_im, axis=0)
            gb_im += tl.sum(gp_im * pt_re - gp_re * pt_im, axis=0)
            h_re = tl.sum(gp_re * ptd_re + gp_im * ptd_im, axis=0)
            h_im = tl.sum(gp_im * ptd_re - gp_re * ptd_im, axis=0)
            gl_re += b_re * h_re + b_im * h_im
            gl_im += b_re * h_im - b_im * h_re
            gl_re += tl.sum(tw * (gbv_re * u_re + gbv_im * u_im), axis=0)
            gl_im += tl.sum(tw * (gbv_im * u_re - gbv_re * u_im), axis=0)

    dxb = dxloc + (i_bh * NT + i_t) * 2 * M * NC
    if KEY:
        tl.store(
            dk + tok_r + offs_s[:, None] * (H * R) + offs_r[None, :], dk_acc, mask=col_ok[:, None] & mask_r[None, :]
        )
        tl.store(dxb + offs_m[:, None] * NC + offs_r[None, :], dxk_re, mask=xm)
        tl.store(dxb + M * NC + offs_m[:, None] * NC + offs_r[None, :], dxk_im, mask=xm)
    if VAL:
        tl.store(
            dv + tok_d + offs_s[:, None] * (H * D) + offs_d[None, :], dv_acc, mask=col_ok[:, None] & mask_d[None, :]
        )
        tl.store(dxb + offs_m[:, None] * NC + R + offs_d[None, :], dxv_re, mask=vm)
        tl.store(dxb + M * NC + offs_m[:, None] * NC + R + offs_d[None, :], dxv_im, mask=vm)
        gkb = gk_part + (i_bh * NT + i_t) * 2 * M * M
        tl.store(gkb + offs_m[:, None] * M + offs_m[None, :], gk_re, mask=km)
        tl.store(gkb + M * M + offs_m[:, None] * M + offs_m[None, :], gk_im, mask=km)
    pb = (i_bh * NT + i_t) * 2 * M
    tl.store(gb_part + pb + offs_m, gb_re, mask=mask_m)
    tl.store(gb_part + pb + M + offs_m, gb_im, mask=mask_m)
    tl.store(gl_part + pb + offs_m, gl_re, mask=mask_m)
    tl.store(gl_part + pb + M + offs_m, gl_im, mask=mask_m)


@triton.jit
def _state_bwd_step(
    j, e_re, e_im, acc_re, acc_im, loc_re, loc_im, x_re, x_im, dx, states, ptab, i_bh, T, M, NC, NT, offs_m, mask_m,
    st_off, st_mask, BT: tl.constexpr,
):  # fmt: skip
    """One reverse step on chunk j (its local adjoint loc and state x were prefetched one step earlier); prefetches
    chunk j-1's and returns them."""
    LP = BT + 1
    pbase = (i_bh * NT + tl.maximum(j - 1, 0)) * 2 * M * NC
    # a tensor comparison, not `st_mask & (j > 0)`: the triton 3.9 interpreter gives that scalar-bool mix an int dtype
    pmask = st_mask & ((st_off * 0 + j) > 0)
    nloc_re = tl.load(dx + pbase + st_off, mask=pmask, other=0.0)
    nloc_im = tl.load(dx + pbase + M * NC + st_off, mask=pmask, other=0.0)
    nx_re = tl.load(states + pbase + st_off, mask=pmask, other=0.0)
    nx_im = tl.load(states + pbase + M * NC + st_off, mask=pmask, other=0.0)
    base = (i_bh * NT + j) * 2 * M * NC
    tl.store(dx + base + st_off, e_re, mask=st_mask)
    tl.store(dx + base + M * NC + st_off, e_im, mask=st_mask)
    Lj = tl.minimum(BT, T - j * BT)
    l_re = tl.load(ptab + Lj * M + offs_m, mask=mask_m, other=0.0)
    l_im = tl.load(ptab + LP * M + Lj * M + offs_m, mask=mask_m, other=0.0)
    # s = Σ_c conj(X_j) dXe_j ; acc += Lj conj(λ^Lj) s
    s_re = tl.sum(x_re * e_re + x_im * e_im, axis=1)
    s_im = tl.sum(x_re * e_im - x_im * e_re, axis=1)
    lf = Lj * 1.0
    acc_re += lf * (l_re * s_re + l_im * s_im)
    acc_im += lf * (l_re * s_im - l_im * s_re)
    ne_re = l_re[:, None] * e_re + l_im[:, None] * e_im + loc_re
    ne_im = l_re[:, None] * e_im - l_im[:, None] * e_re + loc_im
    return ne_re, ne_im, acc_re, acc_im, nloc_re, nloc_im, nx_re, nx_im


@triton.jit
def _state_bwd(
    P,
    states,
    dx,
    dfinal,
    dinit,
    gl_part,
    T,
    H,
    M,
    R,
    D,
    NT,
    HAS_DFINAL: tl.constexpr,
    STORE_DINIT: tl.constexpr,
    USE_WHILE: tl.constexpr,
    BT: tl.constexpr,
    BMS: tl.constexpr,
    BCH: tl.constexpr,
):
    """Reverse adjoint scan. On entry dx[j] holds chunk j's local adjoint of X_j; on exit dx[j] holds dXe_j, the
    total adjoint of the state after chunk j (= X_{j+1}), which ``_chunk_dz`` turns into dk/dv. Loads are
    software-prefetched one chunk ahead (the loop has no matmul for the compiler to pipeline around)."""
    i_c = tl.program_id(0)
    i_m = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    h = i_bh % H
    NC = R + D
    LP = BT + 1
    n_cb = tl.num_programs(0)
    offs_m = i_m * BMS + tl.arange(0, BMS)
    offs_c = i_c * BCH + tl.arange(0, BCH)
    mask_m = offs_m < M
    mask_c = offs_c < NC
    st_off = offs_m[:, None] * NC + offs_c[None, :]
    st_mask = mask_m[:, None] & mask_c[None, :]
    ptab = P + h * 2 * LP * M
    if HAS_DFINAL:
        e_re = tl.load(dfinal + i_bh * 2 * M * NC + st_off, mask=st_mask, other=0.0)
        e_im = tl.load(dfinal + i_bh * 2 * M * NC + M * NC + st_off, mask=st_mask, other=0.0)
    else:
        e_re = tl.zeros([BMS, BCH], dtype=tl.float32)
        e_im = tl.zeros([BMS, BCH], dtype=tl.float32)
    acc_re = tl.zeros([BMS], dtype=tl.float32)
    acc_im = tl.zeros([BMS], dtype=tl.float32)
    last = (i_bh * NT + NT - 1) * 2 * M * NC
    loc_re = tl.load(dx + last + st_off, mask=st_mask, other=0.0)
    loc_im = tl.load(dx + last + M * NC + st_off, mask=st_mask, other=0.0)
    x_re = tl.load(states + last + st_off, mask=st_mask, other=0.0)
    x_im = tl.load(states + last + M * NC + st_off, mask=st_mask, other=0.0)
    if USE_WHILE:
        jj = 0
        while jj < NT:
            e_re, e_im, acc_re, acc_im, loc_re, loc_im, x_re, x_im = _state_bwd_step(
                NT - 1 - jj, e_re, e_im, acc_re, acc_im, loc_re, loc_im, x_re, x_im, dx, states, ptab, i_bh, T, M,
                NC, NT, offs_m, mask_m, st_off, st_mask, BT,
            )  # fmt: skip
            jj += 1
    else:
        for jj in range(NT):
            e_re, e_im, acc_re, acc_im, loc_re, loc_im, x_re, x_im = _state_bwd_step(
                NT - 1 - jj, e_re, e_im, acc_re, acc_im, loc_re, loc_im, x_re, x_im, dx, states, ptab, i_bh, T, M,
                NC, NT, offs_m, mask_m, st_off, st_mask, BT,
            )  # fmt: skip
    if STORE_DINIT:
        tl.store(dinit + i_bh * 2 * M * NC + st_off, e_re, mask=st_mask)
        tl.store(dinit + i_bh * 2 * M * NC + M * NC + st_off, e_im, mask=st_mask)
    pb = (i_bh * n_cb + i_c) * 2 * M
    tl.store(gl_part + pb + offs_m, acc_re, mask=mask_m)
    tl.store(gl_part + pb + M + offs_m, acc_im, mask=mask_m)


@triton.jit
def _chunk_dz(
    k,
    v,
    dk,
    dv,
    P,
    Bp,
    dx,
    gb_part,
    gl_part,
    T,
    H,
    M,
    R,
    D,
    NT,
    BT: tl.constexpr,
    BM: tl.constexpr,
    BCH: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """dz_s += Re Σ_m conj(B λ^{L-1-s})_m dXe[m, :] (state-carry part of dk, dv) and the B / log λ partials."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_c = tl.program_id(2)
    n_cb = tl.num_programs(2)
    b = i_bh // H
    h = i_bh % H
    NC = R + D
    LP = BT + 1
    t0 = i_t * BT
    Lj = tl.minimum(BT, T - t0)
    offs_s = tl.arange(0, BT)
    offs_m = tl.arange(0, BM)
    offs_c = i_c * BCH + tl.arange(0, BCH)
    mask_m = offs_m < M
    mask_c = offs_c < NC
    is_k = offs_c < R
    is_v = (offs_c >= R) & mask_c
    ms = offs_s < Lj
    ptab = P + h * 2 * LP * M
    n = tl.where(ms, Lj - 1 - offs_s, 0)
    pm = ms[:, None] & mask_m[None, :]
    p_re = tl.load(ptab + n[:, None] * M + offs_m[None, :], mask=pm, other=0.0)
    p_im = tl.load(ptab + LP * M + n[:, None] * M + offs_m[None, :], mask=pm, other=0.0)
    b_re = tl.load(Bp + h * 2 * M + offs_m, mask=mask_m, other=0.0)
    b_im = tl.load(Bp + h * 2 * M + M + offs_m, mask=mask_m, other=0.0)
    e_re, e_im = _cmul(p_re, p_im, b_re[None, :], b_im[None, :])
    base = dx + (i_bh * NT + i_t) * 2 * M * NC
    st_off = offs_m[:, None] * NC + offs_c[None, :]
    st_mask = mask_m[:, None] & mask_c[None, :]
    x_re = tl.load(base + st_off, mask=st_mask, other=0.0)
    x_im = tl.load(base + M * NC + st_off, mask=st_mask, other=0.0)
    dz = tl.dot(e_re, x_re, input_precision=DOT_PREC) + tl.dot(e_im, x_im, input_precision=DOT_PREC)
    rows = t0 + offs_s
    kofs = b * T * H * R + h * R + rows[:, None] * (H * R) + offs_c[None, :]
    vofs = b * T * H * D + h * D + rows[:, None] * (H * D) + (offs_c - R)[None, :]
    kmask = ms[:, None] & is_k[None, :]
    vmask = ms[:, None] & is_v[None, :]
    zk = tl.load(k + kofs, mask=kmask, other=0.0)
    zv = tl.load(v + vofs, mask=vmask, other=0.0)
    z = zk.to(tl.float32) + zv.to(tl.float32)
    # Y[s, m] = Σ_c dXe[m, c] z_s[c]
    y_re = tl.dot(z, tl.trans(x_re), input_precision=DOT_PREC)
    y_im = tl.dot(z, tl.trans(x_im), input_precision=DOT_PREC)
    # gB += Σ_s conj(λ^n) Y ; g log λ += Σ_s n conj(E) Y
    gb_re = tl.sum(p_re * y_re + p_im * y_im, axis=0)
    gb_im = tl.sum(p_re * y_im - p_im * y_re, axis=0)
    nf = n.to(tl.float32)[:, None]
    gl_re = tl.sum(nf * (e_re * y_re + e_im * y_im), axis=0)
    gl_im = tl.sum(nf * (e_re * y_im - e_im * y_re), axis=0)
    pb = ((i_bh * NT + i_t) * n_cb + i_c) * 2 * M
    tl.store(gb_part + pb + offs_m, gb_re, mask=mask_m)
    tl.store(gb_part + pb + M + offs_m, gb_im, mask=mask_m)
    tl.store(gl_part + pb + offs_m, gl_re, mask=mask_m)
    tl.store(gl_part + pb + M + offs_m, gl_im, mask=mask_m)
    dk_old = tl.load(dk + kofs, mask=kmask, other=0.0)
    tl.store(dk + kofs, dk_old + dz, mask=kmask)
    dv_old = tl.load(dv + vofs, mask=vmask, other=0.0)
    tl.store(dv + vofs, dv_old + dz, mask=vmask)


# ----------------------------------------------------------------------------------------------------------------------
# Fused reverse scan + state-carry gradient (``set_kernel_config(fuse_dz=True)``): replaces _state_bwd + _chunk_dz.
#
# Parallelisation (design decision): one program per (channel block, b·h) holding ALL M modes of its channels, tile
# [BM, BCH]. The state-carry part of dk / dv, dz_s[c] = Re Σ_m conj(B λ^{L-1-s})_m dXe[m, c], is a sum over every
# mode, so a program that owns all modes of its channels finishes dz without any cross-program reduction: no atomics
# (deterministic results, no read-modify-write race on dk / dv) and no [T, M, R+D] partial buffer. With M = 64 and
# BCH = 16 the tile is as large as the unfused scan's 32 x 32 tile and the grid keeps (R+D)/16 x B·H programs (128 at
# B=1, H=16, R=D=64) -- the same count as the unfused scan. The other two terms (dB, d log λ) are sums over channels:
# each program accumulates its channel block's share per mode in registers across all chunks and writes one partial
# per (b·h, channel block), summed on the host (instead of one partial per chunk as _chunk_dz wrote).
# The adjoint dXe_j is used while it is in registers, so the dx buffer is read (local adjoints) but never written back
# nor re-read, and one launch disappears.


@triton.jit
def _dz_table(ptab, Lj, offs_s, offs_m, mask_m, M, BT: tl.constexpr):
    """Rows of a chunk of Lj tokens: P[s, m] = λ_m^{n_s}, n_s = Lj-1-s (zero rows for s >= Lj), n_s as float, and
    the chunk carry λ^{Lj}."""
    LP = BT + 1
    ms = offs_s < Lj
    n = tl.where(ms, Lj - 1 - offs_s, 0)
    pm = ms[:, None] & mask_m[None, :]
    p_re = tl.load(ptab + n[:, None] * M + offs_m[None, :], mask=pm, other=0.0)
    p_im = tl.load(ptab + LP * M + n[:, None] * M + offs_m[None, :], mask=pm, other=0.0)
    l_re = tl.load(ptab + Lj * M + offs_m, mask=mask_m, other=0.0)
    l_im = tl.load(ptab + LP * M + Lj * M + offs_m, mask=mask_m, other=0.0)
    return p_re, p_im, n.to(tl.float32), l_re, l_im


@triton.jit
def _z_tile_offsets(j, Lj, H, R, D, offs_c, offs_s, is_k, is_v, BT: tl.constexpr):
    """Offsets and masks of chunk j's [BT, BCH] tile of the [k | v] channel block (rows >= Lj masked): k channels
    at offs_c of a [T, H, R] tensor, v channels at offs_c - R of a [T, H, D] tensor; the two masks are disjoint."""
    rows = j * BT + offs_s
    ms = offs_s < Lj
    kofs = rows[:, None] * (H * R) + offs_c[None, :]
    vofs = rows[:, None] * (H * D) + (offs_c - R)[None, :]
    return kofs, vofs, ms[:, None] & is_k[None, :], ms[:, None] & is_v[None, :]


@triton.jit
def _load_z_dz(k_base, v_base, dk_base, dv_base, j, Lj, H, R, D, offs_c, offs_s, is_k, is_v, BT: tl.constexpr):
    """Chunk j's [k | v] channels z and the chunk-local [dk | dv] already written by the chunk kernel, both float32
    [BT, BCH] (rows >= Lj zero). The k and v masks are disjoint, so one tile carries both halves."""
    kofs, vofs, kmask, vmask = _z_tile_offsets(j, Lj, H, R, D, offs_c, offs_s, is_k, is_v, BT)
    z = tl.load(k_base + kofs, mask=kmask, other=0.0).to(tl.float32)
    z += tl.load(v_base + vofs, mask=vmask, other=0.0).to(tl.float32)
    dzl = tl.load(dk_base + kofs, mask=kmask, other=0.0) + tl.load(dv_base + vofs, mask=vmask, other=0.0)
    return z, dzl


@triton.jit
def _state_bwd_dz_step(
    j, Lj, p_re, p_im, l_re, l_im, b_re, b_im, e_re, e_im, loc_re, loc_im, x_re, x_im, z, dzl, ay_re, ay_im, ax_re,
    ax_im, k_base, v_base, dk_base, dv_base, dx, states, i_bh, H, M, R, D, NT, offs_c, offs_s, is_k, is_v, st_off,
    st_mask, BT: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Chunk j (Lj tokens) of the fused reverse scan. On entry e = dXe_j, the total adjoint of the state after chunk
    j; loc / x (chunk j's local adjoint and entering state) and z / dzl (its [k | v] and chunk-local [dk | dv]) were
    prefetched one step earlier (design decision: every load of a step is issued one step ahead, so no global-load
    latency sits on the sequential chain). Adds chunk j's state-carry part to dk / dv, prefetches chunk j-1's
    tiles and returns dXe_{j-1} = conj(λ^Lj) e + loc; adds
    the two un-reduced per-chunk terms of the parameter gradients to the accumulators
      ay[s, m] += Y[s, m] = Σ_{c in block} z_s[c] e[m, c]  (dB = Σ_s conj(λ^n_s) Y, d log λ ∝ Σ_s n_s conj(λ^n_s) Y)
      ax[m, c] += conj(X_j[m, c]) e[m, c]                  (λ^L carry ∝ Σ_c ax)
    Design decision: for every full chunk the factors conj(λ^{n_s}), n_s and BT conj(λ^BT) are the same, so the loop
    only accumulates (Y inside the matmul accumulator) and the caller applies the factors and reduces once after it:
    no cross-thread reduction, hence no extra barrier, inside the sequential loop."""
    NC = R + D
    pbase = (i_bh * NT + tl.maximum(j - 1, 0)) * 2 * M * NC
    pmask = st_mask & ((st_off * 0 + j) > 0)  # tensor comparison: see _state_bwd_step
    nloc_re = tl.load(dx + pbase + st_off, mask=pmask, other=0.0)
    nloc_im = tl.load(dx + pbase + M * NC + st_off, mask=pmask, other=0.0)
    nx_re = tl.load(states + pbase + st_off, mask=pmask, other=0.0)
    nx_im = tl.load(states + pbase + M * NC + st_off, mask=pmask, other=0.0)
    nz, ndzl = _load_z_dz(
        k_base, v_base, dk_base, dv_base, j - 1, tl.where(j > 0, BT, 0), H, R, D, offs_c, offs_s, is_k, is_v, BT
    )
    # dz[s, c] = Re Σ_m conj(λ^{n_s} B)_m e[m, c] = (Re conj(P) @ f)[s, c] with f = conj(B) ⊙ e (B folded into the
    # [M, BCH] tile instead of a second [BT, M] table: fewer live registers)
    f_re = b_re[:, None] * e_re + b_im[:, None] * e_im
    f_im = b_re[:, None] * e_im - b_im[:, None] * e_re
    dz = tl.dot(p_re, f_re, input_precision=DOT_PREC) + tl.dot(p_im, f_im, input_precision=DOT_PREC)
    kofs, vofs, kmask, vmask = _z_tile_offsets(j, Lj, H, R, D, offs_c, offs_s, is_k, is_v, BT)
    # chunk-local part (from the chunk kernel) + carry part; each element is owned by exactly one program
    tl.store(dk_base + kofs, dzl + dz, mask=kmask)
    tl.store(dv_base + vofs, dzl + dz, mask=vmask)
    ay_re = tl.dot(z, tl.trans(e_re), acc=ay_re, input_precision=DOT_PREC)
    ay_im = tl.dot(z, tl.trans(e_im), acc=ay_im, input_precision=DOT_PREC)
    ax_re += x_re * e_re + x_im * e_im
    ax_im += x_re * e_im - x_im * e_re
    ne_re = l_re[:, None] * e_re + l_im[:, None] * e_im + loc_re
    ne_im = l_re[:, None] * e_im - l_im[:, None] * e_re + loc_im
    return ne_re, ne_im, nloc_re, nloc_im, nx_re, nx_im, nz, ndzl, ay_re, ay_im, ax_re, ax_im


@triton.jit
def _carry_terms(ay_re, ay_im, xe_re, xe_im, p_re, p_im, nf, l_re, l_im, Lj):
    """Reduces the accumulated terms of chunks that share (P, n, λ^Lj): gB share Σ_s conj(λ^{n_s}) Y, hs = Σ_s n_s
    conj(λ^{n_s}) Y (d log λ input term before the conj(B) factor), and the λ^L carry Lj conj(λ^Lj) Σ_c xe (per
    mode)."""
    cy_re = p_re * ay_re + p_im * ay_im
    cy_im = p_re * ay_im - p_im * ay_re
    gb_re = tl.sum(cy_re, axis=0)
    gb_im = tl.sum(cy_im, axis=0)
    hs_re = tl.sum(nf[:, None] * cy_re, axis=0)
    hs_im = tl.sum(nf[:, None] * cy_im, axis=0)
    s_re = tl.sum(xe_re, axis=1)
    s_im = tl.sum(xe_im, axis=1)
    lf = Lj * 1.0
    acc_re = lf * (l_re * s_re + l_im * s_im)
    acc_im = lf * (l_re * s_im - l_im * s_re)
    return gb_re, gb_im, hs_re, hs_im, acc_re, acc_im


@triton.jit
def _state_bwd_dz(
    k,
    v,
    dk,
    dv,
    P,
    Bp,
    states,
    dx,
    dfinal,
    dinit,
    gb_part,
    gl_part,
    T,
    H,
    M,
    R,
    D,
    NT,
    HAS_DFINAL: tl.constexpr,
    STORE_DINIT: tl.constexpr,
    USE_WHILE: tl.constexpr,
    BT: tl.constexpr,
    BM: tl.constexpr,
    BCH: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """Fused reverse adjoint scan + state-carry gradient. Grid (channel blocks, b·h); each program holds all modes.
    Reads dx[j] (chunk j's local adjoint from _chunk_bwd) and never writes it; adds the carry part to dk / dv and
    writes the per-(b·h, channel block) partials of dB and d log λ (carry + input terms) and dX0."""
    i_c = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    n_cb = tl.num_programs(0)
    b = i_bh // H
    h = i_bh % H
    NC = R + D
    LP = BT + 1
    offs_m = tl.arange(0, BM)
    offs_c = i_c * BCH + tl.arange(0, BCH)
    offs_s = tl.arange(0, BT)
    mask_m = offs_m < M
    mask_c = offs_c < NC
    is_k = offs_c < R
    is_v = (offs_c >= R) & mask_c
    st_off = offs_m[:, None] * NC + offs_c[None, :]
    st_mask = mask_m[:, None] & mask_c[None, :]
    ptab = P + h * 2 * LP * M
    b_re = tl.load(Bp + h * 2 * M + offs_m, mask=mask_m, other=0.0)
    b_im = tl.load(Bp + h * 2 * M + M + offs_m, mask=mask_m, other=0.0)
    k_base = k + b * T * H * R + h * R
    v_base = v + b * T * H * D + h * D
    dk_base = dk + b * T * H * R + h * R
    dv_base = dv + b * T * H * D + h * D
    if HAS_DFINAL:
        e_re = tl.load(dfinal + i_bh * 2 * M * NC + st_off, mask=st_mask, other=0.0)
        e_im = tl.load(dfinal + i_bh * 2 * M * NC + M * NC + st_off, mask=st_mask, other=0.0)
    else:
        e_re = tl.zeros([BM, BCH], dtype=tl.float32)
        e_im = tl.zeros([BM, BCH], dtype=tl.float32)
    last = (i_bh * NT + NT - 1) * 2 * M * NC
    loc_re = tl.load(dx + last + st_off, mask=st_mask, other=0.0)
    loc_im = tl.load(dx + last + M * NC + st_off, mask=st_mask, other=0.0)
    x_re = tl.load(states + last + st_off, mask=st_mask, other=0.0)
    x_im = tl.load(states + last + M * NC + st_off, mask=st_mask, other=0.0)
    # the last chunk (possibly partial) is peeled off and reduced on its own; every other chunk is full and shares
    # one table (loaded once) and the factors n_s, BT conj(λ^BT), so the loop accumulates un-reduced tiles
    L_last = T - (NT - 1) * BT
    p_re, p_im, nf, l_re, l_im = _dz_table(ptab, L_last, offs_s, offs_m, mask_m, M, BT)
    ay_re = tl.zeros([BT, BM], dtype=tl.float32)
    ay_im = tl.zeros([BT, BM], dtype=tl.float32)
    ax_re = tl.zeros([BM, BCH], dtype=tl.float32)
    ax_im = tl.zeros([BM, BCH], dtype=tl.float32)
    z, dzl = _load_z_dz(k_base, v_base, dk_base, dv_base, NT - 1, L_last, H, R, D, offs_c, offs_s, is_k, is_v, BT)
    e_re, e_im, loc_re, loc_im, x_re, x_im, z, dzl, ay_re, ay_im, ax_re, ax_im = _state_bwd_dz_step(
        NT - 1, L_last, p_re, p_im, l_re, l_im, b_re, b_im, e_re, e_im, loc_re, loc_im, x_re, x_im, z, dzl, ay_re,
        ay_im, ax_re, ax_im, k_base, v_base, dk_base, dv_base, dx, states, i_bh, H, M, R, D, NT, offs_c, offs_s, is_k,
        is_v, st_off, st_mask, BT, DOT_PREC,
    )  # fmt: skip
    gb_re, gb_im, hs_re, hs_im, acc_re, acc_im = _carry_terms(
        ay_re, ay_im, ax_re, ax_im, p_re, p_im, nf, l_re, l_im, L_last
    )
    p_re, p_im, nf, l_re, l_im = _dz_table(ptab, BT, offs_s, offs_m, mask_m, M, BT)
    ay_re = tl.zeros([BT, BM], dtype=tl.float32)
    ay_im = tl.zeros([BT, BM], dtype=tl.float32)
    ax_re = tl.zeros([BM, BCH], dtype=tl.float32)
    ax_im = tl.zeros([BM, BCH], dtype=tl.float32)
    if USE_WHILE:  # the interpreter cannot run `range` over a runtime bound with numpy >= 2.3
        jj = 1
        while jj < NT:
            e_re, e_im, loc_re, loc_im, x_re, x_im, z, dzl, ay_re, ay_im, ax_re, ax_im = _state_bwd_dz_step(
                NT - 1 - jj, BT, p_re, p_im, l_re, l_im, b_re, b_im, e_re, e_im, loc_re, loc_im, x_re, x_im, z, dzl,
                ay_re, ay_im, ax_re, ax_im, k_base, v_base, dk_base, dv_base, dx, states, i_bh, H, M, R, D, NT, offs_c,
                offs_s, is_k, is_v, st_off, st_mask, BT, DOT_PREC,
            )  # fmt: skip
            jj += 1
    else:
        for jj in range(1, NT):
            e_re, e_im, loc_re, loc_im, x_re, x_im, z, dzl, ay_re, ay_im, ax_re, ax_im = _state_bwd_dz_step(
                NT - 1 - jj, BT, p_re, p_im, l_re, l_im, b_re, b_im, e_re, e_im, loc_re, loc_im, x_re, x_im, z, dzl,
                ay_re, ay_im, ax_re, ax_im, k_base, v_base, dk_base, dv_base, dx, states, i_bh, H, M, R, D, NT, offs_c,
                offs_s, is_k, is_v, st_off, st_mask, BT, DOT_PREC,
            )  # fmt: skip
    gb2_re, gb2_im, hs2_re, hs2_im, acc2_re, acc2_im = _carry_terms(
        ay_re, ay_im, ax_re, ax_im, p_re, p_im, nf, l_re, l_im, BT
    )
    gb_re += gb2_re
    gb_im += gb2_im
    hs_re += hs2_re
    hs_im += hs2_im
    acc_re += acc2_re
    acc_im += acc2_im
    if STORE_DINIT:
        tl.store(dinit + i_bh * 2 * M * NC + st_off, e_re, mask=st_mask)
        tl.store(dinit + i_bh * 2 * M * NC + M * NC + st_off, e_im, mask=st_mask)
    # d log λ (input side) = conj(B) hs: B is per mode, so it is applied once here instead of per token
    gl_re = acc_re + b_re * hs_re + b_im * hs_im
    gl_im = acc_im + b_re * hs_im - b_im * hs_re
    pb = (i_bh * n_cb + i_c) * 2 * M
    tl.store(gb_part + pb + offs_m, gb_re, mask=mask_m)
    tl.store(gb_part + pb + M + offs_m, gb_im, mask=mask_m)
    tl.store(gl_part + pb + offs_m, gl_re, mask=mask_m)
    tl.store(gl_part + pb + M + offs_m, gl_im, mask=mask_m)
