"""Which inputs the gated-delta Triton kernels handle (importable without triton)."""

from __future__ import annotations

import torch

from ...common.triton import HAS_TRITON, interpreting

__all__ = ["supported"]


def supported(q: torch.Tensor, v: torch.Tensor, chunk_size: int) -> bool:
    """Whether the Triton path handles these inputs (else callers fall back to the PyTorch chunk form).

    Requirements: triton importable, CUDA tensors (or the interpreter), not float64, chunk size a power of two in
    [16, 128], K <= 256. q ``[B, T, H, K]``, v ``[B, T, H, V]``.
    """
    if not HAS_TRITON or q.dtype == torch.float64 or v.dtype == torch.float64:
        return False
    if not (q.is_cuda or interpreting()):
        return False
    if chunk_size not in (16, 32, 64, 128):
        return False
    return q.shape[-1] <= 256
