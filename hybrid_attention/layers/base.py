"""The token-mixer contract shared by every layer (see DESIGN.md).

    y, state = layer(x, state=None)              # x: [B, T, hidden]
    state = layer.init_state(batch_size, device=..., dtype=...)
    n = layer.state_size(seq_len)                # real numbers kept per sequence after seq_len tokens

`state=None` runs a stateless pass (training) and returns `(y, None)` unless `output_state=True`. Passing a state
(e.g. from `init_state`) continues from it and returns the updated state; the state object is not modified in place,
so a caller can keep an old state to branch from it. Prefill then one-token decoding, or feeding a sequence in
arbitrary pieces, reproduces the full forward pass.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class TokenMixer(nn.Module):
    """Base class of the token mixers: documents the contract and holds no parameters."""

    def init_state(self, batch_size: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        raise NotImplementedError

    def state_size(self, seq_len: int) -> int:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, state: Any = None, *, output_state: bool | None = None):
        raise NotImplementedError


def check_hidden(x: torch.Tensor, hidden_size: int) -> None:
    if x.dim() != 3 or x.shape[-1] != hidden_size:
        raise ValueError(f"x must be [B, T, {hidden_size}], got shape {tuple(x.shape)}")
