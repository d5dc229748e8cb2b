"""Triton backend of ``chunk_attention``: block-sparse FlashAttention-2 style kernels over the chunk routing.

Importable without triton: ``HAS_TRITON`` says whether the kernels are available, ``supported(q, v, chunk_size)``
(``support.py``) whether they handle these inputs, and without triton ``triton_chunk_attention`` raises a clear
``RuntimeError``. ``kernels.py`` holds the kernels and the algorithm, ``function.py`` the launches and the autograd
Function, ``config.py`` the frozen launch configuration (``ChunkAttentionConfig``, passed as ``config=``).
"""

from __future__ import annotations

from ...common.triton import HAS_TRITON, missing
from .config import DEFAULT_CONFIG, ChunkAttentionConfig
from .support import supported

if HAS_TRITON:
    from .function import triton_chunk_attention
else:  # pragma: no cover - CPU-only installs without triton
    triton_chunk_attention = missing("triton_chunk_attention")

__all__ = ["HAS_TRITON", "supported", "ChunkAttentionConfig", "DEFAULT_CONFIG", "triton_chunk_attention"]
