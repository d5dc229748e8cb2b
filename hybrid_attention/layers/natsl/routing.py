"""NAtS-L routing outside the layer's state: what may force it (``RoutingSpec``, configuration) and what records it
(``RoutingRecorder``, an analysis hook). DECISION: a NAtS-L layer remembers nothing about its past passes, and its
decode state holds only what decoding needs."""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SOFTMAX", "GDN", "RoutingSpec", "RoutingRecorder", "force_routing"]

SOFTMAX, GDN = 0, 1  # op indices of the routing logits (the fusion weights ω use the opposite order: ω₀ = GDN)


@dataclass(frozen=True)
class RoutingSpec:
    """The forced chunk types of a NAtS-L layer. ``force``: None (the router decides), "softmax", "gdn", or a
    softmax fraction p in [0, 1] (chunk n is softmax iff floor((n+1)p) > floor(np): evenly spaced, the same for
    every row and head): analysis, tests and speed measurements at a set fraction. Validated on construction.

    Forcing is configuration: a frozen spec in the layer's ``routing`` attribute, set once (the layer's
    ``force_routing`` argument, ``mixer_options``, or ``force_routing(model, ...)`` before a measurement). The eager
    forward, the continued prefill / decode and the static step all read it."""

    force: str | float | None = None

    def __post_init__(self) -> None:
        fr = self.force
        named = isinstance(fr, str) and fr in ("softmax", "gdn")
        fraction = isinstance(fr, (int, float)) and not isinstance(fr, bool) and 0.0 <= fr <= 1.0
        if not (fr is None or named or fraction):
            raise ValueError(f"force_routing must be None, 'softmax', 'gdn' or a fraction in [0, 1], got {fr!r}")

    def apply(self, hard: torch.Tensor, first_chunk: int | torch.Tensor) -> torch.Tensor:
        """The router's one-hot routing hard [B, N, Hn, 2] of chunks first_chunk.. (an int, or an integer device
        tensor in the static step: 0-d, or [B] with rows at their own chunk numbers) -> the routing imposed by
        ``force`` (``hard`` itself when None)."""
        fr = self.force
        if fr is None:
            return hard
        if isinstance(fr, str):
            sel = torch.full(hard.shape[:-1], fr == "softmax", dtype=torch.bool, device=hard.device)
        else:
            n = torch.arange(hard.shape[1], device=hard.device, dtype=torch.float64)  # chunk numbers [N] or [B, N]
            per_row = isinstance(first_chunk, torch.Tensor) and first_chunk.dim() == 1
            n = first_chunk[:, None] + n[None] if per_row else first_chunk + n
            sel = torch.floor((n + 1) * fr) > torch.floor(n * fr)
            sel = (sel[..., None] if per_row else sel[None, :, None]).expand(hard.shape[:-1])
        return F.one_hot(torch.where(sel, SOFTMAX, GDN), 2).to(hard.dtype)

    def forced_count(self, n_chunks: int) -> int | None:
        """How many of chunks 0..n_chunks-1 ``force`` types softmax (the same for every row and head), computed on
        the host with ``apply``'s own formula (no device read); None when the router decides."""
        if self.force is None:
            return None
        hard = torch.zeros(1, n_chunks, 1, 2, dtype=torch.float64)
        return int(self.apply(hard, 0)[..., SOFTMAX].sum())


def _routes(module: nn.Module) -> bool:
    return isinstance(getattr(module, "routing", None), RoutingSpec)


def _routing_layers(target: nn.Module | Mapping[Hashable, nn.Module]) -> dict[Hashable, nn.Module]:
    """{key: NAtS-L layer} of a model (its ``routing_layers()``: layer index -> layer), a layer (key None) or a
    mapping."""
    if isinstance(target, Mapping):
        return dict(target)
    if _routes(target):
        return {None: target}
    if hasattr(target, "routing_layers"):
        return dict(target.routing_layers())
    raise TypeError(f"{type(target).__name__} has no NAtS-L routing (no `routing` spec, no routing_layers())")


def force_routing(target: nn.Module | Mapping[Hashable, nn.Module], force: str | float | None) -> None:
    """Set ``RoutingSpec(force)`` on every NAtS-L layer of ``target`` (a model, a layer or {key: layer})."""
    spec = RoutingSpec(force)
    for layer in _routing_layers(target).values():
        layer.routing = spec


