"""Which inputs the gated-delta Triton kernels handle (importable without triton)."""

from __future__ import annotations

import torch

from ...common.triton import HAS_TRITON, interpreting

__all__ = ["supported"]


def supported(q: torch.Tensor, v: torch.Tensor, chunk_size: int) -> bool:
    """Whether the Triton path handles these inputs (else callers fall back to the PyTorch chunk form).

    Requirements: triton importable, CUDA tensors (or the interpreter), not float64, chunk size a power of two in
    [16, 128], K <= 256, and chunk 128 only with K <= 32. q ``[B, T, H, K]``, v ``[B, T, H, V]``.

    Chunk 128 (H200, triton 3.6): at K 128 / V 256 with fp32 activations the state forward asks for 428 KB of shared
    memory (the limit is 227 KB: OutOfResources), and the bf16 launch at that shape (8 warps, 32-wide tiles) hits an
    illegal memory access; K 16 and K 32 / V 64 pass on the H200 against float64, forward and
    backward (tests/ops/test_gated_delta_triton.py). The state
    kernels hold [C, K] tiles of w and k per pipeline stage, so the need scales with C·K: K <= 32 keeps it at about
    a quarter of the failing case. Larger heads at chunk 128 take the PyTorch chunk form.
    """
    if not HAS_TRITON or q.dtype == torch.float64 or v.dtype == torch.float64:
        return False
    if not (q.is_cuda or interpreting()):
        return False
    if chunk_size not in (16, 32, 64, 128) or (chunk_size == 128 and q.shape[-1] > 32):
        return False
    return q.shape[-1] <= 256
