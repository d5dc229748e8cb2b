"""Triton backend of the bilinear S4D core (chunked forward/backward on the state scans shared with Interdomain).

Importable without triton: ``HAS_TRITON`` says whether the kernels are available, ``supported(a, b)``
(``support.py``) whether they handle these inputs, and without triton ``triton_s4d_bilinear`` raises a clear
``RuntimeError``. See ``ops.py`` for the algorithm and the autograd / torch.library side, ``kernels.py`` for the
readout kernels.
"""

from __future__ import annotations

from ...common.triton import HAS_TRITON, missing
from .support import supported

if HAS_TRITON:
    from .ops import triton_s4d_bilinear
else:  # pragma: no cover - CPU-only installs without triton
    triton_s4d_bilinear = missing("triton_s4d_bilinear")

__all__ = ["HAS_TRITON", "supported", "triton_s4d_bilinear"]
