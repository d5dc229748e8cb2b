"""The three complex-to-real readouts of Interdomain Attention (ops/interdomain/readout.py), float64 on the CPU.

Each readout equals a direct O(T³) double sum over (key at s, value at s') with that readout's pair weight W, written
here from the basis functions κ(τ) = C (λ^τ ⊙ B̄); the Hermitian W is a positive semi-definite Gram kernel, the plain
transpose's is indefinite at the S4D-Inv initialisation; every form (naive, chunk, dispatcher) agrees.
"""

from __future__ import annotations

import math

import pytest
import torch

from hybrid_attention.modules import S4DCore
from hybrid_attention.ops.interdomain import READOUTS, chunk_interdomain, interdomain, naive_interdomain

F64, C128 = torch.float64, torch.complex128


def basis(log_lam: torch.Tensor, B: torch.Tensor, C: torch.Tensor, L: int) -> torch.Tensor:
    """κ(τ) = C (λ^τ ⊙ B̄) for τ = 0..L-1: [H, L, M] complex."""
    tau = torch.arange(L, dtype=F64)
    lam_pow = torch.exp(log_lam[:, None, :] * tau[None, :, None])  # [H, L, M]
    return torch.einsum("hmn,hln->hlm", C, lam_pow * B[:, None, :])


def pair_weight(kappa: torch.Tensor, readout: str) -> torch.Tensor:
    """W[h, τ, τ'] of a readout: the weight of the pair (key at lag τ, value at lag τ')."""
    if readout == "transpose":
        return torch.einsum("htm,hum->htu", kappa, kappa).real
    if readout == "hermitian":
        return torch.einsum("htm,hum->htu", kappa.conj(), kappa).real
    return torch.einsum("htm,hum->htu", kappa.real, kappa.real)


def random_core(H, M, g):
    log_lam = torch.complex(-torch.rand(H, M, dtype=F64, generator=g) * 0.6 - 0.02,
                            torch.randn(H, M, dtype=F64, generator=g) * 2)
    B = torch.randn(H, M, dtype=C128, generator=g)
    C = torch.randn(H, M, M, dtype=C128, generator=g) / math.sqrt(M)
    return log_lam, B, C


@pytest.mark.parametrize("readout", READOUTS)
def test_readout_equals_double_sum(readout):
    g = torch.Generator().manual_seed(11)
    Bsz, T, H, R, D, M = 2, 13, 2, 3, 4, 5
    log_lam, B, C = random_core(H, M, g)
    q, k = torch.randn(Bsz, T, H, R, dtype=F64, generator=g), torch.randn(Bsz, T, H, R, dtype=F64, generator=g)
    v = torch.randn(Bsz, T, H, D, dtype=F64, generator=g)
    W = pair_weight(basis(log_lam, B, C, T), readout)  # [H, T, T]
    want = torch.zeros(Bsz, T, H, D, dtype=F64)
    for t in range(T):
        for s in range(t + 1):
            qk = (q[:, t] * k[:, s]).sum(-1)  # [B, H]
            for s2 in range(t + 1):
                want[:, t] += qk[..., None] * W[None, :, t - s, t - s2, None] * v[:, s2]
    for fn in (naive_interdomain, lambda *a, **kw: chunk_interdomain(*a, chunk_size=4, **kw)):
        got = fn(q, k, v, log_lam, B, C, readout=readout)[0]
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_hermitian_weight_is_psd_and_transpose_is_not():
    """On random parameters the Hermitian W is PSD (a Gram matrix); at the layer's S4D-Inv initialisation the plain
    transpose's W is indefinite and its matched-pair weight W(τ, τ) is negative at some lags."""
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        log_lam, B, C = random_core(2, 6, g)
        W = pair_weight(basis(log_lam, B, C, 24), "hermitian")
        assert torch.linalg.eigvalsh(W).min() > -1e-10 * W.abs().max()
    torch.manual_seed(0)
    log_lam, B, C = S4DCore(4, 16).double()()
    kappa = basis(log_lam, B, C, 64)
    Wt, Wh = pair_weight(kappa, "transpose"), pair_weight(kappa, "hermitian")
    assert torch.linalg.eigvalsh(Wt).min() < -1e-3 * Wt.abs().max()
    assert (torch.diagonal(Wt, dim1=-2, dim2=-1) < 0).any()
    assert (torch.diagonal(Wh, dim1=-2, dim2=-1) >= 0).all()


