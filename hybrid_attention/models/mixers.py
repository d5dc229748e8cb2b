"""Mixer name -> layer constructor. The one place where config fields become layer arguments.

Each builder starts from defaults taken from the config (hidden size, heads, head dim, state size, chunk size, eps,
RoPE θ) and lets `config.mixer_options[name]` override any of them, e.g. the softmax layers of a GDN hybrid use
{"softmax": {"num_heads": 16, "head_dim": 64}} while the GDN layers use the config's 6 × 128.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hybrid_attention.layers.base import TokenMixer
from hybrid_attention.layers.gated_deltanet import GatedDeltaNet
from hybrid_attention.layers.interdomain import InterdomainAttention, S4DBilinearMixer, S4DMixer
from hybrid_attention.layers.natsl import NatsLAttention
from hybrid_attention.layers.softmax import SoftmaxAttention

if TYPE_CHECKING:
    from hybrid_attention.models.configuration import HybridConfig


def _heads(cfg: HybridConfig) -> dict[str, Any]:
    return {"num_heads": cfg.num_heads, "head_dim": cfg.head_dim}


def _ssm(cfg: HybridConfig) -> dict[str, Any]:
    return {**_heads(cfg), "state_size": cfg.state_size, "chunk_size": cfg.chunk_size, "norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta}


# Revision of what the mixer names compute, stamped on every experiment result (experiments/runner.py) so that results
# of an earlier revision are never merged with new ones under the same cell name. 1: bilinear `s4d`, S4D-Inv
# with N = M, a complex B per head. 2: `s4d` is the linear control and the bilinear
# one is `s4d_bilinear`; S4D-Inv with N = 2M; B one real gain per SSM input channel; the `readout` flag.
MODEL_REVISION = 2

MIXER_BUILDERS: dict[str, tuple[type[TokenMixer], Callable[[HybridConfig], dict[str, Any]]]] = {
    "softmax": (SoftmaxAttention, lambda cfg: {**_heads(cfg), "rope_theta": cfg.rope_theta}),
    # the config's readout, never the layer's constructor default (HybridConfig.interdomain_readout)
    "interdomain": (InterdomainAttention, lambda cfg: {**_ssm(cfg), "readout": cfg.interdomain_readout}),
    "s4d": (S4DMixer, _ssm),  # the paper's S4D-only control (readout linear in the state)
    "s4d_bilinear": (S4DBilinearMixer, _ssm),  # the library's earlier bilinear S4D mixer, a stronger baseline
    "gdn": (GatedDeltaNet, lambda cfg: {**_heads(cfg), "chunk_size": cfg.chunk_size, "norm_eps": cfg.norm_eps}),
    # NAtS-L: G = 2 softmax heads per GDN head unless mixer_options say otherwise (the released 340M config).
    "natsl": (NatsLAttention, lambda cfg: {**_heads(cfg), "num_attn_heads": 2 * cfg.num_heads,
                                           "chunk_size": cfg.chunk_size, "norm_eps": cfg.norm_eps,
                                           "rope_theta": cfg.rope_theta}),
}


def build_mixer(cfg: HybridConfig, layer_idx: int) -> TokenMixer:
    name = cfg.mixer_types[layer_idx]
    cls, defaults = MIXER_BUILDERS[name]
    kwargs = {**defaults(cfg), **cfg.mixer_options.get(name, {})}
    try:
        return cls(cfg.hidden_size, **kwargs)
    except TypeError as e:  # unknown option name for this mixer
        raise ValueError(f"mixer_options[{name!r}] has an invalid option: {e}") from e
