"""FFT-convolution form of the S4D-only control (exact, differentiable by autograd): the default fast path.

The shared convolution view (kernel, initial-state and final-state terms) is ``conv_form.py``; this file holds the
convolution: torch.fft.rfft/irfft at a 5-smooth size n >= 2T (zero-padded, no wrap-around), O(T log T) per channel,
in float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import torch

from ..common.varlen import per_document
from .conv_form import conv_s4d

__all__ = ["fft_s4d", "fft_size", "fft_convolve", "s4d_fft_convolve"]


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


def _causal_convolve(z: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """The FFT convolution itself (see ``fft_convolve``), differentiable by autograd."""
    T = z.shape[1]
    n = fft_size(2 * T)
    Zf = torch.fft.rfft(z, n=n, dim=1)  # [B, F, H, C]
    Kf = torch.fft.rfft(K, n=n, dim=1)  # [H, F]
    return torch.fft.irfft(Zf * Kf.transpose(0, 1)[None, :, :, None], n=n, dim=1)[:, :T]


def fft_convolve(z: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Causal convolution along time: y[b, t, h, c] = Σ_{s<=t} K[h, t-s] z[b, s, h, c]. z ``[B, T, H, C]``, K ``[H, T]``
    (same real dtype); returns ``[B, T, H, C]``.

    Eager calls run the FFTs under autograd. Under ``torch.compile`` the convolution and its backward are two custom
    ops, opaque to the compiler: CPU inductor of torch 2.11 gives ``aten._fft_r2c`` a wrong fake stride and the
    compiled s4d training step crashes (``pytest tests/models/test_compile.py -k s4d``). Inductor generates no code
    for the complex FFT nodes anyway (they run as eager ATen kernels), so the opaque form fuses nothing less.
    """
    if torch.compiler.is_compiling():
        return s4d_fft_convolve(z, K)
    return _causal_convolve(z, K)


@torch.library.custom_op("hybrid_attention::s4d_fft_convolve", mutates_args=())
def s4d_fft_convolve(z: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """``fft_convolve`` as one op: z ``[B, T, H, C]``, K ``[H, T]`` -> contiguous ``[B, T, H, C]``."""
    return _causal_convolve(z, K).contiguous()


@s4d_fft_convolve.register_fake
def _(z: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    return z.new_empty(z.shape)


@torch.library.custom_op("hybrid_attention::s4d_fft_convolve_backward", mutates_args=())
def s4d_fft_convolve_backward(dy: torch.Tensor, z: torch.Tensor, K: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``s4d_fft_convolve``: dz[s] = Σ_{t>=s} K[t-s] dy[t] and dK[l] = Σ_{b,c} Σ_t dy[t] z[t-l], both
    cross-correlations by FFT at the forward's size n >= 2T (the zero padding keeps the wrap-around out).
    dy, z ``[B, T, H, C]``, K ``[H, T]`` -> (dz ``[B, T, H, C]``, dK ``[H, T]``), contiguous. The conjugates are
    materialised: run from an AOT-compiled graph, the op lost a lazy ``conj()`` bit (torch 2.13,
    ``torch.library.opcheck``'s ``test_aot_dispatch_static`` on this op)."""
    T = z.shape[1]
    n = fft_size(2 * T)
    dyf = torch.fft.rfft(dy.to(z.dtype), n=n, dim=1)  # [B, F, H, C]
    Kf = torch.fft.rfft(K, n=n, dim=1)  # [H, F]
    dz = torch.fft.irfft(dyf * Kf.conj_physical().transpose(0, 1)[None, :, :, None], n=n, dim=1)[:, :T]
    Zf = torch.fft.rfft(z, n=n, dim=1)
    dK = torch.fft.irfft((dyf * Zf.conj_physical()).sum((0, 3)).transpose(0, 1), n=n, dim=1)[:, :T]
    return dz.contiguous(), dK.contiguous()


@s4d_fft_convolve_backward.register_fake
def _(dy: torch.Tensor, z: torch.Tensor, K: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return z.new_empty(z.shape), K.new_empty(K.shape)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z, K = ctx.saved_tensors
    return s4d_fft_convolve_backward(dy, z, K)


s4d_fft_convolve.register_autograd(_backward, setup_context=_setup_context)


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
