"""FFT-convolution form of the S4D-only control (exact, differentiable by autograd): the fast path on every device.

Same contract as ``naive_s4d`` (see naive.py for the definition). The readout is linear in the state, so with
c̃_h = C_hᵀ w_h ∈ C^M (only this product of C and w matters) the layer is a per-channel causal convolution::

    y_t[c] = Σ_{s<=t} K_h(t - s) z_s[c] + Re(Σ_m c̃_m λ_m^{t+1} X0[m, c]),   K_h(l) = Re(Σ_m c̃_m B_m λ_m^l),
    X_T = λ^T ⊙ X0 + Σ_s λ^{T-1-s} B z_sᵀ

(the S4 convolution view). The Vandermonde table λ^l = exp(l·log λ) is built in float64 in real arithmetic
(|λ|^l·(cos, sin)(l·Im log λ)): the phases l·Im(log λ) reach ~1e6 rad at T = 4K, where float32 would lose ~0.1 rad.
The kernel, the initial-state table and the final-state weights are then cast to the real compute dtype (float32,
or float64 for float64 inputs; bf16/fp16 inputs are computed in float32 and the output cast back to ``a.dtype``).
The convolution runs as torch.fft.rfft/irfft at a 5-smooth size n >= 2T (no wrap-around). The initial-state term
(only with ``initial_state``) and the final state (only with ``output_final_state``) are real einsums against the
λ tables; no per-token M×(R+D) state is materialised: the cost is O(T log T) per channel plus O(T·M) per channel
for the optional state terms.
"""

from __future__ import annotations

import torch

from ..common.ssm import compute_dtypes, prepare_ssm_params
from ..common.varlen import per_document
from .naive import validate_s4d_inputs

__all__ = ["fft_s4d", "fft_size", "ssm_kernel"]


def fft_size(n: int) -> int:
    """Smallest 2^i·3^j·5^k >= max(n, 1): a size that pocketfft and cuFFT transform fast."""
    n = max(int(n), 1)
    best = 1 << (n - 1).bit_length()  # next power of two, an upper bound
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def _vandermonde(log_lam: torch.Tensor, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Re, Im) of λ^l = exp(l·log_lam) for l = 0..L-1, float64 ``[H, L, M]`` (log_lam complex128 ``[H, M]``)."""
    ll = torch.arange(L, device=log_lam.device, dtype=torch.float64)[None, :, None]
    mag = torch.exp(log_lam.real[:, None, :] * ll)
    phase = log_lam.imag[:, None, :] * ll
    return mag * torch.cos(phase), mag * torch.sin(phase)


def _cmul(xr, xi, yr, yi):
    return xr * yr - xi * yi, xr * yi + xi * yr


def _tables(log_lam, B, C, w, L: int):
    """float64 tables: c̃ = Cᵀw and B (complex128 ``[H, M]``) and (Re, Im) of λ^l for l = 0..L-1 (``[H, L, M]``)."""
    ll, Bc, Cc = prepare_ssm_params(log_lam, B, C, torch.complex128)
    ct = torch.einsum("hm,hmn->hn", w.to(torch.float64).to(torch.complex128), Cc)
    return ct, Bc, *_vandermonde(ll, L)


def _kernel(ct, Bc, Vr, Vi) -> torch.Tensor:
    """K_h(l) = Re(Σ_m c̃_m B_m λ_m^l) for the rows l of (Vr, Vi): float64 ``[H, L]``."""
    g = ct * Bc
    return torch.einsum("hn,hln->hl", g.real, Vr) - torch.einsum("hn,hln->hl", g.imag, Vi)


def ssm_kernel(log_lam: torch.Tensor, B: torch.Tensor, C: torch.Tensor, w: torch.Tensor, L: int) -> torch.Tensor:
    """The convolution kernel K_h(l) = Re(Σ_m c̃_m B_m λ_m^l), c̃_h = C_hᵀ w_h, l = 0..L-1: float64 ``[H, L]``."""
    return _kernel(*_tables(log_lam, B, C, w, L))


@per_document(tokens=("a", "b"))
def fft_s4d(
    a: torch.Tensor,
    b: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    w: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """S4D-only control as an FFT convolution (equal to ``naive_s4d`` to rounding).

    Shapes: a ``[B, T, H, R]``, b ``[B, T, H, D]`` real; log_lam, B ``[H, M]`` complex; C ``[H, M, M]`` complex;
    w ``[H, M]`` real; initial_state ``[B, H, M, R + D]`` complex. Any T >= 0. Returns ``y [B, T, H, R + D]`` in
    ``a.dtype`` and the final raw state X_T (complex128 for float64 inputs, else complex64) or ``None``.
    """
    validate_s4d_inputs(a, b, log_lam, B, C, w, initial_state)
    Bsz, T, H, R = a.shape
    D = b.shape[-1]
    M = log_lam.shape[1]
    out_dtype = a.dtype
    rdtype, cdtype = compute_dtypes(a, b)
    X0 = None if initial_state is None else initial_state.to(cdtype)
    if T == 0:
        y = a.new_zeros(Bsz, 0, H, R + D, dtype=out_dtype)
        if not output_final_state:
            return y, None
        return y, (X0 if X0 is not None else torch.zeros(Bsz, H, M, R + D, dtype=cdtype, device=a.device))

    z = torch.cat([a.to(rdtype), b.to(rdtype)], dim=-1)  # [B, T, H, R + D]
    ct, Bc, Vr, Vi = _tables(log_lam, B, C, w, T + 1)  # float64; row T of λ^l only for the state terms
    K = _kernel(ct, Bc, Vr[:, :T], Vi[:, :T])  # [H, T]

    # causal convolution along time, per (batch, head, channel): zero-padded to n >= 2T, no wrap-around
    n = fft_size(2 * T)
    Zf = torch.fft.rfft(z, n=n, dim=1)  # [B, F, H, R + D]
    Kf = torch.fft.rfft(K.to(rdtype), n=n, dim=1)  # [H, F]
    y = torch.fft.irfft(Zf * Kf.transpose(0, 1)[None, :, :, None], n=n, dim=1)[:, :T]

    if X0 is not None:  # Re(Σ_m c̃_m λ_m^{t+1} X0[m, c]) for t = 0..T-1
        Pr, Pi = _cmul(ct.real[:, None, :], ct.imag[:, None, :], Vr[:, 1:], Vi[:, 1:])  # [H, T, M]
        y = y + (
            torch.einsum("htm,bhmc->bthc", Pr.to(rdtype), X0.real)
            - torch.einsum("htm,bhmc->bthc", Pi.to(rdtype), X0.imag)
        )

    final = None
    if output_final_state:  # X_T = λ^T ⊙ X0 + Σ_s λ^{T-1-s} B z_sᵀ
        Wr, Wi = _cmul(Bc.real[:, None, :], Bc.imag[:, None, :], Vr[:, :T].flip(1), Vi[:, :T].flip(1))  # [H, T, M]
        final = torch.complex(
            torch.einsum("hsm,bshc->bhmc", Wr.to(rdtype), z), torch.einsum("hsm,bshc->bhmc", Wi.to(rdtype), z)
        )
        if X0 is not None:
            final = final + torch.complex(Vr[:, T], Vi[:, T]).to(cdtype)[None, :, :, None] * X0
    return y.to(out_dtype), final
