"""Dense-Toeplitz form of the S4D-only control: the causal convolution as one lower-triangular matmul per head, the
cheaper side at training lengths (T ~ 1-2K)."""

from __future__ import annotations

import torch

from ..common.autocast import AUTOCAST_DEVICES, autocast_off
from ..common.varlen import per_document
from .conv_form import conv_s4d

__all__ = ["toeplitz_s4d", "toeplitz_convolve"]


def _toeplitz(K: torch.Tensor) -> torch.Tensor:
    """Lower-triangular Toeplitz matrices T[h, t, s] = K[h, t-s] for s <= t, else 0: ``[H, T, T]`` from K ``[H, T]``."""
    T = K.shape[-1]
    lag = torch.arange(T, device=K.device)[:, None] - torch.arange(T, device=K.device)[None, :]
    return torch.where(lag >= 0, K[:, lag.clamp(min=0)], K.new_zeros(()))


def _diagonal_sums(G: torch.Tensor) -> torch.Tensor:
    """S[h, l] = Σ_{t>=l} G[h, t, t-l] for l = 0..T-1 (sums along the lower diagonals): ``[H, T]`` from ``[H, T, T]``.

    Each row of G gets T zeros on its left ([H, T, 2T]); element (t, t-l) then sits at offset t·(2T+1) + 1 + l' in a
    head's block, with l' = T-1-l, and an upper-triangle position (t < l) falls into the zeros. So a strided view
    [H, T (t), T (l')] with strides (2T², 2T+1, 1) holds every diagonal as a column: summed over t with contiguous
    (coalesced) reads along l', then flipped back to l. A sum along a stride-(T+1) axis instead would read one
    memory sector per element on a GPU."""
    H, T, _ = G.shape
    Gp = torch.cat([G.new_zeros(H, T, T), G], dim=2).contiguous()  # [H, T, 2T]
    return Gp.as_strided((H, T, T), (2 * T * T, 2 * T + 1, 1), 1).sum(1).flip(-1)


def _mm_dtype(z: torch.Tensor) -> torch.dtype:
    dev = z.device.type
    if dev in AUTOCAST_DEVICES and torch.is_autocast_enabled(dev) and z.dtype == torch.float32:
        return torch.get_autocast_dtype(dev)
    return z.dtype


class _ToeplitzConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
        dt = _mm_dtype(z)
        zd = z.to(dt)  # the matmul operand; saved instead of z (bf16 under autocast: half the bytes, same values)
        ctx.save_for_backward(zd, K)
        ctx.mm_dtype, ctx.z_dtype = dt, z.dtype
        Bsz, T, H, C = z.shape
        with autocast_off(z.device.type):
            zh = zd.permute(2, 1, 0, 3).reshape(H, T, Bsz * C)  # [H, T, B·C]
            y = torch.matmul(_toeplitz(K.to(dt)), zh)  # [H, T, B·C]
        return y.reshape(H, T, Bsz, C).permute(2, 1, 0, 3).to(z.dtype)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        zd, K = ctx.saved_tensors  # zd: z in the matmul dtype
        dt = ctx.mm_dtype
        Bsz, T, H, C = zd.shape
        with autocast_off(zd.device.type):
            dyh = dy.to(dt).permute(2, 1, 0, 3).reshape(H, T, Bsz * C)
            dz = dK = None
            if ctx.needs_input_grad[0]:
                dz = torch.matmul(_toeplitz(K.to(dt)).transpose(1, 2), dyh)
                dz = dz.reshape(H, T, Bsz, C).permute(2, 1, 0, 3).to(ctx.z_dtype)
            if ctx.needs_input_grad[1]:
                zh = zd.permute(2, 1, 0, 3).reshape(H, T, Bsz * C)
                G = torch.matmul(dyh, zh.transpose(1, 2))  # [H, T (t), T (s)] = Σ_{b,c} dy[t] z[s]
                dK = _diagonal_sums(G.to(K.dtype))
        return dz, dK


def toeplitz_convolve(z: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Causal convolution along time as a Toeplitz matmul: y[b, t, h, c] = Σ_{s<=t} K[h, t-s] z[b, s, h, c].
    z ``[B, T, H, C]``, K ``[H, T]`` (same real dtype); returns ``[B, T, H, C]`` in z's dtype."""
    return _ToeplitzConv.apply(z, K)


@per_document(tokens=("a", "b"))
def toeplitz_s4d(
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
    """S4D-only control through a dense Toeplitz matmul (equal to ``naive_s4d`` to rounding); shapes of ``conv_s4d``.

    Same contract as ``naive_s4d``; the kernel, initial-state and final-state terms are those of ``conv_form.py``. The
    convolution y[b, t, h, c] = Σ_{s<=t} K[h, t-s] z[b, s, h, c] is written as y_h = T_h z_h with the lower-triangular
    Toeplitz matrix T_h[t, s] = K[h, t-s] (s <= t): O(T²) multiply-adds per channel instead of the FFT's O(T log T), but
    as batched matmuls on tensor cores, which is the cheaper side at training lengths (T ~ 1-2K, where the FFT path is
    bound by memory traffic and eager complex elementwise work; ``python -m benchmarks.s4d_conv``). Memory: one
    [H, T, T] matrix per call (T = 1024, H = 8: 32 MB in float32), so it is meant for T <= ~4K.

    Precision, decided here: the matmuls run in the dtype of the autocast region they are called in (bf16 under the
    training's bf16 autocast, like every Linear layer: the kernel K is then rounded to bf16, relative 2^-9), otherwise
    in the compute dtype (float32, or float64 for float64 inputs). The backward is written out (``_ToeplitzConv``):
    dz = T_hᵀ dy, and dK[h, l] = Σ_t G_h[t, t-l] with G_h = Σ_{b,c} dy z ᵀ (one matmul, then sums along its
    diagonals through a strided view), so no scatter of T² entries.
    """
    return conv_s4d(toeplitz_convolve, a, b, log_lam, B, C, w, initial_state=initial_state,
                    output_final_state=output_final_state)
