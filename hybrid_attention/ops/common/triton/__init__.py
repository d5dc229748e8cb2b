"""Triton availability and the state scans shared by the complex diagonal-SSM ops (Interdomain, bilinear S4D).

Every op's ``triton/`` package shows the same face built on this module: ``HAS_TRITON`` (triton imports),
``supported(...)`` (the kernels handle these inputs) and the op's entry point, which raises a clear
``RuntimeError`` (``require_triton``; ``missing(name)`` builds that stand-in) when triton is missing.
``interpreting()`` says whether the kernels run under the CPU interpreter (``TRITON_INTERPRET=1``), read at call
time.

Both diagonal-SSM ops carry the same state X_t = λ ⊙ X_{t-1} + B z_tᵀ across chunk boundaries and differ only in
their chunk-local readout kernels, so the chunk-boundary scans live here once: ``ssm_scan_kernels.py`` (the Triton
kernels: forward scan, reverse adjoint scan, state-carry gradient, and their fused variant), ``ssm_scan.py`` (their
host side: the power table, the planar complex layout, launches) and ``config.py`` (the frozen launch
configuration). The linear S4D op (``hybrid_attention.ops.s4d``) is an FFT convolution and needs none of it.
The scan modules import triton and are only imported by the ops' Triton entry points.
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
