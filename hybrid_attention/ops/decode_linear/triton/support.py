"""Which inputs the decode GEMV Triton kernels handle (importable without triton)."""

from __future__ import annotations

import torch

from ...common.triton import HAS_TRITON

__all__ = ["MAX_ROWS", "supported"]

MAX_ROWS = 8  # the kernels keep all rows of x in one program: decode batch sizes only
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def supported(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether the Triton kernels run these inputs natively: triton imports, CUDA tensors of one floating dtype
    (float16 / bfloat16 / float32 / float64), B <= MAX_ROWS rows, contiguous weights. x ``[B, K]``, weights
    ``[N, K]`` (and the residual ``[B, K]`` of ``add_norm_linear``). Under the interpreter CPU tensors run too, but
    only when asked for by name (backend="triton"), as every op here."""
    return (HAS_TRITON and x.is_cuda and x.dtype in _DTYPES and x.shape[0] <= MAX_ROWS
            and all(w.is_cuda and w.dtype == x.dtype and w.is_contiguous() for w in weights))
