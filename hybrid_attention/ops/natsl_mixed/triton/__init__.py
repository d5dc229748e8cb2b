"""Triton backend of the NAtS-L mixed op: the two branches' Triton ops, the GDN branch on a synchronised side stream.

Importable without triton: ``HAS_TRITON``, ``supported(q, v, q_attn, v_attn, chunk_size)`` (``support.py``), and
without triton ``triton_natsl_mixed`` raises a clear ``RuntimeError``. ``concurrent.py`` holds the stream logic.
"""

from __future__ import annotations

from ...common.triton import HAS_TRITON, missing
from .support import supported

if HAS_TRITON:
    from .concurrent import triton_natsl_mixed
else:  # pragma: no cover - CPU-only installs without triton
    triton_natsl_mixed = missing("triton_natsl_mixed")

__all__ = ["HAS_TRITON", "supported", "triton_natsl_mixed"]
