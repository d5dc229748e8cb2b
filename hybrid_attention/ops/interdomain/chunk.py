"""Chunk-parallel PyTorch form of the Interdomain Attention core (exact, differentiable by autograd):
``chunk_interdomain``, whose docstring gives the factorisation through the M-vectors p_t = X^k_t q_t and r_t = K p_t
(never the per-token states), the denominator channel, the overflow-free decays and the memory."""

from __future__ import annotations

import torch

from ..common.ssm import chunk_decays, compute_dtypes, prepare_ssm_params, validate_chunk_size
from ..common.varlen import per_document
from .naive import safe_divide, validate_interdomain_inputs
from .readout import DEFAULT_READOUT, readout_operators, validate_readout

__all__ = ["chunk_interdomain"]


# DECISION: on CPU tensors this PyTorch form runs chunks of at most REFERENCE_CHUNK tokens whatever chunk_size asks
# for (on a GPU, longer chunks mean fewer sequential steps, so chunk_size is used as given): its
# per-token work grows with the chunk length (the [L, L, M] decay table), while the Triton kernels use chunk_size as
# asked. Measured on one CPU thread, forward + backward, L = 16 / 32 / 64: `small` shapes (M=64, R=D=64; B 2, T 256,
# H 8 / B 4, T 512, H 4) 158 / 205 / 380 and 243 / 257 / 403 ms; `tiny` (M=16, R=D=32, B 8, T 128, H 2) 21 / 16 /
# 20 ms. 32 is the cap (the tiny preset asks for 16 anyway). Results do not depend on it beyond rounding.
REFERENCE_CHUNK = 32


