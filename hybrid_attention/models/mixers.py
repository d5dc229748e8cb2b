"""Mixer name -> layer constructor. The one place where config fields become layer arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hybrid_attention.layers.base import TokenMixer
from hybrid_attention.layers.interdomain import InterdomainAttention, S4DMixer
from hybrid_attention.layers.softmax import SoftmaxAttention

if TYPE_CHECKING:
    from hybrid_attention.models.configuration import HybridConfig


def _softmax(cfg: HybridConfig, opts: dict) -> TokenMixer:
    return SoftmaxAttention(cfg.hidden_size, cfg.num_heads, cfg.head_dim, rope_theta=cfg.rope_theta, **opts)


def _interdomain(cfg: HybridConfig, opts: dict) -> TokenMixer:
    opts = {"state_size": cfg.state_size, "chunk_size": cfg.chunk_size, "norm_eps": cfg.norm_eps, **opts}
    return InterdomainAttention(cfg.hidden_size, cfg.num_heads, cfg.head_dim, rope_theta=cfg.rope_theta, **opts)


def _s4d(cfg: HybridConfig, opts: dict) -> TokenMixer:
    opts = {"state_size": cfg.state_size, "chunk_size": cfg.chunk_size, "norm_eps": cfg.norm_eps, **opts}
    return S4DMixer(cfg.hidden_size, cfg.num_heads, head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, **opts)


MIXER_BUILDERS: dict[str, Callable[[HybridConfig, dict], TokenMixer]] = {
    "softmax": _softmax,
    "interdomain": _interdomain,
    "s4d": _s4d,
}


def build_mixer(cfg: HybridConfig, layer_idx: int) -> TokenMixer:
    name = cfg.mixer_types[layer_idx]
    opts = dict(cfg.mixer_options.get(name, {}))
    try:
        return MIXER_BUILDERS[name](cfg, opts)
    except TypeError as e:  # unknown option name for this mixer
        raise ValueError(f"mixer_options[{name!r}] has an invalid option: {e}") from e
