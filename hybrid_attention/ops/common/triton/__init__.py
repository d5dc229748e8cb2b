"""Triton state scans shared by the complex diagonal-SSM ops (Interdomain Attention and the bilinear S4D op).

Both ops carry the same state X_t = λ ⊙ X_{t-1} + B z_tᵀ across chunk boundaries and differ only in their chunk-local
readout kernels, so the chunk-boundary scans live here once: ``ssm_scan_kernels.py`` (the Triton kernels: forward
scan, reverse adjoint scan, state-carry gradient, and their fused variant) and ``ssm_scan.py`` (their host side: the
power table, the planar complex layout, launches, the launch configuration). The linear S4D op
(``hybrid_attention.ops.s4d``) is an FFT convolution and needs none of it.

Importable without triton: ``HAS_TRITON`` says whether the kernels are available (``_IMPORT_ERROR`` holds the reason
when not); the two modules import triton and are only imported by the ops' Triton entry points.
"""

from __future__ import annotations

try:  # pragma: no cover - depends on the environment
    import triton  # noqa: F401

    HAS_TRITON = True
    _IMPORT_ERROR: Exception | None = None
except Exception as exc:  # ImportError, or a broken triton install
    HAS_TRITON = False
    _IMPORT_ERROR = exc

__all__ = ["HAS_TRITON"]
