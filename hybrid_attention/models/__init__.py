"""Configuration, decoder model and cache."""

from hybrid_attention.models.cache import HybridCache
from hybrid_attention.models.configuration import PRESETS, HybridConfig
from hybrid_attention.models.modeling import HybridForCausalLM, HybridModel

__all__ = ["PRESETS", "HybridCache", "HybridConfig", "HybridForCausalLM", "HybridModel"]
