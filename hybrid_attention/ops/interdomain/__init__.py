"""Interdomain Attention core op: o_t = read(q_t, U_t, Γ_t) over a complex diagonal S4D state (see naive.py), with the
complex-to-real readout "transpose" Re(q_tᵀ U_tᵀ Γ_t), "hermitian" Re(q_tᵀ U_t^H Γ_t) or "real" (readout.py).

Backends: "naive" (token loop, the definition), "reference" (chunk-parallel PyTorch form), "triton" (chunked Triton
kernels, ``hybrid_attention.ops.interdomain.triton``) and "auto".
"""

from __future__ import annotations

import torch

from ..common.backend import resolve_backend
from ..common.ssm import validate_chunk_size
from . import triton as triton_backend
from .chunk import chunk_interdomain
from .naive import naive_interdomain
from .readout import DEFAULT_READOUT, READOUTS, validate_readout
from .triton import triton_interdomain

__all__ = ["interdomain", "naive_interdomain", "chunk_interdomain", "triton_interdomain", "BACKENDS", "READOUTS",
           "DEFAULT_READOUT"]

BACKENDS = ("auto", "reference", "naive", "triton")
_FORMS = {"reference": chunk_interdomain, "naive": naive_interdomain, "triton": triton_interdomain}


def interdomain(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    denominator: bool = False,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    backend: str = "auto",
    readout: str = DEFAULT_READOUT,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Interdomain Attention core, dispatched to a backend.

    Shapes: q, k ``[B, T, H, R]`` real; v ``[B, T, H, D]`` real; log_lam, B ``[H, M]`` complex (discretised);
    C ``[H, M, M]`` complex; initial_state ``[B, H, M, R + D]`` (``R + D + 1`` with ``denominator``) complex.
    log_lam, B and C may also be ``Planar`` (real, imaginary) pairs (``ops/common/planar.py``; ``S4DCore.planar()``):
    the "triton" glue then runs no complex op unless a state is passed in or returned; "naive" and "reference" join
    them into complex tensors (they are the oracles). Returns ``(o [B, T, H, D] in q.dtype, final_state or None)``.
    See ``naive_interdomain`` for the definition.

    ``backend``: "naive" runs the token loop; "reference" the chunk-parallel PyTorch form; "triton" the Triton
    kernels (float32 state math, bf16/fp16/fp32 activations, not float64); "auto" picks "triton" for CUDA inputs
    when triton imports and no input is float64, else "reference".

    ``cu_seqlens [N + 1]``: packed documents (B == 1, ``ops/common/varlen.py``): states start fresh at each
    document (or from ``initial_state [N, ...]``), final states ``[N, ...]``; every backend takes them ("auto"
    picks "triton" for CUDA inputs as without them; the Triton kernels read the offsets on the device, no host sync).
    """
    supported = lambda: all(t.is_cuda for t in (q, k, v)) and triton_backend.supported(q, k, v)  # noqa: E731
    backend = resolve_backend(backend, "interdomain", supported, BACKENDS, varlen=cu_seqlens is not None,
                              no_varlen=())
    validate_chunk_size(chunk_size)  # checked for every backend so that errors do not depend on the backend
    validate_readout(readout)
    fn = _FORMS[backend]
    extra = {} if backend == "naive" else {"chunk_size": chunk_size}  # the token loop has no chunks
    return fn(q, k, v, log_lam, B, C, denominator=denominator, initial_state=initial_state,
              output_final_state=output_final_state, readout=readout, cu_seqlens=cu_seqlens, **extra)
