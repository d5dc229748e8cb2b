"""Triton backend of the decode GEMVs (`norm_linear`, `add_norm_linear`, `linear_residual`). Importable without
triton: ``HAS_TRITON`` says whether the kernels are available, ``supported(x, *weights)`` (``support.py``) whether
they handle these inputs, and without triton the entry points raise a clear RuntimeError."""

from __future__ import annotations

from ...common.triton import HAS_TRITON, missing
from .support import MAX_ROWS, supported

if HAS_TRITON:
    from .kernel import add_norm_linear, linear_residual, norm_linear
else:  # pragma: no cover - depends on the environment
    norm_linear = missing("norm_linear")
    add_norm_linear = missing("add_norm_linear")
    linear_residual = missing("linear_residual")


__all__ = ["HAS_TRITON", "MAX_ROWS", "supported", "add_norm_linear", "linear_residual", "norm_linear"]
