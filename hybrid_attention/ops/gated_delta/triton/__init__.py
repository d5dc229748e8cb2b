"""Triton backend of ``gated_delta`` (forward + backward, commit mask, initial/final states).

Importing this package never fails: without Triton, ``TRITON_AVAILABLE`` is False and the op raises on use.
"""

from __future__ import annotations

try:  # guarded: CPU-only installs need not have Triton
    import triton  # noqa: F401

    TRITON_AVAILABLE = True
except Exception:  # pragma: no cover - ImportError, or a broken triton install
    TRITON_AVAILABLE = False

if TRITON_AVAILABLE:
    from .decode import triton_gated_delta_step
    from .function import triton_gated_delta, triton_supported
    from .mixed import natsl_mixed
else:  # pragma: no cover

    def triton_supported(*args, **kwargs) -> bool:  # type: ignore[misc]
        return False

    def triton_gated_delta(*args, **kwargs):  # type: ignore[misc]
        raise RuntimeError("triton is not installed; use backend='reference'")

    def natsl_mixed(*args, **kwargs):  # type: ignore[misc]
        raise RuntimeError("triton is not installed")

    def triton_gated_delta_step(*args, **kwargs):  # type: ignore[misc]
        raise RuntimeError("triton is not installed")


__all__ = ["TRITON_AVAILABLE", "triton_gated_delta", "triton_supported", "natsl_mixed", "triton_gated_delta_step"]
