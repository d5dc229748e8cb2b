"""The complex-to-real readout of Interdomain Attention (``READOUTS``): which real number the query reads from
(U, Γ); the default is decided at ``DEFAULT_READOUT``."""

from __future__ import annotations

import torch

from ..common.autocast import autocast_off
from ..common.planar import Planar

__all__ = ["READOUTS", "DEFAULT_READOUT", "LEGACY_READOUT", "validate_readout", "readout_operators",
           "planar_readout_operator", "readout_product"]

# The paper writes o_t = ξ(q_t)ᵀ U_tᵀ Γ_t (Eq. 13) with real basis functions in mind; with the complex S4D basis it
# does not say how the complex product becomes real (spec §6.2 item 1). Three readouts (``READOUTS``): "transpose"
# Re(Σ_m u_m Γ_m), "hermitian" Re(Σ_m conj(u_m) Γ_m) and "real" Σ_m Re(u_m) Re(Γ_m), u = U_t q_t; `readout_product`
# gives them by definition and as kernels over (key, value) pairs. All three are real-linear in the key-side vector
# p_t = X^k_t q_t: `readout_operators` gives the one factorisation every chunked, Triton and decode form uses.
READOUTS = ("transpose", "hermitian", "real")

# DECISION: "real", by the credible-scale A/B (RESULTS.md C1; 35M parameters, 100M BPE tokens of English prose,
# 2 seeds, H200, `configs/experiments/credible_prose.yaml`): validation ppl real 7.884 / 7.878, hermitian
# 8.189 / 7.982, transpose 8.865 / 8.601; paired by seed, real is 9.7% ± 1.9 below transpose and 2.5% ± 1.7 below
# hermitian, lower in 2 of 2 seeds each time (the linear S4D-only control: 10.338 / 10.267). Its cost is training
# speed: 0.28-0.29M tok/s, against 0.39-0.43M for hermitian and 0.45-0.56M for transpose (each run alone). The code
# regime of RESULTS.md section A (`small`, 6.55M byte tokens of stdlib code) ranks transpose first (11-13.5% better
# than both); it is discounted, because softmax comes out worst there, so that regime cannot rank mixers.
DEFAULT_READOUT = "real"

# The readout of every Interdomain model saved before configs recorded it (HybridConfig.config_revision 0): a saved
# config without mixer_options["interdomain"]["readout"] means this one, whatever DEFAULT_READOUT is. Never change.
# Every HybridConfig records its readout (models/configuration.py, CONFIG_REVISION); the suites with transpose
# results pin it (tests/experiments/test_readout_pins.py). A step checkpoint (checkpoints/step-*) is rebuilt from its
# run's config.yaml, not from a config.json: to resume or evaluate one of a transpose run, add
# model.options.mixer_options.interdomain.readout: transpose to that run config.
LEGACY_READOUT = "transpose"


def validate_readout(readout: str) -> None:
    """Raise ``ValueError`` naming ``readout`` and the allowed values."""
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {', '.join(READOUTS)}, got {readout!r}")


