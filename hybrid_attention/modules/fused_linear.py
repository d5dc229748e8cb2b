"""Decode-time fusion of the Linear layers that read the same input: one matrix-vector product instead of several
(``concat_linear_weights``, whose docstring holds the decision)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_attention.modules.conv import ShortConvolution, short_conv_step

__all__ = ["FusedInputs", "concat_linear_weights", "fuse_inputs"]


@torch.no_grad()
def concat_linear_weights(linears: Sequence[nn.Linear]) -> tuple[torch.Tensor, list[int]]:
    """Bias-free Linears with the same input size -> (weight [Σ out, in] (a detached copy, contiguous), the output
    sizes in order): ``F.linear(x, w).split(sizes, -1)`` equals the Linears applied one by one.

    At batch 1 a decode step is a chain of small kernels (one per projection, norm, convolution, ...), each with a fixed
    launch-and-ramp cost inside the CUDA graph of a few microseconds: on the H200 a compiled and captured gdn-340m step
    runs ~19 kernels per layer in 1.75 ms where streaming its weights takes 0.16 ms (``benchmarks/profile_decode.py``).
    Concatenating the weights of projections that share an input (q/k/v/..., the SwiGLU gate and up) makes them one
    GEMV. DECISION: the static decode state keeps its own concatenated copy of those weights, made once when the state
    is built (the decoder's contract already requires frozen weights while serving); the training modules keep separate
    Linears (parameter names, checkpoints and HF weights unchanged). Cost: one extra copy of the fused weights in the
    decoder (for gdn-340m ≈ 0.44 GB in bf16 next to 0.76 GB of model).
    """
    if not linears:
        raise ValueError("linears must be a non-empty sequence of nn.Linear")
    in_features = {lin.in_features for lin in linears}
    if len(in_features) != 1 or any(lin.bias is not None for lin in linears):
        raise ValueError("linears must be bias-free nn.Linear layers with one input size, got "
                         f"in_features {sorted(in_features)}, biases {[lin.bias is not None for lin in linears]}")
    return torch.cat([lin.weight for lin in linears]).contiguous(), [lin.out_features for lin in linears]


@dataclass
class FusedInputs:
    """A mixer's decode-step inputs fused: its input projections as one weight [Σ out, hidden] (``sizes`` their
    widths, in order), the first ``n_conv`` of them followed by their ShortConvolutions as one convolution (kernels
    ``conv_weight [Σ channels, K]``, state ``conv_state [B, Σ channels, K-1]``, activation ``activation``).
    Built by ``fuse_inputs``; calling it on x [B, hidden] returns every projection's output [B, width] in order (the
    convolved ones after their convolution; conv_state advances in place)."""

    weight: torch.Tensor
    sizes: list[int]
    conv_weight: torch.Tensor
    conv_state: torch.Tensor
    n_conv: int
    activation: str | None

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        z = F.linear(x, self.weight).split(self.sizes, -1)
        n = self.n_conv
        conv = short_conv_step(torch.cat(z[:n], -1), self.conv_state, self.conv_weight, self.activation)
        return [*conv.split(self.sizes[:n], -1), *z[n:]]


@torch.no_grad()
def fuse_inputs(linears: Sequence[nn.Linear], convs: Sequence[ShortConvolution], conv_states: Sequence[torch.Tensor],
                device: torch.device | str, dtype: torch.dtype) -> tuple[FusedInputs, list[torch.Tensor]]:
    """``FusedInputs`` of bias-free ``linears`` whose first ``len(convs)`` outputs go through ``convs`` (one
    activation for all), with the conv states ``conv_states [B, channels_i, K-1]`` as their initial value. Returns it
    and the views of its one conv state, one per conv (what the static state keeps by branch name: loading a prefill
    state into them fills the fused state)."""
    if [lin.out_features for lin in linears[:len(convs)]] != [c.channels for c in convs]:
        raise ValueError("convs must follow the first linears: their channels must equal those outputs' widths")
    if len({c.activation for c in convs}) > 1 or len({c.kernel_size for c in convs}) > 1:
        raise ValueError("convs must share one activation and one kernel size to run as one convolution")
    weight, sizes = concat_linear_weights(linears)
    state = torch.cat(list(conv_states), dim=1).to(device=device, dtype=dtype)
    ends = torch.tensor([c.channels for c in convs]).cumsum(0).tolist()
    # plain slices, not split(): a view from a multi-output op may not be written in place (copy_ under grad mode)
    views = [state[:, e - c.channels:e] for c, e in zip(convs, ends)]
    conv_weight = torch.cat([c.weight[:, 0, :] for c in convs]).detach().to(device).contiguous()
    fused = FusedInputs(weight.to(device=device, dtype=dtype), sizes, conv_weight, state, len(convs),
                        convs[0].activation if convs else None)
    return fused, views
