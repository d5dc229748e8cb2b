"""The S4D-only control as a causal convolution (the S4 convolution view), with the convolution itself left to the
caller: ``fft.py`` (rfft/irfft, O(T log T)) or ``toeplitz.py`` (a dense Toeplitz matmul, O(T²) on tensor cores)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..common.autocast import autocast_off
from ..common.planar import Planar, cexp_scaled
from ..common.planar import cmul as _cmul
from ..common.ssm import compute_dtypes, prepare_planar_params
from .naive import validate_s4d_inputs

__all__ = ["conv_s4d", "ssm_kernel", "Convolve"]


Convolve = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _vandermonde(log_lam: Planar, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Re, Im) of λ^l = exp(l·log_lam) for l = 0..L-1, float64 ``[H, L, M]`` (log_lam planar float64 ``[H, M]``)."""
    ll = torch.arange(L, device=log_lam.device, dtype=torch.float64)[None, :, None]
    return cexp_scaled(log_lam.map(lambda t: t[:, None, :]), ll)


def _tables(log_lam, B, C, w, L: int) -> tuple[Planar, Planar, torch.Tensor, torch.Tensor]:
    """float64 planar tables: c̃ = Cᵀw and B (``Planar`` ``[H, M]``) and (Re, Im) of λ^l for l = 0..L-1
    (``[H, L, M]``). log_lam, B, C: complex tensors or ``Planar`` pairs (``prepare_planar_params``)."""
    ll, Bp, Cp = prepare_planar_params(log_lam, B, C, torch.float64)
    w64 = w.to(torch.float64)
    ct = Cp.map(lambda t: torch.einsum("hm,hmn->hn", w64, t))  # w real: Cᵀw part by part
    return ct, Bp, *_vandermonde(ll, L)


def _kernel(ct: Planar, Bc: Planar, Vr: torch.Tensor, Vi: torch.Tensor) -> torch.Tensor:
    """K_h(l) = Re(Σ_m c̃_m B_m λ_m^l) for the rows l of (Vr, Vi): float64 ``[H, L]``."""
    gr, gi = _cmul(ct.re, ct.im, Bc.re, Bc.im)
    return torch.einsum("hn,hln->hl", gr, Vr) - torch.einsum("hn,hln->hl", gi, Vi)


def ssm_kernel(log_lam: torch.Tensor, B: torch.Tensor, C: torch.Tensor, w: torch.Tensor, L: int) -> torch.Tensor:
    """The convolution kernel K_h(l) = Re(Σ_m c̃_m B_m λ_m^l), c̃_h = C_hᵀ w_h, l = 0..L-1: float64 ``[H, L]``.
    log_lam, B, C: complex tensors or ``Planar`` pairs."""
    return _kernel(*_tables(log_lam, B, C, w, L))


def conv_s4d(
    convolve: Convolve,
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
    """S4D-only control as the causal convolution ``convolve(z, K)`` (equal to ``naive_s4d`` to rounding).

    Shapes: a ``[B, T, H, R]``, b ``[B, T, H, D]`` real; log_lam, B ``[H, M]`` complex; C ``[H, M, M]`` complex
    (or each a ``Planar`` pair of real tensors: no complex op then on the path without states); w ``[H, M]`` real;
    initial_state ``[B, H, M, R + D]`` complex. Any T >= 0. Returns ``y [B, T, H, R + D]`` in ``a.dtype`` and the
    final raw state X_T (complex128 for float64 inputs, else complex64) or ``None``: the states are complex by
    contract, split or joined only here, at the boundary.

    Same contract as ``naive_s4d`` (see naive.py for the definition). The readout is linear in the state, so with
    c̃_h = C_hᵀ w_h ∈ C^M (only this product of C and w matters) the layer is a per-channel causal convolution::

        y_t[c] = Σ_{s<=t} K_h(t - s) z_s[c] + Re(Σ_m c̃_m λ_m^{t+1} X0[m, c]),   K_h(l) = Re(Σ_m c̃_m B_m λ_m^l),
        X_T = λ^T ⊙ X0 + Σ_s λ^{T-1-s} B z_sᵀ

    (the S4 convolution view). The Vandermonde table λ^l = exp(l·log λ) is built in float64 in real arithmetic
    (|λ|^l·(cos, sin)(l·Im log λ)): the phases l·Im(log λ) reach ~1e6 rad at T = 4K, where float32 would lose ~0.1 rad.
    The kernel, the initial-state table and the final-state weights are then cast to the real compute dtype (float32,
    or float64 for float64 inputs; bf16/fp16 inputs are computed in float32 and the output cast back to ``a.dtype``).
    ``conv_s4d`` takes the causal convolution ``convolve(z [B, T, H, C], K [H, T]) -> [B, T, H, C]`` as an argument:
    ``fft.py`` (rfft/irfft, O(T log T)) and ``toeplitz.py`` (a dense lower-triangular Toeplitz matmul, O(T²) on tensor
    cores). The initial-state term (only with ``initial_state``) and the final state (only with ``output_final_state``)
    are real einsums against the λ tables; no per-token M×(R+D) state is materialised.
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

    y = convolve(z, K.to(rdtype))  # causal, along time, per (batch, head, channel)

    # The state terms run outside any autocast region, in the compute dtype: under bf16 autocast the einsums would be
    # rounded to bf16 and torch.complex refuses bf16 parts (the final state broke every autocast prefill).
    with autocast_off(a.device.type):
        if X0 is not None:  # Re(Σ_m c̃_m λ_m^{t+1} X0[m, c]) for t = 0..T-1
            Pr, Pi = _cmul(ct.re[:, None, :], ct.im[:, None, :], Vr[:, 1:], Vi[:, 1:])  # [H, T, M]
            y = y.to(rdtype) + (
                torch.einsum("htm,bhmc->bthc", Pr.to(rdtype), X0.real)
                - torch.einsum("htm,bhmc->bthc", Pi.to(rdtype), X0.imag)
            )

        final = None
        if output_final_state:  # X_T = λ^T ⊙ X0 + Σ_s λ^{T-1-s} B z_sᵀ
            Wr, Wi = _cmul(Bc.re[:, None, :], Bc.im[:, None, :], Vr[:, :T].flip(1), Vi[:, :T].flip(1))  # [H, T, M]
            final = torch.complex(
                torch.einsum("hsm,bshc->bhmc", Wr.to(rdtype), z), torch.einsum("hsm,bshc->bhmc", Wi.to(rdtype), z)
            )
            if X0 is not None:
                final = final + torch.complex(Vr[:, T], Vi[:, T]).to(cdtype)[None, :, :, None] * X0
    return y.to(out_dtype), final
