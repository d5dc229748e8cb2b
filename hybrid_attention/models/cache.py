"""HybridCache: the per-layer decode states of a HybridForCausalLM.

Deliberately *not* a `transformers.Cache` subclass: its layer types and method set keep changing across 5.x releases,
while the model only needs a list of per-layer state objects (see `layers/base.py`) and a token count. `generate()`
receives it back through the model output (under both `cache` and `past_key_values`) and passes it in again.
"""

from __future__ import annotations

from typing import Any

import torch


class HybridCache:
    """states[i] is the state object of layer i (KVState, InterdomainState, ...); seen_tokens counts tokens fed (the
    padded width of a left-padded prefill included); pad [B] (int64) or None: after a left-padded (or packed) prefill,
    row b holds seen_tokens - pad[b] tokens of its own, so its next position is seen_tokens - pad[b]."""

    is_compileable = False

    def __init__(self, states: list[Any], seen_tokens: int = 0, pad: torch.Tensor | None = None) -> None:
        self.states = states
        self.seen_tokens = seen_tokens
        self.pad = pad

    def next_positions(self, t: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Positions [B or 1, t] of the next t tokens of every row (each row counts its own tokens from 0)."""
        pos = torch.arange(self.seen_tokens, self.seen_tokens + t, device=device)[None]
        return pos if self.pad is None else pos - self.pad.to(pos.device)[:, None]

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, layer_idx: int) -> Any:
        return self.states[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def get_max_length(self) -> int:
        return -1  # no maximum: recurrent states are fixed-size and the KV cache grows on demand

    def __repr__(self) -> str:
        kinds = sorted({type(s).__name__ for s in self.states})
        return f"HybridCache(layers={len(self.states)}, seen_tokens={self.seen_tokens}, kinds={kinds})"
