"""Chunk-parallel PyTorch form of the Interdomain Attention core (exact): ``chunk_interdomain``, whose docstring gives
the factorisation through the M-vectors p_t = X^k_t q_t and r_t = K p_t (never the per-token states), the denominator
channel, the overflow-free decays and the all-chunks-at-once layout; the batched core and its closed-form backward
are ``chunk_function.ChunkCore``."""

from __future__ import annotations

import torch

from ..common.autocast import autocast_off
from ..common.planar import Planar, cexp_scaled, cmul
from ..common.ssm import compute_dtypes, prepare_planar_params, validate_chunk_size
from ..common.varlen import per_document
from .chunk_function import ChunkCore
from .naive import safe_divide, validate_interdomain_inputs
from .readout import DEFAULT_READOUT, validate_readout

__all__ = ["chunk_interdomain", "planar_readout_matrix"]


# DECISION: on CPU tensors this form runs chunks of at most REFERENCE_CHUNK tokens whatever chunk_size asks for (on a
# GPU chunk_size is used as given): the intra-chunk work per token grows with the chunk length (the [L, L, M] decay
# table, the [L, L] scores), the number of entering states shrinks with it; 16-32 is fastest at the `small` and `tiny`
# shapes (the chunk-length row of the CPU training-step section of benchmarks/README.md). Results do not depend on it
# beyond rounding.
REFERENCE_CHUNK = 32


def planar_readout_matrix(C: Planar, readout: str) -> torch.Tensor:
    """The readout r = K₁ p + K₂ conj(p) (``readout_operators``) as one real map P ``[H, 2M, 2M]`` of p^ to r^,
    r^ = P p^, where x^ = (Re x₀, Im x₀, Re x₁, Im x₁, ...) interleaves a complex M-vector (``chunk_function``'s
    layout); C ``Planar`` [H, M, M].

    With rr = CrᵀCr, ri = CrᵀCi, ir = CiᵀCr, ii = CiᵀCi (one matmul of [Cr, Ci] with itself), the 2×2 block of P at
    modes (m, n) is, for "transpose" K₁ = (rr - ii) + i(ri + ir): [[Re K₁, -Im K₁], [Im K₁, Re K₁]]; for "hermitian"
    K₂ = (rr + ii) + i(ir - ri), which acts on conj(p): [[Re K₂, Im K₂], [Im K₂, -Re K₂]]; for "real", half of their
    sum: [[rr, -ri], [ir, -ii]] (r = Cᵀ Re(C p)).
    """
    validate_readout(readout)
    H, M = C.shape[0], C.shape[-1]
    y = torch.cat([C.re, C.im], dim=-1)  # [H, M, 2M]
    g = y.transpose(1, 2) @ y  # [H, 2M, 2M] = [[rr, ri], [ir, ii]]
    rr, ri, ir, ii = g[:, :M, :M], g[:, :M, M:], g[:, M:, :M], g[:, M:, M:]
    if readout == "transpose":
        a, b = rr - ii, ri + ir
        blocks = (a, -b, b, a)
    elif readout == "hermitian":
        c, d = rr + ii, ir - ri
        blocks = (c, d, d, -c)
    else:
        blocks = (rr, -ri, ir, -ii)
    # blocks (re←re, re←im, im←re, im←im), each [H, M, M] -> P[h, 2m + α, 2n + β]
    return torch.stack(blocks, dim=-1).view(H, M, M, 2, 2).permute(0, 1, 3, 2, 4).reshape(H, 2 * M, 2 * M)


