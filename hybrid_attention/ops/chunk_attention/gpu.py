"""Block-sparse Triton kernels for chunk attention (the NAtS-L softmax branch), forward + backward.

Our own FlashAttention-2 style kernels over the chunk routing. Query t (chunk c(t), softmax head i, decision head
h = i // G) sees its own chunk causally and every earlier chunk n with routing[b, n, h] = 1; cross-chunk logits get
``routing_bias[b, n, h]`` (the NAtS-L routing gradient is d bias = Σ dS over those pairs, no softmax-scale factor).

* Forward / dq: one program per (query tile of QC chunks, b, head). It walks the compacted, ascending list of routed
  chunks before its tile (``idx``/``cnt``, built on the device from the routing, no host sync) without masks, then
  the QC diagonal chunks with the causal + routing mask. Cost ∝ ρ·T²/2 + T·C per head (ρ = routed fraction).
* dk/dv: one program per (key chunk, b, head): its own chunk causally, then, only if the chunk is routed, every
  later query tile (unmasked); it also accumulates Σ dS over those later queries = the routing-bias gradient.

Softmax statistics in fp32 (log2 domain); dots take the input dtype (bf16 on the GPU) with fp32 accumulation.
Interpreter-compatible (``TRITON_INTERPRET=1``): runtime-bounded loops become ``while`` loops there (NumPy >= 2.4
refuses ``int()`` of the interpreter's 1-element scalars), the compiled kernels use ``for`` loops.
The softmax scales are constexpr: inductor (``torch.compile``) types Python float runtime arguments of user Triton
kernels fp64, which would promote the fp32 loop-carried accumulators (Triton refuses the loop).
"""

from __future__ import annotations

import math
import os

import torch

from .naive import validate_chunk_attention_inputs

try:  # guarded: CPU-only installs need not have Triton
    import triton
    import triton.language as tl

    TRITON_AVAILABLE = True
except Exception:  # pragma: no cover - ImportError or a broken install
    TRITON_AVAILABLE = False

__all__ = ["TRITON_AVAILABLE", "triton_chunk_attention", "triton_chunk_attention_supported", "LAUNCH", "POISON"]

LOG2E = 1.4426950408889634

# Launch configuration (C = 64 on the GPU). QC: chunks per query tile of the forward / dq kernels; QB: query rows per
# step of the dk/dv kernel. The benchmark may override these to compare variants.
# H200 run 1 (T = 16K / 64K, 30% routed): fwd QC=1/4 warps/3 stages 0.62 / 7.85 ms vs QC=2/8/3 0.88 / 10.8 ms;
# dq QC=1/4/2 saved 0.25 / 2.8 ms of forward+backward vs QC=2/8/2; dk/dv QB=64/4 warps/2 stages was the best tried.
LAUNCH = {"fwd_qc": 1, "fwd_warps": 4, "fwd_stages": 3, "dq_qc": 1, "dq_warps": 4, "dq_stages": 2,
          "dkv_qb": 64, "dkv_warps": 4, "dkv_stages": 2}


POISON = False  # tests / benchmarks: fill every kernel-written buffer with NaN first (unwritten elements show up)


def _empty(*shape, device, dtype) -> torch.Tensor:
    if POISON:
        return torch.full(shape, float("nan"), device=device, dtype=dtype)
    return torch.empty(*shape, device=device, dtype=dtype)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_chunk_attention_supported(q: torch.Tensor, v: torch.Tensor, chunk_size: int) -> bool:
    """CUDA (or the interpreter), not float64, chunk size a power of two in [16, 128], head dims <= 256."""
    if not TRITON_AVAILABLE or q.dtype == torch.float64 or v.dtype == torch.float64:
        return False
    if not (q.is_cuda or _interpreting()):
        return False
    return chunk_size in (16, 32, 64, 128) and q.shape[-1] <= 256 and v.shape[-1] <= 256


