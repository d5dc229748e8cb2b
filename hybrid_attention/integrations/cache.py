"""The caches the fla-style faces (``integrations/fla.py``) keep their decode states in: the library's ``LayerCache``,
or the ``Cache`` that fla's models pass (``read_state`` / ``store_state`` take either)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any


class LayerCache:
    """Per-layer decode states and token counts.

    ``update(state, layer_idx, offset)`` stores layer ``layer_idx``'s new state and adds ``offset`` (the tokens of the
    call, the padded width of a left-padded prefill included, as HF counts them) to that layer's count;
    ``cache[layer_idx]`` returns the state (``KeyError`` for a layer never updated); ``len(cache)`` is the number of
    layer slots (the highest updated ``layer_idx`` + 1) and iterating yields them (None for a slot never updated);
    ``get_seq_length(layer_idx)`` is the tokens that layer has seen (0 before its first update).

    It follows the method set of fla's ``Cache`` (``update``, ``__getitem__``, ``__len__``, ``get_seq_length``) with one
    difference, decided here: an entry is the layer's own state object (``GDNState``, ``InterdomainState``,
    ``NatsLState``, or ``models.padding.RowStates`` after a left-padded prefill of NAtS-L), not fla's dict of
    ``recurrent_state`` / ``attn_state`` / ``conv_state`` tensors. The faces accept fla's own ``Cache`` too (what fla's
    models make with ``use_cache=True``): there the state object is the entry's ``recurrent_state``.
    """

    is_compileable = False

    def __init__(self) -> None:
        self.states: list[Any] = []
        self.seen_tokens: list[int] = []

    def update(self, state: Any, layer_idx: int = 0, offset: int = 1) -> Any:
        """Store ``state`` as layer ``layer_idx``'s state after ``offset`` more tokens; returns it."""
        if layer_idx < 0:
            raise ValueError(f"layer_idx must be >= 0, got {layer_idx}")
        while len(self.states) <= layer_idx:
            self.states.append(None)
            self.seen_tokens.append(0)
        self.states[layer_idx] = state
        self.seen_tokens[layer_idx] += offset
        return state

    def __getitem__(self, layer_idx: int) -> Any:
        if not 0 <= layer_idx < len(self.states) or self.states[layer_idx] is None:
            raise KeyError(f"LayerCache holds no state for layer_idx {layer_idx} (layers with a state: "
                           f"{[i for i, s in enumerate(self.states) if s is not None]})")
        return self.states[layer_idx]

    def get(self, layer_idx: int) -> Any | None:
        """Layer ``layer_idx``'s state, or None before its first update."""
        return self.states[layer_idx] if 0 <= layer_idx < len(self.states) else None

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[Any]:
        """Every layer slot's state in layer order (None for a slot never updated)."""
        return iter(self.states)

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        """Tokens layer ``layer_idx`` (default 0) has seen, padding included; 0 before its first update."""
        i = layer_idx or 0
        return self.seen_tokens[i] if i < len(self.seen_tokens) else 0

    def get_max_cache_shape(self) -> int:
        return -1  # no maximum: recurrent states are fixed-size and NAtS-L's softmax cache grows on demand

    def __repr__(self) -> str:
        kinds = sorted({type(s).__name__ for s in self.states if s is not None})
        return f"LayerCache(layers={len(self.states)}, seen_tokens={self.seen_tokens}, kinds={kinds})"


def is_fla_cache(cache: Any) -> bool:
    """Whether ``cache`` is fla's kind of cache (``fla.models.utils.Cache``, ``FLACache``, ``LegacyFLACache``): an
    ``update`` that takes ``recurrent_state`` and ``layer_idx``, entries read by ``cache[layer_idx]`` as dicts.
    Recognised by that method, so fla is not imported here."""
    update = getattr(cache, "update", None)
    if update is None or isinstance(cache, LayerCache):
        return False
    try:
        params = inspect.signature(update).parameters
    except (TypeError, ValueError):
        return False
    return "recurrent_state" in params and "layer_idx" in params


def read_state(cache: Any, layer_idx: int) -> Any | None:
    """Layer ``layer_idx``'s state in a ``LayerCache`` or an fla cache (``is_fla_cache``), or None before its first
    update."""
    if isinstance(cache, LayerCache):
        return cache.get(layer_idx)
    if len(cache) <= layer_idx or cache[layer_idx] is None:
        return None
    return cache[layer_idx].get("recurrent_state")


def store_state(cache: Any, state: Any, layer_idx: int, offset: int) -> None:
    """Store ``state`` as layer ``layer_idx``'s after ``offset`` more tokens: ``LayerCache.update``, or fla's
    ``update(recurrent_state=state, layer_idx=..., offset=...)``, which also counts the tokens per layer."""
    if isinstance(cache, LayerCache):
        cache.update(state, layer_idx, offset)
    else:
        cache.update(recurrent_state=state, layer_idx=layer_idx, offset=offset)
