"""The block-sparse Triton kernels of chunk attention (the NAtS-L softmax branch), forward + backward; the design
notes are above the kernels."""

from __future__ import annotations

import triton
import triton.language as tl

from ...common.triton.chunk_rows import table_row

# Our own FlashAttention-2 style kernels over the chunk routing: query t sees its own chunk causally and every earlier
# chunk routed to softmax for its decision head; cross-chunk logits get ``routing_bias`` (its gradient is the routing
# gradient). `_fwd_kernel` (forward, and the dq pass) walks a device-built list of routed chunks, `_dkv_kernel` the
# transpose; `_bwd_kernel` is the one-pass backward; `_query_tile` gives the packed-document (``VARLEN``) layout.
# Softmax statistics in fp32 (log2 domain); dots take the input dtype with fp32 accumulation. Softmax scales
# are constexpr (inductor types Python float runtime arguments fp64, promoting the fp32 loop-carried accumulators).
# Runtime-bounded loops are ``while`` loops under ``TRITON_INTERPRET=1`` (NumPy >= 2.4 refuses ``int()`` of the
# interpreter's 1-element scalars), ``for`` loops when compiled.


@triton.jit
def _chunk_start(cu_ptr, ci_ptr, kc, C: tl.constexpr):
    """First packed token of global chunk kc (a real chunk: a routed one before the query's)."""
    _, c0, _ = table_row(cu_ptr, ci_ptr, kc, C)
    return c0


