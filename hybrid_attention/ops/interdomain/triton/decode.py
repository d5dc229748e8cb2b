"""Fused single-token decode step of the Interdomain core (state update + readout), one Triton launch, in place on
the state: ``interdomain_decode_step`` and its registered op ``interdomain_decode_op``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..naive import safe_divide
from ..readout import DEFAULT_READOUT, readout_operators

__all__ = ["decode_params", "interdomain_decode_op", "interdomain_decode_step"]



@triton.jit
def _decode_kernel(
    q,
    k,
    v,
    o,
    lam,
    Bp,
    Kp,
    X,
    H,
    M,
    R,
    D,
    BR: tl.constexpr,
    BD: tl.constexpr,
    BM: tl.constexpr,
    HAS_K1: tl.constexpr,
    HAS_K2: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    h = i_bh % H
    NC = R + D
    offs_m = tl.arange(0, BM)
    offs_r = tl.arange(0, BR)
    offs_d = tl.arange(0, BD)
    mask_m = offs_m < M
    mask_r = offs_r < R
    mask_d = offs_d < D
    # λ, B: interleaved complex64 [H, M, 2]; K: planar [2 (K₁, K₂), H, 2, M, M];
    # X: interleaved complex64 [B*H, M, NC, 2]
    l_re = tl.load(lam + (h * M + offs_m) * 2, mask=mask_m, other=0.0)
    l_im = tl.load(lam + (h * M + offs_m) * 2 + 1, mask=mask_m, other=0.0)
    b_re = tl.load(Bp + (h * M + offs_m) * 2, mask=mask_m, other=0.0)
    b_im = tl.load(Bp + (h * M + offs_m) * 2 + 1, mask=mask_m, other=0.0)
    qv = tl.load(q + i_bh * R + offs_r, mask=mask_r, other=0.0).to(tl.float32)
    kv = tl.load(k + i_bh * R + offs_r, mask=mask_r, other=0.0).to(tl.float32)
    vv = tl.load(v + i_bh * D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    xb = X + i_bh * M * NC * 2
    # key half
    km = mask_m[:, None] & mask_r[None, :]
    kofs = (offs_m[:, None] * NC + offs_r[None, :]) * 2
    xk_re = tl.load(xb + kofs, mask=km, other=0.0)
    xk_im = tl.load(xb + kofs + 1, mask=km, other=0.0)
    nk_re = l_re[:, None] * xk_re - l_im[:, None] * xk_im + b_re[:, None] * kv[None, :]
    nk_im = l_re[:, None] * xk_im + l_im[:, None] * xk_re + b_im[:, None] * kv[None, :]
    tl.store(xb + kofs, nk_re, mask=km)
    tl.store(xb + kofs + 1, nk_im, mask=km)
    p_re = tl.sum(nk_re * qv[None, :], axis=1)
    p_im = tl.sum(nk_im * qv[None, :], axis=1)
    # r = K₁ p + K₂ conj(p)  (K[m, n] rows m, columns n)
    mm = mask_m[:, None] & mask_m[None, :]
    kk_off = h * 2 * M * M + offs_m[:, None] * M + offs_m[None, :]
    r_re = tl.zeros([BM], dtype=tl.float32)
    r_im = tl.zeros([BM], dtype=tl.float32)
    if HAS_K1:
        kk_re = tl.load(Kp + kk_off, mask=mm, other=0.0)
        kk_im = tl.load(Kp + kk_off + M * M, mask=mm, other=0.0)
        r_re += tl.sum(kk_re * p_re[None, :] - kk_im * p_im[None, :], axis=1)
        r_im += tl.sum(kk_re * p_im[None, :] + kk_im * p_re[None, :], axis=1)
    if HAS_K2:
        kk_re = tl.load(Kp + H * 2 * M * M + kk_off, mask=mm, other=0.0)
        kk_im = tl.load(Kp + H * 2 * M * M + kk_off + M * M, mask=mm, other=0.0)
        r_re += tl.sum(kk_re * p_re[None, :] + kk_im * p_im[None, :], axis=1)
        r_im += tl.sum(kk_im * p_re[None, :] - kk_re * p_im[None, :], axis=1)
    # value half
    vm = mask_m[:, None] & mask_d[None, :]
    vofs = (offs_m[:, None] * NC + R + offs_d[None, :]) * 2
    xv_re = tl.load(xb + vofs, mask=vm, other=0.0)
    xv_im = tl.load(xb + vofs + 1, mask=vm, other=0.0)
    nv_re = l_re[:, None] * xv_re - l_im[:, None] * xv_im + b_re[:, None] * vv[None, :]
    nv_im = l_re[:, None] * xv_im + l_im[:, None] * xv_re + b_im[:, None] * vv[None, :]
    tl.store(xb + vofs, nv_re, mask=vm)
    tl.store(xb + vofs + 1, nv_im, mask=vm)
    out = tl.sum(r_re[:, None] * nv_re - r_im[:, None] * nv_im, axis=0)
    tl.store(o + i_bh * D + offs_d, out.to(o.dtype.element_ty), mask=mask_d)


def decode_params(
    log_lam: torch.Tensor, B: torch.Tensor, C: torch.Tensor, readout: str = DEFAULT_READOUT
) -> tuple[torch.Tensor, ...]:
    """(λ, B, K, readout) in the decode kernel's layouts, all real float32: λ = exp(log λ) and B as [H, M, 2]
    (interleaved real / imaginary parts: ``torch.view_as_real`` of complex64), the readout operators (K₁, K₂) as a
    planar [2, H, 2, M, M] (an absent one is zeros and skipped by the kernel). Compute once per model/layer and pass
    as ``params`` to every step. Real tensors because inductor cannot functionalise a registered op over complex
    tensors ("auto_functionalized_v2 was not removed", seen on the H200): the op below takes and mutates real views."""
    lam = torch.exp(log_lam.to(torch.complex128)).to(torch.complex64)
    Bc = B.to(torch.complex64)
    ops = readout_operators(C.to(torch.complex64), readout)
    zero = torch.zeros_like(C, dtype=torch.complex64)
    kk = torch.stack([torch.stack([K.real, K.imag], dim=1) for K in (k if k is not None else zero for k in ops)])
    return torch.view_as_real(lam).contiguous(), torch.view_as_real(Bc).contiguous(), kk.contiguous(), readout


@torch.no_grad()
def interdomain_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_lam: torch.Tensor | None,
    B: torch.Tensor | None,
    C: torch.Tensor | None,
    state: torch.Tensor,
    *,
    denominator: bool = False,
    params: tuple[torch.Tensor, ...] | None = None,
    out: torch.Tensor | None = None,
    readout: str = DEFAULT_READOUT,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: q, k ``[B, H, R]``, v ``[B, H, D]``; state ``[B, H, M, R + D (+1)]`` complex64 (or its
    ``torch.view_as_real`` float32 [..., 2]), updated in place and returned. Returns
    ``(o [B, H, D] in q.dtype (or ``out``), state)``. Equals ``naive_interdomain`` with T = 1 and
    ``initial_state=state``. ``params`` = ``decode_params(log_lam, B, C, readout)`` skips recomputing λ and the
    readout operators (then log_lam, B, C and ``readout`` are taken from it and may be None).

    Per (b, h), with the readout operators K₁, K₂ precomputed once (``decode_params``, readout.py)::

        X^k ← λ ⊙ X^k + B k_tᵀ,   X^v ← λ ⊙ X^v + B v_tᵀ        (the recurrence of naive.py)
        p = X^k q_t ∈ C^M,   r = K₁ p + K₂ conj(p) ∈ C^M,   o_t = Re(rᵀ X^v) ∈ R^D   (= read(q_t, U_t, Γ_t), chunk.py)

    transpose: K₁ = Cᵀ C, no K₂; hermitian: K₂ = Cᵀ conj(C), no K₁; real: half of each (the same operators as the
    training forms).

    Cost O(M(R+D) + M²) per head instead of the O(M²(R+D)) of forming U and Γ. The state is updated IN PLACE (complex64
    buffer [B, H, M, R+D(+1)]), and the output can be written into a caller-provided buffer, so the step captures into a
    CUDA graph with static buffers; its cost does not depend on the context length. Inference only (no autograd).
    ``interdomain_decode_op`` is the same step registered as a custom op (state mutated, fake kernel) for compiled
    steps.
    """
    state_r = torch.view_as_real(state) if state.dtype == torch.complex64 else state
    if state_r.dtype != torch.float32 or state_r.shape[-1:] != (2,) or not state_r.is_contiguous():
        raise ValueError("state must be a contiguous complex64 tensor [B, H, M, R + D (+1)] or its view_as_real "
                         "float32 [..., 2] (it is updated in place)")
    if params is None:
        params = decode_params(log_lam, B, C, readout)
    lam, Bc, kk, readout = params
    Bsz, H, R = q.shape
    D = v.shape[-1]
    M = lam.shape[-2]
    if denominator:
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    Dv = v.shape[-1]
    if tuple(state_r.shape[:-1]) != (Bsz, H, M, R + Dv):
        raise ValueError(f"state must be [B, H, M, R + D{' + 1' if denominator else ''}] complex, got "
                         f"{tuple(state_r.shape[:-1])}")
    o = (
        out
        if (out is not None and not denominator)
        else torch.empty(Bsz, H, Dv, device=q.device, dtype=torch.float32 if denominator else q.dtype)
    )
    _decode_kernel[(Bsz * H,)](
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        o,
        lam,
        Bc,
        kk,
        state_r,
        H,
        M,
        R,
        Dv,
        BR=max(16, triton.next_power_of_2(R)),
        BD=max(16, triton.next_power_of_2(Dv)),
        BM=max(16, triton.next_power_of_2(M)),
        HAS_K1=readout != "hermitian",
        HAS_K2=readout != "transpose",
        num_warps=4,
    )
    if denominator:
        res = safe_divide(o[..., :D], o[..., D:]).to(q.dtype)
        if out is not None:
            out.copy_(res)
            res = out
        return res, state
    return o, state


@torch.library.custom_op("hybrid_attention::interdomain_decode_step", mutates_args=("state",))
def interdomain_decode_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor, b: torch.Tensor,
                          kk: torch.Tensor, state: torch.Tensor, denominator: bool, readout: str) -> torch.Tensor:
    """`interdomain_decode_step` with params = (lam, b, kk, readout) from `decode_params`, as a registered op: state
    [B, H, M, R + D (+1), 2] float32 (`torch.view_as_real` of the complex64 state, see `decode_params`) is updated in
    place; returns o [B, H, D] in q.dtype. What `torch.compile` sees of the kernel (fake kernel below)."""
    return interdomain_decode_step(q, k, v, None, None, None, state, denominator=denominator,
                                   params=(lam, b, kk, readout))[0]


@interdomain_decode_op.register_fake
def _(q, k, v, lam, b, kk, state, denominator, readout):
    return q.new_empty(*q.shape[:2], v.shape[-1])