if TRITON_AVAILABLE:

    @triton.jit
    def _fwd_block(acc, m_i, l_i, q, k_ptr, v_ptr, kv_base, kc, rows, r_kc, bias_kc, qk_scale, T, HS,
                   DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr,
                   DIAG: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr):
        cols = kc * C + tl.arange(0, C)
        dk_r = tl.arange(0, BDK)
        dv_r = tl.arange(0, BDV)
        cm = cols < T
        k = tl.load(k_ptr + kv_base + cols[:, None] * (HS * DK) + dk_r[None, :],
                    mask=cm[:, None] & (dk_r < DK)[None, :], other=0.0)
        v = tl.load(v_ptr + kv_base // DK * DV + cols[:, None] * (HS * DV) + dv_r[None, :],
                    mask=cm[:, None] & (dv_r < DV)[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if DIAG:
            qc = rows // C
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
    def _fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, o32_ptr, lse_ptr, idx_ptr, cnt_ptr, r_ptr, bias_ptr,
                    qk_scale: tl.constexpr, T, N, HS, G,
                    DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr,
                    QC: tl.constexpr, HAS_BIAS: tl.constexpr, WHILE_LOOP: tl.constexpr,
                    UPCAST: tl.constexpr, STORE_O32: tl.constexpr):
        BM: tl.constexpr = QC * C
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # longest tiles (most routed chunks) first
        bh = tl.program_id(1).to(tl.int64)
        b = bh // HS
        hs = bh % HS
        hn = hs // G
        rows = pid_m * BM + tl.arange(0, BM)
        rm = rows < T
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
        n_full = tl.load(cnt_ptr + (b * (HS // G) + hn) * (N + 1) + c0)
        if WHILE_LOOP:
            j = 0
            while j < n_full:
                kc = tl.load(idx_ptr + rbase + j)
                bias_kc = tl.load(bias_ptr + rbase + kc) if HAS_BIAS else 0.0
                acc, m_i, l_i = _fwd_block(acc, m_i, l_i, q, k_ptr, v_ptr, q_base, kc, rows, 1, bias_kc, qk_scale,
                                           T, HS, DK, DV, BDK, BDV, C, False, HAS_BIAS, UPCAST)
                j += 1
        else:
            for j in range(n_full):
                kc = tl.load(idx_ptr + rbase + j)
                bias_kc = tl.load(bias_ptr + rbase + kc) if HAS_BIAS else 0.0
                acc, m_i, l_i = _fwd_block(acc, m_i, l_i, q, k_ptr, v_ptr, q_base, kc, rows, 1, bias_kc, qk_scale,
                                           T, HS, DK, DV, BDK, BDV, C, False, HAS_BIAS, UPCAST)
        for d in tl.static_range(QC):
            kc = c0 + d
            r_kc = tl.load(r_ptr + rbase + kc, mask=kc < N, other=0)
            bias_kc = tl.load(bias_ptr + rbase + kc, mask=kc < N, other=0.0) if HAS_BIAS else 0.0
            acc, m_i, l_i = _fwd_block(acc, m_i, l_i, q, k_ptr, v_ptr, q_base, kc, rows, r_kc, bias_kc, qk_scale,
                                       T, HS, DK, DV, BDK, BDV, C, True, HAS_BIAS, UPCAST)
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        o = acc / l_safe[:, None]
        o_base = b * T * HS * DV + hs * DV
        o_offs = o_base + rows[:, None] * (HS * DV) + dv_r[None, :]
        tl.store(o_ptr + o_offs, o.to(o_ptr.dtype.element_ty), mask=rm[:, None] & (dv_r < DV)[None, :])
        if STORE_O32:  # fp32 copy for the backward's Δ = rowsum(o ⊙ dO) (a bf16 o costs ~2e-3 in the routing grad)
            tl.store(o32_ptr + o_offs, o, mask=rm[:, None] & (dv_r < DV)[None, :])
        tl.store(lse_ptr + bh * T + rows, m_i + tl.log2(l_safe), mask=rm)

    @triton.jit
    def _dq_block(dq, q, do, lse, delta, k_ptr, v_ptr, kv_base, kc, rows, r_kc, bias_kc, qk_scale, T, HS,
                  DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr,
                  DIAG: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr):
        cols = kc * C + tl.arange(0, C)
        dk_r = tl.arange(0, BDK)
        dv_r = tl.arange(0, BDV)
        cm = cols < T
        k = tl.load(k_ptr + kv_base + cols[:, None] * (HS * DK) + dk_r[None, :],
                    mask=cm[:, None] & (dk_r < DK)[None, :], other=0.0)
        v = tl.load(v_ptr + kv_base // DK * DV + cols[:, None] * (HS * DV) + dv_r[None, :],
                    mask=cm[:, None] & (dv_r < DV)[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if DIAG:
            qc = rows // C
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
                   scale: tl.constexpr, qk_scale: tl.constexpr, T, N, HS, G,
                   DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr,
                   QC: tl.constexpr, HAS_BIAS: tl.constexpr, WHILE_LOOP: tl.constexpr,
                   UPCAST: tl.constexpr):
        BM: tl.constexpr = QC * C
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b = bh // HS
        hs = bh % HS
        hn = hs // G
        rows = pid_m * BM + tl.arange(0, BM)
        rm = rows < T
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
        n_full = tl.load(cnt_ptr + (b * (HS // G) + hn) * (N + 1) + c0)
        if WHILE_LOOP:
            j = 0
            while j < n_full:
                kc = tl.load(idx_ptr + rbase + j)
                bias_kc = tl.load(bias_ptr + rbase + kc) if HAS_BIAS else 0.0
                dq = _dq_block(dq, q, do, lse, delta, k_ptr, v_ptr, q_base, kc, rows, 1, bias_kc, qk_scale, T, HS,
                               DK, DV, BDK, BDV, C, False, HAS_BIAS, UPCAST)
                j += 1
        else:
            for j in range(n_full):
                kc = tl.load(idx_ptr + rbase + j)
                bias_kc = tl.load(bias_ptr + rbase + kc) if HAS_BIAS else 0.0
                dq = _dq_block(dq, q, do, lse, delta, k_ptr, v_ptr, q_base, kc, rows, 1, bias_kc, qk_scale, T, HS,
                               DK, DV, BDK, BDV, C, False, HAS_BIAS, UPCAST)
        for d in tl.static_range(QC):
            kc = c0 + d
            r_kc = tl.load(r_ptr + rbase + kc, mask=kc < N, other=0)
            bias_kc = tl.load(bias_ptr + rbase + kc, mask=kc < N, other=0.0) if HAS_BIAS else 0.0
            dq = _dq_block(dq, q, do, lse, delta, k_ptr, v_ptr, q_base, kc, rows, r_kc, bias_kc, qk_scale, T, HS,
                           DK, DV, BDK, BDV, C, True, HAS_BIAS, UPCAST)
        tl.store(dq_ptr + q_base + rows[:, None] * (HS * DK) + dk_r[None, :], (dq * scale).to(dq_ptr.dtype.element_ty),
                 mask=rm[:, None] & (dk_r < DK)[None, :])

    @triton.jit
    def _dkv_block(dk, dv, dsum, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, q_base, o_base, bh, rows, cols, bias_kc,
                   qk_scale, T, HS, DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                   DIAG: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr):
        dk_r = tl.arange(0, BDK)
        dv_r = tl.arange(0, BDV)
        rm = rows < T
        q = tl.load(q_ptr + q_base + rows[:, None] * (HS * DK) + dk_r[None, :], mask=rm[:, None] & (dk_r < DK)[None, :],
                    other=0.0)
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
        if not DIAG:
            dsum += tl.sum(dsT, 1)
        return dk, dv, dsum

    @triton.jit
    def _dkv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dbias_ptr, r_ptr, bias_ptr,
                    scale: tl.constexpr, qk_scale: tl.constexpr, T, N, HS, G,
                    DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr,
                    QB: tl.constexpr, HAS_BIAS: tl.constexpr, WHILE_LOOP: tl.constexpr,
                    UPCAST: tl.constexpr):
        kc = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b = bh // HS
        hs = bh % HS
        hn = hs // G
        cols = kc * C + tl.arange(0, C)
        cm = cols < T
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
        bias_kc = tl.load(bias_ptr + rbase + kc) if HAS_BIAS else 0.0
        for d in tl.static_range(C // QB):  # own chunk, causal
            rows = kc * C + d * QB + tl.arange(0, QB)
            dk, dv, dsum = _dkv_block(dk, dv, dsum, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, q_base, o_base, bh, rows,
                                      cols, bias_kc, qk_scale, T, HS, DK, DV, BDK, BDV, True, HAS_BIAS, UPCAST)
        r_kc = tl.load(r_ptr + rbase + kc)
        start = (kc + 1) * C
        n_tiles = tl.where(r_kc > 0, tl.cdiv(T - start, QB), 0)
        if WHILE_LOOP:
            i = 0
            while i < n_tiles:
                r_i = start + i * QB + tl.arange(0, QB)
                dk, dv, dsum = _dkv_block(dk, dv, dsum, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, q_base, o_base, bh,
                                          r_i, cols, bias_kc, qk_scale, T, HS, DK, DV, BDK, BDV, False, HAS_BIAS,
                                          UPCAST)
                i += 1
        else:
            for i in range(n_tiles):  # r_i, not rows: an i64 T (inductor) would re-type the loop-carried rows
                r_i = start + i * QB + tl.arange(0, QB)
                dk, dv, dsum = _dkv_block(dk, dv, dsum, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, q_base, o_base, bh,
                                          r_i, cols, bias_kc, qk_scale, T, HS, DK, DV, BDK, BDV, False, HAS_BIAS,
                                          UPCAST)
        tl.store(dk_ptr + q_base + cols[:, None] * (HS * DK) + dk_r[None, :], (dk * scale).to(dk_ptr.dtype.element_ty),
                 mask=cm[:, None] & (dk_r < DK)[None, :])
        tl.store(dv_ptr + o_base + cols[:, None] * (HS * DV) + dv_r[None, :], dv.to(dv_ptr.dtype.element_ty),
                 mask=cm[:, None] & (dv_r < DV)[None, :])
        tl.store(dbias_ptr + bh * N + kc, tl.sum(dsum, 0))


def _routing_lists(routing: torch.Tensor):
    """routing [B, N, Hn] -> (r [B, Hn, N] int32, idx [B, Hn, N] int32 routed chunks first (ascending),
    cnt [B, Hn, N + 1] int32: number of routed chunks before chunk n). All on the device, no host sync."""
    r = (routing if routing.dtype == torch.bool else routing > 0.5).transpose(1, 2)
    idx = torch.sort((~r).to(torch.uint8), dim=-1, stable=True).indices.to(torch.int32).contiguous()
    cnt = torch.nn.functional.pad(r.to(torch.int32).cumsum(-1), (1, 0)).to(torch.int32).contiguous()
    return r.to(torch.int32).contiguous(), idx, cnt


def _p2(x: int) -> int:
    return max(16, triton.next_power_of_2(int(x)))


def _qc(C: int, key: str) -> int:
    return max(1, min(LAUNCH[key], 128 // C)) if C <= 64 else 1


def _launch_fwd(q, k, v, r, idx, cnt, bias, scale, C, G, store_o32=False):
    B, T, HS, DK = q.shape
    DV = v.shape[-1]
    N = math.ceil(T / C)
    QC = _qc(C, "fwd_qc")
    o = _empty(B, T, HS, DV, device=q.device, dtype=q.dtype)
    lse = _empty(B, HS, T, device=q.device, dtype=torch.float32)
    o32 = _empty(B, T, HS, DV, device=q.device, dtype=torch.float32) if store_o32 else lse
    interp = _interpreting()
    _fwd_kernel[(triton.cdiv(T, QC * C), B * HS)](
        q, k, v, o, o32, lse, idx, cnt, r, bias if bias is not None else lse,
        scale * LOG2E, T, N, HS, G,
        DK=DK, DV=DV, BDK=_p2(DK), BDV=_p2(DV), C=C, QC=QC, HAS_BIAS=bias is not None, WHILE_LOOP=interp, UPCAST=interp,
        STORE_O32=store_o32, num_warps=LAUNCH["fwd_warps"], num_stages=LAUNCH["fwd_stages"],
    )
    return o, (o32 if store_o32 else o), lse


def _launch_bwd(q, k, v, o, lse, do, r, idx, cnt, bias, scale, C, G):
    B, T, HS, DK = q.shape
    DV = v.shape[-1]
    N = math.ceil(T / C)
    interp = _interpreting()
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()  # [B, HS, T]; o is the fp32 copy
    dq = _empty(*q.shape, device=q.device, dtype=q.dtype)
    dk = _empty(*k.shape, device=k.device, dtype=k.dtype)
    dv = _empty(*v.shape, device=v.device, dtype=v.dtype)
    dbias = _empty(B, HS, N, device=q.device, dtype=torch.float32)
    bias_arg = bias if bias is not None else lse
    QC = _qc(C, "dq_qc")
    _dq_kernel[(triton.cdiv(T, QC * C), B * HS)](
        q, k, v, do, lse, delta, dq, idx, cnt, r, bias_arg, scale, scale * LOG2E, T, N, HS, G,
        DK=DK, DV=DV, BDK=_p2(DK), BDV=_p2(DV), C=C, QC=QC, HAS_BIAS=bias is not None, WHILE_LOOP=interp, UPCAST=interp,
        num_warps=LAUNCH["dq_warps"], num_stages=LAUNCH["dq_stages"],
    )
    QB = min(LAUNCH["dkv_qb"], C)
    _dkv_kernel[(N, B * HS)](
        q, k, v, do, lse, delta, dk, dv, dbias, r, bias_arg, scale, scale * LOG2E, T, N, HS, G,
        DK=DK, DV=DV, BDK=_p2(DK), BDV=_p2(DV), C=C, QB=QB, HAS_BIAS=bias is not None, WHILE_LOOP=interp, UPCAST=interp,
        num_warps=LAUNCH["dkv_warps"], num_stages=LAUNCH["dkv_stages"],
    )
    return dq, dk, dv, dbias


class _TritonChunkAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, routing, bias, scale, C, G):
        r, idx, cnt = _routing_lists(routing)
        o, o32, lse = _launch_fwd(q, k, v, r, idx, cnt, bias, scale, C, G, store_o32=True)
        ctx.save_for_backward(q, k, v, o32, lse, r, idx, cnt, bias)
        ctx.cfg = (scale, C, G, bias.dtype if bias is not None else None)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, r, idx, cnt, bias = ctx.saved_tensors
        scale, C, G, bias_dtype = ctx.cfg
        dq, dk, dv, dbias = _launch_bwd(q, k, v, o, lse, do.contiguous(), r, idx, cnt, bias, scale, C, G)
        d_bias = None
        if bias_dtype is not None:
            B, HS, N = dbias.shape
            d_bias = dbias.view(B, HS // G, G, N).sum(2).to(bias_dtype)  # [B, Hn, N] like the saved bias
        return dq, dk, dv, None, d_bias, None, None, None


def triton_chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    routing: torch.Tensor,
    *,
    chunk_size: int = 64,
    group_size: int = 1,
    scale: float | None = None,
    routing_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Chunk attention on Triton kernels; same contract as ``naive_chunk_attention``.

    Shapes: q, k ``[B, T, Hs, Dk]``; v ``[B, T, Hs, Dv]``; routing, routing_bias ``[B, ceil(T / C), Hs // G]``.
    Returns ``o [B, T, Hs, Dv]`` in ``v.dtype``. Differentiable in q, k, v and ``routing_bias`` (d bias = Σ dS over
    the cross-chunk pairs of the bias's chunk and decision head). q, k, v are computed in a common dtype (q's).
    """
    validate_chunk_attention_inputs(q, k, v, routing, chunk_size, group_size, routing_bias)
    if not triton_chunk_attention_supported(q, v, chunk_size):
        raise ValueError("triton_chunk_attention: unsupported inputs (need CUDA or TRITON_INTERPRET=1, not float64, "
                         "chunk_size in {16, 32, 64, 128}, head dims <= 256)")
    B, T, HS, DK = q.shape
    scale = DK**-0.5 if scale is None else float(scale)
    if T == 0:
        return v.new_zeros(B, 0, HS, v.shape[-1])
    dt = q.dtype
    q, k, v = (x.to(dt).contiguous() for x in (q, k, v))
    bias = routing_bias.float().transpose(1, 2).contiguous() if routing_bias is not None else None  # [B, Hn, N]
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (q, k, v, routing_bias)):
        o = _TritonChunkAttention.apply(q, k, v, routing, bias, scale, chunk_size, group_size)
    else:
        r, idx, cnt = _routing_lists(routing)
        o, _, _ = _launch_fwd(q, k, v, r, idx, cnt, bias, scale, chunk_size, group_size)
    return o.to(v.dtype) if o.dtype != v.dtype else o
