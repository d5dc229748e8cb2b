"""SwiGLU feed-forward block."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_attention.modules.fused_linear import concat_linear_weights


def swiglu_hidden_size(hidden_size: int, multiple_of: int = 128) -> int:
    """(2/3)·4d rounded *up* to a multiple of `multiple_of` (Interdomain paper: 2048/2816/4096/5504 at its 4 scales)."""
    return multiple_of * math.ceil(int(8 * hidden_size / 3) / multiple_of)


class SwiGLU(nn.Module):
    """y = W_2 (silu(W_1 x) ⊙ W_3 x); x: [..., d] -> [..., d]. No biases. `down_proj` is the residual-path output."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def decode_weights(self) -> torch.Tensor:
        """gate|up as one weight [2·intermediate, hidden] (a detached copy) for `forward_fused`: one GEMV instead of
        two in a decode step (modules/fused_linear.py)."""
        return concat_linear_weights([self.gate_proj, self.up_proj])[0]

    def forward_fused(self, x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
        """`forward` with the weight of `decode_weights()`: x [..., d] -> [..., d]."""
        g, u = F.linear(x, gate_up).chunk(2, -1)
        return self.down_proj(F.silu(g) * u)
