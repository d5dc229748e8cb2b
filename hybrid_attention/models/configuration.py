"""HybridConfig: one decoder configuration for every mixer, plus named presets."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
from transformers import PretrainedConfig

from hybrid_attention.models.mixers import MIXER_BUILDERS
from hybrid_attention.modules.mlp import swiglu_hidden_size
from hybrid_attention.ops.interdomain import readout as _readout

# Revision of the config format (what a config records; what the mixers compute is MODEL_REVISION, models/mixers.py).
# 0: nothing recorded beyond the fields set. 1: an Interdomain config records its readout in
# mixer_options["interdomain"]["readout"] (HybridConfig.__init__ writes it in when it is not set).
# DECISION (how a saved config is told from a fresh one, here only): every new config stores `config_revision`, so
# every config saved since does too (to_dict / save_pretrained keep the attribute; from_dict, from_pretrained,
# from_json_file pass it back to __init__). A config dict without it that carries `transformers_version` (written
# by every to_dict / save_pretrained, passed by no fresh construction) was saved before: revision 0, whose Interdomain
# readout is LEGACY_READOUT. Without either key the config is fresh (revision 1, DEFAULT_READOUT).
CONFIG_REVISION = 1


def _interdomain_family(hidden: int, layers: int, heads: int, head_dim: int, mixer: str) -> dict[str, Any]:
    """Interdomain paper shapes (spec §4.1): Llama-2 vocab, SwiGLU (2/3)·4d rounded up to 128, M = 64, R = d_h."""
    return dict(
        vocab_size=32000, hidden_size=hidden, num_hidden_layers=layers, num_heads=heads, head_dim=head_dim,
        state_size=64, layers=mixer, max_position_embeddings=4096,
    )


_PAPER_SCALES = {"125m": (768, 12, 12, 64), "350m": (1024, 24, 16, 64), "760m": (1536, 24, 16, 96),
                 "1.3b": (2048, 24, 32, 64)}

PRESETS: dict[str, dict[str, Any]] = {
    # CI: a few thousand parameters per layer, byte vocabulary (256 bytes + 3 specials).
    "tiny": dict(vocab_size=259, hidden_size=64, num_hidden_layers=2, num_heads=2, head_dim=32, state_size=16,
                 chunk_size=16, layers="interdomain", max_position_embeddings=1024),
    # ~20M parameters with a byte vocabulary: CPU demos and small GPU experiments.
    "small": dict(vocab_size=259, hidden_size=512, num_hidden_layers=6, num_heads=8, head_dim=64, state_size=64,
                  layers="interdomain", max_position_embeddings=2048),
}
for _scale, (_d, _l, _h, _dh) in _PAPER_SCALES.items():
    for _mixer in ("interdomain", "softmax", "s4d"):
        PRESETS[f"{_mixer}-{_scale}"] = _interdomain_family(_d, _l, _h, _dh, _mixer)


# NAtS-L paper family (spec natsl.md §3–4): 21 layers, GDN heads 6 × d_k (d_v = 2 d_k), 64-token chunks, Llama-2
# vocabulary, SwiGLU 256·ceil(8d/3 / 256), eps 1e-6, N(0, 0.02) init without residual rescaling (the official code).
_NATSL_HYBRID_LAYERS = ["gdn", "gdn", "gdn", "natsl"] * 5 + ["natsl"]  # NAtS-L at layers 3, 7, 11, 15, 19, 20


def _natsl_family(hidden: int, head_dim: int, attn_heads: int, intermediate: int, layers, **opts) -> dict[str, Any]:
    return dict(
        vocab_size=32000, hidden_size=hidden, num_hidden_layers=21, num_heads=6, head_dim=head_dim,
        intermediate_size=intermediate, chunk_size=64, layers=layers, rescale_residual=False,
        max_position_embeddings=4096, mixer_options={"natsl": {"num_attn_heads": attn_heads, **opts}},
    )


PRESETS.update({
    "natsl-hybrid-340m": _natsl_family(1024, 128, 12, 2816, _NATSL_HYBRID_LAYERS),
    "natsl-hybrid-760m": _natsl_family(1536, 192, 18, 4096, _NATSL_HYBRID_LAYERS),
    # The paper's all-layers "NAtS-L" uses RoPE on the softmax branch; the Hybrid does not.
    "natsl-340m": _natsl_family(1024, 128, 12, 2816, "natsl", rope=True),
    # Decision: the GDN baseline uses the GDN layer of the NAtS-L Hybrid (6 × 128/256), so the three 340M models
    # differ only in the mixer of six layers (flame's GDN 340M config uses 6 × 256/512 instead).
    "gdn-340m": _natsl_family(1024, 128, 12, 2816, "gdn"),
    # GDN Hybrid (3:1): softmax attention (16 × 64, RoPE) where the NAtS-L Hybrid has NAtS-L layers.
    "gdn-hybrid-340m": {
        **_natsl_family(1024, 128, 12, 2816, [("softmax" if n == "natsl" else n) for n in _NATSL_HYBRID_LAYERS]),
        "mixer_options": {"softmax": {"num_heads": 16, "head_dim": 64}},
    },
    # Transformer++ 340M (flame's reference config): 24 layers, 16 heads × 64, RoPE, SwiGLU, untied.
    "transformer-340m": dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=24, num_heads=16, head_dim=64,
                             intermediate_size=2816, layers="softmax", rescale_residual=False,
                             max_position_embeddings=8192),
})


def mixer_option_names(cls: type) -> list[str]:
    """The keyword arguments a mixer class accepts after ``hidden_size``: its ``__init__`` parameters and, where it
    forwards ``**kwargs``, those of the parent class it forwards to (e.g. S4DMixer -> S4DCoreMixer)."""
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass in (torch.nn.Module, object):
            continue
        params = list(inspect.signature(vars(klass)["__init__"]).parameters.values())[1:]  # without self
        names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and p.name != "hidden_size" and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


class HybridConfig(PretrainedConfig):
    """Configuration of `HybridForCausalLM`.

    `layers` is one mixer name for every layer or a list with one name per layer (then it sets num_hidden_layers);
    names: see `hybrid_attention.models.mixers.MIXER_BUILDERS`. `mixer_options[name]` holds extra constructor
    arguments of that mixer (e.g. {"interdomain": {"rope": False}}); with an interdomain layer the config records
    mixer_options["interdomain"]["readout"] (see `interdomain_readout`, CONFIG_REVISION). `state_size` is the S4D basis
    size M and `chunk_size` the chunk length of the chunked ops.
    """

    model_type = "hybrid_attention"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_heads: int = 12,
        head_dim: int | None = None,
        intermediate_size: int | None = None,
        layers: str | list[str] = "interdomain",
        mixer_options: dict[str, dict[str, Any]] | None = None,
        state_size: int = 64,
        chunk_size: int = 64,
        rope_theta: float = 10000.0,
        norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        rescale_residual: bool = True,
        max_position_embeddings: int = 4096,
        tie_word_embeddings: bool = False,
        use_cache: bool = True,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(layers, (list, tuple)):
            layers = list(layers)
            num_hidden_layers = len(layers)  # a per-layer list defines the depth
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_heads = num_heads
        self.head_dim = head_dim or (hidden_size // num_heads if num_heads else None)
        self.intermediate_size = intermediate_size or swiglu_hidden_size(hidden_size)
        self.layers = layers
        self.mixer_options = copy.deepcopy(mixer_options) if mixer_options else {}
        self.state_size = state_size
        self.chunk_size = chunk_size
        self.rope_theta = rope_theta
        self.norm_eps = norm_eps
        self.initializer_range = initializer_range
        self.rescale_residual = rescale_residual
        self.max_position_embeddings = max_position_embeddings
        self.use_cache = use_cache
        revision = kwargs.pop("config_revision", None)
        if revision is None:  # the DECISION at CONFIG_REVISION
            revision = 0 if "transformers_version" in kwargs else CONFIG_REVISION
        super().__init__(
            tie_word_embeddings=tie_word_embeddings, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
            pad_token_id=pad_token_id, **kwargs,
        )
        self.config_revision = revision
        self.validate_fields()
        if "interdomain" in self.mixer_types:
            self.mixer_options.setdefault("interdomain", {}).setdefault("readout", self.interdomain_readout)

    @property
    def mixer_types(self) -> list[str]:
        """One mixer name per layer."""
        if isinstance(self.layers, str):
            return [self.layers] * self.num_hidden_layers
        return list(self.layers)

    @property
    def interdomain_readout(self) -> str:
        """The readout of the interdomain layers: mixer_options["interdomain"]["readout"] where set, else what a
        config of this revision means without it (revision 0: LEGACY_READOUT; later: DEFAULT_READOUT)."""
        opts = self.mixer_options.get("interdomain", {})
        if "readout" in opts:
            return opts["readout"]
        return _readout.LEGACY_READOUT if self.config_revision < 1 else _readout.DEFAULT_READOUT

    def to_dict(self) -> dict[str, Any]:
        """As PretrainedConfig.to_dict (save_pretrained uses it too), with the interdomain readout written in also when
        layers or mixer_options were changed after construction."""
        out = super().to_dict()
        if "interdomain" in self.mixer_types:
            out["mixer_options"].setdefault("interdomain", {}).setdefault("readout", self.interdomain_readout)
        return out

    def validate_fields(self) -> None:
        """Raise ValueError naming the offending field and the allowed values (a ``config_revision`` above
        ``CONFIG_REVISION`` is a config saved by a newer version of this library, which this one does not read)."""
        revision = self.config_revision
        if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
            raise ValueError(f"config_revision must be an integer from 0 to {CONFIG_REVISION}, got {revision!r}")
        if revision > CONFIG_REVISION:
            raise ValueError(f"config_revision {revision}, written by a newer version of hybrid_attention (this one "
                             f"reads config_revision {CONFIG_REVISION} at most); upgrade hybrid_attention to load it")
        allowed = sorted(MIXER_BUILDERS)
        for i, name in enumerate(self.mixer_types):
            if name not in allowed:
                raise ValueError(f"layers[{i}] = {name!r} is not a mixer; allowed values: {allowed}")
        for key, opts in self.mixer_options.items():
            if key not in allowed:
                raise ValueError(f"mixer_options has key {key!r}; allowed keys: {allowed}")
            if not isinstance(opts, dict):
                raise ValueError(f"mixer_options[{key!r}] must be a mapping of option names to values, got {opts!r}")
            names = mixer_option_names(MIXER_BUILDERS[key][0])
            for opt in opts:
                if opt not in names:
                    raise ValueError(f"mixer_options[{key!r}] has unknown option {opt!r}; allowed options of "
                                     f"{key}: {', '.join(names)}")
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "head_dim", "intermediate_size",
                    "state_size", "chunk_size")
        for field in positive:
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{field} must be a positive integer, got {v!r}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        for field in ("norm_eps", "initializer_range", "rope_theta"):
            v = getattr(self, field)
            if not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"{field} must be a positive number, got {v!r}")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> HybridConfig:
        """A named preset with overrides, e.g. `from_preset("tiny", layers="softmax")` or `layers=[...]`."""
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
        return cls(**{**copy.deepcopy(PRESETS[name]), **overrides})
