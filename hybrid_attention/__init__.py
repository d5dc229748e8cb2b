"""hybrid_attention: Interdomain Attention, NAtS-L and their baselines.

Importing the package registers the `hybrid_attention` model type with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(dir)` works on checkpoints written by this library.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from hybrid_attention.models import HybridCache, HybridConfig, HybridForCausalLM, HybridModel

__version__ = "0.1.0"

AutoConfig.register(HybridConfig.model_type, HybridConfig, exist_ok=True)
AutoModel.register(HybridConfig, HybridModel, exist_ok=True)
AutoModelForCausalLM.register(HybridConfig, HybridForCausalLM, exist_ok=True)

__all__ = ["HybridCache", "HybridConfig", "HybridForCausalLM", "HybridModel", "__version__"]
