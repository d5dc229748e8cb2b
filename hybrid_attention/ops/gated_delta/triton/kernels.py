"""Triton kernels of the chunked gated delta rule with the NAtS-L per-chunk commit mask (the pipeline is described
above the kernels)."""

from __future__ import annotations

import triton
import triton.language as tl

from ...common.triton.chunk_rows import table_row
from ...common.triton.lowp import bf16_round

# Our own formulation: the same WY algebra as ``chunk.py`` (no fla code). Forward: ``prep`` (parallel over chunks)
# -> ``state_fwd`` (sequential over chunks) -> ``output`` (parallel); backward: ``bwd_local`` -> ``state_bwd``
# (reverse sequential) -> ``bwd_k`` -> ``bwd_finish``. All state math is fp32. `_prep_kernel` gives the per-chunk
# equations and the pipeline, `_chunk_rows` the packed-document (``VARLEN``) layout, `_bf16` the bf16-buffer path,
# `_state_bwd_kernel` why no kernel takes a runtime float argument. Interpreter-compatible (TRITON_INTERPRET=1): plain
# pointer arithmetic with masks, no block pointers, loop indices never cast.


@triton.jit
def _chunk_rows(cu_ptr, ci_ptr, n, T, C: tl.constexpr, VARLEN: tl.constexpr):
    """Packed token index ``[C]`` of the rows of chunk row n, their validity mask (row < the chunk's end) and the
    chunk's token range ``[t0, t1)`` (``t1 <= t0``: a spare row of the chunk table).

    Packed documents (``cu_seqlens``, ``VARLEN``; B == 1, ``ops/common/varlen.py``). Decided once for all seven
    kernels: the internal buffers are indexed by *chunk row* n of the call's ``ChunkTable`` (``varlen.chunk_table``,
    built on the device, no host sync): its NT = ``max_chunks(T, N, C)`` rows are the real chunks in document order
    (chunks restart at each document start; rows ``[0, Nc)``, Nc = Σ ceil(len_i / C), so row n *is* global chunk n),
    then up to N - 1 spare rows without tokens. Buffer row n·C + i; only the token rows read from / written to the
    packed ``[1, T, ...]`` inputs and outputs move: row i of chunk row n is packed token ``t0 + i``, valid while
    ``< t1``, ``(doc, t0, t1) = table_row(cu, indices, n, C)`` (the tail of a document's last chunk is the same zero
    padding as the partial last chunk of an unpacked call). Chunk-parallel kernels keep one program per (chunk row,
    head) and return at once on a spare row (``t1 <= t0``): it reads and writes nothing, so it adds nothing to any
    gradient. The two sequential kernels run one program per (document, head) over its chunk rows
    ``[offsets[d], offsets[d + 1])`` (real rows only), starting from zero or ``initial_state[d]`` and storing
    ``final_state[d]`` (their gradients likewise). The per-chunk commit mask and its gradient are ``[1, NM, H]`` with
    NM the true Nc (the caller's tensor, checked by ``varlen.check_packed``), read at row n (masked ``n < NM``).
    Without ``VARLEN`` the kernels compute the same quantities from n (chunk start n·C, end T) and NM = N.
    """
    if VARLEN:
        _, t0, t1 = table_row(cu_ptr, ci_ptr, n, C)
    else:
        t0 = n * C
        t1 = T
    tt = t0 + tl.arange(0, C)
    return tt, tt < t1, t0, t1


@triton.jit
def _bf16(x, BF16: tl.constexpr, UPCAST: tl.constexpr):
    """x as a bf16 dot operand / bf16-buffer value when ``BF16`` (x itself otherwise: the fp32 path is unchanged).

    GPU: ``x.to(tl.bfloat16)`` (cvt.rn: round to nearest even; a bf16 load passes through). ``UPCAST``
    (interpreter): an fp32 tensor holding that rounded value (see below): a bf16 load is cast to fp32
    (exact); an fp32 value is rounded to nearest even on its bits (NaN kept: poisoned buffers must stay visible).

    bf16 buffers (``BF16``, ``GatedDeltaConfig.buffer_dtype`` "bf16", or the default "auto" with bf16 / fp16
    activations): w, u, S_n and vn are stored bf16 and the dots of ``state_fwd`` / ``output`` take bf16 operands
    (``_bf16``: the fp32 value rounded to nearest even, then the dot accumulates in fp32); the carried S, every
    elementwise term of its update and all of ``prep``'s math stay fp32 (prep rounds only on store). The backward
    kernels keep their fp32 path and cast every buffer they load to fp32 (``.to(tl.float32)``: a no-op on fp32 buffers,
    so the fp32 launch compiles to the same code); only the state backward's dots may take bf16 operands too
    (``GatedDeltaConfig.seqb_dots="bf16"``, with bf16 buffers). ``UPCAST`` (interpreter only, GPU value False): the
    interpreter's ``tl.dot`` multiplies bf16's uint16 storage as integers and its fp32 -> bf16 cast truncates, so there
    ``_bf16`` keeps an fp32 tensor holding the round-to-nearest-even bf16 value (products of two bf16 values are exact
    in fp32, so the interpreter's dot is the GPU's bf16 MMA with fp32 accumulation up to the summation order) and stores
    of such values into a bf16 buffer are exact.
    """
    if BF16:
        if UPCAST:
            if x.dtype == tl.bfloat16:
                y = x.to(tl.float32)
            else:
                y = bf16_round(x)
        else:
            y = x.to(tl.bfloat16)
    else:
        y = x
    return y


