"""Which inputs the causal-convolution Triton kernels handle (importable without triton)."""

from __future__ import annotations

import torch

from ...common.triton import HAS_TRITON, interpreting

__all__ = ["MAX_KERNEL_SIZE", "supported"]

# The kernels unroll the K lags (the backward K² of them): widths up to 8 cover every short convolution in use (4).
MAX_KERNEL_SIZE = 8


def supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernels run these inputs: triton importable, CUDA tensors (or the interpreter), no float64 (the
    kernels compute in float32; float64 stays on the reference form), kernel width K <= ``MAX_KERNEL_SIZE``."""
    if not HAS_TRITON or torch.float64 in (x.dtype, weight.dtype) or weight.shape[-1] > MAX_KERNEL_SIZE:
        return False
    return (x.is_cuda and weight.is_cuda) or interpreting()
