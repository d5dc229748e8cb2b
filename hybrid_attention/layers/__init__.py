"""Token mixers, all following the contract in `layers/base.py`."""

from hybrid_attention.layers.base import StaticState, TokenMixer, has_static_step
from hybrid_attention.layers.gated_deltanet import GatedDeltaNet, GDNState, GDNStaticState
from hybrid_attention.layers.interdomain import (
    InterdomainAttention,
    InterdomainState,
    InterdomainStaticState,
    S4DBilinearMixer,
    S4DMixer,
)
from hybrid_attention.layers.natsl import NatsLAttention, NatsLState
from hybrid_attention.layers.natsl.routing import RoutingRecorder, RoutingSpec, force_routing
from hybrid_attention.layers.natsl.static import NatsLStaticState
from hybrid_attention.layers.softmax import KVState, SoftmaxAttention, StaticKVState

__all__ = [
    "GDNState",
    "GDNStaticState",
    "GatedDeltaNet",
    "InterdomainAttention",
    "InterdomainState",
    "InterdomainStaticState",
    "KVState",
    "NatsLAttention",
    "NatsLState",
    "NatsLStaticState",
    "RoutingRecorder",
    "RoutingSpec",
    "S4DBilinearMixer",
    "S4DMixer",
    "SoftmaxAttention",
    "StaticKVState",
    "StaticState",
    "TokenMixer",
    "force_routing",
    "has_static_step",
]