class RoutingRecorder:
    """Chunk types of the NAtS-L layers it is attached to, all bool tensors, True = softmax; passed in for the calls
    it should see:

        rec = RoutingRecorder()
        with rec.attach(model):       # a model (its ``routing_layers()``), one layer, or {key: layer}
            model(ids)
        rec.fractions()               # {layer index: softmax fraction per decision head [Hn]} of the last pass

    The recorder keeps, per layer and in call order, the chunk types of each pass from an empty state (prefill /
    training forward) and every chunk typed (those passes' chunks, then each chunk completed while decoding from a
    state). Outside ``attach`` a layer holds no recorder; attachments nest (an outer recorder keeps seeing the calls of
    an inner one's block). The static step (``layers/natsl/static.py``) records nothing: it runs inside compiled /
    captured graphs, where a host-side list is not allowed.
    """

    def __init__(self) -> None:
        self._keys: dict[int, Hashable] = {}  # id(layer) -> key
        self._passes: dict[Hashable, list[torch.Tensor]] = {}  # [B, N, Hn] per pass from an empty state
        self._chunks: dict[Hashable, list[torch.Tensor]] = {}  # [B, n, Hn] per typing, in sequence order

    @contextlib.contextmanager
    def attach(self, target: nn.Module | Mapping[Hashable, nn.Module]) -> Iterator[RoutingRecorder]:
        """Record the NAtS-L layers of ``target`` (a model, a layer or {key: layer}) inside the ``with`` block;
        attaching again appends to what was recorded."""
        layers = _routing_layers(target)
        for key, layer in layers.items():
            if self in layer.recorders:
                raise RuntimeError(f"this RoutingRecorder is already attached to NAtS-L layer {key!r}")
            self._keys[id(layer)] = key
            layer.recorders = (*layer.recorders, self)
        try:
            yield self
        finally:
            for layer in layers.values():
                layer.recorders = tuple(r for r in layer.recorders if r is not self)

    # ------------------------------------------------------------------------------------------------ the layer's
    # Both run eagerly under torch.compile (a graph break per recorded layer): traced, their appends put guards on the
    # recorder's list lengths into the graph, so every call of a compiled model with a recorder attached would recompile
    # (H200: a 128K natsl-hybrid-340m prefill 8.55 s instead of ~0.7 s, the compile inside the timing).
    @torch.compiler.disable
    def record_pass(self, layer: nn.Module, types: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """A pass from an empty state typed its complete chunks: types [B, N, Hn] (N may be 0). valid [N] bool: which
        rows are chunks (a packed pass types a static bound of rows, the complete chunks first, ``NatsLAttention.
        _complete_chunks``); they are kept, the others dropped: a boolean-mask selection, one host read of the count
        per recorded pass (a recorder is an analysis hook, attached only on request; without one the layer reads
        nothing)."""
        key = self._keys[id(layer)]
        types = types.detach().bool()
        if valid is not None:
            types = types[:, valid]
        self._passes.setdefault(key, []).append(types)
        self._chunks.setdefault(key, []).append(types)

    @torch.compiler.disable
    def record_chunk(self, layer: nn.Module, types: torch.Tensor) -> None:
        """Decoding / continued prefill from a state completed one chunk: types [B, 1, Hn]."""
        self._chunks.setdefault(self._keys[id(layer)], []).append(types.detach().bool())

    # ------------------------------------------------------------------------------------------------ the reader's
    def last(self, key: Hashable = None) -> torch.Tensor | None:
        """Types [B, N, Hn] of the last pass from an empty state of layer ``key`` (None before any)."""
        passes = self._passes.get(key)
        return passes[-1] if passes else None

    def fraction(self, key: Hashable = None) -> torch.Tensor | None:
        """Softmax fraction per decision head [Hn] (float32) of the last pass of layer ``key`` that typed at least
        one chunk (None before any)."""
        for types in reversed(self._passes.get(key, [])):
            if types.shape[1]:
                return types.float().mean((0, 1))
        return None

    def fractions(self) -> dict[Hashable, torch.Tensor]:
        """{key: ``fraction(key)``} of every attached layer that has one, in the order they were attached (a model:
        layer order)."""
        out = {key: self.fraction(key) for key in dict.fromkeys(self._keys.values())}
        return {key: f for key, f in out.items() if f is not None}

    def mean_fractions(self) -> dict[Hashable, float]:
        """{key: mean over the decision heads of ``fraction(key)``}: the softmax fraction a state size assumes
        (``HybridForCausalLM.state_size(seq_len, softmax_fractions=...)``)."""
        return {key: float(f.mean()) for key, f in self.fractions().items()}

    def pass_fractions(self, key: Hashable = None) -> list[torch.Tensor]:
        """Softmax fraction per decision head [Hn] of every pass of layer ``key`` that typed at least one chunk."""
        return [t.float().mean((0, 1)) for t in self._passes.get(key, []) if t.shape[1]]

    def chunk_types(self, key: Hashable = None) -> torch.Tensor:
        """Every chunk layer ``key`` typed while recorded, in sequence order: [B, N_total, Hn]."""
        return torch.cat(self._chunks[key], 1)
