"""Causal depthwise short convolution with a decode state (the ShortConv of fla / Mamba)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ShortConvolution(nn.Module):
    """Causal depthwise 1-D convolution over time, no bias, optional SiLU.

    forward(x [B, T, D], state [B, D, K-1] | None, output_final_state) -> (y [B, T, D], new_state [B, D, K-1] | None)

    `state` holds the last K-1 inputs (oldest first); `None` means zeros (start of a sequence). Feeding a sequence in
    pieces with the state carried gives exactly the output of one call.
    """

    def __init__(self, channels: int, kernel_size: int = 4, activation: str | None = None) -> None:
        super().__init__()
        if activation not in (None, "silu"):
            raise ValueError(f"activation must be one of None, 'silu', got {activation!r}")
        if kernel_size < 1:
            raise ValueError(f"kernel_size must be >= 1, got {kernel_size}")
        self.channels, self.kernel_size, self.activation = channels, kernel_size, activation
        # Same parameter layout as nn.Conv1d(channels, channels, kernel_size, groups=channels, bias=False).
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)  # nn.Conv1d's default

    def init_state(self, batch_size: int, device=None, dtype=None) -> torch.Tensor:
        return torch.zeros(batch_size, self.channels, self.kernel_size - 1, device=device, dtype=dtype)

    def forward(
        self, x: torch.Tensor, state: torch.Tensor | None = None, output_final_state: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, t, d = x.shape
        if d != self.channels:
            raise ValueError(f"x must have {self.channels} channels in its last dim, got shape {tuple(x.shape)}")
        k = self.kernel_size
        if torch.compiler.is_compiling():
            # Compiled (training): the same sum written as K shifted products in the [B, T, D] layout, which inductor
            # fuses with the activation into one kernel per direction. F.conv1d of a depthwise kernel runs ATen's
            # generic conv_depthwise2d kernels (not cuDNN) behind two layout copies: 10-18% of a compiled training
            # step of every mixer on the H200 (benchmarks/NOTES.md, session 5 profile). Eager keeps the one conv1d.
            past = x.new_zeros(b, k - 1, d) if state is None else state.transpose(1, 2).to(x.dtype)
            xp = torch.cat([past, x], dim=1)  # [B, K-1+T, D]
            w = self.weight[:, 0, :].to(x.dtype)  # [D, K]
            y = xp[:, :t] * w[:, 0]
            for j in range(1, k):
                y = y + xp[:, j : j + t] * w[:, j]
            new_state = xp[:, xp.shape[1] - (k - 1) :].transpose(1, 2).contiguous() if output_final_state else None
        else:
            xt = x.transpose(1, 2)  # [B, D, T]
            if state is None:
                state = xt.new_zeros(b, d, k - 1)
            xp = torch.cat([state.to(xt.dtype), xt], dim=-1)  # [B, D, K-1+T]
            y = F.conv1d(xp, self.weight.to(xt.dtype), groups=d).transpose(1, 2)
            new_state = xp[..., xp.shape[-1] - (k - 1) :].contiguous() if output_final_state else None
        if self.activation == "silu":
            y = F.silu(y)
        return y, new_state

    def extra_repr(self) -> str:
        return f"{self.channels}, kernel_size={self.kernel_size}, activation={self.activation}"
