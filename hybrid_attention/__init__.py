"""hybrid_attention: Interdomain Attention, NAtS-L and their baselines.

Importing the package registers the `hybrid_attention` model type with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)` work on folders written by this
library; `hybrid_attention.evaluation.loading.load_model(dir)` is the checked route (every rule of the command
line, manifest verified).
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

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
# The tokenizer of a model of this library is a fast (tokenizers) tokenizer. Registered, transformers counts the
# tokenizer as local code, so AutoTokenizer on a model folder never asks "run the custom code? [y/N]" for an
# `auto_map` in tokenizer_config.json and never imports the folder's code (unless trust_remote_code=True is passed);
# tests/evaluation/test_load_trust.py answers "y" to a prompt under a terminal to show that none appears.
AutoTokenizer.register(HybridConfig, fast_tokenizer_class=PreTrainedTokenizerFast, exist_ok=True)


__all__ = ["HybridCache", "HybridConfig", "HybridForCausalLM", "HybridModel", "__version__"]
