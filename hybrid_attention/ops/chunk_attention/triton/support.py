"""Which inputs the chunk-attention Triton kernels handle (importable without triton)."""

from __future__ import annotations

import torch

from ...common.triton import HAS_TRITON, interpreting

__all__ = ["supported"]


def supported(q: torch.Tensor, v: torch.Tensor, chunk_size: int) -> bool:
    """Whether the kernels run these inputs: triton importable, CUDA tensors (or the interpreter), not float64, chunk
    size a power of two in [16, 128], head dims <= 256. q ``[B, T, Hs, Dk]``, v ``[B, T, Hs, Dv]``."""
    if not HAS_TRITON or q.dtype == torch.float64 or v.dtype == torch.float64:
        return False
    if not (q.is_cuda or interpreting()):
        return False
    return chunk_size in (16, 32, 64, 128) and q.shape[-1] <= 256 and v.shape[-1] <= 256
