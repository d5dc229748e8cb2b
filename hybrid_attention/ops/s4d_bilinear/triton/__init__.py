"""Triton backend of the bilinear S4D core (chunked forward/backward on the state scans shared with Interdomain).

Importable without triton: ``HAS_TRITON`` says whether the kernels are available; ``triton_s4d_bilinear`` raises a clear
``RuntimeError`` otherwise. See ``ops.py`` for the algorithm and the autograd / torch.library side, ``kernels.py``
for the readout kernels.
"""

from __future__ import annotations

from ...common.triton import _IMPORT_ERROR, HAS_TRITON

__all__ = ["HAS_TRITON", "triton_s4d_bilinear"]


def triton_s4d_bilinear(*args, **kwargs):
    """Bilinear S4D core on Triton kernels; see ``ops.triton_s4d_bilinear``."""
    if not HAS_TRITON:
        raise RuntimeError(f"the triton backend needs the 'triton' package, which failed to import: {_IMPORT_ERROR!r}")
    from .ops import triton_s4d_bilinear as impl

    return impl(*args, **kwargs)
