"""Triton backend of `decode_attention`. Importable without triton: ``HAS_TRITON`` says whether the kernel is
available; without it `decode_attention` raises a clear RuntimeError."""

from __future__ import annotations

from ...common.triton import _IMPORT_ERROR, HAS_TRITON

if HAS_TRITON:
    from .kernel import decode_attention
else:  # pragma: no cover - depends on the environment

    def decode_attention(*args, **kwargs):  # type: ignore[misc]
        raise RuntimeError(f"decode_attention needs the 'triton' package, which failed to import: {_IMPORT_ERROR!r}")


__all__ = ["HAS_TRITON", "decode_attention"]