def readout_operators(C: torch.Tensor, readout: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(K₁, K₂), each [H, M, M] complex or None, with r = K₁ p + K₂ conj(p) (r_t[m] = Σ_n K[m, n] p_t[n]).

    All three are real-linear in the key-side vector p_t = X^k_t q_t ∈ C^M (the chunked forms' contraction of the
    query with the raw key state, X^k before C): o_t = Re(r_tᵀ X^v_t) with r_t = K₁ p_t + K₂ conj(p_t), where
    K₁ = Cᵀ C (transpose), K₂ = Cᵀ conj(C) (hermitian), and half of each for "real" (``readout_operators``). This is how
    the chunked PyTorch form, the Triton training kernels and the fused decode step implement every readout with one
    factorisation: the Hermitian form is the conjugate recurrence on the key side, conj(X^k) = the state of (conj λ,
    conj B̄), and since q and the inputs are real that is just conj(p_t).

    For "real", ½ (K₁ p + K₂ conj p) = Cᵀ Re(C p): a real vector x = Re(C p) read back through Cᵀ. The Triton training
    kernels run "real" in one pass in this form (``InterdomainConfig.real_one_pass``; the kernels' REAL_C reads the
    planar C itself, two M×M tiles, x = Re p Re Cᵀ − Im p Im Cᵀ, then Re r = x Re C, Im r = x Im C per token row), at
    the cost of one transpose pass; the choice of this form over four real blocks of the map (a, b) -> r is the DECISION
    in triton/kernels.py.
    """
    validate_readout(readout)
    k1 = torch.einsum("hnm,hnk->hmk", C, C) if readout != "hermitian" else None  # Cᵀ C, complex symmetric
    k2 = torch.einsum("hnm,hnk->hmk", C, C.conj()) if readout != "transpose" else None  # Cᵀ conj(C)
    if readout == "real":
        k1, k2 = 0.5 * k1, 0.5 * k2
    return k1, k2


def planar_readout_operator(C: Planar, readout: str) -> Planar:
    """The one operator of a one-operator readout in real arithmetic: K₁ = Cᵀ C ("transpose") or K₂ = Cᵀ conj(C)
    ("hermitian"), ``Planar`` [H, M, M] from C ``Planar`` [H, M, M] (equal to ``readout_operators`` to rounding).
    With C = Cr + i·Ci: K₁ = (CrᵀCr - CiᵀCi) + i(CrᵀCi + CiᵀCr), K₂ = (CrᵀCr + CiᵀCi) + i(CiᵀCr - CrᵀCi)."""
    if readout not in ("transpose", "hermitian"):
        raise ValueError(f"planar_readout_operator takes readout 'transpose' or 'hermitian', got {readout!r}")
    M = C.shape[-1]
    # DECISION: outside autocast, in C's own dtype: the complex form this replaces was never autocast (complex
    # matmuls are not autocast-eligible), and a bf16 K would round the readout operator (2^-9 relative).
    # DECISION: one batched matmul of Y = [Cr, Ci] ([H, M, 2M]) with itself, YᵀY = [[CrᵀCr, CrᵀCi], [CiᵀCr, CiᵀCi]],
    # gives the four real blocks in one launch (forward and backward) instead of four.
    # DECISION: in float64, cast back to C's dtype: a float32 matmul would run on TF32 tensor cores on CUDA
    # (train.tf32, on by default), rounding K to ~1e-3; the matmul is [H, 2M, 2M] (tiny), so float64 costs nothing.
    with autocast_off(C.device.type):
        y = torch.cat([C.re, C.im], dim=-1).double()
        g = (y.transpose(1, 2) @ y).to(C.dtype)  # [H, 2M, 2M]
    rr, ri, ir, ii = g[:, :M, :M], g[:, :M, M:], g[:, M:, :M], g[:, M:, M:]
    if readout == "transpose":
        return Planar(rr - ii, ri + ir)
    return Planar(rr + ii, ir - ri)


def readout_product(U: torch.Tensor, q: torch.Tensor, G: torch.Tensor, readout: str) -> torch.Tensor:
    """The readout by its definition (the naive forms): U ``[..., M, R]``, q ``[..., R]``, G ``[..., M, D]`` complex
    (q real or complex with zero imaginary part) -> ``[..., D]`` real.

    Three readouts, per head, with u = U_t q_t ∈ C^M and Γ = Γ_t ∈ C^{M×D}:

        "transpose"  o = Re(q_tᵀ U_tᵀ Γ_t) = Re(Σ_m u_m Γ_m)           plain transpose (bilinear, no conjugation)
        "hermitian"  o = Re(q_tᵀ U_t^H Γ_t) = Re(Σ_m conj(u_m) Γ_m)    conjugate transpose (Hermitian inner product)
        "real"       o = Re(U_t q_t)ᵀ Re(Γ_t) = Σ_m Re(u_m) Re(Γ_m)     real parts only; = ½ (transpose + hermitian)

    As a kernel over (key at s, value at s'), with the basis functions κ(τ) = C (λ^τ ⊙ B̄) ∈ C^M, the readouts weigh the
    pair by W(τ, τ') = Re Σ_m κ_m(τ) κ_m(τ') (transpose, indefinite), Re Σ_m conj(κ_m(τ)) κ_m(τ') (hermitian, a positive
    semi-definite Gram kernel, the reading of the derivation's Σ_m φ_m(s) φ_m(s') ≈ δ(s - s') with a complex basis) and
    Σ_m Re κ_m(τ) Re κ_m(τ') (real).
    """
    if readout == "transpose":
        return torch.einsum("...m,...md->...d", torch.einsum("...mr,...r->...m", U, q), G).real
    if readout == "hermitian":
        return torch.einsum("...m,...md->...d", torch.einsum("...mr,...r->...m", U.conj(), q), G).real
    if readout == "real":
        return torch.einsum("...m,...md->...d", torch.einsum("...mr,...r->...m", U.real, q.real), G.real)
    raise ValueError(f"readout must be one of {', '.join(READOUTS)}, got {readout!r}")