@triton.jit
def _seq_program(sh, co_ptr, H, N, VARLEN: tl.constexpr):
    """(b, h, bh, c0, c1) of a sequential state kernel's program sh = (sequence, head): its batch row b, head h, the
    row bh of the internal buffers and its chunk rows [c0, c1). Packed documents: sequence = document, every document
    in the one packed row (b = 0, bh = h), its chunk rows [offsets[d], offsets[d + 1]) of the chunk table."""
    if VARLEN:
        b = sh * 0
        h = sh % H
        bh = h  # buffers of the one packed row
        c0 = tl.load(co_ptr + sh // H)
        c1 = tl.load(co_ptr + sh // H + 1)
    else:
        b = sh // H
        h = sh % H
        bh = sh
        c0 = 0
        c1 = N
    return b, h, bh, c0, c1


@triton.jit
def _inverse_unit_lower(A_scr, X_out, A, C: tl.constexpr):
    """X = (I + A)^{-1} for strictly lower-triangular A [C, C] (C a multiple of 16), exact in fp32.

    Blocked: the C/16 diagonal 16x16 blocks are inverted together by row-wise forward substitution (15 steps on a
    [C/16, 16, 16] tile), then the off-diagonal blocks follow block row by block row,
    X_ij = -X_ii Σ_{k=j}^{i-1} A_ik X_kj, with fp32 (ieee) 16x16 dots. The blocks go through this chunk's [C, C]
    scratch (A_scr) and output (X_out) rows in global memory; barriers order the writes and reads of the program."""
    NB: tl.constexpr = C // 16
    ti = tl.arange(0, C)
    cc = ti[:, None] * C + ti[None, :]
    tl.store(A_scr + cc, A)
    tl.store(X_out + cc, tl.zeros([C, C], dtype=tl.float32))
    b3 = tl.arange(0, NB)[:, None, None]
    r3 = tl.arange(0, 16)[None, :, None]
    c3 = tl.arange(0, 16)[None, None, :]
    d3 = (16 * b3 + r3) * C + 16 * b3 + c3  # offsets of the diagonal blocks, [NB, 16, 16]
    tl.debug_barrier()
    Ad = tl.load(A_scr + d3)
    Xd = tl.where(r3 == c3, 1.0, 0.0) + tl.zeros([NB, 16, 16], dtype=tl.float32)
    for i in range(1, 16):
        a_i = tl.sum(tl.where(r3 == i, Ad, 0.0), 1)  # [NB, 16]: row i of each diagonal block
        x_i = -tl.sum(a_i[:, :, None] * Xd, 1)  # -Σ_j A_b[i, j] X_b[j, :] (rows j >= i are still e_j, A_b[i, j] = 0)
        Xd = tl.where(r3 == i, x_i[:, None, :] + tl.where(c3 == i, 1.0, 0.0), Xd)
    tl.store(X_out + d3, Xd)
    tl.debug_barrier()
    r = tl.arange(0, 16)
    blk = r[:, None] * C + r[None, :]
    for i in tl.static_range(1, NB):
        Xii = tl.load(X_out + 16 * i * C + 16 * i + blk)
        for j in tl.static_range(0, i):
            acc = tl.zeros([16, 16], dtype=tl.float32)
            for k in tl.static_range(j, i):
                Aik = tl.load(A_scr + 16 * i * C + 16 * k + blk)
                Xkj = tl.load(X_out + 16 * k * C + 16 * j + blk)
                acc += tl.dot(Aik, Xkj, input_precision="ieee")
            tl.store(X_out + 16 * i * C + 16 * j + blk, -tl.dot(Xii, acc, input_precision="ieee"))
        tl.debug_barrier()
    return tl.load(X_out + cc)


@triton.jit
def _prep_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
    G_ptr, rq_ptr, rk_ptr, X_ptr, A_ptr, w_ptr, u_ptr, cu_ptr, ci_ptr,
    T, H, N, Tp,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_L2: tl.constexpr, EPS: tl.constexpr, PREC: tl.constexpr, VARLEN: tl.constexpr, BF16: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Per (chunk row, head): G, r, X, w, u of the chunk (the first kernel of the forward).

    Per (batch b, head h) and chunk n of C tokens, with k̂ = r_k·k, q̂ = r_q·q (l2 norm factors r), chunk-local
    inclusive log-gate cumsum G, Γ = e^{G_last}:

        A_ts = β_t (k̂_t·k̂_s) e^{G_t-G_s}  (s < t),   X = (I + A)^{-1}            (forward substitution, fp32)
        w    = X diag(β e^G) k̂,   u = X diag(β) v
        vn   = u - w S_n                                                         (S_n: state at the start of chunk n)
        o    = scale (e^G q̂ S_n + ((q̂ k̂ᵀ) ⊙ D) vn),   D_ts = e^{G_t-G_s} (s <= t)
        S_{n+1} = a_n S_n + m_n K̃ᵀ vn,   K̃ = e^{G_last-G} k̂,   a_n = Γ (decay_uncommitted) or m_n Γ + 1 - m_n

    Forward: ``prep`` (parallel over chunks: G, r, X, w, u) -> ``state_fwd`` (sequential over chunks per V tile: S_n,
    vn) -> ``output`` (parallel). Backward: ``bwd_local`` (parallel: dvn_local = scale (P⊙D)ᵀ dO and dP⊙D) ->
    ``state_bwd`` (reverse sequential: dS at every chunk end, total dvn, d initial state) -> ``bwd_k`` (parallel over
    chunks × K tiles: dq̂, dk̂ slices, dw and the partial sums) -> ``bwd_finish`` (parallel over chunks: WY backward,
    dβ, dG -> dg, dv, dm, l2-norm backward). All state math is fp32; dots take fp32 operands (tf32 on the GPU).

    Internal buffers use a padded token axis Tp = N·C (rows past T hold the zero padding of ``chunk.py``).
    """
    n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    ti = tl.arange(0, C)
    t = n * C + ti  # buffer rows
    tt, tm, t0, t1 = _chunk_rows(cu_ptr, ci_ptr, n, T, C, VARLEN)  # packed token rows
    if VARLEN:
        if t1 <= t0:  # a spare row of the chunk table: no tokens, nothing to read or write
            return
    g_t = tl.load(g_ptr + (b * T + tt) * H + h, mask=tm, other=0.0).to(tl.float32)
    beta_t = tl.load(beta_ptr + (b * T + tt) * H + h, mask=tm, other=0.0).to(tl.float32)
    G = tl.cumsum(g_t, axis=0)
    tl.store(G_ptr + bh * Tp + t, G)

    qk_base = b * T * H * K + h * K
    kk = tl.zeros([C, C], dtype=tl.float32)
    ssk = tl.zeros([C], dtype=tl.float32)
    ssq = tl.zeros([C], dtype=tl.float32)
    for k0 in range(0, K, BK):
        kc = k0 + tl.arange(0, BK)
        msk = tm[:, None] & (kc < K)[None, :]
        offs = qk_base + tt[:, None] * (H * K) + kc[None, :]
        kt = tl.load(k_ptr + offs, mask=msk, other=0.0).to(tl.float32)
        kk += tl.dot(kt, tl.trans(kt), input_precision=PREC)
        if USE_L2:
            qt = tl.load(q_ptr + offs, mask=msk, other=0.0).to(tl.float32)
            ssk += tl.sum(kt * kt, 1)
            ssq += tl.sum(qt * qt, 1)
    if USE_L2:
        rk = 1.0 / tl.sqrt(ssk + EPS)
        rq = 1.0 / tl.sqrt(ssq + EPS)
    else:
        rk = tl.full([C], 1.0, tl.float32)
        rq = tl.full([C], 1.0, tl.float32)
    tl.store(rk_ptr + bh * Tp + t, rk)
    tl.store(rq_ptr + bh * Tp + t, rq)

    strict = ti[:, None] > ti[None, :]
    E = tl.exp(tl.where(strict, G[:, None] - G[None, :], float("-inf")))
    A = (beta_t * rk)[:, None] * kk * rk[None, :] * E
    X = _inverse_unit_lower(A_ptr + (bh * N + n) * C * C, X_ptr + (bh * N + n) * C * C, A, C)

    coef = beta_t * tl.exp(G) * rk
    for k0 in range(0, K, BK):
        kc = k0 + tl.arange(0, BK)
        km = (kc < K)[None, :]
        kt = tl.load(k_ptr + qk_base + tt[:, None] * (H * K) + kc[None, :], mask=tm[:, None] & km, other=0.0)
        wt = tl.dot(X, kt.to(tl.float32) * coef[:, None], input_precision=PREC)
        tl.store(w_ptr + bh * Tp * K + t[:, None] * K + kc[None, :], _bf16(wt, BF16, UPCAST), mask=km)
    v_base = b * T * H * V + h * V
    for v0 in range(0, V, BV):
        vc = v0 + tl.arange(0, BV)
        vm = (vc < V)[None, :]
        vt = tl.load(v_ptr + v_base + tt[:, None] * (H * V) + vc[None, :], mask=tm[:, None] & vm, other=0.0)
        ut = tl.dot(X, vt.to(tl.float32) * beta_t[:, None], input_precision=PREC)
        tl.store(u_ptr + bh * Tp * V + t[:, None] * V + vc[None, :], _bf16(ut, BF16, UPCAST), mask=vm)


@triton.jit
def _state_fwd_step(
    n, S, k_ptr, w_ptr, u_ptr, G_ptr, rk_ptr, m_ptr, states_ptr, vn_ptr, cu_ptr, ci_ptr,
    bh, b, h, kr, km, vc, vm, kv_offs, kv_mask, T, H, N, NM, Tp,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
    HAS_COMMIT: tl.constexpr, DECAY_UNCOMMITTED: tl.constexpr, PREC: tl.constexpr, VARLEN: tl.constexpr,
    BF16: tl.constexpr, UPCAST: tl.constexpr,
):
    # BF16: S is rounded once and serves as the stored S_n and the operand of w S (fla's h.to(bf16)); S stays fp32
    Sb = _bf16(S, BF16, UPCAST)
    tl.store(states_ptr + (bh * N + n) * K * V + kv_offs, Sb, mask=kv_mask)
    t = n * C + tl.arange(0, C)
    tt, tm, _, _ = _chunk_rows(cu_ptr, ci_ptr, n, T, C, VARLEN)
    wn = tl.load(w_ptr + bh * Tp * K + t[:, None] * K + kr[None, :], mask=km[None, :], other=0.0)
    un = tl.load(u_ptr + bh * Tp * V + t[:, None] * V + vc[None, :], mask=vm[None, :], other=0.0)
    vn = un.to(tl.float32) - tl.dot(_bf16(wn, BF16, UPCAST), Sb, input_precision=PREC)
    # BF16: the rounded vn is the stored vn (read by output / backward) and, scaled per token and rounded once more,
    # the operand of the state update below
    vn = _bf16(vn, BF16, UPCAST)
    tl.store(vn_ptr + bh * Tp * V + t[:, None] * V + vc[None, :], vn, mask=vm[None, :])
    Gt = tl.load(G_ptr + bh * Tp + t)
    Gl = tl.load(G_ptr + bh * Tp + n * C + C - 1)
    rkt = tl.load(rk_ptr + bh * Tp + t)
    kt = tl.load(k_ptr + b * T * H * K + h * K + tt[:, None] * (H * K) + kr[None, :],
                 mask=tm[:, None] & km[None, :], other=0.0)
    # K̃ᵀ vn = kᵀ (diag(r_k e^{G_last - G}) vn): the per-token scale goes on the [C, BV] tile of this program, not on
    # the [C, K] key tile that every V-tile program of the head would scale again (K / BV times the work)
    vs = _bf16(vn.to(tl.float32) * (rkt * tl.exp(Gl - Gt))[:, None], BF16, UPCAST)
    dS = tl.dot(tl.trans(_bf16(kt.to(tl.float32), BF16, UPCAST)), vs, input_precision=PREC)
    gam = tl.exp(Gl)
    if HAS_COMMIT:
        m = tl.load(m_ptr + (b * NM + n) * H + h, mask=n < NM, other=0.0).to(tl.float32)
        if DECAY_UNCOMMITTED:
            S = gam * S + m * dS
        else:
            S = (m * gam + 1.0 - m) * S + m * dS
    else:
        S = gam * S + dS
    return S


@triton.jit
def _state_fwd_kernel(
    k_ptr, w_ptr, u_ptr, G_ptr, rk_ptr, m_ptr, S0_ptr,
    states_ptr, vn_ptr, Sfin_ptr, cu_ptr, ci_ptr, co_ptr,
    T, H, N, NM, Tp,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BKF: tl.constexpr, BV: tl.constexpr,
    HAS_COMMIT: tl.constexpr, HAS_S0: tl.constexpr, STORE_FINAL: tl.constexpr, DECAY_UNCOMMITTED: tl.constexpr,
    PREC: tl.constexpr, WHILE_LOOP: tl.constexpr, VARLEN: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr,
):
    """Sequential chunk recurrence for one V tile of one (sequence, head): stores S_n (chunk start states), vn, and
    the final state. Grid (V / BV, B·H), or (V / BV, N_docs·H) with ``VARLEN`` (chunk rows ``offsets[d]..[d + 1]``).

    WHILE_LOOP (interpreter only): a runtime-bounded ``for`` needs ``int()`` of a 1-element array there, which
    NumPy >= 2.4 refuses; the compiled kernel uses the ``for`` loop (software-pipelined loads)."""
    pv = tl.program_id(0)
    sh = tl.program_id(1).to(tl.int64)  # (sequence, head): indexes S0 / Sfin
    b, h, bh, c0, c1 = _seq_program(sh, co_ptr, H, N, VARLEN)
    kr = tl.arange(0, BKF)
    km = kr < K
    vc = pv * BV + tl.arange(0, BV)
    vm = vc < V
    kv_offs = kr[:, None] * V + vc[None, :]
    kv_mask = km[:, None] & vm[None, :]
    if HAS_S0:
        S = tl.load(S0_ptr + sh * K * V + kv_offs, mask=kv_mask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BKF, BV], dtype=tl.float32)
    if WHILE_LOOP:
        n = c0
        while n < c1:
            S = _state_fwd_step(n, S, k_ptr, w_ptr, u_ptr, G_ptr, rk_ptr, m_ptr, states_ptr, vn_ptr, cu_ptr, ci_ptr,
                                bh, b, h, kr, km, vc, vm, kv_offs, kv_mask, T, H, N, NM, Tp,
                                K, V, C, HAS_COMMIT, DECAY_UNCOMMITTED, PREC, VARLEN, BF16, UPCAST)
            n += 1
    else:
        for n in range(c0, c1):
            S = _state_fwd_step(n, S, k_ptr, w_ptr, u_ptr, G_ptr, rk_ptr, m_ptr, states_ptr, vn_ptr, cu_ptr, ci_ptr,
                                bh, b, h, kr, km, vc, vm, kv_offs, kv_mask, T, H, N, NM, Tp,
                                K, V, C, HAS_COMMIT, DECAY_UNCOMMITTED, PREC, VARLEN, BF16, UPCAST)
    if STORE_FINAL:
        tl.store(Sfin_ptr + sh * K * V + kv_offs, S, mask=kv_mask)


@triton.jit
def _output_kernel(
    q_ptr, k_ptr, G_ptr, rq_ptr, rk_ptr, states_ptr, vn_ptr, o_ptr, cu_ptr, ci_ptr,
    T, H, N, Tp,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
    SCALE: tl.constexpr, VARLEN: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr,
):
    pv = tl.program_id(0)
    n = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b = bh // H
    h = bh % H
    ti = tl.arange(0, C)
    t = n * C + ti
    tt, tm, t0, t1 = _chunk_rows(cu_ptr, ci_ptr, n, T, C, VARLEN)
    if VARLEN:
        if t1 <= t0:  # a spare row: nothing to read or write
            return
    vc = pv * BV + tl.arange(0, BV)
    vm = vc < V
    Gt = tl.load(G_ptr + bh * Tp + t)
    rq = tl.load(rq_ptr + bh * Tp + t)
    rk = tl.load(rk_ptr + bh * Tp + t)
    qk_base = b * T * H * K + h * K
    acc = tl.zeros([C, BV], dtype=tl.float32)
    P = tl.zeros([C, C], dtype=tl.float32)
    for k0 in range(0, K, BK):
        kc = k0 + tl.arange(0, BK)
        km = kc < K
        offs = qk_base + tt[:, None] * (H * K) + kc[None, :]
        msk = tm[:, None] & km[None, :]
        qt = tl.load(q_ptr + offs, mask=msk, other=0.0).to(tl.float32) * rq[:, None]
        kt = tl.load(k_ptr + offs, mask=msk, other=0.0).to(tl.float32) * rk[:, None]
        P += tl.dot(_bf16(qt, BF16, UPCAST), tl.trans(_bf16(kt, BF16, UPCAST)), input_precision=PREC)
        Sk = tl.load(states_ptr + (bh * N + n) * K * V + kc[:, None] * V + vc[None, :],
                     mask=km[:, None] & vm[None, :], other=0.0)
        acc += tl.dot(_bf16(qt * tl.exp(Gt)[:, None], BF16, UPCAST), _bf16(Sk, BF16, UPCAST), input_precision=PREC)
    incl = ti[:, None] >= ti[None, :]
    D = tl.exp(tl.where(incl, Gt[:, None] - Gt[None, :], float("-inf")))
    vn = tl.load(vn_ptr + bh * Tp * V + t[:, None] * V + vc[None, :], mask=vm[None, :], other=0.0)
    acc += tl.dot(_bf16(P * D, BF16, UPCAST), _bf16(vn, BF16, UPCAST), input_precision=PREC)
    o = acc * SCALE
    tl.store(o_ptr + b * T * H * V + h * V + tt[:, None] * (H * V) + vc[None, :], o.to(o_ptr.dtype.element_ty),
             mask=tm[:, None] & vm[None, :])


@triton.jit
def _bwd_local_kernel(
    q_ptr, k_ptr, do_ptr, G_ptr, rq_ptr, rk_ptr, vn_ptr,
    dvl_ptr, dPD_ptr, dG_ptr, cu_ptr, ci_ptr,
    T, H, N, Tp,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
    SCALE: tl.constexpr, VARLEN: tl.constexpr, LOCAL_PD: tl.constexpr,
):
    """dvn_local = scale (P⊙D)ᵀ dO;  dPD = scale (dO vnᵀ) ⊙ D;  dG from D: rowsum(M) - colsum(M), M = dPD ⊙ P.

    With ``LOCAL_PD`` (``GatedDeltaConfig.local_dv="state_bwd"``) ``dvl_ptr`` is [BH, N, C, C] in the buffer dtype
    and receives scale (P⊙D)ᵀ, from which the state backward forms dvn_local itself."""
    n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    ti = tl.arange(0, C)
    t = n * C + ti
    tt, tm, t0, t1 = _chunk_rows(cu_ptr, ci_ptr, n, T, C, VARLEN)
    if VARLEN:
        if t1 <= t0:  # a spare row: nothing to read or write
            return
    Gt = tl.load(G_ptr + bh * Tp + t)
    rq = tl.load(rq_ptr + bh * Tp + t)
    rk = tl.load(rk_ptr + bh * Tp + t)
    qk_base = b * T * H * K + h * K
    P = tl.zeros([C, C], dtype=tl.float32)
    for k0 in range(0, K, BK):
        kc = k0 + tl.arange(0, BK)
        offs = qk_base + tt[:, None] * (H * K) + kc[None, :]
        msk = tm[:, None] & (kc < K)[None, :]
        qt = tl.load(q_ptr + offs, mask=msk, other=0.0).to(tl.float32) * rq[:, None]
        kt = tl.load(k_ptr + offs, mask=msk, other=0.0).to(tl.float32) * rk[:, None]
        P += tl.dot(qt, tl.trans(kt), input_precision=PREC)
    incl = ti[:, None] >= ti[None, :]
    D = tl.exp(tl.where(incl, Gt[:, None] - Gt[None, :], float("-inf")))
    PD = P * D
    if LOCAL_PD:  # (P⊙D)ᵀ row-major: element (i, j) of P⊙D at j·C + i
        tl.store(dvl_ptr + (bh * N + n) * C * C + ti[None, :] * C + ti[:, None],
                 (PD * SCALE).to(dvl_ptr.dtype.element_ty))
    dP = tl.zeros([C, C], dtype=tl.float32)
    do_base = b * T * H * V + h * V
    for v0 in range(0, V, BV):
        vc = v0 + tl.arange(0, BV)
        vm = (vc < V)[None, :]
        dO = tl.load(do_ptr + do_base + tt[:, None] * (H * V) + vc[None, :], mask=tm[:, None] & vm, other=0.0)
        dO = dO.to(tl.float32)
        vn = tl.load(vn_ptr + bh * Tp * V + t[:, None] * V + vc[None, :], mask=vm, other=0.0).to(tl.float32)
        if not LOCAL_PD:
            dvl = tl.dot(tl.trans(PD), dO, input_precision=PREC) * SCALE
            tl.store(dvl_ptr + bh * Tp * V + t[:, None] * V + vc[None, :], dvl, mask=vm)
        dP += tl.dot(dO, tl.trans(vn), input_precision=PREC)
    dPD = dP * D * SCALE
    tl.store(dPD_ptr + (bh * N + n) * C * C + ti[:, None] * C + ti[None, :], dPD)
    M = dPD * P
    dG = tl.sum(M, 1) - tl.sum(M, 0)
    tl.store(dG_ptr + bh * Tp + t, dG)


@triton.jit
def _keys_dot(kd, dS, rk, Gl, Gt, TILE_SCALE: tl.constexpr, PREC: tl.constexpr):
    """K̃ dS [C, BV] for K̃ = diag(r_k e^{G_last - G}) k̂: with TILE_SCALE ``kd`` is the raw k̂ tile and the scale goes on
    the product, otherwise ``kd`` is K̃ already (scaled as it loaded)."""
    if TILE_SCALE:
        r = tl.dot(kd, dS, input_precision=PREC) * (rk * tl.exp(Gl - Gt))[:, None]
    else:
        r = tl.dot(kd, dS, input_precision=PREC)
    return r


@triton.jit
def _state_bwd_step(
    n, dS, q_ptr, k_ptr, w_ptr, do_ptr, dvl_ptr, G_ptr, rq_ptr, rk_ptr, m_ptr, dh_ptr, dvn_ptr, cu_ptr, ci_ptr,
    scale, bh, b, h, kr, km, vc, vm, kv_offs, kv_mask, T, H, N, NM, Tp,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
    HAS_COMMIT: tl.constexpr, DECAY_UNCOMMITTED: tl.constexpr, PREC: tl.constexpr, VARLEN: tl.constexpr,
    TILE_SCALE: tl.constexpr, BF16: tl.constexpr, UPCAST: tl.constexpr, LOCAL_PD: tl.constexpr,
    DH_BF16: tl.constexpr,
):
    """One reverse step of the state backward: stores dh[n] (bf16 with ``DH_BF16``) and dvn of chunk n, returns dS_n.

    The per-token scales sk = r_k e^{G_last - G} (K̃ = diag(sk) k̂) and sq = r_q e^G (e^G q̂ = diag(sq) q̂) go on the
    [C, K] key / query tiles as they load (default), or with TILE_SCALE on the [C, BV] side of the two dots,
    K̃ dS = diag(sk) (k̂ dS) and (e^G q̂)ᵀ dO = q̂ᵀ (diag(sq) dO). Which launches may use TILE_SCALE and why:
    ``GatedDeltaConfig.seqb_scale``. ``BF16`` (``GatedDeltaConfig.seqb_dots="bf16"`` with bf16 buffers): the three
    dots take bf16 operands (``_bf16``) with fp32 accumulation; dS and dvn stay fp32, and so does dh unless
    ``DH_BF16``."""
    tl.store(dh_ptr + (bh * N + n) * K * V + kv_offs, _bf16(dS, DH_BF16, UPCAST).to(dh_ptr.dtype.element_ty),
             mask=kv_mask)
    ti = tl.arange(0, C)
    t = n * C + ti
    tt, tm, _, _ = _chunk_rows(cu_ptr, ci_ptr, n, T, C, VARLEN)
    Gt = tl.load(G_ptr + bh * Tp + t)
    Gl = tl.load(G_ptr + bh * Tp + n * C + C - 1)
    rq = tl.load(rq_ptr + bh * Tp + t)
    rk = tl.load(rk_ptr + bh * Tp + t)
    offs = b * T * H * K + h * K + tt[:, None] * (H * K) + kr[None, :]
    msk = tm[:, None] & km[None, :]
    if TILE_SCALE:
        kd = tl.load(k_ptr + offs, mask=msk, other=0.0).to(tl.float32)
        qg = tl.load(q_ptr + offs, mask=msk, other=0.0).to(tl.float32)
    else:
        kd = tl.load(k_ptr + offs, mask=msk, other=0.0).to(tl.float32) * (rk * tl.exp(Gl - Gt))[:, None]
        qg = tl.load(q_ptr + offs, mask=msk, other=0.0).to(tl.float32) * (rq * tl.exp(Gt))[:, None]
    wn = tl.load(w_ptr + bh * Tp * K + t[:, None] * K + kr[None, :], mask=km[None, :], other=0.0).to(tl.float32)
    dO = tl.load(do_ptr + b * T * H * V + h * V + tt[:, None] * (H * V) + vc[None, :],
                 mask=tm[:, None] & vm[None, :], other=0.0).to(tl.float32)
    if LOCAL_PD:  # dvn_local = scale (P⊙D)ᵀ dO from the chunk's stored scale (P⊙D)ᵀ (``_bwd_local_kernel``)
        pdt = tl.load(dvl_ptr + (bh * N + n) * C * C + ti[:, None] * C + ti[None, :]).to(tl.float32)
        dvl = tl.dot(_bf16(pdt, BF16, UPCAST), _bf16(dO, BF16, UPCAST), input_precision=PREC)
    else:
        dvl = tl.load(dvl_ptr + bh * Tp * V + t[:, None] * V + vc[None, :], mask=vm[None, :], other=0.0)
    gam = tl.exp(Gl)
    if HAS_COMMIT:
        m = tl.load(m_ptr + (b * NM + n) * H + h, mask=n < NM, other=0.0).to(tl.float32)
        if DECAY_UNCOMMITTED:
            a = gam
        else:
            a = m * gam + 1.0 - m
        dvn = dvl + m * _keys_dot(_bf16(kd, BF16, UPCAST), _bf16(dS, BF16, UPCAST), rk, Gl, Gt, TILE_SCALE, PREC)
    else:
        a = gam
        dvn = dvl + _keys_dot(_bf16(kd, BF16, UPCAST), _bf16(dS, BF16, UPCAST), rk, Gl, Gt, TILE_SCALE, PREC)
    tl.store(dvn_ptr + bh * Tp * V + t[:, None] * V + vc[None, :], dvn, mask=vm[None, :])
    if TILE_SCALE:  # (e^G q̂)ᵀ dO = q̂ᵀ (diag(r_q e^G) dO)
        dO = dO * (rq * tl.exp(Gt))[:, None]
    dS = (a * dS + scale * tl.dot(tl.trans(_bf16(qg, BF16, UPCAST)), _bf16(dO, BF16, UPCAST), input_precision=PREC)
          - tl.dot(tl.trans(_bf16(wn, BF16, UPCAST)), _bf16(dvn, BF16, UPCAST), input_precision=PREC))
    return dS


@triton.jit
def _state_bwd_kernel(
    q_ptr, k_ptr, w_ptr, do_ptr, dvl_ptr, G_ptr, rq_ptr, rk_ptr, m_ptr, dSfin_ptr,
    dh_ptr, dvn_ptr, dS0_ptr, cu_ptr, ci_ptr, co_ptr,
    T, H, N, NM, Tp,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BKF: tl.constexpr, BV: tl.constexpr,
    HAS_COMMIT: tl.constexpr, HAS_DSFIN: tl.constexpr, DECAY_UNCOMMITTED: tl.constexpr, PREC: tl.constexpr,
    WHILE_LOOP: tl.constexpr, SCALE: tl.constexpr, VARLEN: tl.constexpr, TILE_SCALE: tl.constexpr,
    BF16: tl.constexpr, UPCAST: tl.constexpr, LOCAL_PD: tl.constexpr, DH_BF16: tl.constexpr,
):
    """Reverse chunk recurrence: dh[n] = dS_{n+1} (grad of chunk n's end state), dvn = dvn_local + m K̃ dS_{n+1},
    dS_n = a_n dS_{n+1} + scale (e^G q̂)ᵀ dO - wᵀ dvn; finally the initial-state gradient dS_0. One program per
    (V tile, sequence / document, head), like ``_state_fwd_kernel``.

    No runtime float arguments: the output scale is the constexpr ``SCALE``. ``torch.compile`` traces the launches in
    ``function.py`` and inductor re-compiles these kernels, typing Python float runtime arguments fp64; ``fp64 · fp32``
    would promote the fp32 loop-carried states (dS of ``state_bwd``) and Triton refuses the loop. Every accumulator is
    created with an explicit fp32 dtype, and every operand that meets the state is fp32 (activations are cast on load).
    """
    pv = tl.program_id(0)
    sh = tl.program_id(1).to(tl.int64)  # (sequence, head): indexes S0 / Sfin
    b, h, bh, c0, c1 = _seq_program(sh, co_ptr, H, N, VARLEN)
    kr = tl.arange(0, BKF)
    km = kr < K
    vc = pv * BV + tl.arange(0, BV)
    vm = vc < V
    kv_offs = kr[:, None] * V + vc[None, :]
    kv_mask = km[:, None] & vm[None, :]
    if HAS_DSFIN:
        dS = tl.load(dSfin_ptr + sh * K * V + kv_offs, mask=kv_mask, other=0.0).to(tl.float32)
    else:
        dS = tl.zeros([BKF, BV], dtype=tl.float32)
    if WHILE_LOOP:
        i = 0
        while i < c1 - c0:
            dS = _state_bwd_step(c1 - 1 - i, dS, q_ptr, k_ptr, w_ptr, do_ptr, dvl_ptr, G_ptr, rq_ptr, rk_ptr, m_ptr,
                                 dh_ptr, dvn_ptr, cu_ptr, ci_ptr, SCALE, bh, b, h, kr, km, vc, vm, kv_offs, kv_mask,
                                 T, H, N, NM, Tp, K, V, C, HAS_COMMIT, DECAY_UNCOMMITTED, PREC, VARLEN,
                                 TILE_SCALE, BF16, UPCAST, LOCAL_PD, DH_BF16)
            i += 1
    else:
        for i in range(c1 - c0):
            dS = _state_bwd_step(c1 - 1 - i, dS, q_ptr, k_ptr, w_ptr, do_ptr, dvl_ptr, G_ptr, rq_ptr, rk_ptr, m_ptr,
                                 dh_ptr, dvn_ptr, cu_ptr, ci_ptr, SCALE, bh, b, h, kr, km, vc, vm, kv_offs, kv_mask,
                                 T, H, N, NM, Tp, K, V, C, HAS_COMMIT, DECAY_UNCOMMITTED, PREC, VARLEN,
                                 TILE_SCALE, BF16, UPCAST, LOCAL_PD, DH_BF16)
    tl.store(dS0_ptr + sh * K * V + kv_offs, dS, mask=kv_mask)


@triton.jit
def _bwd_k_kernel(
    q_ptr, k_ptr, do_ptr, beta_ptr, G_ptr, rq_ptr, rk_ptr, m_ptr, X_ptr, states_ptr, dh_ptr, vn_ptr, dvn_ptr,
    dPD_ptr,
    dqh_ptr, dkh_ptr, dGp_ptr, dbp_ptr, dXp_ptr, scp_ptr, cu_ptr, ci_ptr,
    T, H, N, NM, Tp, NB,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_COMMIT: tl.constexpr, PREC: tl.constexpr, SCALE: tl.constexpr, VARLEN: tl.constexpr, BF16: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One K slice of one chunk: dq̂, dk̂ (all but the A-term), and partial sums for dG, dβ, dX_w, ⟨dh, S⟩, dm.
    ``BF16`` (``GatedDeltaConfig.bwdk_dots="bf16"``): the V loop's three products take bf16 operands (``_bf16``)."""
    pk = tl.program_id(0)
    n = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b = bh // H
    h = bh % H
    ti = tl.arange(0, C)
    t = n * C + ti
    tt, tm, t0, t1 = _chunk_rows(cu_ptr, ci_ptr, n, T, C, VARLEN)
    if VARLEN:
        if t1 <= t0:  # a spare row: nothing to read or write
            return
    kc = pk * BK + tl.arange(0, BK)
    km = kc < K
    Gt = tl.load(G_ptr + bh * Tp + t)
    Gl = tl.load(G_ptr + bh * Tp + n * C + C - 1)
    rq = tl.load(rq_ptr + bh * Tp + t)
    rk = tl.load(rk_ptr + bh * Tp + t)
    beta = tl.load(beta_ptr + (b * T + tt) * H + h, mask=tm, other=0.0).to(tl.float32)
    if HAS_COMMIT:
        m = tl.load(m_ptr + (b * NM + n) * H + h, mask=n < NM, other=0.0).to(tl.float32)
    else:
        m = 1.0
    dQt = tl.zeros([C, BK], dtype=tl.float32)
    dw = tl.zeros([C, BK], dtype=tl.float32)
    dKt = tl.zeros([C, BK], dtype=tl.float32)
    sig = tl.zeros([BK], dtype=tl.float32)
    do_base = b * T * H * V + h * V
    st_base = (bh * N + n) * K * V
    for v0 in range(0, V, BV):
        vc = v0 + tl.arange(0, BV)
        vm = vc < V
        dO = tl.load(do_ptr + do_base + tt[:, None] * (H * V) + vc[None, :], mask=tm[:, None] & vm[None, :],
                     other=0.0)
        if not BF16:
            dO = dO.to(tl.float32)
        rows = bh * Tp * V + t[:, None] * V + vc[None, :]
        vn = tl.load(vn_ptr + rows, mask=vm[None, :], other=0.0)  # bf16 with bf16 buffers
        if not BF16:
            vn = vn.to(tl.float32)
        dvn = tl.load(dvn_ptr + rows, mask=vm[None, :], other=0.0)
        kv = st_base + kc[:, None] * V + vc[None, :]
        kvm = km[:, None] & vm[None, :]
        Sk = tl.load(states_ptr + kv, mask=kvm, other=0.0).to(tl.float32)
        dhk = tl.load(dh_ptr + kv, mask=kvm, other=0.0)  # bf16 with BF16
        # BF16: bf16 operands (S, vn and bf16 dO round-trip exactly; dvn and dh are rounded)
        Sb = _bf16(Sk, BF16, UPCAST)
        dQt += tl.dot(_bf16(dO, BF16, UPCAST), tl.trans(Sb), input_precision=PREC)
        dw -= tl.dot(_bf16(dvn, BF16, UPCAST), tl.trans(Sb), input_precision=PREC)
        dKt += tl.dot(_bf16(vn, BF16, UPCAST), tl.trans(_bf16(dhk, BF16, UPCAST)), input_precision=PREC)
        sig += tl.sum(Sk * dhk.to(tl.float32), 1)

    # q̂, k̂ of this K slice: loaded after the V loop, which does not read them (fewer fp32 tiles live in the loop)
    offs = b * T * H * K + h * K + tt[:, None] * (H * K) + kc[None, :]
    msk = tm[:, None] & km[None, :]
    Qk = tl.load(q_ptr + offs, mask=msk, other=0.0).to(tl.float32) * rq[:, None]
    Kk = tl.load(k_ptr + offs, mask=msk, other=0.0).to(tl.float32) * rk[:, None]
    dPD = tl.load(dPD_ptr + (bh * N + n) * C * C + ti[:, None] * C + ti[None, :])
    eG = tl.exp(Gt)
    eL = tl.exp(Gl - Gt)
    dQt = dQt * SCALE
    dqh = eG[:, None] * dQt + tl.dot(dPD, Kk, input_precision=PREC)
    dG = tl.sum(Qk * dQt, 1) * eG
    dkh = tl.dot(tl.trans(dPD), Qk, input_precision=PREC)
    kap = tl.sum(Kk * dKt, 1) * eL  # e^{G_last - G_t} k̂_t · (dS_end vn_t), this slice
    dkh += (m * eL)[:, None] * dKt
    dG -= m * kap
    X = tl.load(X_ptr + (bh * N + n) * C * C + ti[:, None] * C + ti[None, :])
    dBw = tl.dot(tl.trans(X), dw, input_precision=PREC)
    coef = beta * eG
    dkh += coef[:, None] * dBw
    t1 = tl.sum(Kk * dBw, 1) * eG
    dG += beta * t1
    dXw = tl.dot(dw, tl.trans(Kk * coef[:, None]), input_precision=PREC)

    kq_rows = bh * Tp * K + t[:, None] * K + kc[None, :]
    tl.store(dqh_ptr + kq_rows, dqh, mask=km[None, :])
    tl.store(dkh_ptr + kq_rows, dkh, mask=km[None, :])
    p_base = pk * NB + bh  # partial buffers are [n_k_tiles, B*H, ...]
    tl.store(dGp_ptr + p_base * Tp + t, dG)
    tl.store(dbp_ptr + p_base * Tp + t, t1)
    tl.store(dXp_ptr + (p_base * N + n) * C * C + ti[:, None] * C + ti[None, :], dXw)
    # scalars: [⟨dh, S⟩, Σ kap]
    tl.store(scp_ptr + (p_base * N + n) * 2, tl.sum(sig, 0))
    tl.store(scp_ptr + (p_base * N + n) * 2 + 1, tl.sum(kap, 0))


@triton.jit
def _bwd_finish_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, G_ptr, rq_ptr, rk_ptr, m_ptr, X_ptr, dvn_ptr,
    dqh_ptr, dkh_ptr, dGloc_ptr, dGp_ptr, dbp_ptr, dXp_ptr, scp_ptr,
    dq_ptr, dk_ptr, dv_ptr, dg_ptr, dbeta_ptr, dm_ptr, cu_ptr, ci_ptr,
    T, H, N, NM, Tp, NB,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NKT: tl.constexpr,
    HAS_COMMIT: tl.constexpr, DECAY_UNCOMMITTED: tl.constexpr, USE_L2: tl.constexpr, PREC: tl.constexpr,
    VARLEN: tl.constexpr,
):
    n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    ti = tl.arange(0, C)
    t = n * C + ti
    tt, tm, t0, t1 = _chunk_rows(cu_ptr, ci_ptr, n, T, C, VARLEN)
    if VARLEN:
        if t1 <= t0:  # a spare row: nothing to read or write
            return
    Gt = tl.load(G_ptr + bh * Tp + t)
    Gl = tl.load(G_ptr + bh * Tp + n * C + C - 1)
    rq = tl.load(rq_ptr + bh * Tp + t)
    rk = tl.load(rk_ptr + bh * Tp + t)
    beta = tl.load(beta_ptr + (b * T + tt) * H + h, mask=tm, other=0.0).to(tl.float32)
    if HAS_COMMIT:
        m = tl.load(m_ptr + (b * NM + n) * H + h, mask=n < NM, other=0.0).to(tl.float32)
    else:
        m = 1.0
    cc = ti[:, None] * C + ti[None, :]

    # partial sums of the K slices
    dG = tl.load(dGloc_ptr + bh * Tp + t)
    db_w = tl.zeros([C], dtype=tl.float32)
    dX = tl.zeros([C, C], dtype=tl.float32)
    two = tl.arange(0, 2)
    sc = tl.zeros([2], dtype=tl.float32)
    for pk in range(NKT):
        p_base = pk * NB + bh
        dG += tl.load(dGp_ptr + p_base * Tp + t)
        db_w += tl.load(dbp_ptr + p_base * Tp + t)
        dX += tl.load(dXp_ptr + (p_base * N + n) * C * C + cc)
        sc += tl.load(scp_ptr + (p_base * N + n) * 2 + two)
    sig = tl.sum(tl.where(two == 0, sc, 0.0), 0)  # ⟨dS_end, S_start⟩
    kap = tl.sum(tl.where(two == 1, sc, 0.0), 0)  # ⟨dS_end, ΔS⟩
    dbeta = db_w

    X = tl.load(X_ptr + (bh * N + n) * C * C + cc)
    v_base = b * T * H * V + h * V
    for v0 in range(0, V, BV):
        vc = v0 + tl.arange(0, BV)
        vm = vc < V
        io = v_base + tt[:, None] * (H * V) + vc[None, :]
        iom = tm[:, None] & vm[None, :]
        vt = tl.load(v_ptr + io, mask=iom, other=0.0).to(tl.float32)
        dvn = tl.load(dvn_ptr + bh * Tp * V + t[:, None] * V + vc[None, :], mask=vm[None, :], other=0.0)
        dX += tl.dot(dvn, tl.trans(vt * beta[:, None]), input_precision=PREC)
        dBu = tl.dot(tl.trans(X), dvn, input_precision=PREC)
        tl.store(dv_ptr + io, (dBu * beta[:, None]).to(dv_ptr.dtype.element_ty), mask=iom)
        dbeta += tl.sum(vt * dBu, 1)

    strict = ti[:, None] > ti[None, :]
    dA = -tl.dot(tl.dot(tl.trans(X), dX, input_precision=PREC), tl.trans(X), input_precision=PREC)
    E = tl.exp(tl.where(strict, Gt[:, None] - Gt[None, :], float("-inf")))
    dAE = tl.where(strict, dA, 0.0) * E

    qk_base = b * T * H * K + h * K
    KK = tl.zeros([C, C], dtype=tl.float32)
    for k0 in range(0, K, BK):
        kc = k0 + tl.arange(0, BK)
        kt = tl.load(k_ptr + qk_base + tt[:, None] * (H * K) + kc[None, :], mask=tm[:, None] & (kc < K)[None, :],
                     other=0.0).to(tl.float32) * rk[:, None]
        KK += tl.dot(kt, tl.trans(kt), input_precision=PREC)
    dbeta += tl.sum(dAE * KK, 1)
    R = dAE * KK * beta[:, None]
    dG += tl.sum(R, 1) - tl.sum(R, 0)
    dKK = dAE * beta[:, None]

    gam = tl.exp(Gl)
    dGlast = m * kap
    if HAS_COMMIT:
        if DECAY_UNCOMMITTED:
            dGlast += gam * sig
            dm = kap
        else:
            dGlast += m * gam * sig
            dm = kap + (gam - 1.0) * sig
        tl.store(dm_ptr + (b * NM + n) * H + h, dm, mask=n < NM)
    else:
        dGlast += gam * sig
    dG += tl.where(ti == C - 1, dGlast, 0.0)
    dg = tl.cumsum(dG, axis=0, reverse=True)
    tl.store(dg_ptr + (b * T + tt) * H + h, dg, mask=tm)
    tl.store(dbeta_ptr + (b * T + tt) * H + h, dbeta, mask=tm)

    # dk̂ += (dKK + dKKᵀ) k̂, then the l2-norm backward: dk = r (dk̂ - k̂ (k̂·dk̂)); the same for q.
    kdot = tl.zeros([C], dtype=tl.float32)
    qdot = tl.zeros([C], dtype=tl.float32)
    if USE_L2:
        for k0 in range(0, K, BK):
            kc = k0 + tl.arange(0, BK)
            km = kc < K
            offs = qk_base + tt[:, None] * (H * K) + kc[None, :]
            msk = tm[:, None] & km[None, :]
            kt = tl.load(k_ptr + offs, mask=msk, other=0.0).to(tl.float32) * rk[:, None]
            qt = tl.load(q_ptr + offs, mask=msk, other=0.0).to(tl.float32) * rq[:, None]
            rows = bh * Tp * K + t[:, None] * K + kc[None, :]
            dkh = tl.load(dkh_ptr + rows, mask=km[None, :], other=0.0)
            dkh += tl.dot(dKK, kt, input_precision=PREC) + tl.dot(tl.trans(dKK), kt, input_precision=PREC)
            dqh = tl.load(dqh_ptr + rows, mask=km[None, :], other=0.0)
            kdot += tl.sum(kt * dkh, 1)
            qdot += tl.sum(qt * dqh, 1)
    for k0 in range(0, K, BK):
        kc = k0 + tl.arange(0, BK)
        km = kc < K
        offs = qk_base + tt[:, None] * (H * K) + kc[None, :]
        msk = tm[:, None] & km[None, :]
        kt = tl.load(k_ptr + offs, mask=msk, other=0.0).to(tl.float32) * rk[:, None]
        qt = tl.load(q_ptr + offs, mask=msk, other=0.0).to(tl.float32) * rq[:, None]
        rows = bh * Tp * K + t[:, None] * K + kc[None, :]
        dkh = tl.load(dkh_ptr + rows, mask=km[None, :], other=0.0)
        dkh += tl.dot(dKK, kt, input_precision=PREC) + tl.dot(tl.trans(dKK), kt, input_precision=PREC)
        dqh = tl.load(dqh_ptr + rows, mask=km[None, :], other=0.0)
        if USE_L2:
            dkh = rk[:, None] * (dkh - kt * kdot[:, None])
            dqh = rq[:, None] * (dqh - qt * qdot[:, None])
        tl.store(dk_ptr + offs, dkh.to(dk_ptr.dtype.element_ty), mask=msk)
        tl.store(dq_ptr + offs, dqh.to(dq_ptr.dtype.element_ty), mask=msk)
