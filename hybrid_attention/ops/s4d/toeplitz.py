"""Toeplitz form of the S4D-only control: the causal convolution as a lower-triangular matmul per head (optionally in
blocks that skip the zero upper part), the cheaper side at training lengths (T ~ 1-2K)."""

from __future__ import annotations

import torch

from ..common.autocast import AUTOCAST_DEVICES, autocast_off
from ..common.varlen import per_document
from .conv_form import conv_s4d

__all__ = ["toeplitz_s4d", "toeplitz_convolve", "default_block", "DENSE_MAX_T", "TOEPLITZ_BLOCK"]


# DECISION: one dense matmul up to DENSE_MAX_T tokens, blocks of TOEPLITZ_BLOCK rows above. A block skips the zero
# blocks above the diagonal (with n = ceil(T / block) blocks it does n (n + 1) / 2 of the n² block products) and builds
# one [block, n·block] block row instead of the T x T matrix; each block product is a smaller matmul. Evidence
# (`python -m benchmarks.s4d_conv --skip-model --skip-packed --toeplitz-blocks 4096 512 256`, bf16 autocast, H = 8,
# R = D = M = 64, forward + backward ms, eager / compiled): H100, 16 x 2048 dense 2.71 / 1.29, block 512 2.88 / 1.89,
# block 256 4.54 / 1.83; 4 x 4096 dense 4.46 / 6.53, block 512 2.52 / 1.84, block 256 3.33 / 2.77, FFT 4.11 / 4.48.
# H200 eager: 16 x 2048 dense 2.83, block 512 2.67 (compiled 1.69 / 1.81); 4 x 4096 dense 3.86, block 512 2.93, FFT
# 3.71. So "auto" runs this form up to 4096 tokens (ops/s4d/__init__.py).
DENSE_MAX_T = 2048
TOEPLITZ_BLOCK = 512


def default_block(T: int) -> int:
    """Rows per block of ``toeplitz_convolve`` at length T: T (one dense matmul) up to ``DENSE_MAX_T``, else
    ``TOEPLITZ_BLOCK`` (the DECISION above)."""
    return T if T <= DENSE_MAX_T else TOEPLITZ_BLOCK


def _block_row(K: torch.Tensor, block: int, n: int, *, transposed: bool = False) -> torch.Tensor:
    """One [block, n·block] strip of the lower-triangular Toeplitz matrix of K ``[H, n·block]`` (0 above the diagonal):
    ``[H, block, n·block]``.

    transposed=False: its last block row, entry [a, s] = K[(n-1)·block + a - s]; output block i reads its columns from
    (n-1-i)·block on (the rows of block i, shifted). transposed=True: its first block column, transposed, entry
    [c, r] = K[r - c]; input block j's gradient reads its first (n-j)·block columns."""
    i = torch.arange(block, device=K.device)[:, None]
    j = torch.arange(n * block, device=K.device)[None, :]
    lag = j - i if transposed else (n - 1) * block + i - j
    return torch.where(lag >= 0, K[:, lag.clamp(min=0)], K.new_zeros(()))


def _diagonal_sums(G: torch.Tensor, n_lags: int) -> torch.Tensor:
    """dK[h, l] = Σ_a G[h, a, (W - A) + a - l] for l = 0..n_lags-1 (n_lags <= W), entries outside G counting 0:
    ``[H, n_lags]`` from G ``[H, A, W]`` (A <= W; the block-row layout of ``_block_row``, lag = W - A + a - s).

    Each row of G gets A zeros on its left ([H, A, W + A]); element (a, a + j) then sits at offset
    a·(W + A + 1) + A + j of a head's block, and an index past either end of a row lands in padding zeros. So a
    strided view [H, A (a), W (j)] with strides (A·(W + A), W + A + 1, 1) holds every diagonal j = W - A - l as a
    column: summed over a with contiguous (coalesced) reads along j, then flipped to l. A sum along a stride-(W + 1)
    axis instead would read one memory sector per element on a GPU."""
    H, A, W = G.shape
    Gp = torch.cat([G.new_zeros(H, A, A), G], dim=2).contiguous()  # [H, A, W + A]
    j0 = W - A - (n_lags - 1)  # the diagonal of the largest lag (>= 1 - A)
    sums = Gp.as_strided((H, A, n_lags), (A * (W + A), W + A + 1, 1), A + j0).sum(1)  # column c: lag n_lags-1-c
    return sums.flip(-1)


def _mm_dtype(z: torch.Tensor) -> torch.dtype:
    dev = z.device.type
    if dev in AUTOCAST_DEVICES and torch.is_autocast_enabled(dev) and z.dtype == torch.float32:
        return torch.get_autocast_dtype(dev)
    return z.dtype


