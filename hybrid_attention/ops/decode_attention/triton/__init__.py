"""Triton backend of `decode_attention` (the split-KV one-token attention over a static K/V buffer). Importable
without triton: ``HAS_TRITON`` says whether the kernel is available, ``supported(q, k, v)`` (``support.py``) whether
it handles these inputs, and without triton the entry point raises a clear RuntimeError."""

from __future__ import annotations

from ...common.triton import HAS_TRITON, missing
from .support import supported

if HAS_TRITON:
    from .kernel import decode_attention
else:  # pragma: no cover - depends on the environment
    decode_attention = missing("decode_attention")


__all__ = ["HAS_TRITON", "supported", "decode_attention"]
