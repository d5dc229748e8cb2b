"""Triton kernels of the causal depthwise short convolution (imported only when triton is installed)."""

from __future__ import annotations

import triton
import triton.language as tl

from ...common.triton.chunk_rows import table_row


@triton.jit
def _rows(cu, ci, i_t, i_b, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(seq, start, end, t0, t1) of program (i_t, i_b): its sequence (batch row or document), the sequence's first
    and end token, and the program's token range [t0, t1) (empty for a spare chunk-table row)."""
    if IS_VARLEN:
        seq, t0, t1 = table_row(cu, ci, i_t, BT)
        start = tl.load(cu + seq)
        end = tl.load(cu + seq + 1)
    else:
        seq = i_b
        start = 0
        end = T
        t0 = i_t * BT
        t1 = tl.minimum(t0 + BT, T)
    return seq, start, end, t0, t1


@triton.jit
def _lag(xb, SX, init, o_r, t0, m_t, start, seq, o_c, m_c, C: tl.constexpr, L: tl.constexpr, K: tl.constexpr,
         HAS_INIT: tl.constexpr):
    """[BT, BC] float32 tile of the inputs at tokens t0 + o_r - L (xb points at token t0 of the batch row, o_r the
    rows relative to it: the K lags differ by compile-time offsets): tokens before ``start`` read the initial state
    (HAS_INIT) or zero; rows outside ``m_t`` read zero."""
    src = t0 + o_r - L
    ok = m_t & (src >= start)
    v = tl.load(xb + (o_r - L)[:, None] * SX + o_c[None, :], mask=ok[:, None] & m_c[None, :],
                other=0.0).to(tl.float32)
    if HAS_INIT:
        if L > 0:
            hist = m_t & (src < start)
            p_h = init + (seq.to(tl.int64) * (K - 1) + (K - 1 + src - start)[:, None]) * C + o_c[None, :]
            v += tl.load(p_h, mask=hist[:, None] & m_c[None, :], other=0.0).to(tl.float32)
    return v


@triton.jit
def _preact(xb, SX, w, init, o_r, t0, m_t, start, seq, o_c, m_c, C: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
            BC: tl.constexpr, HAS_INIT: tl.constexpr):
    """Pre-activation [BT, BC] (float32) at tokens t0 + o_r: Σ_L w[:, K-1-L] · x[t0 + o_r - L]."""
    acc = tl.zeros((BT, BC), dtype=tl.float32)
    for L in tl.static_range(K):
        w_l = tl.load(w + o_c * K + (K - 1 - L), mask=m_c, other=0.0).to(tl.float32)
        acc += _lag(xb, SX, init, o_r, t0, m_t, start, seq, o_c, m_c, C, L, K, HAS_INIT) * w_l[None, :]
    return acc


@triton.jit
def _dact(g, pre, SILU: tl.constexpr):
    """dpre = g · SiLU'(pre) (SILU) or g."""
    if SILU:
        sg = tl.sigmoid(pre)
        g = g * sg * (1.0 + pre * (1.0 - sg))
    return g


@triton.jit
def _dy_ahead(dyb, o_r, o_t, m_t, end, o_c, m_c, C: tl.constexpr, L: tl.constexpr):
    """[BT, BC] float32 tile of dy at tokens t0 + o_r + L (dyb points at token t0 of the batch row): the tokens that
    read t0 + o_r at lag L; zero past the sequence's end and on rows outside ``m_t``."""
    m_s = m_t & (o_t + L < end)
    return tl.load(dyb + (o_r + L)[:, None] * C + o_c[None, :], mask=m_s[:, None] & m_c[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _bwd_program(cu, ci, T, SX, C: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, IS_VARLEN: tl.constexpr):
    """The tile of a backward program: (seq, start, end, t0, o_r, o_t, m_t, o_c, m_c, tile, part) with ``_rows``'
    first five, o_t = t0 + o_r its tokens, m_t / m_c the token / channel masks, ``tile`` / ``xtile`` the offset of
    token t0 of its batch row in dy and dx / in x (rows SX apart), ``part`` its row of the weight-gradient
    partials."""
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq, start, end, t0, t1 = _rows(cu, ci, i_t, i_b, T, BT, IS_VARLEN)
    o_r = tl.arange(0, BT)
    o_t = t0 + o_r
    m_t = o_t < t1
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    tile = (i_b.to(tl.int64) * T + t0) * C
    xtile = (i_b.to(tl.int64) * T + t0) * SX
    part = (i_b * tl.num_programs(0) + i_t).to(tl.int64)
    return seq, start, end, t0, o_r, o_t, m_t, o_c, m_c, tile, xtile, part


@triton.jit
def _store_dx(dx, dfin, dxa, tile, seq, o_r, o_t, m_t, end, o_c, m_c, C: tl.constexpr, K: tl.constexpr,
              HAS_DFINAL: tl.constexpr):
    """Store the dx tile ``dxa`` plus, with HAS_DFINAL, the final-state gradient on the sequence's last K-1 tokens
    (the final state holds its last K-1 inputs)."""
    if HAS_DFINAL:
        i_f = o_t - (end - (K - 1))
        p_f = dfin + (seq.to(tl.int64) * (K - 1) + i_f[:, None]) * C + o_c[None, :]
        dxa += tl.load(p_f, mask=(m_t & (i_f >= 0))[:, None] & m_c[None, :], other=0.0).to(tl.float32)
    tl.store(dx + tile + o_r[:, None] * C + o_c[None, :], dxa.to(dx.dtype.element_ty), mask=m_t[:, None] & m_c[None, :])


@triton.jit
def _conv_fwd_kernel(
    x,
    w,
    init,
    cu,
    ci,
    y,
    T,
    SX,
    C: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    SILU: tl.constexpr,
    HAS_INIT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """y = act(pre) for one [BT tokens, BC channels] tile.

    Notation: x, y ``[B, T, C]`` (channels last; y contiguous, x's rows SX elements apart, so a column slice of a
    wider tensor is read in place), weight ``[C, K]``; lag L = 0..K-1 multiplies ``w[:,
    K-1-L]``: ``pre[t] = Σ_L w[K-1-L] · x[t-L]``, ``y = SiLU(pre)`` (SILU) or ``pre``. A token before its sequence's
    start reads the initial state or zero: the kernels read the initial state and the final-state gradient transposed,
    ``[N, K-1, C]`` (channels contiguous, as x: the same register layout; slot i oldest first, lag L at position p < L
    reads slot K-1-L+p), and write the final state and the initial-state gradient ``[N, C, K-1]``.

    One program per (block of BT tokens, block of BC channels, batch row); packed documents (IS_VARLEN, B = 1) take the
    rows of the ``ChunkTable`` (``table_row``): a program's tokens lie in one document, so its sequence start and end
    are two scalars. The channel count C is a constexpr: the K lagged tiles of a program then sit at compile-time
    offsets of one pointer tile (the registers of one address tile, not K). Every product and sum is float32; the lagged
    loads overlap (L1 / L2 hits), so each kernel reads x and writes its output about once from memory.

    The backward recomputes the pre-activation where it needs it (no stored ``pre``): dpre = dy · SiLU'(pre);
    ``dx[u] = Σ_L w[K-1-L] · dpre[u+L]`` over the targets u+L of the same sequence, plus the final-state gradient on the
    last K-1 tokens; the weight gradient as per-program partials ``[P, K, C]`` (summed on the host: deterministic);
    the initial-state gradient in a small per-sequence kernel. Two forms of the backward tile kernel
    (``CausalConvConfig.bwd_form``): ``_conv_bwd_kernel`` (any K) recomputes pre at every lag from K shifted loads
    each; ``_conv_bwd_shifted_kernel`` (K = 4) loads each distinct shifted tile of x and dy once and computes every
    lag from registers.
    """
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq, start, end, t0, t1 = _rows(cu, ci, i_t, i_b, T, BT, IS_VARLEN)
    o_r = tl.arange(0, BT)
    m_t = t0 + o_r < t1
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    tile = (i_b.to(tl.int64) * T + t0) * C  # token t0 of batch row i_b in y
    pre = _preact(x + (i_b.to(tl.int64) * T + t0) * SX, SX, w, init, o_r, t0, m_t, start, seq, o_c, m_c, C, K, BT,
                  BC, HAS_INIT)
    out = pre * tl.sigmoid(pre) if SILU else pre
    tl.store(y + tile + o_r[:, None] * C + o_c[None, :], out.to(y.dtype.element_ty), mask=m_t[:, None] & m_c[None, :])


@triton.jit
def _conv_bwd_kernel(
    x,
    w,
    init,
    cu,
    ci,
    dy,
    dfin,
    dx,
    dw_part,
    T,
    SX,
    C: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    SILU: tl.constexpr,
    HAS_INIT: tl.constexpr,
    HAS_DFINAL: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """dx of one tile (sources u): Σ_L w[K-1-L] · dpre[u+L] over targets of the same sequence (+ dfinal on the last
    K-1 tokens); the tile's weight-gradient partial dw_part[p, K-1-L] = Σ_t dpre[t] · x[t-L] over its own tokens t."""
    seq, start, end, t0, o_r, o_t, m_t, o_c, m_c, tile, xtile, part = _bwd_program(cu, ci, T, SX, C, BT, BC,
                                                                                   IS_VARLEN)
    xb = x + xtile
    dxa = tl.zeros((BT, BC), dtype=tl.float32)
    for L in tl.static_range(K):
        g = _dy_ahead(dy + tile, o_r, o_t, m_t, end, o_c, m_c, C, L)
        if SILU:
            pre = _preact(xb, SX, w, init, o_r + L, t0, m_t & (o_t + L < end), start, seq, o_c, m_c, C, K, BT, BC,
                          HAS_INIT)
            g = _dact(g, pre, SILU)
        w_l = tl.load(w + o_c * K + (K - 1 - L), mask=m_c, other=0.0).to(tl.float32)
        dxa += g * w_l[None, :]
        if L == 0:  # g is dpre at the tile's own tokens: the weight-gradient partials, one per lag
            for L2 in tl.static_range(K):
                src = _lag(xb, SX, init, o_r, t0, m_t, start, seq, o_c, m_c, C, L2, K, HAS_INIT)
                tl.store(dw_part + part * K * C + (K - 1 - L2) * C + o_c, tl.sum(g * src, axis=0), mask=m_c)
    _store_dx(dx, dfin, dxa, tile, seq, o_r, o_t, m_t, end, o_c, m_c, C, K, HAS_DFINAL)


@triton.jit
def _x_at(xb, SX, init, o_r, t0, m_t, start, end, seq, o_c, m_c, C: tl.constexpr, D: tl.constexpr, K: tl.constexpr,
          HAS_INIT: tl.constexpr):
    """[BT, BC] float32 tile of the inputs at tokens t0 + o_r + D, D = -(K-1)..K-1: ``_lag``'s rules before the
    sequence's start (the initial state or zero), zero past its end and on rows outside ``m_t``."""
    if D > 0:
        v = _lag(xb, SX, init, o_r + D, t0, m_t & (t0 + o_r + D < end), start, seq, o_c, m_c, C, 0, K, HAS_INIT)
    else:
        v = _lag(xb, SX, init, o_r, t0, m_t, start, seq, o_c, m_c, C, -D, K, HAS_INIT)
    return v


@triton.jit
def _dpre4(dyb, o_r, o_t, m_t, end, o_c, m_c, a, b, c, d, w0, w1, w2, w3, C: tl.constexpr, L: tl.constexpr,
           SILU: tl.constexpr):
    """dpre at tokens t0 + o_r + L of a width-4 filter from the inputs a, b, c, d at tokens t0 + o_r + L - 3 .. L
    (oldest first): pre = w0·a + w1·b + w2·c + w3·d."""
    pre = a * w0[None, :] + b * w1[None, :] + c * w2[None, :] + d * w3[None, :]
    return _dact(_dy_ahead(dyb, o_r, o_t, m_t, end, o_c, m_c, C, L), pre, SILU)


@triton.jit
def _weights4(w, o_c, m_c):
    """The four [BC] float32 columns w[:, 0..3] of a width-4 filter ``w [C, 4]``."""
    w0 = tl.load(w + o_c * 4, mask=m_c, other=0.0).to(tl.float32)
    w1 = tl.load(w + o_c * 4 + 1, mask=m_c, other=0.0).to(tl.float32)
    w2 = tl.load(w + o_c * 4 + 2, mask=m_c, other=0.0).to(tl.float32)
    w3 = tl.load(w + o_c * 4 + 3, mask=m_c, other=0.0).to(tl.float32)
    return w0, w1, w2, w3


@triton.jit
def _conv_bwd_shifted_kernel(
    x,
    w,
    init,
    cu,
    ci,
    dy,
    dfin,
    dx,
    dw_part,
    T,
    SX,
    C: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    SILU: tl.constexpr,
    HAS_INIT: tl.constexpr,
    HAS_DFINAL: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """``_conv_bwd_kernel``'s results for K = 4 from each distinct shifted tile loaded once: the 2K-1 = 7 input
    tiles at tokens t0 + o_r + D (D = -3..3, ``_x_at``) and the K dy tiles at t0 + o_r + L give the pre-activation
    and dpre at the K target rows (L = 0..3) in registers; dx = Σ_L w[K-1-L] · dpre_L (+ dfinal on the last K-1
    tokens), dw_part[p, K-1-l] = Σ_t dpre_0[t] · x[t-l] from the same tiles (7 x and 4 dy tile loads per program
    against the reloading kernel's K² + K and K)."""
    tl.static_assert(K == 4, "the shifted backward unrolls a width-4 filter")
    seq, start, end, t0, o_r, o_t, m_t, o_c, m_c, tile, xtile, part = _bwd_program(cu, ci, T, SX, C, BT, BC,
                                                                                   IS_VARLEN)
    xb = x + xtile
    dyb = dy + tile
    p_w = dw_part + part * K * C + o_c
    w0, w1, w2, w3 = _weights4(w, o_c, m_c)
    xm3 = _x_at(xb, SX, init, o_r, t0, m_t, start, end, seq, o_c, m_c, C, -3, K, HAS_INIT)
    xm2 = _x_at(xb, SX, init, o_r, t0, m_t, start, end, seq, o_c, m_c, C, -2, K, HAS_INIT)
    xm1 = _x_at(xb, SX, init, o_r, t0, m_t, start, end, seq, o_c, m_c, C, -1, K, HAS_INIT)
    x0 = _x_at(xb, SX, init, o_r, t0, m_t, start, end, seq, o_c, m_c, C, 0, K, HAS_INIT)
    g = _dpre4(dyb, o_r, o_t, m_t, end, o_c, m_c, xm3, xm2, xm1, x0, w0, w1, w2, w3, C, 0, SILU)
    # dpre at the tile's own tokens: the weight-gradient partials, slot K-1-l from the inputs at lag l
    tl.store(p_w, tl.sum(g * xm3, axis=0), mask=m_c)
    tl.store(p_w + C, tl.sum(g * xm2, axis=0), mask=m_c)
    tl.store(p_w + 2 * C, tl.sum(g * xm1, axis=0), mask=m_c)
    tl.store(p_w + 3 * C, tl.sum(g * x0, axis=0), mask=m_c)
    dxa = g * w3[None, :]
    xp1 = _x_at(xb, SX, init, o_r, t0, m_t, start, end, seq, o_c, m_c, C, 1, K, HAS_INIT)
    g = _dpre4(dyb, o_r, o_t, m_t, end, o_c, m_c, xm2, xm1, x0, xp1, w0, w1, w2, w3, C, 1, SILU)
    dxa += g * w2[None, :]
    xp2 = _x_at(xb, SX, init, o_r, t0, m_t, start, end, seq, o_c, m_c, C, 2, K, HAS_INIT)
    g = _dpre4(dyb, o_r, o_t, m_t, end, o_c, m_c, xm1, x0, xp1, xp2, w0, w1, w2, w3, C, 2, SILU)
    dxa += g * w1[None, :]
    xp3 = _x_at(xb, SX, init, o_r, t0, m_t, start, end, seq, o_c, m_c, C, 3, K, HAS_INIT)
    g = _dpre4(dyb, o_r, o_t, m_t, end, o_c, m_c, x0, xp1, xp2, xp3, w0, w1, w2, w3, C, 3, SILU)
    dxa += g * w0[None, :]
    _store_dx(dx, dfin, dxa, tile, seq, o_r, o_t, m_t, end, o_c, m_c, C, K, HAS_DFINAL)


@triton.jit
def _seq_range(cu, i_n, T, IS_VARLEN: tl.constexpr):
    """(length, index of the first token in the flattened [B·T] rows, int64) of sequence i_n: a document of the
    packed row, or batch row i_n."""
    if IS_VARLEN:
        start = tl.load(cu + i_n)
        length = tl.load(cu + i_n + 1) - start
        first = start.to(tl.int64)
    else:
        length = T
        first = i_n.to(tl.int64) * T
    return length, first


@triton.jit
def _conv_final_kernel(
    x,
    init,
    cu,
    fin,
    T,
    SX,
    C: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    BC: tl.constexpr,
    HAS_INIT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """final[n, :, i] = the input K-1-i tokens before the sequence's end (i = 0..K-2, oldest first): x inside the
    sequence, the initial state (or zero) before its start; copied in x's dtype."""
    i_n, i_c = tl.program_id(0), tl.program_id(1)
    length, first = _seq_range(cu, i_n, T, IS_VARLEN)
    i = tl.arange(0, KP)
    m_i = i < K - 1
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    u = length - (K - 1) + i  # token of slot i, from the sequence's start
    in_x = u >= 0
    v = tl.load(x + (first + u[:, None]) * SX + o_c[None, :], mask=(m_i & in_x)[:, None] & m_c[None, :], other=0.0)
    if HAS_INIT:
        p_h = init + (i_n.to(tl.int64) * (K - 1) + (u + K - 1)[:, None]) * C + o_c[None, :]
        h = tl.load(p_h, mask=(m_i & ~in_x)[:, None] & m_c[None, :], other=0.0)
        v = tl.where(in_x[:, None], v, h.to(v.dtype))
    p_f = fin + i_n.to(tl.int64) * C * (K - 1) + o_c[None, :] * (K - 1) + i[:, None]
    tl.store(p_f, v.to(fin.dtype.element_ty), mask=m_i[:, None] & m_c[None, :])


@triton.jit
def _conv_dinit_kernel(
    x,
    w,
    init,
    cu,
    dy,
    dfin,
    dinit,
    T,
    SX,
    C: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    BC: tl.constexpr,
    SILU: tl.constexpr,
    HAS_DFINAL: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """dinit[n, :, i] = Σ_{p <= i} dpre[start + p] · w[:, i - p] over the sequence's first K-1 tokens (token p reads
    init[:, i] at lag p + K-1-i), plus dfinal[n, :, i - len] where the final state still holds init[:, i]."""
    i_n, i_c = tl.program_id(0), tl.program_id(1)
    length, first = _seq_range(cu, i_n, T, IS_VARLEN)
    p = tl.arange(0, KP)  # the sequence's first K-1 tokens
    m_t = (p < K - 1) & (p < length)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    g = tl.load(dy + (first + p[:, None]) * C + o_c[None, :], mask=m_t[:, None] & m_c[None, :],
                other=0.0).to(tl.float32)
    if SILU:
        pre = _preact(x + first * SX, SX, w, init, p, 0, m_t, 0, i_n, o_c, m_c, C, K, KP, BC, True)
        g = _dact(g, pre, SILU)
    st = i_n.to(tl.int64) * C * (K - 1) + o_c * (K - 1)
    for i in tl.static_range(K - 1):
        w_t = tl.load(w + o_c[None, :] * K + (i - p)[:, None], mask=(m_t & (p <= i))[:, None] & m_c[None, :],
                      other=0.0).to(tl.float32)
        acc = tl.sum(g * w_t, axis=0)
        if HAS_DFINAL:
            j = o_c * 0 + (i - length)  # the final-state slot holding init[:, i], as a [BC] vector
            p_f = dfin + (i_n.to(tl.int64) * (K - 1) + j) * C + o_c
            acc += tl.load(p_f, mask=m_c & (j >= 0), other=0.0).to(tl.float32)
        tl.store(dinit + st + i, acc, mask=m_c)


@triton.jit
def _row(t, o_c, S):
    """Offsets [BC] of token t's channels o_c in a buffer of rows S apart, in int64 (t may be a loop counter, which
    the interpreter hands over as a Python int)."""
    return (t + o_c * 0).to(tl.int64) * S + o_c


@triton.jit
def _x_row(xb, SX, init, s, start, end, seq, o_c, m_c, CS, K: tl.constexpr, HAS_INIT: tl.constexpr):
    """[BC] float32 row of the inputs at token s of the batch row (xb points at its token 0): x inside the sequence
    [start, end), the initial state (HAS_INIT, rows CS apart) or zero before it, zero past it."""
    sv = s + o_c * 0  # the token as a [BC] vector: the masks are vectors (the interpreter refuses scalar & vector)
    v = tl.load(xb + _row(s, o_c, SX), mask=m_c & (sv >= start) & (sv < end), other=0.0).to(tl.float32)
    if HAS_INIT:
        p_h = init + (seq.to(tl.int64) * (K - 1) + (K - 1 + s - start)) * CS + o_c
        v += tl.load(p_h, mask=m_c & (sv < start) & (sv >= start - (K - 1)), other=0.0).to(tl.float32)
    return v


@triton.jit
def _conv_fwd_walk_kernel(
    x,
    w,
    init,
    cu,
    ci,
    y,
    T,
    SX,
    CS,
    C: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    SILU: tl.constexpr,
    HAS_INIT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """``_conv_fwd_kernel``'s y for K = 4, walking the program's tokens in order: the three previous input rows of its
    BC channels stay in registers, so each step loads one [BC] row and stores one (``CausalConvConfig.fwd_form`` =
    "walk").

    One launch may cover a part of the channels (``triton_causal_conv1d``'s ``split_sizes``): x, w and init then point
    at the part's first channel, y is the part's own [B, T, C] tensor, and CS is the row stride of init (the full
    channel count; C when the launch covers them all)."""
    tl.static_assert(K == 4, "the walking forward unrolls a width-4 filter")
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq, start, end, t0, t1 = _rows(cu, ci, i_t, i_b, T, BT, IS_VARLEN)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    xb = x + i_b.to(tl.int64) * T * SX
    yb = y + i_b.to(tl.int64) * T * C
    w0, w1, w2, w3 = _weights4(w, o_c, m_c)
    xm3 = _x_row(xb, SX, init, t0 - 3, start, end, seq, o_c, m_c, CS, K, HAS_INIT)
    xm2 = _x_row(xb, SX, init, t0 - 2, start, end, seq, o_c, m_c, CS, K, HAS_INIT)
    xm1 = _x_row(xb, SX, init, t0 - 1, start, end, seq, o_c, m_c, CS, K, HAS_INIT)
    for t in range(t0, t1):
        x0 = tl.load(xb + _row(t, o_c, SX), mask=m_c, other=0.0).to(tl.float32)
        pre = w0 * xm3 + w1 * xm2 + w2 * xm1 + w3 * x0
        out = pre * tl.sigmoid(pre) if SILU else pre
        tl.store(yb + _row(t, o_c, C), out.to(y.dtype.element_ty), mask=m_c)
        xm3 = xm2
        xm2 = xm1
        xm1 = x0


@triton.jit
def _dpre_row(dyb, s, end, o_c, m_c, a, b, c, d, w0, w1, w2, w3, C: tl.constexpr, SILU: tl.constexpr):
    """[BC] dpre at token s from the inputs a, b, c, d at s-3 .. s (oldest first); zero past the sequence's end."""
    g = tl.load(dyb + _row(s, o_c, C), mask=m_c & (s + o_c * 0 < end), other=0.0).to(tl.float32)
    return _dact(g, w0 * a + w1 * b + w2 * c + w3 * d, SILU)


@triton.jit
def _conv_bwd_walk_kernel(
    x,
    w,
    init,
    cu,
    ci,
    dy,
    dfin,
    dx,
    dw_part,
    T,
    SX,
    CS,
    C: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    SILU: tl.constexpr,
    HAS_INIT: tl.constexpr,
    HAS_DFINAL: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """``_conv_bwd_kernel``'s dx and weight-gradient partials for K = 4, walking the program's tokens t in order with
    the inputs at t-3 .. t+2 and dpre at t .. t+2 in registers: each step loads the input and dy rows at t+3, forms
    dpre there, stores dx[t] = Σ_L w[3-L] · dpre[t+L] (+ dfinal on the last K-1 tokens) and adds dpre[t] · x[t-l] to
    the [BC] partial of slot 3-l (``CausalConvConfig.bwd_form`` = "walk").

    A launch over a part of the channels (as the forward's): dy is the part's own [B, T, C] tensor; init, dfin, dx and
    dw_part point at the part's first channel, their rows CS apart."""
    tl.static_assert(K == 4, "the walking backward unrolls a width-4 filter")
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq, start, end, t0, t1 = _rows(cu, ci, i_t, i_b, T, BT, IS_VARLEN)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    xb = x + i_b.to(tl.int64) * T * SX
    dyb = dy + i_b.to(tl.int64) * T * C
    dxb = dx + i_b.to(tl.int64) * T * CS
    part = (i_b * tl.num_programs(0) + i_t).to(tl.int64)
    w0, w1, w2, w3 = _weights4(w, o_c, m_c)
    xm3 = _x_row(xb, SX, init, t0 - 3, start, end, seq, o_c, m_c, CS, K, HAS_INIT)
    xm2 = _x_row(xb, SX, init, t0 - 2, start, end, seq, o_c, m_c, CS, K, HAS_INIT)
    xm1 = _x_row(xb, SX, init, t0 - 1, start, end, seq, o_c, m_c, CS, K, HAS_INIT)
    x0 = _x_row(xb, SX, init, t0, start, end, seq, o_c, m_c, CS, K, HAS_INIT)
    xp1 = _x_row(xb, SX, init, t0 + 1, start, end, seq, o_c, m_c, CS, K, HAS_INIT)
    xp2 = _x_row(xb, SX, init, t0 + 2, start, end, seq, o_c, m_c, CS, K, HAS_INIT)
    g0 = _dpre_row(dyb, t0, end, o_c, m_c, xm3, xm2, xm1, x0, w0, w1, w2, w3, C, SILU)
    g1 = _dpre_row(dyb, t0 + 1, end, o_c, m_c, xm2, xm1, x0, xp1, w0, w1, w2, w3, C, SILU)
    g2 = _dpre_row(dyb, t0 + 2, end, o_c, m_c, xm1, x0, xp1, xp2, w0, w1, w2, w3, C, SILU)
    dw0 = tl.zeros((BC,), dtype=tl.float32)
    dw1 = tl.zeros((BC,), dtype=tl.float32)
    dw2 = tl.zeros((BC,), dtype=tl.float32)
    dw3 = tl.zeros((BC,), dtype=tl.float32)
    for t in range(t0, t1):
        xp3 = _x_row(xb, SX, init, t + 3, start, end, seq, o_c, m_c, CS, K, HAS_INIT)
        g3 = _dpre_row(dyb, t + 3, end, o_c, m_c, x0, xp1, xp2, xp3, w0, w1, w2, w3, C, SILU)
        dxa = w3 * g0 + w2 * g1 + w1 * g2 + w0 * g3
        if HAS_DFINAL:
            i_f = o_c * 0 + (t - (end - (K - 1)))  # the final-state slot of token t, as a [BC] vector
            p_f = dfin + (seq.to(tl.int64) * (K - 1) + i_f) * CS + o_c
            dxa += tl.load(p_f, mask=m_c & (i_f >= 0), other=0.0).to(tl.float32)
        tl.store(dxb + _row(t, o_c, CS), dxa.to(dx.dtype.element_ty), mask=m_c)
        dw0 += g0 * xm3
        dw1 += g0 * xm2
        dw2 += g0 * xm1
        dw3 += g0 * x0
        xm3 = xm2
        xm2 = xm1
        xm1 = x0
        x0 = xp1
        xp1 = xp2
        xp2 = xp3
        g0 = g1
        g1 = g2
        g2 = g3
    p_w = dw_part + part * K * CS + o_c
    tl.store(p_w, dw0, mask=m_c)
    tl.store(p_w + CS, dw1, mask=m_c)
    tl.store(p_w + 2 * CS, dw2, mask=m_c)
    tl.store(p_w + 3 * CS, dw3, mask=m_c)
