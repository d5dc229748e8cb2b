"""Which inputs the bilinear S4D Triton kernels handle (importable without triton)."""

from __future__ import annotations

import torch

from ...common.triton import HAS_TRITON, interpreting

__all__ = ["supported"]


def supported(*tensors: torch.Tensor) -> bool:
    """Whether the kernels run these activations (a, b): triton importable, CUDA tensors (or the interpreter), no
    float64 (the kernels compute in float32; float64 stays on the reference form)."""
    if not HAS_TRITON or any(t.dtype == torch.float64 for t in tensors):
        return False
    return all(t.is_cuda for t in tensors) or interpreting()
