"""Fusion of the Linear layers that read the same input and of the ShortConvolutions after them: one matrix product
and one convolution instead of several, for training and prefill (``project_inputs``, differentiable) and for the
decode step (``fuse_inputs``; ``concat_linear_weights`` holds the decision)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_attention.modules.conv import ShortConvolution, short_conv, short_conv_step

__all__ = ["PRODUCT_WIDTH_MULTIPLE", "FusedInputs", "concat_conv_weights", "concat_linear_weights", "fuse_inputs",
           "linear_weights", "project_inputs"]


PRODUCT_WIDTH_MULTIPLE = 64
"""``project_inputs`` pads its weight with zero rows to a multiple of this many outputs on CUDA: cuBLAS is several
times slower at a width such as the GDN layer's q|k|v|g plus its few a / b columns. DECISION: the "fused input
projection width" rows in benchmarks/README.md."""


def linear_weights(linears: Sequence[nn.Linear], width_multiple: int = 1) -> tuple[torch.Tensor, list[int]]:
    """Bias-free Linears with the same input size -> (their weights concatenated [Σ out, in], differentiable: the
    gradient reaches each ``Linear.weight``, then zero rows up to a multiple of ``width_multiple``; the output sizes
    in order). ``F.linear(x, w)[..., :Σ out].split(sizes, -1)`` equals the Linears applied one by one."""
    if not linears:
        raise ValueError("linears must be a non-empty sequence of nn.Linear")
    in_features = {lin.in_features for lin in linears}
    if len(in_features) != 1 or any(lin.bias is not None for lin in linears):
        raise ValueError("linears must be bias-free nn.Linear layers with one input size, got "
                         f"in_features {sorted(in_features)}, biases {[lin.bias is not None for lin in linears]}")
    sizes = [lin.out_features for lin in linears]
    weights = [lin.weight for lin in linears]
    pad = -sum(sizes) % width_multiple
    if pad:  # zero rows: the product's extra columns are never read
        weights.append(weights[0].new_zeros(pad, weights[0].shape[1]))
    return torch.cat(weights), sizes


def concat_conv_weights(convs: Sequence[ShortConvolution]) -> torch.Tensor:
    """ShortConvolutions of one kernel size and activation -> their kernels concatenated [Σ channels, 1, K]
    (differentiable): the depthwise convolution over the concatenated channels equals each one on its own."""
    if len({(c.kernel_size, c.activation) for c in convs}) > 1:
        raise ValueError("convs must share one activation and one kernel size to run as one convolution")
    return torch.cat([c.weight for c in convs])


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
    Linears (parameter names, checkpoints and HF weights unchanged) and concatenate them per call
    (``project_inputs``). Cost: one extra copy of the fused weights in the decoder (for gdn-340m ≈ 0.44 GB in bf16
    next to 0.76 GB of model).
    """
    return linear_weights(linears)


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
    weight, sizes = concat_linear_weights(linears)
    state = torch.cat(list(conv_states), dim=1).to(device=device, dtype=dtype)
    ends = torch.tensor([c.channels for c in convs]).cumsum(0).tolist()
    # plain slices, not split(): a view from a multi-output op may not be written in place (copy_ under grad mode)
    views = [state[:, e - c.channels:e] for c, e in zip(convs, ends)]
    conv_weight = concat_conv_weights(convs)[:, 0, :].to(device).contiguous()
    fused = FusedInputs(weight.to(device=device, dtype=dtype), sizes, conv_weight, state, len(convs),
                        convs[0].activation if convs else None)
    return fused, views


def project_inputs(
    x: torch.Tensor, linears: Mapping[str, nn.Linear], convs: Mapping[str, ShortConvolution] | None = None,
    state: Mapping[str, torch.Tensor] | None = None, output_final_state: bool = False, *,
    cu_seqlens: torch.Tensor | None = None, width_multiple: int | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The input projections of a layer as one matrix product and the ShortConvolutions after some of them as one
    convolution (training and prefill; differentiable, the gradients reach each module's own weight).

    Equals ``linears[n](x)``, followed by ``convs[n](·, state[n], output_final_state, cu_seqlens=cu_seqlens)`` for
    each name n of ``convs``: ``F.linear`` with the concatenated weights (the convolved projections first, so that
    they are one block of its output), then ``short_conv`` over that block with the concatenated kernels (the
    convolution is depthwise: exact), the backend of the convs. The product's width is padded with zero weight rows
    to a multiple of ``width_multiple``.

    Args:
        x: [B, T, in] the input every Linear reads.
        linears: name -> bias-free nn.Linear of input size ``in`` (the order of the returned outputs).
        convs: name -> ShortConvolution, for names of ``linears`` (one kernel size, activation and backend); None: none.
        state: name -> [B, channels, K-1] conv state of each conv, or None / empty (zeros).
        output_final_state: return the new conv states.
        cu_seqlens: [N + 1] offsets of packed documents (B == 1; the convolutions restart at each).
        width_multiple: pad the product to a multiple of this many columns; None: ``PRODUCT_WIDTH_MULTIPLE`` for
            CUDA inputs (cuBLAS), 1 (no padding) otherwise.

    Returns:
        (outputs by name [B, T, out_n] (views of one product; the convolved ones are the convolution's parts, tensors
        of their own on the Triton backend), new conv states by name, [B, channels, K-1] (packed: [N, channels, K-1]
        per document), empty unless output_final_state).
    """
    convs = convs or {}
    if not set(convs) <= set(linears):
        raise ValueError(f"convs {sorted(convs)} must name projections among {list(linears)}")
    conv_names = [n for n in linears if n in convs]
    names = conv_names + [n for n in linears if n not in convs]
    if width_multiple is None:
        width_multiple = PRODUCT_WIDTH_MULTIPLE if x.is_cuda else 1
    weight, sizes = linear_weights([linears[n] for n in names], width_multiple)
    z = F.linear(x, weight)
    width = sum(sizes[:len(conv_names)])
    out = dict(zip(names[len(conv_names):], z[..., width:sum(sizes)].split(sizes[len(conv_names):], -1)))
    new_state = {}
    if conv_names:
        mods = [convs[n] for n in conv_names]
        if len({c.backend for c in mods}) > 1:
            raise ValueError("convs must share one backend to run as one convolution")
        init = torch.cat([state[n] for n in conv_names], 1) if state else None
        parts, final = short_conv(z[..., :width], concat_conv_weights(mods), mods[0].activation, mods[0].backend,
                                  init, output_final_state, cu_seqlens=cu_seqlens, split=sizes[:len(conv_names)])
        out.update(zip(conv_names, parts))
        if final is not None:
            new_state = {n: s.contiguous() for n, s in zip(conv_names, final.split(sizes[:len(conv_names)], 1))}
    return {n: out[n] for n in linears}, new_state
