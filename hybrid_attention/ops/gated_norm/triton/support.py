"""Which inputs the gated-RMSNorm Triton kernels handle (importable without triton)."""

from __future__ import annotations

import torch

from ...common.triton import HAS_TRITON, interpreting

__all__ = ["MAX_DIM", "supported"]

# One program holds whole rows of D values: widths up to 1024 cover every head (the GDN value heads are 128 / 256).
MAX_DIM = 1024


def supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernels run these inputs: triton importable, CUDA tensors (or the interpreter), no float64 (the
    kernels compute in float32), D <= ``MAX_DIM``."""
    if not HAS_TRITON or torch.float64 in (x.dtype, weight.dtype) or x.shape[-1] > MAX_DIM:
        return False
    return (x.is_cuda and weight.is_cuda) or interpreting()