@triton.jit
def _fwd_block(acc, m_i, l_i, q, k_ptr, v_ptr, kv_base, kc, col0, col_end, rows, rchunk, r_kc, bias_kc, qk_scale,
               HS, DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr,
               DIAG: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr):
    """Key chunk kc (tokens col0 .. min(col0 + C, col_end)) into the running softmax of the query rows (of chunks
    ``rchunk``)."""
    cols = col0 + tl.arange(0, C)
    dk_r = tl.arange(0, BDK)
    dv_r = tl.arange(0, BDV)
    cm = cols < col_end
    k = tl.load(k_ptr + kv_base + cols[:, None] * (HS * DK) + dk_r[None, :],
                mask=cm[:, None] & (dk_r < DK)[None, :], other=0.0)
    v = tl.load(v_ptr + kv_base // DK * DV + cols[:, None] * (HS * DV) + dv_r[None, :],
                mask=cm[:, None] & (dv_r < DV)[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if DIAG:
        qc = rchunk
        cross = qc > kc
        vis = ((qc == kc)[:, None] & (rows[:, None] >= cols[None, :])) | (cross & (r_kc > 0))[:, None]
        vis = vis & cm[None, :]
        if HAS_BIAS:
            s += tl.where(cross, bias_kc * 1.4426950408889634, 0.0)[:, None]
        s = tl.where(vis, s, float("-inf"))
    else:
        if HAS_BIAS:
            s += bias_kc * 1.4426950408889634
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i

@triton.jit
def _query_tile(cu_ptr, ci_ptr, pid_m, T, C: tl.constexpr, BM: tl.constexpr, VARLEN: tl.constexpr):
    """(doc, r0, r1, rows [BM], rm [BM], rchunk [BM]) of query tile pid_m: its document (packed; 0 otherwise), token
    range [r0, r1), row indices, their validity and chunk index. Packed (QC == 1): the tile is chunk row pid_m of the
    chunk table (= global chunk pid_m) with its true rows; r1 <= r0 marks a spare row (no queries).

    Packed documents (``cu_seqlens``, ``VARLEN``; B == 1, ``ops/common/varlen.py``), decided once for the three
    kernels: chunks restart at each document start and are numbered globally in document order (routing, bias and
    their gradient ``[1, N, Hn]`` with N the true Nc = Σ ceil(len_i / C), the caller's tensors); the grids run over the
    rows of the call's ``ChunkTable`` (``varlen.chunk_table``, built on the device, no host sync): its first Nc rows
    are those chunks (row c *is* global chunk c), ``table_row`` gives a row's document and token range, and the up to
    N_docs - 1 spare rows after them have no tokens: their programs return at once (they read and write nothing, and
    store no bias gradient). Query tiles are one chunk (QC = 1): one program per (chunk row, head) with the chunk's
    true rows (masked at a document's partial last chunk); the routed chunks of its own document before it are
    ``idx[cnt[offsets[doc]] : cnt[c]]`` (the same device-built lists as unpacked: cnt counts routed chunks in global
    order, idx is ascending; both indices clamped to N, so no read goes past the lists). An earlier chunk of the same
    document is always full. dk/dv: one program per (key chunk row, head); its later query rows stop at its document's
    end ``cu[doc + 1]``. So no query ever reads another document.
    """
    if VARLEN:
        doc, r0, r1 = table_row(cu_ptr, ci_ptr, pid_m, C)
        rows = r0 + tl.arange(0, BM)
        rm = rows < r1
        rchunk = tl.zeros([BM], dtype=tl.int32) + pid_m
    else:
        doc = 0
        r0 = pid_m * BM
        r1 = T
        rows = pid_m * BM + tl.arange(0, BM)
        rm = rows < T
        rchunk = rows // C
    return doc, r0, r1, rows, rm, rchunk


@triton.jit
def _fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, o32_ptr, lse_ptr, idx_ptr, cnt_ptr, r_ptr, bias_ptr, cu_ptr, ci_ptr, co_ptr,
                qk_scale: tl.constexpr, T, N, HS, G,
                DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr,
                QC: tl.constexpr, HAS_BIAS: tl.constexpr, WHILE_LOOP: tl.constexpr,
                UPCAST: tl.constexpr, STORE_O32: tl.constexpr, VARLEN: tl.constexpr):
    """Forward of one query tile (QC chunks) of one (b, head): the output and the log-sum-exp.

    Query t (chunk c(t), softmax head i, decision head
    h = i // G) sees its own chunk causally and every earlier chunk n with routing[b, n, h] = 1; cross-chunk logits get
    ``routing_bias[b, n, h]`` (the NAtS-L routing gradient is d bias = Σ dS over those pairs, no softmax-scale factor).

    Forward / dq: one program per (query tile of QC chunks, b, head). It walks the compacted, ascending list of routed
    chunks before its tile (``idx``/``cnt``, built on the device from the routing, no host sync) without masks, then
    the QC diagonal chunks with the causal + routing mask. Cost ∝ ρ·T²/2 + T·C per head (ρ = routed fraction).
    """
    BM: tl.constexpr = QC * C
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # longest tiles (most routed chunks) first
    bh = tl.program_id(1).to(tl.int64)
    b = bh // HS
    hs = bh % HS
    hn = hs // G
    doc, r0, r1, rows, rm, rchunk = _query_tile(cu_ptr, ci_ptr, pid_m, T, C, BM, VARLEN)
    if VARLEN:
        if r1 <= r0:  # a spare row of the chunk table: no queries, nothing to read or write
            return
    dk_r = tl.arange(0, BDK)
    dv_r = tl.arange(0, BDV)
    q_base = b * T * HS * DK + hs * DK
    q = tl.load(q_ptr + q_base + rows[:, None] * (HS * DK) + dk_r[None, :], mask=rm[:, None] & (dk_r < DK)[None, :],
                other=0.0)
    if UPCAST:  # the interpreter's bf16 dot is wrong (NumPy has no bf16): compute in fp32 there
        q = q.to(tl.float32)
    acc = tl.zeros([BM, BDV], dtype=tl.float32)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    c0 = pid_m * QC
    rbase = (b * (HS // G) + hn) * N
    cbase = (b * (HS // G) + hn) * (N + 1)
    n_full = tl.load(cnt_ptr + cbase + tl.minimum(c0, N))  # clamped: never past the lists
    # from its document's first chunk
    j0 = tl.load(cnt_ptr + cbase + tl.minimum(tl.load(co_ptr + doc), N)) if VARLEN else 0
    if WHILE_LOOP:
        j = j0
        while j < n_full:
            kc = tl.load(idx_ptr + rbase + j)
            col0 = _chunk_start(cu_ptr, ci_ptr, kc, C) if VARLEN else kc * C
            bias_kc = tl.load(bias_ptr + rbase + kc) if HAS_BIAS else 0.0
            acc, m_i, l_i = _fwd_block(acc, m_i, l_i, q, k_ptr, v_ptr, q_base, kc, col0, T, rows, rchunk, 1, bias_kc,
                                       qk_scale, HS, DK, DV, BDK, BDV, C, False, HAS_BIAS, UPCAST)
            j += 1
    else:
        for j in range(j0, n_full):
            kc = tl.load(idx_ptr + rbase + j)
            col0 = _chunk_start(cu_ptr, ci_ptr, kc, C) if VARLEN else kc * C
            bias_kc = tl.load(bias_ptr + rbase + kc) if HAS_BIAS else 0.0
            acc, m_i, l_i = _fwd_block(acc, m_i, l_i, q, k_ptr, v_ptr, q_base, kc, col0, T, rows, rchunk, 1, bias_kc,
                                       qk_scale, HS, DK, DV, BDK, BDV, C, False, HAS_BIAS, UPCAST)
    for d in tl.static_range(QC):
        kc = c0 + d
        r_kc = tl.load(r_ptr + rbase + kc, mask=kc < N, other=0)
        bias_kc = tl.load(bias_ptr + rbase + kc, mask=kc < N, other=0.0) if HAS_BIAS else 0.0
        acc, m_i, l_i = _fwd_block(acc, m_i, l_i, q, k_ptr, v_ptr, q_base, kc, r0 + d * C, r1, rows, rchunk, r_kc,
                                   bias_kc, qk_scale, HS, DK, DV, BDK, BDV, C, True, HAS_BIAS, UPCAST)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    o_base = b * T * HS * DV + hs * DV
    o_offs = o_base + rows[:, None] * (HS * DV) + dv_r[None, :]
    tl.store(o_ptr + o_offs, o.to(o_ptr.dtype.element_ty), mask=rm[:, None] & (dv_r < DV)[None, :])
    if STORE_O32:  # fp32 copy for the backward's Δ = rowsum(o ⊙ dO) (a bf16 o costs ~2e-3 in the routing grad)
        tl.store(o32_ptr + o_offs, o, mask=rm[:, None] & (dv_r < DV)[None, :])
    tl.store(lse_ptr + bh * T + rows, m_i + tl.log2(l_safe), mask=rm)

@triton.jit
def _dq_block(dq, q, do, lse, delta, k_ptr, v_ptr, kv_base, kc, col0, col_end, rows, rchunk, r_kc, bias_kc,
              qk_scale, HS, DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
              C: tl.constexpr, DIAG: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr):
    cols = col0 + tl.arange(0, C)
    dk_r = tl.arange(0, BDK)
    dv_r = tl.arange(0, BDV)
    cm = cols < col_end
    k = tl.load(k_ptr + kv_base + cols[:, None] * (HS * DK) + dk_r[None, :],
                mask=cm[:, None] & (dk_r < DK)[None, :], other=0.0)
    v = tl.load(v_ptr + kv_base // DK * DV + cols[:, None] * (HS * DV) + dv_r[None, :],
                mask=cm[:, None] & (dv_r < DV)[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if DIAG:
        qc = rchunk
        cross = qc > kc
        vis = ((qc == kc)[:, None] & (rows[:, None] >= cols[None, :])) | (cross & (r_kc > 0))[:, None]
        vis = vis & cm[None, :]
        if HAS_BIAS:
            s += tl.where(cross, bias_kc * 1.4426950408889634, 0.0)[:, None]
        p = tl.where(vis, tl.exp2(s - lse[:, None]), 0.0)
    else:
        if HAS_BIAS:
            s += bias_kc * 1.4426950408889634
        p = tl.exp2(s - lse[:, None])
    dp = tl.dot(do, tl.trans(v))
    ds = p * (dp - delta[:, None])
    dq += tl.dot(ds.to(k.dtype), k)
    return dq

@triton.jit
def _dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, idx_ptr, cnt_ptr, r_ptr, bias_ptr,
               cu_ptr, ci_ptr, co_ptr,
               scale: tl.constexpr, qk_scale: tl.constexpr, T, N, HS, G,
               DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr,
               QC: tl.constexpr, HAS_BIAS: tl.constexpr, WHILE_LOOP: tl.constexpr,
               UPCAST: tl.constexpr, VARLEN: tl.constexpr):
    BM: tl.constexpr = QC * C
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // HS
    hs = bh % HS
    hn = hs // G
    doc, r0, r1, rows, rm, rchunk = _query_tile(cu_ptr, ci_ptr, pid_m, T, C, BM, VARLEN)
    if VARLEN:
        if r1 <= r0:  # a spare row of the chunk table: no queries, nothing to read or write
            return
    dk_r = tl.arange(0, BDK)
    dv_r = tl.arange(0, BDV)
    q_base = b * T * HS * DK + hs * DK
    o_base = b * T * HS * DV + hs * DV
    q = tl.load(q_ptr + q_base + rows[:, None] * (HS * DK) + dk_r[None, :], mask=rm[:, None] & (dk_r < DK)[None, :],
                other=0.0)
    do = tl.load(do_ptr + o_base + rows[:, None] * (HS * DV) + dv_r[None, :],
                 mask=rm[:, None] & (dv_r < DV)[None, :], other=0.0)
    lse = tl.load(lse_ptr + bh * T + rows, mask=rm, other=0.0)
    delta = tl.load(delta_ptr + bh * T + rows, mask=rm, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    dq = tl.zeros([BM, BDK], dtype=tl.float32)
    c0 = pid_m * QC
    rbase = (b * (HS // G) + hn) * N
    cbase = (b * (HS // G) + hn) * (N + 1)
    n_full = tl.load(cnt_ptr + cbase + tl.minimum(c0, N))  # clamped: never past the lists
    j0 = tl.load(cnt_ptr + cbase + tl.minimum(tl.load(co_ptr + doc), N)) if VARLEN else 0
    if WHILE_LOOP:
        j = j0
        while j < n_full:
            kc = tl.load(idx_ptr + rbase + j)
            col0 = _chunk_start(cu_ptr, ci_ptr, kc, C) if VARLEN else kc * C
            bias_kc = tl.load(bias_ptr + rbase + kc) if HAS_BIAS else 0.0
            dq = _dq_block(dq, q, do, lse, delta, k_ptr, v_ptr, q_base, kc, col0, T, rows, rchunk, 1, bias_kc,
                           qk_scale, HS, DK, DV, BDK, BDV, C, False, HAS_BIAS, UPCAST)
            j += 1
    else:
        for j in range(j0, n_full):
            kc = tl.load(idx_ptr + rbase + j)
            col0 = _chunk_start(cu_ptr, ci_ptr, kc, C) if VARLEN else kc * C
            bias_kc = tl.load(bias_ptr + rbase + kc) if HAS_BIAS else 0.0
            dq = _dq_block(dq, q, do, lse, delta, k_ptr, v_ptr, q_base, kc, col0, T, rows, rchunk, 1, bias_kc,
                           qk_scale, HS, DK, DV, BDK, BDV, C, False, HAS_BIAS, UPCAST)
    for d in tl.static_range(QC):
        kc = c0 + d
        r_kc = tl.load(r_ptr + rbase + kc, mask=kc < N, other=0)
        bias_kc = tl.load(bias_ptr + rbase + kc, mask=kc < N, other=0.0) if HAS_BIAS else 0.0
        dq = _dq_block(dq, q, do, lse, delta, k_ptr, v_ptr, q_base, kc, r0 + d * C, r1, rows, rchunk, r_kc, bias_kc,
                       qk_scale, HS, DK, DV, BDK, BDV, C, True, HAS_BIAS, UPCAST)
    tl.store(dq_ptr + q_base + rows[:, None] * (HS * DK) + dk_r[None, :], (dq * scale).to(dq_ptr.dtype.element_ty),
             mask=rm[:, None] & (dk_r < DK)[None, :])

@triton.jit
def _dkv_block(dk, dv, dsum, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, q_base, o_base, bh, rows, row_end, cols,
               bias_kc, scale: tl.constexpr, qk_scale, T, HS, DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr,
               BDV: tl.constexpr, DIAG: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr,
               DQ_ATOMIC: tl.constexpr):
    """Query rows ``rows`` (valid below ``row_end``) into dk, dv (and Σ dS) of the key chunk ``cols``; with
    ``DQ_ATOMIC`` also this key chunk's share dS·K·scale of those rows' dq, added into the fp32 ``dq_ptr``."""
    dk_r = tl.arange(0, BDK)
    dv_r = tl.arange(0, BDV)
    rm = rows < row_end
    q_offs = q_base + rows[:, None] * (HS * DK) + dk_r[None, :]
    q_mask = rm[:, None] & (dk_r < DK)[None, :]
    q = tl.load(q_ptr + q_offs, mask=q_mask, other=0.0)
    do = tl.load(do_ptr + o_base + rows[:, None] * (HS * DV) + dv_r[None, :],
                 mask=rm[:, None] & (dv_r < DV)[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse = tl.load(lse_ptr + bh * T + rows, mask=rm, other=0.0)
    delta = tl.load(delta_ptr + bh * T + rows, mask=rm, other=0.0)
    sT = tl.dot(k, tl.trans(q)) * qk_scale  # [keys, queries]
    if DIAG:
        vis = (rows[None, :] >= cols[:, None]) & rm[None, :]
    else:
        vis = rm[None, :]
        if HAS_BIAS:
            sT += bias_kc * 1.4426950408889634
    pT = tl.where(vis, tl.exp2(sT - lse[None, :]), 0.0)
    dv += tl.dot(pT.to(do.dtype), do)
    dpT = tl.dot(v, tl.trans(do))
    dsT = pT * (dpT - delta[None, :])
    dk += tl.dot(dsT.to(q.dtype), q)
    if DQ_ATOMIC:
        # relaxed: the adds only need to be atomic, no ordering (the host reads dq after the kernel); the default
        # acq_rel would order every add. Masked rows (past row_end) add nothing; the sum order is not deterministic.
        dq = tl.dot(tl.trans(dsT).to(k.dtype), k) * scale
        tl.atomic_add(dq_ptr + q_offs, dq, mask=q_mask, sem="relaxed")
    if not DIAG:
        dsum += tl.sum(dsT, 1)
    return dk, dv, dsum

@triton.jit
def _dkv_program(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, dbias_ptr, r_ptr, bias_ptr,
                 cu_ptr, ci_ptr, scale: tl.constexpr, qk_scale: tl.constexpr, T, N, HS, G,
                 DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr,
                 QB: tl.constexpr, HAS_BIAS: tl.constexpr, WHILE_LOOP: tl.constexpr, UPCAST: tl.constexpr,
                 VARLEN: tl.constexpr, DQ_ATOMIC: tl.constexpr):
    """The body of ``_dkv_kernel`` (``DQ_ATOMIC`` False; ``dq_ptr`` unused) and ``_bwd_kernel`` (True): one key
    chunk (program 0) of one (b, head) (program 1)."""
    kc = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // HS
    hs = bh % HS
    hn = hs // G
    if VARLEN:  # key chunk kc's true tokens [c0, c1) and its document's end (the last query row it may serve)
        doc, c0, c1 = table_row(cu_ptr, ci_ptr, kc, C)
        if c1 <= c0:  # a spare row: no keys, nothing to read or write (its bias gradient is not stored)
            return
        d_end = tl.load(cu_ptr + doc + 1)
    else:
        c0 = kc * C
        c1 = T
        d_end = T
    cols = c0 + tl.arange(0, C)
    cm = cols < c1
    dk_r = tl.arange(0, BDK)
    dv_r = tl.arange(0, BDV)
    q_base = b * T * HS * DK + hs * DK
    o_base = b * T * HS * DV + hs * DV
    k = tl.load(k_ptr + q_base + cols[:, None] * (HS * DK) + dk_r[None, :], mask=cm[:, None] & (dk_r < DK)[None, :],
                other=0.0)
    v = tl.load(v_ptr + o_base + cols[:, None] * (HS * DV) + dv_r[None, :], mask=cm[:, None] & (dv_r < DV)[None, :],
                other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([C, BDK], dtype=tl.float32)
    dv = tl.zeros([C, BDV], dtype=tl.float32)
    dsum = tl.zeros([C], dtype=tl.float32)
    rbase = (b * (HS // G) + hn) * N
    bias_kc = tl.load(bias_ptr + rbase + kc, mask=kc < N, other=0.0) if HAS_BIAS else 0.0
    for d in tl.static_range(C // QB):  # own chunk, causal
        rows = c0 + d * QB + tl.arange(0, QB)
        dk, dv, dsum = _dkv_block(dk, dv, dsum, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, q_base, o_base, bh,
                                  rows, c1, cols, bias_kc, scale, qk_scale, T, HS, DK, DV, BDK, BDV, True, HAS_BIAS,
                                  UPCAST, DQ_ATOMIC)
    r_kc = tl.load(r_ptr + rbase + kc, mask=kc < N, other=0)
    start = c0 + C  # the later chunks of its document (none after a document's last chunk)
    n_tiles = tl.where(r_kc > 0, tl.maximum(tl.cdiv(d_end - start, QB), 0), 0)
    if WHILE_LOOP:
        i = 0
        while i < n_tiles:
            r_i = start + i * QB + tl.arange(0, QB)
            dk, dv, dsum = _dkv_block(dk, dv, dsum, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, q_base, o_base,
                                      bh, r_i, d_end, cols, bias_kc, scale, qk_scale, T, HS, DK, DV, BDK, BDV, False,
                                      HAS_BIAS, UPCAST, DQ_ATOMIC)
            i += 1
    else:
        for i in range(n_tiles):  # r_i, not rows: an i64 T (inductor) would re-type the loop-carried rows
            r_i = start + i * QB + tl.arange(0, QB)
            dk, dv, dsum = _dkv_block(dk, dv, dsum, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, q_base, o_base,
                                      bh, r_i, d_end, cols, bias_kc, scale, qk_scale, T, HS, DK, DV, BDK, BDV, False,
                                      HAS_BIAS, UPCAST, DQ_ATOMIC)
    tl.store(dk_ptr + q_base + cols[:, None] * (HS * DK) + dk_r[None, :], (dk * scale).to(dk_ptr.dtype.element_ty),
             mask=cm[:, None] & (dk_r < DK)[None, :])
    tl.store(dv_ptr + o_base + cols[:, None] * (HS * DV) + dv_r[None, :], dv.to(dv_ptr.dtype.element_ty),
             mask=cm[:, None] & (dv_r < DV)[None, :])
    tl.store(dbias_ptr + bh * N + kc, tl.sum(dsum, 0), mask=kc < N)

@triton.jit
def _dkv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dbias_ptr, r_ptr, bias_ptr,
                cu_ptr, ci_ptr,
                scale: tl.constexpr, qk_scale: tl.constexpr, T, N, HS, G,
                DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr,
                QB: tl.constexpr, HAS_BIAS: tl.constexpr, WHILE_LOOP: tl.constexpr,
                UPCAST: tl.constexpr, VARLEN: tl.constexpr):
    """Two-pass backward, second pass: dk, dv and Σ dS of one key chunk (the dq kernel did dq).

    dk/dv: one program per (key chunk, b, head): its own chunk causally, then, only if the chunk is routed, every
    later query tile (unmasked); it also accumulates Σ dS over those later queries = the routing-bias gradient.
    These are the transpose of the forward's block lists: a routed chunk is seen by every later query of its
    document, an unrouted one only by its own chunk, so the dk/dv walk needs no list.
    """
    _dkv_program(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dk_ptr, dv_ptr, dbias_ptr, r_ptr, bias_ptr,
                 cu_ptr, ci_ptr, scale, qk_scale, T, N, HS, G, DK, DV, BDK, BDV, C, QB, HAS_BIAS, WHILE_LOOP, UPCAST,
                 VARLEN, False)

@triton.jit
def _bwd_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, dbias_ptr, r_ptr, bias_ptr,
                cu_ptr, ci_ptr,
                scale: tl.constexpr, qk_scale: tl.constexpr, T, N, HS, G,
                DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr,
                QB: tl.constexpr, HAS_BIAS: tl.constexpr, WHILE_LOOP: tl.constexpr,
                UPCAST: tl.constexpr, VARLEN: tl.constexpr):
    """One-pass backward: dk, dv, Σ dS of one key chunk as ``_dkv_kernel``, plus its dq share added with atomics
    into ``dq_ptr`` (fp32 ``[B, T, HS, DK]``, zero-initialised by the host).

    One-pass backward (``_bwd_kernel``, ``ChunkAttentionConfig(bwd_mode="one_pass")``): the dk/dv program (same body,
    ``_dkv_program``) also computes each query step's dq share dS·K and adds it with relaxed fp32 ``tl.atomic_add``
    into a zero-initialised fp32 dq buffer (cast to q's dtype by the host), as FlashAttention-2's backward: 5 matmuls
    per (query step, key chunk) pair instead of the two-pass 3 (dq kernel) + 4 (dk/dv kernel), and no second read of
    k, v; the price is C·Dk fp32 atomic adds per (query chunk, key chunk) pair, in no fixed order (dq is not
    bit-reproducible run to run on a GPU).
    """
    _dkv_program(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, dbias_ptr, r_ptr, bias_ptr,
                 cu_ptr, ci_ptr, scale, qk_scale, T, N, HS, G, DK, DV, BDK, BDV, C, QB, HAS_BIAS, WHILE_LOOP, UPCAST,
                 VARLEN, True)
