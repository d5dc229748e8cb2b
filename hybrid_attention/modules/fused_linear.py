"""Decode-time fusion of the Linear layers that read the same input: one matrix-vector product instead of several.

At batch 1 a decode step is a chain of small kernels (one per projection, norm, convolution, ...), each with a fixed
launch-and-ramp cost inside the CUDA graph of a few microseconds: on the H200 a compiled and captured gdn-340m step
ran ~19 kernels per layer in 1.75 ms where streaming its weights takes 0.16 ms (benchmarks/NOTES.md, session 6).
Concatenating the weights of projections that share an input (q/k/v/..., the SwiGLU gate and up) makes them one
GEMV. DECISION: the static decode state keeps its own concatenated copy of those weights, made once when the state is
built (the decoder's contract already requires frozen weights while serving); the training modules keep separate
Linears (parameter names, checkpoints and HF weights unchanged). Cost: one extra copy of the fused weights in the
decoder (for gdn-340m ≈ 0.44 GB in bf16 next to 0.76 GB of model).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["concat_linear_weights"]


@torch.no_grad()
def concat_linear_weights(linears: Sequence[nn.Linear]) -> tuple[torch.Tensor, list[int]]:
    """Bias-free Linears with the same input size -> (weight [Σ out, in] (a detached copy, contiguous), the output
    sizes in order): ``F.linear(x, w).split(sizes, -1)`` equals the Linears applied one by one."""
    if not linears:
        raise ValueError("linears must be a non-empty sequence of nn.Linear")
    in_features = {lin.in_features for lin in linears}
    if len(in_features) != 1 or any(lin.bias is not None for lin in linears):
        raise ValueError("linears must be bias-free nn.Linear layers with one input size, got "
                         f"in_features {sorted(in_features)}, biases {[lin.bias is not None for lin in linears]}")
    return torch.cat([lin.weight for lin in linears]).contiguous(), [lin.out_features for lin in linears]
