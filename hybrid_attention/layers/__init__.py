"""Token mixers, all following the contract in `layers/base.py`."""

from hybrid_attention.layers.base import TokenMixer
from hybrid_attention.layers.gated_deltanet import GatedDeltaNet, GDNState
from hybrid_attention.layers.interdomain import InterdomainAttention, InterdomainState, S4DBilinearMixer, S4DMixer
from hybrid_attention.layers.natsl import NatsLAttention, NatsLState
from hybrid_attention.layers.softmax import KVState, SoftmaxAttention

__all__ = [
    "GDNState",
    "GatedDeltaNet",
    "InterdomainAttention",
    "InterdomainState",
    "KVState",
    "NatsLAttention",
    "NatsLState",
    "S4DBilinearMixer",
    "S4DMixer",
    "SoftmaxAttention",
    "TokenMixer",
]
