"""Triton kernels of the gated RMSNorm over rows of D values, y = n · w · swish(g) with n = x · r and
r = 1 / sqrt(mean(x²) + eps), all in float32 (interpreter-compatible: plain pointer arithmetic with masks).

Backward, per row: with s = swish(g), σ = sigmoid(g) and dn = dy · w · s,
dx = r (dn - n · mean(dn · n)),  dg = dy · n · w · σ (1 + g (1 - σ)),  dw = Σ_rows dy · n · s.
The forward stores r (one float per row) for the backward; each backward program walks ``ITERS`` blocks of rows and
writes its partial dw, which the host sums (deterministic, no atomics)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rows(blk, R, D, BR: tl.constexpr, BD: tl.constexpr):
    """Row indices [BR] of row block ``blk``, column indices [BD], their masks and the [BR, BD] element offsets."""
    rows = blk * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    rm = rows < R
    cm = cols < D
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    return rows, cols, rm, cm, offs, rm[:, None] & cm[None, :]


@triton.jit
def _gated_norm_fwd_kernel(x_ptr, g_ptr, w_ptr, y_ptr, r_ptr, R, D, EPS: tl.constexpr, BR: tl.constexpr,
                           BD: tl.constexpr):
    rows, cols, rm, cm, offs, m = _rows(tl.program_id(0), R, D, BR, BD)
    x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cm, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, 1) / D + EPS)
    y = x * r[:, None] * w[None, :] * (g * tl.sigmoid(g))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=m)
    tl.store(r_ptr + rows, r, mask=rm)


@triton.jit
def _gated_norm_bwd_kernel(x_ptr, g_ptr, w_ptr, r_ptr, dy_ptr, dx_ptr, dg_ptr, dw_ptr, R, D, ITERS,
                           BR: tl.constexpr, BD: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BD)
    cm = cols < D
    w = tl.load(w_ptr + cols, mask=cm, other=0.0).to(tl.float32)
    dw = tl.zeros([BD], dtype=tl.float32)
    for i in range(0, ITERS):
        rows, _, rm, _, offs, m = _rows(pid * ITERS + i, R, D, BR, BD)
        x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=m, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + rows, mask=rm, other=0.0)
        n = x * r[:, None]
        sig = tl.sigmoid(g)
        s = g * sig
        dn = dy * w[None, :] * s
        c = tl.sum(dn * n, 1) / D
        tl.store(dx_ptr + offs, (r[:, None] * (dn - n * c[:, None])).to(dx_ptr.dtype.element_ty), mask=m)
        dgv = dy * n * w[None, :] * sig * (1.0 + g * (1.0 - sig))
        tl.store(dg_ptr + offs, dgv.to(dg_ptr.dtype.element_ty), mask=m)
        dw += tl.sum(dy * n * s, 0)
    tl.store(dw_ptr + pid * D + cols, dw, mask=cm)
