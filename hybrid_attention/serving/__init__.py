"""Serving: static-buffer, compiled, CUDA-graph capturable decoding of whole models (``StaticDecoder``). Its latency
benchmark is ``benchmarks/decode_latency.py``. The per-mixer one-token steps are part of each mixer's contract
(layers/base.py), not of this package."""

from hybrid_attention.serving.decoder import StaticDecoder

__all__ = ["StaticDecoder"]
