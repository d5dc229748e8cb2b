"""NAtS-L: the layer (`layer.py`), its static decode step (`static.py`) and its routing hooks (`routing.py`)."""

from hybrid_attention.layers.natsl.layer import NatsLAttention, NatsLState
from hybrid_attention.layers.natsl.routing import GDN, SOFTMAX, RoutingRecorder, RoutingSpec, force_routing
from hybrid_attention.layers.natsl.static import NatsLStaticState, NatsLStaticStep

__all__ = [
    "GDN",
    "SOFTMAX",
    "NatsLAttention",
    "NatsLState",
    "NatsLStaticState",
    "NatsLStaticStep",
    "RoutingRecorder",
    "RoutingSpec",
    "force_routing",
]
