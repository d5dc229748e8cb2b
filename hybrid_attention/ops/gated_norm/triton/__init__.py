"""Triton backend of the gated RMSNorm (``kernels.py``: the two kernels; ``ops.py``: the autograd / torch.library
side). Importable without triton: ``supported`` says whether the kernels take these inputs, and without triton
``triton_gated_rms_norm`` raises a clear ``RuntimeError``."""

from __future__ import annotations

from ...common.triton import HAS_TRITON, missing
from .support import MAX_DIM, supported

if HAS_TRITON:
    from .ops import triton_gated_rms_norm
else:  # pragma: no cover - CPU-only installs without triton
    triton_gated_rms_norm = missing("triton_gated_rms_norm")

__all__ = ["HAS_TRITON", "MAX_DIM", "supported", "triton_gated_rms_norm"]
