"""Serving: static-buffer, CUDA-graph capturable decoding of whole models and its latency benchmark."""

from hybrid_attention.serving.decoder import StaticDecoder
from hybrid_attention.serving.static_layers import STATIC_MIXERS, static_mixer_for

__all__ = ["STATIC_MIXERS", "StaticDecoder", "static_mixer_for"]
