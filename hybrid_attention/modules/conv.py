"""Causal depthwise short convolution with a decode state (the ShortConv of fla / Mamba)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_attention.ops import causal_conv
from hybrid_attention.ops.causal_conv import triton as causal_conv_triton
from hybrid_attention.ops.common.backend import resolve_backend, validate_backend
from hybrid_attention.ops.common.varlen import check_cu_seqlens, positions_in_document

CONV_BACKENDS = (*causal_conv.BACKENDS, "fla")
"""``ShortConvolution`` backends: the op's (``ops/causal_conv``) and "fla", flash-linear-attention's Triton
``causal_conv1d`` (an optional dependency) for the stateless training call."""


def _fla_causal_conv1d():
    """fla's ``causal_conv1d``; RuntimeError naming the package when it does not import."""
    try:
        from fla.modules.causal_conv1d import causal_conv1d
    except ImportError as e:
        raise RuntimeError("ShortConvolution: backend 'fla' needs flash-linear-attention (pip install "
                           f"flash-linear-attention), which failed to import: {e}") from e
    return causal_conv1d


def short_conv_step(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, activation: str | None) -> torch.Tensor:
    """One token of a (possibly concatenated) causal depthwise convolution: x [B, C], state [B, C, K-1] (the last K-1
    inputs, oldest first; updated in place), weight [C, K] -> y [B, C] in x.dtype (SiLU for activation="silu"). Equals
    `ShortConvolution.forward` on x[:, None] with that state; written as products so that the compiled decode step
    fuses it with the projection's split and the activation."""
    window = torch.cat([state.to(x.dtype), x[:, :, None]], dim=-1)  # [B, C, K]
    y = (window * weight.to(x.dtype)).sum(-1)
    state.copy_(window[..., 1:])
    return torch.nn.functional.silu(y) if activation == "silu" else y


def _as_parts(y: torch.Tensor, split: Sequence[int] | None) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """y, or its parts of the widths ``split`` (views)."""
    return y if split is None else y.split(list(split), -1)


def short_conv(
    x: torch.Tensor, weight: torch.Tensor, activation: str | None = None, backend: str = "reference",
    state: torch.Tensor | None = None, output_final_state: bool = False, *, cu_seqlens: torch.Tensor | None = None,
    split: Sequence[int] | None = None,
) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor | None]:
    """`ShortConvolution.forward` with the kernels as an argument (the module calls it with its own weight; a fused
    caller with the concatenated weights of several, ``modules/fused_linear.py``).

    Args:
        x: [B, T, D] inputs.
        weight: [D, 1, K] one filter per channel (``ShortConvolution.weight``'s layout).
        activation: None or "silu".
        backend: "reference", "triton", "auto" or "fla" (``ShortConvolution``).
        state: [B, D, K-1] the last K-1 inputs before x, or None (zeros); must be None with cu_seqlens.
        output_final_state: also return the new state ([B, D, K-1], or [N, D, K-1] per packed document).
        cu_seqlens: [N + 1] offsets of packed documents (B == 1).
        split: return y as its parts of these widths (``y.split(split, -1)``; the Triton backend writes each part to
            a tensor of its own: ``causal_conv1d``'s ``split_sizes``).

    Returns:
        (y [B, T, D] or its parts, the new state or None).
    """
    b, t, d = x.shape
    k = weight.shape[-1]
    if cu_seqlens is not None and state is not None:
        raise ValueError("state must be None with cu_seqlens (every document starts from a zero history)")
    if backend == "fla":
        if state is None and not output_final_state:
            y, _ = _fla_causal_conv1d()(x, weight[:, 0], activation=activation, cu_seqlens=cu_seqlens)
            return _as_parts(y, split), None
        backend = "auto"  # a call with states (prefill, continuation) runs the library's own forms
    if backend != "reference" and resolve_backend(
        backend, "ShortConvolution", lambda: x.is_cuda and causal_conv_triton.supported(x, weight),
        causal_conv.BACKENDS, varlen=cu_seqlens is not None, no_varlen=(),
    ) == "triton":
        return causal_conv.triton_causal_conv1d(
            x, weight[:, 0], activation=activation, initial_state=state,
            output_final_state=output_final_state, cu_seqlens=cu_seqlens, split_sizes=split,
        )
    if cu_seqlens is not None:
        y, new_state = _packed_products(x, weight, output_final_state, cu_seqlens)
    elif torch.compiler.is_compiling():
        # Compiled (training): the same sum written as K shifted products in the [B, T, D] layout, which inductor
        # fuses with the activation into one kernel per direction. F.conv1d of a depthwise kernel runs ATen's
        # generic conv_depthwise2d kernels (not cuDNN) behind two layout copies, slower inside a compiled training
        # step (``python -m benchmarks.profile_train``). Eager keeps the one conv1d.
        past = x.new_zeros(b, k - 1, d) if state is None else state.transpose(1, 2).to(x.dtype)
        xp = torch.cat([past, x], dim=1)  # [B, K-1+T, D]
        w = weight[:, 0, :].to(x.dtype)  # [D, K]
        y = xp[:, :t] * w[:, 0]
        for j in range(1, k):
            y = y + xp[:, j : j + t] * w[:, j]
        new_state = xp[:, xp.shape[1] - (k - 1) :].transpose(1, 2).contiguous() if output_final_state else None
    else:
        xt = x.transpose(1, 2)  # [B, D, T]
        if state is None:
            state = xt.new_zeros(b, d, k - 1)
        xp = torch.cat([state.to(xt.dtype), xt], dim=-1)  # [B, D, K-1+T]
        y = F.conv1d(xp, weight.to(xt.dtype), groups=d).transpose(1, 2)
        new_state = xp[..., xp.shape[-1] - (k - 1) :].contiguous() if output_final_state else None
    if activation == "silu":
        y = F.silu(y)
    return _as_parts(y, split), new_state