def _blocks(T: int, block: int) -> tuple[int, int]:
    """(block rows, block count n) for length T: one dense block when T <= block."""
    b = T if T <= block else block
    return b, -(-T // b)


def _heads_first(x: torch.Tensor, Tp: int) -> torch.Tensor:
    """x ``[B, T, H, C]`` -> ``[H, Tp, B·C]``, zero rows appended up to Tp >= T."""
    Bsz, T, H, C = x.shape
    xh = x.permute(2, 1, 0, 3).reshape(H, T, Bsz * C)
    return torch.nn.functional.pad(xh, (0, 0, 0, Tp - T)) if Tp > T else xh


def _padded(K: torch.Tensor, Tp: int) -> torch.Tensor:
    """K ``[H, T]`` with zero lags appended up to Tp."""
    return torch.nn.functional.pad(K, (0, Tp - K.shape[-1])) if Tp > K.shape[-1] else K


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The per-block results joined along time (no copy for a single block)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


class _ToeplitzConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: torch.Tensor, K: torch.Tensor, block: int) -> torch.Tensor:
        dt = _mm_dtype(z)
        zd = z.to(dt)  # the matmul operand; saved instead of z (bf16 under autocast: half the bytes, same values)
        ctx.save_for_backward(zd, K)
        ctx.mm_dtype, ctx.z_dtype, ctx.block = dt, z.dtype, block
        Bsz, T, H, C = z.shape
        b, n = _blocks(T, block)
        Tp = n * b
        with autocast_off(z.device.type):
            zh = _heads_first(zd, Tp)
            rows = _block_row(_padded(K.to(dt), Tp), b, n)  # [H, b, Tp]
            # output block i = (rows of block i) @ z[: (i+1) b]: the zero blocks right of the diagonal are skipped
            y = _joined([torch.matmul(rows[:, :, (n - 1 - i) * b :], zh[:, : (i + 1) * b]) for i in range(n)])
        return y[:, :T].reshape(H, T, Bsz, C).permute(2, 1, 0, 3).to(z.dtype)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        zd, K = ctx.saved_tensors  # zd: z in the matmul dtype
        dt = ctx.mm_dtype
        Bsz, T, H, C = zd.shape
        b, n = _blocks(T, ctx.block)
        Tp = n * b
        dz = dK = None
        with autocast_off(zd.device.type):
            dyh = _heads_first(dy.to(dt), Tp)
            if ctx.needs_input_grad[0]:  # input block j: (first block column)ᵀ @ dy[j b :]
                cols = _block_row(_padded(K.to(dt), Tp), b, n, transposed=True)  # [H, b, Tp]
                dz = _joined([torch.matmul(cols[:, :, : (n - j) * b], dyh[:, j * b :]) for j in range(n)])
                dz = dz[:, :T].reshape(H, T, Bsz, C).permute(2, 1, 0, 3).to(ctx.z_dtype)
            if ctx.needs_input_grad[1]:
                # G[a, s] = Σ_i Σ_{b,c} dy[i b + a] z[s - (n-1-i) b] (block i's products, right-aligned as in
                # _block_row, so lag = (n-1) b + a - s for every term); dK = sums along its diagonals
                zh = _heads_first(zd, Tp)
                if n == 1:
                    G = torch.matmul(dyh, zh.transpose(1, 2)).to(K.dtype)
                else:
                    G = torch.zeros(H, b, Tp, device=zd.device, dtype=K.dtype)
                    for i in range(n):
                        dyi = dyh[:, i * b : (i + 1) * b]
                        G[:, :, (n - 1 - i) * b :] += torch.matmul(dyi, zh[:, : (i + 1) * b].transpose(1, 2))
                dK = _diagonal_sums(G, T)
        return dz, dK, None


def toeplitz_convolve(z: torch.Tensor, K: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """Causal convolution along time as a block-lower-triangular Toeplitz matmul:
    y[b, t, h, c] = Σ_{s<=t} K[h, t-s] z[b, s, h, c]. z ``[B, T, H, C]``, K ``[H, T]`` (same real dtype); returns
    ``[B, T, H, C]`` in z's dtype. ``block``: rows per block (T <= block is one dense matmul); None:
    ``default_block(T)``."""
    if block is None:
        block = default_block(z.shape[1])
    if block < 1:
        raise ValueError(f"block must be a positive number of rows, got {block}")
    return _ToeplitzConv.apply(z, K, block)


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
    """S4D-only control through a Toeplitz matmul (equal to ``naive_s4d`` to rounding); shapes of ``conv_s4d``.

    Same contract as ``naive_s4d``; the kernel, initial-state and final-state terms are those of ``conv_form.py``. The
    convolution y[b, t, h, c] = Σ_{s<=t} K[h, t-s] z[b, s, h, c] is written as y_h = T_h z_h with the lower-triangular
    Toeplitz matrix T_h[t, s] = K[h, t-s] (s <= t): O(T²) multiply-adds per channel instead of the FFT's O(T log T), but
    as batched matmuls on tensor cores, which is the cheaper side at training lengths (T ~ 1-2K, where the FFT path is
    bound by memory traffic and eager complex elementwise work; ``python -m benchmarks.s4d_conv``). Memory: one
    [H, T, T] matrix per call up to ``DENSE_MAX_T`` (T = 2048, H = 8: 64 MB in bf16), one [H, block, T] block row
    above it; it is meant for T <= ~4K.

    Precision, decided here: the matmuls run in the dtype of the autocast region they are called in (bf16 under the
    training's bf16 autocast, like every Linear layer: the kernel K is then rounded to bf16, relative 2^-9), otherwise
    in the compute dtype (float32, or float64 for float64 inputs). The backward is written out (``_ToeplitzConv``):
    dz = T_hᵀ dy, and dK[h, l] = Σ_t Σ_{b,c} dy[t] z[t-l]: the block products dy z ᵀ summed into one [block, T] tile
    whose diagonals hold the lags, then summed along them through a strided view, so no scatter of T² entries.
    """
    return conv_s4d(toeplitz_convolve, a, b, log_lam, B, C, w, initial_state=initial_state,
                    output_final_state=output_final_state)
