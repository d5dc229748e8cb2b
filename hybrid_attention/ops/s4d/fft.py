"""FFT-convolution form of the S4D-only control (exact, differentiable by autograd): the default fast path.

The shared convolution view (kernel, initial-state and final-state terms) is ``conv_form.py``; this file holds the
convolution: torch.fft.rfft/irfft at a 5-smooth size n >= 2T (zero-padded, no wrap-around), O(T log T) per channel,
in float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import torch

from ..common.varlen import per_document
from .conv_form import conv_s4d

__all__ = ["fft_s4d", "fft_size", "fft_convolve"]


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


def fft_convolve(z: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Causal convolution along time: y[b, t, h, c] = Σ_{s<=t} K[h, t-s] z[b, s, h, c]. z ``[B, T, H, C]``, K ``[H, T]``
    (same real dtype); returns ``[B, T, H, C]``."""
    T = z.shape[1]
    n = fft_size(2 * T)
    Zf = torch.fft.rfft(z, n=n, dim=1)  # [B, F, H, C]
    Kf = torch.fft.rfft(K, n=n, dim=1)  # [H, F]
    return torch.fft.irfft(Zf * Kf.transpose(0, 1)[None, :, :, None], n=n, dim=1)[:, :T]


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
    """S4D-only control as an FFT convolution (equal to ``naive_s4d`` to rounding); the shapes of ``conv_s4d``."""
    return conv_s4d(fft_convolve, a, b, log_lam, B, C, w, initial_state=initial_state,
                    output_final_state=output_final_state)