def _packed_products(x: torch.Tensor, weight: torch.Tensor, output_final_state: bool,
                     cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Packed documents x [1, T, D], weight [D, 1, K]: the K lagged products, each lag masked where it would reach
    before the token's document start -> (y [1, T, D] before the activation, final states [N, D, K-1] or None)."""
    t, k = x.shape[1], weight.shape[-1]
    check_cu_seqlens(cu_seqlens, t, x.shape[0])  # in full for CPU offsets; no host read of device ones
    pos = positions_in_document(cu_seqlens, t)[None, :, None]  # [1, T, 1]
    w = weight[:, 0, :].to(x.dtype)  # [D, K]; lag j multiplies w[:, K-1-j]
    y = x * w[:, k - 1]
    for j in range(1, min(k, t + 1)):
        shifted = torch.cat([x.new_zeros(1, j, x.shape[2]), x[:, : t - j]], dim=1)
        y = y + shifted * (pos >= j).to(x.dtype) * w[:, k - 1 - j]
    if not output_final_state:
        return y, None
    starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()
    idx = ends[:, None] - (k - 1) + torch.arange(k - 1, device=x.device)  # [N, K-1]
    ok = (idx >= starts[:, None]).to(x.dtype)
    last = x[0, idx.clamp(min=0)] * ok[..., None]  # [N, K-1, D]
    return y, last.transpose(1, 2).contiguous()


class ShortConvolution(nn.Module):
    """Causal depthwise 1-D convolution over time, no bias, optional SiLU.

    forward(x [B, T, D], state [B, D, K-1] | None, output_final_state) -> (y [B, T, D], new_state [B, D, K-1] | None)

    `state` holds the last K-1 inputs (oldest first); `None` means zeros (start of a sequence). Feeding a sequence in
    pieces with the state carried gives exactly the output of one call.

    `cu_seqlens [N + 1]` (packed documents, B == 1, ``ops/common/varlen.py``): every document starts from a zero
    history (no input leaks across a boundary); `state` must be None, and the final states are per document
    ``[N, D, K-1]`` (the last K-1 inputs of each document, zeros before its start).

    Args:
        channels: D, the number of channels (one filter each).
        kernel_size: K, the filter width (the current token and K-1 before it).
        activation: None or "silu" (applied to the output).
        backend: form of the forward / backward: "reference" (the PyTorch form below: ``F.conv1d`` eager, K shifted
            products under ``torch.compile``), "triton" (``ops/causal_conv``: one forward and one backward kernel,
            SiLU fused, float32 sums; CPU tensors need the Triton interpreter), "auto" ("triton" for CUDA inputs
            the kernels take, else "reference") or "fla" (flash-linear-attention's Triton ``causal_conv1d``, an
            optional dependency, for the stateless training call; calls with a state or a final state run "auto").
            The decode step (``short_conv_step``) is the same for all.
    """

    def __init__(self, channels: int, kernel_size: int = 4, activation: str | None = None,
                 backend: str = "reference") -> None:
        super().__init__()
        if activation not in (None, "silu"):
            raise ValueError(f"activation must be one of None, 'silu', got {activation!r}")
        if kernel_size < 1:
            raise ValueError(f"kernel_size must be >= 1, got {kernel_size}")
        validate_backend(backend, "ShortConvolution", CONV_BACKENDS)
        self.channels, self.kernel_size, self.activation = channels, kernel_size, activation
        self.backend = backend
        # Same parameter layout as nn.Conv1d(channels, channels, kernel_size, groups=channels, bias=False).
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)  # nn.Conv1d's default

    def init_state(self, batch_size: int, device=None, dtype=None) -> torch.Tensor:
        return torch.zeros(batch_size, self.channels, self.kernel_size - 1, device=device, dtype=dtype)

    def forward(
        self, x: torch.Tensor, state: torch.Tensor | None = None, output_final_state: bool = False, *,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if x.shape[-1] != self.channels:
            raise ValueError(f"x must have {self.channels} channels in its last dim, got shape {tuple(x.shape)}")
        return short_conv(x, self.weight, self.activation, self.backend, state, output_final_state,
                          cu_seqlens=cu_seqlens)

    def extra_repr(self) -> str:
        extra = f", backend={self.backend!r}" if self.backend != "reference" else ""
        return f"{self.channels}, kernel_size={self.kernel_size}, activation={self.activation}{extra}"
