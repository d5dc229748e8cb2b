"""Which inputs the split-KV decode attention kernel handles (importable without triton)."""

from __future__ import annotations

import torch

from ...common.triton import HAS_TRITON, interpreting

__all__ = ["supported"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernel runs these inputs: triton importable, CUDA tensors (or the interpreter), float16 /
    bfloat16 / float32 (it accumulates in float32; float64 stays on the reference form), contiguous K / V buffers.
    q ``[B, H, D]``, k ``[B, H, L, D]``, v ``[B, H, L, DV]``. The decode steps of the layers choose it by their
    ``use_kernels`` flag (``ops.common.backend.kernels_backend``), not by this rule."""
    if not HAS_TRITON or any(t.dtype not in _DTYPES for t in (q, k, v)):
        return False
    if not (k.is_contiguous() and v.is_contiguous()):
        return False
    return all(t.is_cuda for t in (q, k, v)) or interpreting()