def _decay_tables(log_lam: Planar, b_in: Planar, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """G ``[H, L, L, M]`` with G[h, t, s] = λ^{t-s} ⊙ B̄ for s <= t and 0 otherwise, and Din ``[H, L, M]`` with
    Din[h, t] = λ^{t+1}, both complex; every power computed directly as exp(n log λ) with n >= 0 (masked entries use
    n = 0)."""
    rdtype = log_lam.dtype
    idx = torch.arange(L, device=log_lam.device)
    n = idx[:, None] - idx[None, :]  # t - s
    causal = (n >= 0).to(rdtype)[None, :, :, None]
    n = n.clamp(min=0).to(rdtype)[None, :, :, None]
    dec = cexp_scaled(log_lam.map(lambda x: x[:, None, None, :]), n)
    g = cmul(dec.re * causal, dec.im * causal, b_in.re[:, None, None, :], b_in.im[:, None, None, :])
    din = cexp_scaled(log_lam.map(lambda x: x[:, None, :]), (idx + 1).to(rdtype)[None, :, None])
    return torch.complex(*g), torch.complex(*din)


# DECISION: this reference form is opaque to torch.compile (Dynamo runs it eagerly, a graph break): its core is a
# custom autograd.Function on complex tensors, which inductor does not generate code for; on the GPU the Triton custom
# ops run instead, also opaque.
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

    Shapes: q, k ``[B, T, H, R]`` real; v ``[B, T, H, D]`` real; log_lam, B ``[H, M]`` complex or ``Planar``; C
    ``[H, M, M]`` complex or ``Planar``; initial_state ``[B, H, M, R + D]`` (``R + D + 1`` with ``denominator``)
    complex. Any T >= 0 and any chunk_size >= 1 (the last chunk may be partial; on the CPU at most REFERENCE_CHUNK
    tokens per chunk). Returns ``o [B, T, H, D]`` in ``q.dtype`` and the final raw state (complex128 for float64
    inputs, complex64 otherwise) or ``None`` unless ``output_final_state``.

    Same contract as ``naive_interdomain`` (see naive.py for the definition). Per batch b and head h, write the state as
    X_t = [X^k_t | X^v_t] (key channels, value channels). Then U_t q_t = C X^k_t q_t and Γ_t = C X^v_t, so

        o_t = Re(q_tᵀ U_tᵀ Γ_t) = Re((C X^k_t q_t)ᵀ (C X^v_t)) = Re(X^v_tᵀ K X^k_t q_t),  K = Cᵀ C (plain transpose)

    and the per-token states never need to exist: only the M-vector p_t = X^k_t q_t and r_t = K p_t do. The other
    readouts (readout.py) only change r_t: r_t = K₁ p_t + K₂ conj(p_t) (hermitian: K₁ = 0, K₂ = Cᵀ conj(C); real: half
    of each), everything else below is the same.

    Factorisation for a chunk [t0, t0 + L) entered with state X0 (the state after token t0 - 1), local indices t, s in
    [0, L). Unrolling the recurrence inside the chunk gives X_t = Σ_{s<=t} λ^{t-s} ⊙ B z_sᵀ + λ^{t+1} ⊙ X0, hence

        G[t, s, m]    = exp(log_lam[m] (t - s)) B[m] if s <= t else 0          [H, L, L, M]   intra-chunk decays
        Din[t, m]     = exp(log_lam[m] (t + 1))                              [H, L, M]      decay of the entering state
        S[t, s]       = q_t · k_s                                            [B, H, L, L]   query-key scores
        p_t = Σ_s S[t, s] G[t, s]  +  Din[t] ⊙ (X0^k q_t)                    [B, H, L, M]   (= X^k_t q_t)
        r_t = K₁ p_t + K₂ conj(p_t)                                          [B, H, L, M]   (transpose: K₁ = K, K₂ = 0)
        W[t, s] = Re Σ_m r_t[m] G[t, s, m]                                   [B, H, L, L]
        o_t = Σ_s W[t, s] v_s  +  Re((r_t ⊙ Din[t])ᵀ X0^v)                   [B, H, L, D]
        X_end = Din[L-1] ⊙ X0 + Σ_s G[L-1, s] z_sᵀ                           [B, H, M, R+D]  (carried to the next chunk)

    With ``denominator=True`` the value gets a constant-1 channel, v' = [v ; 1], and the same formulas give
    num = o'[..., :D] and den = o'[..., D] = Re(q_tᵀ U_tᵀ η_t); o = num / safe(den) exactly as in naive.py.

    Layout: every chunk runs at once (``chunk_function.ChunkCore``, one autograd.Function with a closed-form
    backward): the tokens are padded to N whole chunks and laid out [N, B, H, L, *], so each line above is one batched
    matmul over all chunks; complex products run as real matmuls on interleaved (real, imaginary) views, and
    r = K₁ p + K₂ conj p is one real [2M, 2M] map (``planar_readout_matrix``). Only the entering states depend on the
    previous chunks: X0[n] = λ^L ⊙ X0[n-1] + ΔX[n-1] with ΔX[j] = Σ_s G[L-1, s] z_sᵀ of chunk j, a scan over the N
    chunks of [B, H, M, R+D] elementwise steps. The last chunk, of length L' <= L, leaves X_end = Din[L'-1] ⊙ X0 +
    Σ_s G[L'-1, s] z_sᵀ (G's zeros drop the padding).

    Numerical safety for fast-decaying modes: every power of λ is computed directly as exp(log_lam * n) with n >= 0
    (n = t - s on and below the diagonal, n = t + 1 for the entering state, n = L in the scan), so |λ^n| =
    exp(Re(log_lam) n) <= 1 and no intermediate can overflow. The FLA-style split λ^{t-s} = λ^t · λ^{-s} is
    deliberately NOT used: λ^{-s} = exp(-Re(log_lam) s) reaches e^{5·63} ≈ 1e137 for Re(log_lam) = -5 in a 64-token
    chunk (inf in float32, and in float64 too for faster modes), and the product with the tiny λ^t would lose all
    precision even before overflowing. The price is the explicit [H, L, L, M] decay tensor instead of two rank-one
    factors; fast modes simply underflow to 0, which is their exact limit. Masked entries (s > t) use n = 0 before
    being zeroed, so no inf/NaN reaches the gradients.

    Memory: O(B·H·T·(L + M)) for the scores and M-vectors and O(B·H·N·M·(R+D)) for the entering states, plus the
    inputs and outputs, all kept for the backward; X_t is never materialised for every position.
    """
    validate_readout(readout)
    validate_interdomain_inputs(q, k, v, log_lam, B, C, initial_state, denominator)
    validate_chunk_size(chunk_size)
    if q.device.type == "cpu":
        chunk_size = min(chunk_size, REFERENCE_CHUNK)
    with autocast_off(q.device.type):  # the exact form: float32 / float64 products, also inside bf16 autocast
        return _chunk_interdomain(q, k, v, log_lam, B, C, denominator, initial_state, output_final_state, chunk_size,
                                  readout)


def _chunk_interdomain(q, k, v, log_lam, B, C, denominator, initial_state, output_final_state, chunk_size, readout):
    """The body of ``chunk_interdomain`` (validated inputs, autocast off)."""
    Bsz, T, H, R = q.shape
    D = v.shape[-1]
    M = log_lam.shape[1]
    out_dtype = q.dtype
    rdtype, cdtype = compute_dtypes(q, k, v)
    log_lam, b_in, c_mat = prepare_planar_params(log_lam, B, C, rdtype)

    # the value side carries the constant-1 channel of the denominator if requested
    q, k, v = (x.to(rdtype) for x in (q, k, v))
    if denominator:
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    Dv = v.shape[-1]
    if T == 0:
        o = v.new_zeros(Bsz, 0, H, D).to(out_dtype)
        if not output_final_state:
            return o, None
        return o, q.new_zeros(Bsz, H, M, R + Dv, dtype=cdtype) if initial_state is None else initial_state.to(cdtype)

    L = min(chunk_size, T)
    N = -(-T // L)
    last = T - (N - 1) * L  # length of the last chunk
    pad = N * L - T

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, c] -> [N, B, H, L, c], zero-padded
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)).view(Bsz, N, L, H, x.shape[-1])
        return x.permute(1, 0, 3, 2, 4).contiguous()

    qc, kc, vc = chunks(q), chunks(k), chunks(v)
    G, Din = _decay_tables(log_lam, b_in, L)
    P = planar_readout_matrix(c_mat, readout)  # [H, 2M, 2M]
    E = torch.complex(*cexp_scaled(log_lam, torch.tensor(float(L), dtype=rdtype, device=q.device)))  # λ^L
    x0 = None if initial_state is None else initial_state.to(cdtype).transpose(-1, -2)  # channel-major
    o, x_last = ChunkCore.apply(qc, kc, vc, G, Din, P, E, x0)
    o = o.permute(1, 0, 3, 2, 4).reshape(Bsz, N * L, H, Dv)[:, :T]
    if denominator:
        o = safe_divide(o[..., :D], o[..., D:])
    o = o.to(out_dtype)
    if not output_final_state:
        return o, None

    # final state: the last chunk's entering state decayed over its length plus its own contribution
    zl = torch.cat([kc[N - 1], vc[N - 1]], dim=-1).to(cdtype)  # [B, H, L, C]
    dl = torch.einsum("hsm,bhsc->bhmc", G[:, last - 1], zl)  # λ^{last-1-s} B for s < last, 0 for the padding
    return o, Din[:, last - 1, :, None] * x_last.transpose(-1, -2) + dl
