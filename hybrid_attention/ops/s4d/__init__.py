"""S4D-only control core op: o_t = Re(diag(U_tᵀ Γ_t)) over the shared complex diagonal S4D state (see naive.py).

Backends: "naive" (token loop, the definition), "reference" (chunk-parallel PyTorch form) and "auto".
"""

from __future__ import annotations

import torch

from ..interdomain.chunk import validate_chunk_size
from .chunk import chunk_s4d
from .naive import naive_s4d

__all__ = ["s4d", "naive_s4d", "chunk_s4d", "BACKENDS"]

BACKENDS = ("auto", "reference", "naive")


def s4d(
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """S4D-only core, dispatched to a backend.

    Shapes: a, b ``[B, T, H, R]`` real (R == D required); log_lam, B ``[H, M]`` complex (discretised);
    C ``[H, M, M]`` complex; initial_state ``[B, H, M, 2R]`` complex. Returns ``(o [B, T, H, R] in a.dtype,
    final_state or None)``. See ``naive_s4d`` for the definition.

    ``backend``: "naive" runs the token loop; "reference" the chunk-parallel PyTorch form; "auto" currently also
    runs the chunk-parallel PyTorch form, on every device, because it is the only chunked implementation that exists.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of 'auto', 'reference', 'naive', got {backend!r}")
    validate_chunk_size(chunk_size)  # checked for every backend so that errors do not depend on the backend
    if backend == "naive":
        return naive_s4d(a, b, log_lam, B, C, initial_state=initial_state, output_final_state=output_final_state)
    return chunk_s4d(
        a,
        b,
        log_lam,
        B,
        C,
        initial_state=initial_state,
        output_final_state=output_final_state,
        chunk_size=chunk_size,
    )
