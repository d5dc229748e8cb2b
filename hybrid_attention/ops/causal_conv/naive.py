"""Causal depthwise short convolution, the definition (the oracle of the Triton form) and the input checks every form
shares.

Per sequence with history ``h = initial_state [C, K-1]`` (oldest first; zeros when None) and ``xp = [h | x]`` along
time: ``pre[t] = Σ_j w[:, j] · xp[t + j]`` (j = 0..K-1), ``y = SiLU(pre)`` or ``pre``, ``final_state = xp[-(K-1):]``
(the last K-1 inputs, reaching into the history when T < K-1). The math of ``modules/conv.py`` ``ShortConvolution``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..common.varlen import check_cu_seqlens, check_initial_state, per_document

__all__ = ["ACTIVATIONS", "naive_causal_conv1d", "validate_conv_inputs"]

ACTIVATIONS = (None, "silu")


def validate_conv_inputs(
    x: torch.Tensor,
    weight: torch.Tensor,
    activation: str | None,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    split_sizes: Sequence[int] | None = None,
) -> None:
    """Raise ``ValueError`` (one line naming the argument) unless x is ``[B, T, C]``, weight ``[C, K]`` (K >= 1),
    activation one of ``ACTIVATIONS``, initial_state ``[N, C, K-1]`` (N = B, or the number of documents of
    ``cu_seqlens``, which needs B == 1; no host read of device offsets) and split_sizes None or positive widths
    summing to C."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of None, 'silu', got {activation!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"x must be a [B, T, C] tensor, got {getattr(x, 'shape', x)}")
    c = x.shape[2]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != c or weight.shape[1] < 1:
        raise ValueError(f"weight must be [C, K] with C = {c} (x's channels) and K >= 1, got "
                         f"{tuple(getattr(weight, 'shape', ()))}")
    n = x.shape[0]
    if cu_seqlens is not None:
        n = check_cu_seqlens(cu_seqlens, x.shape[1], x.shape[0])
        check_initial_state(initial_state, n)
    if initial_state is not None and tuple(initial_state.shape) != (n, c, weight.shape[1] - 1):
        raise ValueError(f"initial_state must be [N, C, K-1] = {(n, c, weight.shape[1] - 1)}, got "
                         f"{tuple(initial_state.shape)}")
    if split_sizes is not None and (not split_sizes or any(not isinstance(w, int) or w < 1 for w in split_sizes)
                                    or sum(split_sizes) != c):
        raise ValueError(f"split_sizes must be positive widths summing to C = {c}, got {list(split_sizes)}")


@per_document(tokens=("x",))
def _per_sequence(x, weight, activation, initial_state, output_final_state):
    b, t, c = x.shape
    k = weight.shape[1]
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    hist = x.new_zeros(b, k - 1, c, dtype=ct) if initial_state is None else initial_state.to(ct).mT
    xp = torch.cat([hist, x.to(ct)], dim=1)  # [B, K-1+T, C]
    w = weight.to(ct)
    pre = sum(xp[:, j : j + t] * w[:, j] for j in range(k))
    y = F.silu(pre) if activation == "silu" else pre
    final = xp[:, t:].mT.to(x.dtype).contiguous() if output_final_state else None
    return y.to(x.dtype), final


def naive_causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    activation: str | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The definition in PyTorch (differentiable by autograd): float32 products and sums (float64 for float64 x),
    y and the final state in x's dtype (a final state that reaches into the initial state rounds it to x's dtype).
    Arguments and shapes as ``causal_conv1d``; packed documents run one by one (a host read of the offsets).
    The Triton kernels compute the same way (float32, the initial state read in its own dtype)."""
    validate_conv_inputs(x, weight, activation, initial_state, cu_seqlens)
    kw = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
    return _per_sequence(x, weight, activation, initial_state, output_final_state, **kw)
