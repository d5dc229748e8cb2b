"""Flash form of packed causal attention: PyTorch's FlashAttention varlen op (``torch.nn.attention.varlen``), one
launch for every document of the packed row, offsets read on the device, with autograd and a fake kernel (runs under
``torch.compile``). CUDA only, fp16 / bf16, head dims FlashAttention supports (``supported``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

try:  # guarded: absent before torch 2.10
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - depends on the torch build
    varlen_attn = None

__all__ = ["FLASH_AVAILABLE", "causal_kwargs", "supported", "flash_packed_causal_attention"]


def causal_kwargs(fn: Callable[..., Any] | None) -> dict[str, Any] | None:
    """The keyword argument that makes ``fn`` (a ``varlen_attn``) causal: ``{"is_causal": True}`` when it has an
    ``is_causal`` parameter (torch 2.10 / 2.11), ``{"window_size": (-1, 0)}`` when it has ``window_size``
    (torch 2.12+: left window unbounded, right window 0), else None (no known causal form: flash unavailable).

    Its public signature changed between torch versions: torch 2.10 / 2.11 take ``is_causal=True``, torch 2.12+ take
    ``window_size=(-1, 0)`` (keyword-only) instead. ``causal_kwargs`` reads the signature once, at import.
    """
    if fn is None:
        return None
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - an uninspectable builtin
        return None
    if "is_causal" in params:
        return {"is_causal": True}
    if "window_size" in params:
        return {"window_size": (-1, 0)}
    return None


_CAUSAL = causal_kwargs(varlen_attn)
FLASH_AVAILABLE = _CAUSAL is not None


def supported(q: torch.Tensor) -> bool:
    """Whether the flash form runs q ``[1, T, H, D]``: the op exists, CUDA, fp16 / bf16, D <= 256 and D % 8 == 0."""
    d = q.shape[-1]
    return (FLASH_AVAILABLE and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)
            and d <= 256 and d % 8 == 0)


def flash_packed_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  cu_seqlens: torch.Tensor) -> torch.Tensor:
    """q, k, v ``[1, T, H, D]`` (fp16 / bf16, CUDA), cu_seqlens ``[N + 1]`` on q's device -> o ``[1, T, H, D]``,
    scale 1 / sqrt(D) (the op's default)."""
    if not FLASH_AVAILABLE:
        raise RuntimeError("packed_causal_attention: the flash form needs torch.nn.attention.varlen.varlen_attn "
                           "(torch >= 2.10)")
    T = q.shape[1]
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32)  # a device op (no-op for int32 on q's device)
    # max_q = max_k = T, the packed length: a static upper bound on every document's length, so the offsets are
    # never read on the host (the packed paths are sync-free, tests/models/test_no_host_sync.py) and no shape
    # depends on them (one compiled graph for every document mix). Its cost: FlashAttention sizes its grid by max_q,
    # so each document gets ceil(T / block) query blocks and the blocks past the document's end exit at once.
    o = varlen_attn(*(z[0].contiguous() for z in (q, k, v)), cu, cu, T, T, **_CAUSAL)  # [T, H, D]
    return o.unsqueeze(0)
