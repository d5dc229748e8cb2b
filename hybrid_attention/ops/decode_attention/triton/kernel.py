"""The split-KV Triton kernel of `decode_attention` (the algorithm and its decisions: the op's docstring). Imports
triton: imported only through ``..triton`` (guarded)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, len1_ptr, start2_ptr, len2_ptr, m_ptr, l_ptr, acc_ptr, scale, L, H,
                  s1b, s1h, s2b, s2h, s3b, s3h,
                  D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                  NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    sp = tl.program_id(1)
    b = bh // H
    h = bh % H
    # the lengths are read through the caller's (broadcast) strides, in their own integer dtype: no copies
    n1 = tl.load(len1_ptr + b * s1b + h * s1h).to(tl.int32)
    s2 = tl.load(start2_ptr + b * s2b + h * s2h).to(tl.int32)
    n2 = tl.load(len2_ptr + b * s3b + h * s3h).to(tl.int32)
    total = n1 + n2
    per = tl.cdiv(total, NUM_SPLITS)
    lo = sp * per
    hi = tl.minimum(lo + per, total)
    od = tl.arange(0, BD)
    odv = tl.arange(0, BDV)
    dm = od < D
    dvm = odv < DV
    q = tl.load(q_ptr + bh * D + od, mask=dm, other=0.0).to(tl.float32) * scale
    m_i = tl.zeros([], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([BDV], dtype=tl.float32)
    start = lo
    while start < hi:  # a while loop: runtime bounds (the Triton interpreter cannot range() over loaded values)
        j = start + tl.arange(0, BLOCK_N)
        ok = j < hi
        key = tl.where(j < n1, j, s2 + j - n1).to(tl.int64)  # virtual index -> buffer row
        kb = tl.load(k_ptr + (bh * L + key[:, None]) * D + od[None, :], mask=ok[:, None] & dm[None, :], other=0.0)
        s = tl.sum(kb.to(tl.float32) * q[None, :], 1)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        vb = tl.load(v_ptr + (bh * L + key[:, None]) * DV + odv[None, :], mask=ok[:, None] & dvm[None, :],
                     other=0.0)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * vb.to(tl.float32), 0)
        m_i = m_new
        start += BLOCK_N
    out = bh * NUM_SPLITS + sp
    tl.store(m_ptr + out, m_i)
    tl.store(l_ptr + out, l_i)
    tl.store(acc_ptr + out * DV + odv, acc, mask=dvm)


@triton.jit
def _combine_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, DV: tl.constexpr, BDV: tl.constexpr, NUM_SPLITS: tl.constexpr,
                    BS: tl.constexpr):
    """o[bh] = Σ_s e^{m_s - max m} acc_s / Σ_s e^{m_s - max m} l_s (empty splits: m = -inf, weight 0)."""
    bh = tl.program_id(0).to(tl.int64)
    sp = tl.arange(0, BS)
    sm = sp < NUM_SPLITS
    odv = tl.arange(0, BDV)
    dvm = odv < DV
    m = tl.load(m_ptr + bh * NUM_SPLITS + sp, mask=sm, other=float("-inf"))
    lsum = tl.load(l_ptr + bh * NUM_SPLITS + sp, mask=sm, other=0.0)
    acc = tl.load(acc_ptr + (bh * NUM_SPLITS + sp[:, None]) * DV + odv[None, :], mask=sm[:, None] & dvm[None, :],
                  other=0.0)
    w = tl.where(sm & (m > float("-inf")), tl.exp(m - tl.max(m, 0)), 0.0)  # >= 1 split holds a key
    o = tl.sum(acc * w[:, None], 0) / tl.sum(lsum * w, 0)
    tl.store(o_ptr + bh * DV + odv, o.to(o_ptr.dtype.element_ty), mask=dvm)


@torch.library.custom_op("hybrid_attention::decode_attention", mutates_args=())
def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, len1: torch.Tensor, start2: torch.Tensor,
                     len2: torch.Tensor, scale: float, num_splits: int, block_n: int = 64) -> torch.Tensor:
    """q [B, H, D]; k [B, H, L, D], v [B, H, L, DV] contiguous; len1, start2, len2 [B, H] (or broadcastable, e.g.
    [1, 1]) integer device tensors (len1 + len2 >= 1 everywhere). Returns o [B, H, DV] in v.dtype. A registered
    custom op (fake kernel below), so `torch.compile` traces a step that calls it without looking into Triton.
    Two launches and no other device work (the lengths are read through their broadcast strides, the splits are
    combined by a kernel): every extra op here ran eagerly inside a compiled, graph-captured decode step.

    Per (batch row, head) the keys are the union of two ranges of the buffer: [0, len1) and [start2, start2 + len2),
    with the lengths read from device tensors. Softmax attention uses one range ([0, pos + 1)); NAtS-L uses both (the
    compacted cache prefix [0, n_kept·C) and the current chunk [cap, cap + slot + 1)). The valid keys are treated as one
    virtual sequence of len1 + len2 keys, cut into `num_splits` equal parts, each reduced by its own program (running
    max, sum and weighted values in float32); the parts are then combined with their log-sum-exp weights.

    DECISIONS:
    - Why not SDPA with a boolean mask: it reads the whole buffer (cost of max_length keys whatever the length), and its
      masked kernel parallelises over (query, head, row) only: with one query and B·H = 16 the GPU is mostly idle at
      long contexts. Here the work follows the real number of keys and is spread over B·H·num_splits programs.
    - The split bounds are computed inside the kernel from the device lengths (no host sync, graph capturable); only
      `num_splits` (static) fixes the grid.
    - Inference only, no autograd. The PyTorch reference (`decode_attention_reference`, naive.py) defines the result.
    - The kernel is a registered custom op (`hybrid_attention::decode_attention`, with a fake kernel) so that a compiled
      decode step treats it as one opaque call (inductor failed inside `_split_kernel` when it traced the raw kernel).
    """
    b, h, L, d = k.shape
    dv = v.shape[-1]
    if not (k.is_contiguous() and v.is_contiguous()):
        raise ValueError("decode_attention: k and v must be contiguous [B, H, L, D] buffers")
    bh = b * h
    m = torch.empty(bh, num_splits, device=q.device, dtype=torch.float32)
    lse = torch.empty(bh, num_splits, device=q.device, dtype=torch.float32)
    acc = torch.empty(bh, num_splits, dv, device=q.device, dtype=torch.float32)
    lens = [t.expand(b, h) for t in (len1, start2, len2)]
    strides = [s for t in lens for s in t.stride()]
    _split_kernel[(bh, num_splits)](
        q.reshape(bh, d).contiguous(), k, v, *lens, m, lse, acc, float(scale), L, h, *strides,
        D=d, DV=dv, BD=triton.next_power_of_2(d), BDV=triton.next_power_of_2(dv), NUM_SPLITS=num_splits,
        BLOCK_N=block_n, num_warps=4,
    )
    o = torch.empty(b, h, dv, device=q.device, dtype=v.dtype)
    _combine_kernel[(bh,)](m, lse, acc, o, DV=dv, BDV=triton.next_power_of_2(dv), NUM_SPLITS=num_splits,
                           BS=max(2, triton.next_power_of_2(num_splits)), num_warps=1)
    return o


@decode_attention.register_fake
def _(q, k, v, len1, start2, len2, scale, num_splits, block_n=64):
    return v.new_empty(k.shape[0], k.shape[1], v.shape[-1])
