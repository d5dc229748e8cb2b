"""Triton backend of the Interdomain Attention core (chunked forward/backward, decode step).

Importable without triton: ``HAS_TRITON`` says whether the kernels are available; the functions raise a clear
``RuntimeError`` otherwise. See ``kernels.py`` for the algorithm and ``ops.py`` for the autograd / torch.library side;
the chunk-boundary state scans are shared with the bilinear S4D op (``hybrid_attention.ops.common.triton``).
"""

from __future__ import annotations

from ...common.triton import _IMPORT_ERROR, HAS_TRITON

__all__ = ["HAS_TRITON", "triton_interdomain"]


def _require():
    if not HAS_TRITON:
        raise RuntimeError(f"the triton backend needs the 'triton' package, which failed to import: {_IMPORT_ERROR!r}")


def triton_interdomain(*args, **kwargs):
    """Interdomain core on Triton kernels; see ``ops.triton_interdomain``."""
    _require()
    from .ops import triton_interdomain as impl

    return impl(*args, **kwargs)
