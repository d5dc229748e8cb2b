"""Triton backend of the Interdomain Attention core (chunked forward/backward, decode step).

Importable without triton: ``HAS_TRITON`` says whether the kernels are available; the functions raise a clear
``RuntimeError`` otherwise. See ``kernels.py`` for the algorithm and ``ops.py`` for the autograd / torch.library side.
"""

from __future__ import annotations

try:  # pragma: no cover - depends on the environment
    import triton  # noqa: F401

    HAS_TRITON = True
    _IMPORT_ERROR: Exception | None = None
except Exception as exc:  # ImportError, or a broken triton install
    HAS_TRITON = False
    _IMPORT_ERROR = exc

__all__ = ["HAS_TRITON", "triton_interdomain"]


def _require():
    if not HAS_TRITON:
        raise RuntimeError(f"the triton backend needs the 'triton' package, which failed to import: {_IMPORT_ERROR!r}")


def triton_interdomain(*args, **kwargs):
    """Interdomain core on Triton kernels; see ``ops.triton_interdomain``."""
    _require()
    from .ops import triton_interdomain as impl

    return impl(*args, **kwargs)
