"""Triton availability and the pieces shared by the ops' Triton forms. Every op's ``triton/`` package shows the same
face: ``HAS_TRITON``, ``supported(...)`` and its entry point, which raises a clear ``RuntimeError`` (``require_triton``,
``missing``) when triton is missing. The chunked state scans shared by the diagonal-SSM ops live in ``ssm_scan.py``
(host side), ``ssm_scan_kernels.py`` and ``config.py``; those import triton.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NoReturn

try:  # pragma: no cover - depends on the environment
    import triton  # noqa: F401

    HAS_TRITON = True
    IMPORT_ERROR: Exception | None = None
except Exception as exc:  # ImportError, or a broken triton install
    HAS_TRITON = False
    IMPORT_ERROR = exc

__all__ = ["HAS_TRITON", "IMPORT_ERROR", "interpreting", "require_triton", "missing"]


def interpreting() -> bool:
    """Whether Triton kernels run under the CPU interpreter (``TRITON_INTERPRET`` set and not "0")."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def require_triton(op: str) -> None:
    """Raise ``RuntimeError`` naming ``op`` when triton is not importable."""
    if not HAS_TRITON:
        raise RuntimeError(f"{op}: the triton backend needs the 'triton' package, which failed to import: "
                           f"{IMPORT_ERROR!r}; use backend='reference'")


def missing(op: str) -> Callable[..., NoReturn]:
    """The stand-in an op's ``triton/`` package exports for entry point ``op`` when triton is not importable."""

    def unavailable(*args, **kwargs) -> NoReturn:
        require_triton(op)
        raise AssertionError("unreachable")  # require_triton raised

    unavailable.__name__ = unavailable.__qualname__ = op
    return unavailable