# DECISION: this reference form is opaque to torch.compile (Dynamo runs it eagerly, a graph break): inductor (torch
# 2.13, CPU) failed to compile its complex autograd in training ("self.stride(-1) must be 1 to view ComplexFloat as
# Float" at a gradient addition of the state slices), and miscompiled the SSM-parameter gradients of the similar
# bilinear S4D reference (ops/s4d_bilinear/chunk.py). On the GPU the Triton custom ops run instead, also opaque.
@torch.compiler.disable
@per_document(tokens=("q", "k", "v"))
def chunk_interdomain(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    denominator: bool = False,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    readout: str = DEFAULT_READOUT,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Interdomain Attention core, chunk-parallel (equal to ``naive_interdomain`` to rounding).

    Shapes: q, k ``[B, T, H, R]`` real; v ``[B, T, H, D]`` real; log_lam, B ``[H, M]`` complex; C ``[H, M, M]``
    complex; initial_state ``[B, H, M, R + D]`` (``R + D + 1`` with ``denominator``) complex. Any T >= 0 and any
    chunk_size >= 1 (the last chunk may be partial; on the CPU at most REFERENCE_CHUNK tokens per chunk). Returns
    ``o [B, T, H, D]`` in ``q.dtype`` and the final raw state (complex128 for float64 inputs, complex64 otherwise) or
    ``None`` unless ``output_final_state``.

    Same contract as ``naive_interdomain`` (see naive.py for the definition). Per batch b and head h, write the state as
    X_t = [X^k_t | X^v_t] (key channels, value channels). Then U_t q_t = C X^k_t q_t and Γ_t = C X^v_t, so

        o_t = Re(q_tᵀ U_tᵀ Γ_t) = Re((C X^k_t q_t)ᵀ (C X^v_t)) = Re(X^v_tᵀ K X^k_t q_t),  K = Cᵀ C (plain transpose)

    and the per-token states never need to exist: only the M-vector p_t = X^k_t q_t and r_t = K p_t do. The other
    readouts (readout.py) only change r_t: r_t = K₁ p_t + K₂ conj(p_t) (hermitian: K₁ = 0, K₂ = Cᵀ conj(C); real: half
    of each), everything else below is the same.

    Factorisation for a chunk [t0, t0 + L) entered with state X0 (the state after token t0 - 1), local indices t, s in
    [0, L). Unrolling the recurrence inside the chunk gives X_t = Σ_{s<=t} λ^{t-s} ⊙ B z_sᵀ + λ^{t+1} ⊙ X0, hence

        Ldec[t, s, m] = exp(log_lam[m] (t - s)) if s <= t else 0             [H, L, L, M]   intra-chunk decays
        Din[t, m]     = exp(log_lam[m] (t + 1))                              [H, L, M]      decay of the entering state
        S[t, s]       = q_t · k_s                                            [B, H, L, L]   query-key scores
        p_t = Σ_s S[t, s] Ldec[t, s] ⊙ B  +  Din[t] ⊙ (X0^k q_t)             [B, H, L, M]   (= X^k_t q_t)
        r_t = K₁ p_t + K₂ conj(p_t)                                          [B, H, L, M]   (transpose: K₁ = K, K₂ = 0)
        W[t, s] = Σ_m r_t[m] B[m] Ldec[t, s, m]                              [B, H, L, L]
        o_t = Re(Σ_s W[t, s] v_s)  +  Re((r_t ⊙ Din[t])ᵀ X0^v)               [B, H, L, D]
        X_end = Din[L-1] ⊙ X0 + Σ_s Ldec[L-1, s] ⊙ B z_sᵀ                    [B, H, M, R+D]  (carried to the next chunk)

    With ``denominator=True`` the value gets a constant-1 channel, v' = [v ; 1], and the same formulas give
    num = o'[..., :D] and den = o'[..., D] = Re(q_tᵀ U_tᵀ η_t); o = num / safe(den) exactly as in naive.py.

    Numerical safety for fast-decaying modes: every power of λ is computed directly as exp(log_lam * n) with n >= 0
    (n = t - s on and below the diagonal, n = t + 1 for the entering state), so |λ^n| = exp(Re(log_lam) n) <= 1 and no
    intermediate can overflow. The FLA-style split λ^{t-s} = λ^t · λ^{-s} is deliberately NOT used: λ^{-s} =
    exp(-Re(log_lam) s) reaches e^{5·63} ≈ 1e137 for Re(log_lam) = -5 in a 64-token chunk (inf in float32, and in
    float64 too for faster modes), and the product with the tiny λ^t would lose all precision even before overflowing.
    The price is the explicit [H, L, L, M] decay tensor instead of two rank-one factors; fast modes simply underflow to
    0, which is their exact limit. Masked entries (s > t) use n = 0 before being zeroed, so no inf/NaN reaches autograd.

    Memory: the python loop over chunks keeps per chunk O(L·L·M + L·M·(R+D)) per head, plus the O(T·(R+D)) inputs and
    outputs; X_t is never materialised for every position (autograd still saves the per-chunk intermediates).
    """
    validate_readout(readout)
    validate_interdomain_inputs(q, k, v, log_lam, B, C, initial_state, denominator)
    validate_chunk_size(chunk_size)
    if q.device.type == "cpu":
        chunk_size = min(chunk_size, REFERENCE_CHUNK)
    Bsz, T, H, R = q.shape
    D = v.shape[-1]
    M = log_lam.shape[1]
    out_dtype = q.dtype
    rdtype, cdtype = compute_dtypes(q, k, v)
    log_lam, B, C = prepare_ssm_params(log_lam, B, C, cdtype)

    # [B, H, T, *] layout; the value side carries the constant-1 channel of the denominator if requested.
    q, k, v = (x.to(rdtype).transpose(1, 2) for x in (q, k, v))
    if denominator:
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    X = q.new_zeros(Bsz, H, M, R + v.shape[-1], dtype=cdtype) if initial_state is None else initial_state.to(cdtype)

    K1, K2 = readout_operators(C, readout)  # r = K₁ p + K₂ conj(p), each [H, M, M] or None
    Lmax = min(chunk_size, T)
    Ldec_full, Din_full = chunk_decays(log_lam, Lmax) if T > 0 else (None, None)

    outputs = []
    for t0 in range(0, T, chunk_size):
        L = min(chunk_size, T - t0)
        Ldec, Din = Ldec_full[:, :L, :L], Din_full[:, :L]  # [H, L, L, M], [H, L, M]
        LdecB = Ldec * B[:, None, None, :]  # λ^{t-s} ⊙ B
        qc, kc, vc = q[:, :, t0 : t0 + L], k[:, :, t0 : t0 + L], v[:, :, t0 : t0 + L]
        Xk, Xv = X[..., :R], X[..., R:]

        S = (qc @ kc.transpose(-1, -2)).to(cdtype)  # [B, H, L, L]; Ldec's zeros supply the causal mask
        p = torch.einsum("bhts,htsm->bhtm", S, LdecB)
        p = p + Din * torch.einsum("bhmr,bhtr->bhtm", Xk, qc.to(cdtype))  # p_t = X^k_t q_t
        r = sum(torch.einsum("hmn,bhtn->bhtm", K_, p_) for K_, p_ in ((K1, p), (K2, p.conj())) if K_ is not None)
        W = torch.einsum("bhtm,htsm->bhts", r, LdecB)  # intra-chunk query-to-value weights
        o = W.real @ vc + torch.einsum("bhtm,bhmd->bhtd", r * Din, Xv).real  # v is real: Re(W v) = Re(W) v
        outputs.append(o)

        z = torch.cat([kc, vc], dim=-1).to(cdtype)  # [B, H, L, R+D(+1)]
        X = Din[:, L - 1, :, None] * X + torch.einsum("hsm,bhsc->bhmc", LdecB[:, L - 1], z)

    D_out = v.shape[-1]
    o = torch.cat(outputs, dim=2) if T > 0 else v.new_zeros(Bsz, H, 0, D_out)  # [B, H, T, D(+1)]
    if denominator:
        o = safe_divide(o[..., :D], o[..., D:])
    return o.transpose(1, 2).to(out_dtype), (X if output_final_state else None)
