"""Triton backend of the Interdomain Attention core (chunked forward/backward, decode step).

Importable without triton: ``HAS_TRITON`` says whether the kernels are available, ``supported(q, k, v)``
(``support.py``) whether they handle these inputs, and without triton ``triton_interdomain`` raises a clear
``RuntimeError``. See ``kernels.py`` for the algorithm and ``ops.py`` for the autograd / torch.library side; the
chunk-boundary state scans are shared with the bilinear S4D op (``hybrid_attention.ops.common.triton``).
"""

from __future__ import annotations

from ...common.triton import HAS_TRITON, missing
from .support import supported

if HAS_TRITON:
    from .ops import triton_interdomain
else:  # pragma: no cover - CPU-only installs without triton
    triton_interdomain = missing("triton_interdomain")

__all__ = ["HAS_TRITON", "supported", "triton_interdomain"]
