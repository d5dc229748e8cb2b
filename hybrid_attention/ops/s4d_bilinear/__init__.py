"""Bilinear S4D core op: o_t = Re(diag(U_tᵀ Γ_t)) over the shared complex diagonal S4D state (see naive.py).

This is the bilinear (H3-style multiplicative) S4D mixer, kept as the stronger ``s4d_bilinear`` baseline; the
paper's S4D-only control (arXiv 2605.24330, §3) is the readout linear in the state, ``hybrid_attention.ops.s4d``.

Backends: "naive" (token loop, the definition), "reference" (chunk-parallel PyTorch form), "triton" (chunked Triton
kernels sharing the Interdomain op's state scans, ``hybrid_attention.ops.s4d_bilinear.triton``) and "auto".
"""

from __future__ import annotations

import torch

from ..common.backend import resolve_backend
from ..common.ssm import validate_chunk_size
from . import triton as triton_backend
from .chunk import chunk_s4d_bilinear
from .naive import naive_s4d_bilinear
from .triton import triton_s4d_bilinear

__all__ = ["s4d_bilinear", "naive_s4d_bilinear", "chunk_s4d_bilinear", "triton_s4d_bilinear", "BACKENDS"]

BACKENDS = ("auto", "reference", "naive", "triton")
_FORMS = {"reference": chunk_s4d_bilinear, "naive": naive_s4d_bilinear, "triton": triton_s4d_bilinear}


def s4d_bilinear(
    a: torch.Tensor,
    b: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    backend: str = "auto",
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Bilinear S4D core, dispatched to a backend.

    Shapes: a, b ``[B, T, H, R]`` real (R == D required); log_lam, B ``[H, M]`` complex (discretised);
    C ``[H, M, M]`` complex (log_lam, B and C may also be ``Planar`` (real, imaginary) pairs,
    ``ops/common/planar.py``: the reference forms join them); initial_state ``[B, H, M, 2R]`` complex. Returns
    ``(o [B, T, H, R] in a.dtype, final_state or None)``. See ``naive_s4d_bilinear`` for the definition.

    ``backend``: "naive" runs the token loop; "reference" the chunk-parallel PyTorch form; "triton" the Triton
    kernels (float32 state math, bf16/fp16/fp32 activations, not float64); "auto" picks "triton" for CUDA inputs
    when triton imports and no input is float64, else "reference".

    ``cu_seqlens [N + 1]``: packed documents (B == 1, ``ops/common/varlen.py``): states start fresh at each
    document (or from ``initial_state [N, ...]``), final states ``[N, ...]``; every backend takes them ("auto"
    picks "triton" for CUDA inputs as without them).
    """
    supported = lambda: a.is_cuda and b.is_cuda and triton_backend.supported(a, b)  # noqa: E731
    backend = resolve_backend(backend, "s4d_bilinear", supported, BACKENDS, varlen=cu_seqlens is not None,
                              no_varlen=())
    validate_chunk_size(chunk_size)  # checked for every backend so that errors do not depend on the backend
    fn = _FORMS[backend]
    extra = {} if backend == "naive" else {"chunk_size": chunk_size}  # the token loop has no chunks
    return fn(a, b, log_lam, B, C, initial_state=initial_state, output_final_state=output_final_state,
              cu_seqlens=cu_seqlens, **extra)
