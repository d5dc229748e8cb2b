"""Causal softmax attention over packed documents (``packed_causal_attention``): every document of one packed row is
its own causal sequence."""

from __future__ import annotations

import torch

from ..common.backend import resolve_backend
from ..common.varlen import check_cu_seqlens
from .flash import FLASH_AVAILABLE, causal_kwargs, flash_packed_causal_attention, supported
from .reference import reference_packed_causal_attention

__all__ = [
    "packed_causal_attention",
    "reference_packed_causal_attention",
    "flash_packed_causal_attention",
    "causal_kwargs",
    "resolve_packed_backend",
    "FLASH_AVAILABLE",
    "BACKENDS",
]

BACKENDS = ("auto", "reference", "flash")
_FORMS = {"reference": reference_packed_causal_attention, "flash": flash_packed_causal_attention}


def resolve_packed_backend(backend: str, q: torch.Tensor) -> str:
    """The form ``packed_causal_attention`` runs for q: "reference" | "flash"."""
    return resolve_backend(backend, "packed_causal_attention", lambda: supported(q), BACKENDS, no_varlen=(),
                           fast="flash")


def packed_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, *,
                            backend: str = "auto") -> torch.Tensor:
    """q, k, v ``[1, T, H, D]``, cu_seqlens ``[N + 1]`` (int32 / int64, ``ops/common/varlen.py``) -> o ``[1, T, H, D]``.
    A CPU cu_seqlens is checked in full, a device one for dtype and shape only (no host sync).

    Query t of document i attends to the keys s <= t with s >= cu_seqlens[i], scale 1 / sqrt(D): what a separate causal
    SDPA over each document computes, in one call that never reads the offsets on the host.

    backend:
    - ``"flash"`` (``flash.py``): PyTorch's FlashAttention varlen op; work and memory linear in each document's
      length. CUDA, fp16 / bf16, D <= 256 and D % 8 == 0; forward and backward; runs under ``torch.compile``.
    - ``"reference"`` (``reference.py``): one SDPA with a dense ``[T, T]`` block-diagonal causal mask; exact in
      float64 (the oracle), every device and dtype, O(T²) over the whole row.
    - ``"auto"``: flash when it supports the inputs (``flash.supported``), else reference. Under CUDA autocast the
      layers' q, k, v are bf16, so training takes the flash form.
    """
    if q.dim() != 4 or q.shape[0] != 1 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"packed_causal_attention: q, k, v must all be [1, T, H, D], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    check_cu_seqlens(cu_seqlens, q.shape[1], q.shape[0])
    return _FORMS[resolve_packed_backend(backend, q)](q, k, v, cu_seqlens)
