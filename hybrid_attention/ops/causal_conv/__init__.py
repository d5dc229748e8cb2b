"""Causal depthwise short convolution with a fused SiLU, packed documents and the decode state (the ShortConv of
fla / Mamba in front of q, k, v of the linear-attention layers).

Backends: "reference" (the PyTorch definition, ``naive.py``), "triton" (one forward and one backward kernel,
``hybrid_attention.ops.causal_conv.triton``) and "auto".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..common.backend import resolve_backend
from . import triton as triton_backend
from .naive import ACTIVATIONS, naive_causal_conv1d, validate_conv_inputs
from .triton import MAX_KERNEL_SIZE, triton_causal_conv1d

__all__ = ["ACTIVATIONS", "BACKENDS", "MAX_KERNEL_SIZE", "causal_conv1d", "naive_causal_conv1d",
           "triton_causal_conv1d"]

BACKENDS = ("auto", "reference", "triton")


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    activation: str | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    split_sizes: Sequence[int] | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor | None]:
    """Causal depthwise convolution over time, no bias, optional SiLU, dispatched to a backend.

    ``y[b, t, c] = act(Σ_{j<K} weight[c, j] · xp[b, t + j, c])`` with ``xp = [initial_state | x]`` along time (the
    K-1 history slots oldest first, zeros when None): token t sees itself and the K-1 inputs before it.

    Args:
        x: ``[B, T, C]`` inputs (channels last), bf16 / fp16 / fp32 (float64 on the reference backend).
        weight: ``[C, K]`` one filter per channel (``ShortConvolution.weight[:, 0]``).
        activation: None or "silu" (applied to the convolution's output, fused in the kernels).
        initial_state: ``[N, C, K-1]`` the last K-1 inputs before x per sequence (N = B, or the number of documents
            with ``cu_seqlens``), or None (zeros: the start of a sequence).
        output_final_state: also return the last K-1 inputs of each sequence, ``[N, C, K-1]`` in x's dtype (it
            reaches into ``initial_state`` when a sequence is shorter than K-1): the state of the next call and of
            the decode step (``modules/conv.py`` ``short_conv_step``).
        cu_seqlens: ``[N + 1]`` int32 / int64 offsets of packed documents (B == 1, ``ops/common/varlen.py``): each
            document starts from its own history (zeros, or ``initial_state[n]``), nothing crosses a boundary.
        split_sizes: return y as a tuple of ``[B, T, split_sizes[i]]`` tensors (positive widths summing to C), as
            ``y.split(split_sizes, -1)``; the Triton kernels write each part to a contiguous tensor of its own, so a
            caller that splits y (a fused q|k|v convolution) gets its parts without copies.
        backend: "reference" (the PyTorch definition), "triton" (the kernels: K <= ``MAX_KERNEL_SIZE``, no float64;
            CPU tensors run under the interpreter), or "auto" ("triton" for CUDA inputs it supports, else
            "reference").

    Returns:
        ``(y [B, T, C] (or its parts) in x's dtype, final_state [N, C, K-1] or None)``. Both backends compute in
        float32 (float64 for float64 inputs on the reference one) and are differentiable in x, weight and
        initial_state.
    """
    validate_conv_inputs(x, weight, activation, initial_state, cu_seqlens, split_sizes)
    name = resolve_backend(backend, "causal_conv1d",
                           lambda: x.is_cuda and triton_backend.supported(x, weight), BACKENDS,
                           varlen=cu_seqlens is not None, no_varlen=())
    kw = dict(activation=activation, initial_state=initial_state, output_final_state=output_final_state,
              cu_seqlens=cu_seqlens)
    if name == "triton":
        return triton_causal_conv1d(x, weight, split_sizes=split_sizes, **kw)
    y, final = naive_causal_conv1d(x, weight, **kw)
    return (y if split_sizes is None else y.split(list(split_sizes), -1)), final
