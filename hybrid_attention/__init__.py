"""hybrid_attention: Interdomain Attention, NAtS-L and their baselines.

Importing the package registers the `hybrid_attention` model type with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(dir)` works on checkpoints written by this library.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from hybrid_attention.models import HybridCache, HybridConfig, HybridForCausalLM, HybridModel

__version__ = "0.1.0"

# Loading a saved model needs `import hybrid_attention` first; without it transformers reports model type
# `hybrid_attention` as unknown and suggests upgrading. No other route is taken, on purpose: transformers reads no
# plugin entry points for model types (its Auto classes know only the built-in mapping and what `register` adds), and
# an `auto_map` in config.json would make from_pretrained import code from the model folder (trust_remote_code),
# which this library never writes or loads (tests/models/test_hf_integration_conveniences.py checks both).
AutoConfig.register(HybridConfig.model_type, HybridConfig, exist_ok=True)
AutoModel.register(HybridConfig, HybridModel, exist_ok=True)
AutoModelForCausalLM.register(HybridConfig, HybridForCausalLM, exist_ok=True)

__all__ = ["HybridCache", "HybridConfig", "HybridForCausalLM", "HybridModel", "__version__"]