def test_real_is_mean_of_transpose_and_hermitian_and_forms_agree():
    g = torch.Generator().manual_seed(5)
    Bsz, T, H, R, D, M = 1, 19, 2, 4, 4, 6
    log_lam, B, C = random_core(H, M, g)
    q, k, v = (torch.randn(Bsz, T, H, n, dtype=F64, generator=g) for n in (R, R, D))
    init = torch.randn(Bsz, H, M, R + D, dtype=C128, generator=g)
    outs = {}
    for ro in READOUTS:
        o_n, s_n = naive_interdomain(q, k, v, log_lam, B, C, initial_state=init, output_final_state=True, readout=ro)
        o_c, s_c = interdomain(q, k, v, log_lam, B, C, initial_state=init, output_final_state=True, chunk_size=5,
                               backend="reference", readout=ro)
        torch.testing.assert_close(o_c, o_n, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(s_c, s_n, rtol=1e-12, atol=1e-12)  # the state does not depend on the readout
        outs[ro] = o_n
    torch.testing.assert_close(outs["real"], 0.5 * (outs["transpose"] + outs["hermitian"]), rtol=1e-10, atol=1e-10)
    assert (outs["transpose"] - outs["hermitian"]).abs().max() > 1e-3  # the readouts do differ


def test_unknown_readout_is_one_clear_line():
    g = torch.Generator().manual_seed(1)
    log_lam, B, C = random_core(1, 4, g)
    q = torch.randn(1, 3, 1, 2, dtype=F64)
    for backend in ("naive", "reference"):
        with pytest.raises(ValueError, match="readout must be one of transpose, hermitian, real, got 'conj'"):
            interdomain(q, q, q, log_lam, B, C, backend=backend, readout="conj")


def test_s4d_inv_initialisation():
    """Im(A)_n = (N/π)(N/(2n+1) - 1) with N = 2M: every frequency >= 0, the top one ≈ 5174 at M = 64."""
    M = 64
    core = S4DCore(3, M)
    n = torch.arange(M, dtype=F64)
    want = (2 * M / math.pi) * (2 * M / (2 * n + 1) - 1)
    torch.testing.assert_close(core.A_im.detach().double(), want.expand(3, -1), rtol=1e-6, atol=1e-5)
    assert (core.A_im >= 0).all()
    assert abs(core.A_im.max().item() - 5174.0) < 1.0


def test_real_readout_is_c_transpose_of_re_c_p():
    """The one-pass "real" Triton form's identity: ½ (K₁ p + K₂ conj p) = Cᵀ Re(C p), and in the kernels' row form
    (per token, [T, M] rows) x = Re p Re Cᵀ − Im p Im Cᵀ, Re r = x Re C, Im r = x Im C; C non-symmetric."""
    from hybrid_attention.ops.interdomain.readout import readout_operators

    g = torch.Generator().manual_seed(5)
    H, M = 2, 6
    C = torch.randn(H, M, M, dtype=C128, generator=g)
    p = torch.randn(H, 7, M, dtype=C128, generator=g)
    k1, k2 = readout_operators(C, "real")
    want = torch.einsum("hmn,htn->htm", k1, p) + torch.einsum("hmn,htn->htm", k2, p.conj())
    x = p.real @ C.real.transpose(1, 2) - p.imag @ C.imag.transpose(1, 2)
    torch.testing.assert_close(x, torch.einsum("hnm,htm->htn", C, p).real)
    torch.testing.assert_close(torch.complex(x @ C.real, x @ C.imag), want)
