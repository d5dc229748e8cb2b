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
        xt = x.transpose(1, 2)  # [B, D, T]
        if state is None:
            state = xt.new_zeros(b, d, self.kernel_size - 1)
        xp = torch.cat([state.to(xt.dtype), xt], dim=-1)  # [B, D, K-1+T]
        y = F.conv1d(xp, self.weight.to(xt.dtype), groups=d).transpose(1, 2)
        if self.activation == "silu":
            y = F.silu(y)
        new_state = xp[..., xp.shape[-1] - (self.kernel_size - 1) :].contiguous() if output_final_state else None
        return y, new_state

    def extra_repr(self) -> str:
        return f"{self.channels}, kernel_size={self.kernel_size}, activation={self.activation}"
