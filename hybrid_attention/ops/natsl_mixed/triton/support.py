"""Which inputs the NAtS-L mixed op's Triton path handles: both branches' kernels must (importable without triton)."""

from __future__ import annotations

import torch

from ...chunk_attention.triton import supported as chunk_attention_supported
from ...gated_delta.triton import supported as gated_delta_supported

__all__ = ["supported"]


def supported(q: torch.Tensor, v: torch.Tensor, q_attn: torch.Tensor, v_attn: torch.Tensor, chunk_size: int) -> bool:
    """GDN branch q ``[B, T, H, K]``, v ``[B, T, H, V]`` and softmax branch q_attn ``[B, T, Hs, Dk]``, v_attn
    ``[B, T, Hs, Dv]``: true when both Triton ops run them at this chunk size (CUDA or the interpreter)."""
    return gated_delta_supported(q, v, chunk_size) and chunk_attention_supported(q_attn, v_attn, chunk_size)
