"""Triton backend of ``gated_delta`` (forward + backward, commit mask, initial/final states) and its decode step.

Importable without triton: ``HAS_TRITON`` says whether the kernels are available, ``supported(q, v, chunk_size)``
(``support.py``) whether they handle these inputs, and without triton the entry points raise a clear
``RuntimeError``. ``kernels.py`` holds the chunk kernels, ``function.py`` their launches and the autograd Function,
``config.py`` the frozen launch configuration (``GatedDeltaConfig``, passed as ``config=``), ``decode.py`` the fused
single-token step.
"""

from __future__ import annotations

from ...common.triton import HAS_TRITON, missing
from .config import BUFFER_DTYPES, DEFAULT_CONFIG, GatedDeltaConfig, config_with_buffers
from .support import supported

if HAS_TRITON:
    from .decode import triton_gated_delta_step
    from .function import triton_gated_delta
else:  # pragma: no cover - CPU-only installs without triton
    triton_gated_delta = missing("triton_gated_delta")
    triton_gated_delta_step = missing("triton_gated_delta_step")

__all__ = [
    "HAS_TRITON", "supported", "GatedDeltaConfig", "DEFAULT_CONFIG", "BUFFER_DTYPES", "config_with_buffers",
    "triton_gated_delta", "triton_gated_delta_step",
]
