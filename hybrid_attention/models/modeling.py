"""Decoder-only language model over any mix of token mixers (pre-norm blocks, one mixer and one SwiGLU MLP each), with
HuggingFace integration."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.utils import ModelOutput

from hybrid_attention.layers.base import TokenMixer, left_pad
from hybrid_attention.layers.natsl import NatsLAttention
from hybrid_attention.models.cache import HybridCache
from hybrid_attention.models.configuration import HybridConfig
from hybrid_attention.models.mixers import build_mixer
from hybrid_attention.models.padding import (
    RowStates,
    check_position_ids,
    left_padding_lengths,
    mixer_per_document,
    mixer_per_row,
    pack_rows,
    unpack_rows,
)
from hybrid_attention.modules import HeadRMSNorm, RMSNorm, S4DCore, ShortConvolution, SwiGLU
from hybrid_attention.ops.common.varlen import cu_seqlens_from_lengths

# transformers renamed the cache from `past_key_values` to `cache` (5.2x): newer ModelOutput classes carry a
# `past_key_values` property aliasing `.cache` and refuse both names in the constructor; older ones read the cache that
# generate() feeds back only from a `past_key_values` key. The output class below exposes the cache under both names.
_CACHE_IS_RENAMED = isinstance(getattr(ModelOutput, "past_key_values", None), property)


@dataclass
class HybridCausalLMOutput(ModelOutput):
    """loss: scalar; logits: [B, T', vocab]; cache (also readable as past_key_values): HybridCache or None;
    hidden_states: optional tuple of [B, T, d] (embeddings and each block's output)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    cache: HybridCache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    if not _CACHE_IS_RENAMED:
        past_key_values: HybridCache | None = None


def _causal_lm_output(**fields) -> HybridCausalLMOutput:
    if not _CACHE_IS_RENAMED:
        fields["past_key_values"] = fields["cache"]
    return HybridCausalLMOutput(**fields)


class HybridBlock(nn.Module):
    """Pre-norm block, Llama style: h = h + Mixer(RMSNorm(h)); h = h + SwiGLU(RMSNorm(h)).

    Args:
        config: the ``HybridConfig``.
        layer_idx: the block's index; ``config.mixer_types[layer_idx]`` names its mixer.
    """

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.mixer_type = config.mixer_types[layer_idx]
        self.attn_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mixer: TokenMixer = build_mixer(config, layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        # Residual-path output projections, rescaled at init by the GPT-2 rule.
        self.mixer.o_proj._is_residual_out = True
        self.mlp.down_proj._is_residual_out = True

    def forward(self, h: torch.Tensor, state=None, output_state: bool = False,
                cu_seqlens: torch.Tensor | None = None):
        x = self.attn_norm(h)
        if isinstance(state, RowStates):
            y, state = mixer_per_row(self.mixer, x, state, output_state)
        elif cu_seqlens is not None and output_state and not self.mixer.packed_states:
            y, state = mixer_per_document(self.mixer, x, cu_seqlens)
        else:
            y, state = self.mixer(x, state, output_state=output_state,
                                  **({} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}))
        h = h + y
        h = h + self.mlp(self.mlp_norm(h))
        return h, state


class HybridPreTrainedModel(PreTrainedModel):
    config_class = HybridConfig
    base_model_prefix = "model"
    # activation checkpointing through modules/activation_checkpointing.py's block wrapper (the same one
    # train.checkpointing uses): the HF names below map to it, so `Trainer(gradient_checkpointing=True)` and PEFT
    # recipes work
    supports_gradient_checkpointing = True
    _no_split_modules = ["HybridBlock"]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """``PreTrainedModel.from_pretrained`` (what ``AutoModelForCausalLM.from_pretrained`` calls for this model
        type) after a local folder passes :func:`hybrid_attention.checkpoints.model_folder.check_folder`, as on every
        load path of the library: a folder naming code to import (``auto_map`` in a ``*config.json``, any ``*.py``),
        holding pickled weights or non-regular files, linking outside its run folder, or whose ``manifest.json`` is of
        a newer version is refused with one line (a ``ValueError``) before anything is read. A model of this library
        never needs ``trust_remote_code``.

        Args:
            pretrained_model_name_or_path: a local folder (checked) or a Hugging Face hub id (transformers' rules).
            model_args, kwargs: passed on to ``PreTrainedModel.from_pretrained`` (``subfolder`` is checked too).
        """
        folder = pretrained_model_name_or_path
        if isinstance(folder, (str, os.PathLike)) and os.path.isdir(folder):
            from hybrid_attention.checkpoints.model_folder import check_folder

            check_folder(os.path.join(folder, kwargs.get("subfolder") or ""))
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict | None = None,
                                        every_n_layers: int = 1, offload: bool = False) -> None:
        """Run every decoder block under ``torch.utils.checkpoint`` (non-reentrant) while training: activations
        are recomputed in the backward, the weights and outputs are unchanged. Only the defaults are supported:
        ``use_reentrant=False``, ``every_n_layers=1``, ``offload=False`` (ValueError naming the argument)."""
        from hybrid_attention.modules.activation_checkpointing import enable_block_checkpointing

        kwargs = dict(activation_checkpointing_kwargs or {})
        if kwargs.pop("use_reentrant", False):
            raise ValueError("gradient checkpointing: use_reentrant=True is not supported; allowed: "
                             "use_reentrant=False")
        if kwargs or every_n_layers != 1 or offload:
            raise ValueError(f"gradient checkpointing: unsupported arguments {sorted(kwargs)} every_n_layers="
                             f"{every_n_layers} offload={offload}; allowed: use_reentrant=False, every_n_layers=1, "
                             "offload=False")
        enable_block_checkpointing(self)

    def activation_checkpointing_disable(self) -> None:
        """Undo :meth:`activation_checkpointing_enable` (every block runs its plain forward)."""
        from hybrid_attention.modules.activation_checkpointing import disable_block_checkpointing

        disable_block_checkpointing(self)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None, **kwargs) -> None:
        """transformers' name of :meth:`activation_checkpointing_enable` (``every_n_layers`` / ``offload`` as
        keywords)."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        """transformers' name of :meth:`activation_checkpointing_disable`."""
        self.activation_checkpointing_disable()

    @property
    def is_activation_checkpointing(self) -> bool:
        """Whether the decoder blocks run under activation checkpointing."""
        from hybrid_attention.modules.activation_checkpointing import checkpointed_blocks

        return checkpointed_blocks(self) > 0

    @property
    def is_gradient_checkpointing(self) -> bool:
        """transformers' name of :attr:`is_activation_checkpointing`."""
        return self.is_activation_checkpointing

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:  # safe to call twice (transformers 5 may re-run it)
        """N(0, initializer_range) init; the GPT-2 rule for the residual-path outputs (mixer o_proj and SwiGLU
        down_proj get std initializer_range / sqrt(2·L)) when ``rescale_residual``."""
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            if getattr(module, "_is_residual_out", False) and self.config.rescale_residual:
                std = std / math.sqrt(2 * self.config.num_hidden_layers)
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
        elif isinstance(module, (S4DCore, ShortConvolution)):
            module.reset_parameters()
        elif isinstance(module, TokenMixer) and hasattr(module, "reset_parameters"):
            module.reset_parameters()  # a mixer's own direct parameters (e.g. the GDN decay A_log, dt_bias)
        elif isinstance(module, (RMSNorm, HeadRMSNorm)):
            if module.weight is not None:
                module.weight.fill_(1.0)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()


class HybridModel(HybridPreTrainedModel):
    """Embeddings, blocks and the final norm. forward(input_ids [B, T]) -> hidden [B, T, d], cache.

    Args:
        config: the ``HybridConfig`` (sizes, ``mixer_types`` per layer, ``mixer_options``).
    """

    def __init__(self, config: HybridConfig) -> None:
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(HybridBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings = value

    def init_cache(self, batch_size: int, device=None, dtype=None) -> HybridCache:
        device = device or self.embeddings.weight.device
        dtype = dtype or self.embeddings.weight.dtype
        return HybridCache([blk.mixer.init_state(batch_size, device=device, dtype=dtype) for blk in self.layers])

    def forward(self, input_ids=None, inputs_embeds=None, cache: HybridCache | None = None, use_cache: bool = False,
                output_hidden_states: bool = False, cu_seqlens: torch.Tensor | None = None):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        h = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if cu_seqlens is not None and cache is not None:
            raise ValueError("cu_seqlens runs packed documents from an empty state: pass no cache")
        if use_cache and cache is None:  # packed documents: every layer starts from None, cache row i = document i
            cache = HybridCache([None] * len(self.layers)) if cu_seqlens is not None else \
                self.init_cache(h.shape[0], device=h.device)
        hidden = [h] if output_hidden_states else None
        new_states = []
        for i, blk in enumerate(self.layers):
            h, st = blk(h, cache.states[i] if cache is not None else None, output_state=use_cache,
                        cu_seqlens=cu_seqlens)
            new_states.append(st)
            if hidden is not None:
                hidden.append(h)
        h = self.norm(h)
        if not use_cache:
            new_cache = None
        else:  # packed: the documents right-aligned in rows of the longest one's width (models/padding.py)
            new_cache = (HybridCache(new_states, *left_pad(cu_seqlens)) if cu_seqlens is not None else
                         HybridCache(new_states, cache.seen_tokens + h.shape[1], cache.pad))
        return h, new_cache, (tuple(hidden) if hidden is not None else None)


class HybridForCausalLM(HybridPreTrainedModel, GenerationMixin):
    """Causal LM. forward(input_ids [B, T], labels=None, cache|past_key_values=None, use_cache=None)
    -> HybridCausalLMOutput(loss, logits [B, T, vocab], cache). Input and output embeddings are untied by default
    (``tie_word_embeddings``).

    Left-padded batches (attention_mask with zeros; DECISIONS, the mechanics in ``models/padding.py``):
    - Only left padding (HF ``padding_side="left"``): every row zeros then ones up to the last column; any other mask
      raises one line naming attention_mask. A mask without zeros is ignored: the unpadded path, bit for bit.
    - Prefill (forward / ``prefill`` / generate's first call, empty cache): the rows' tokens are packed into documents
      (``cu_seqlens`` from the mask) and run through the packed forward, so padding never reaches a layer or a state;
      logits and hidden states come back as [B, T, ...] with zeros at the padding. The cache counts the padded width T
      (``seen_tokens``, what generate() slices by); each layer's state keeps its rows' own positions: softmax keeps row
      b's keys right-aligned with ``KVState.pad[b]`` empty leading slots masked in attention and RoPE at position
      offset - pad[b]; Interdomain / S4D keep ``InterdomainState.pad`` for their RoPE; GDN is position-free. NAtS-L (one
      partial-chunk phase per state) keeps one state per row (``RowStates``): exact, its decode steps run row by row.
    - Decode steps after it: every row advances one token (the mask grows by a column of ones; a zero among the new
      columns raises).
    - position_ids (keyword, HF style [B or 1, T']) are validated, never used: every position follows from the mask, the
      cache (``HybridCache.pad``) or cu_seqlens (row b's own tokens count from 0), and position_ids that disagree at a
      non-padding token raise one line naming position_ids (``models/padding.check_position_ids``). Not in the signature
      on purpose: generate() then does not build them every step (a check = a host sync); passed to generate(), they are
      extended by it and checked at every step.
    - Static decoding (``StaticDecoder``) takes the same left-padded prompts: per-row positions in its static buffers
      (serving/decoder.py).

    Args:
        config: the ``HybridConfig`` (sizes, ``mixer_types`` per layer, ``mixer_options``).
    """

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.weight"}

    def __init__(self, config: HybridConfig) -> None:
        super().__init__(config)
        self.model = HybridModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    # transformers' generate() must not build its own DynamicCache: the model creates a HybridCache itself.
    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embeddings = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def init_cache(self, batch_size: int, device=None, dtype=None) -> HybridCache:
        return self.model.init_cache(batch_size, device=device, dtype=dtype)

    @torch.no_grad()
    def prefill(self, input_ids: torch.LongTensor, chunk_size: int = 2048, cache: HybridCache | None = None,
                attention_mask: torch.Tensor | None = None):
        """Chunked prefill: feed the prompt in pieces of `chunk_size` tokens with the cache carried between pieces, so
        activation memory is bounded by one piece (for fixed-state mixers the cache itself is constant-size).
        Returns (logits of the last token [B, vocab], cache). Equal to one full forward pass (layer contract).
        attention_mask [B, T] with left padding: one packed pass (packed calls start from an empty state, so the
        pieces cannot be chained; ``chunk_size`` is then unused)."""
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        if attention_mask is not None and cache is None and left_padding_lengths(attention_mask) is not None:
            out = self(input_ids, attention_mask=attention_mask, use_cache=True, logits_to_keep=1)
            return out.logits[:, -1], out.cache
        cache = cache if cache is not None else self.init_cache(input_ids.shape[0])
        for start in range(0, input_ids.shape[1], chunk_size):
            out = self(input_ids[:, start : start + chunk_size], cache=cache, use_cache=True, logits_to_keep=1)
            cache = out.cache
        return out.logits[:, -1], cache

    @staticmethod
    def _padded_prefill(attention_mask: torch.Tensor, cache: HybridCache | None, cu_seqlens: torch.Tensor | None,
                        t: int) -> torch.Tensor | None:
        """The left-padded mask [B, t] of a prefill to pack, or None: no zero in it (the fast path), or a continuation
        of a cache (its zeros are the prefill's padding, already in the states; the new columns must be ones)."""
        if left_padding_lengths(attention_mask) is None:
            return None
        if cu_seqlens is not None:
            raise ValueError("attention_mask with padding and cu_seqlens are exclusive: pass one of them")
        seen = cache.seen_tokens if cache is not None else 0
        if attention_mask.shape[1] != seen + t:
            raise ValueError(f"attention_mask must cover the {seen} cached and {t} new tokens, got "
                             f"{attention_mask.shape[1]} columns")
        if seen and not bool((attention_mask[:, seen:] != 0).all()):
            raise ValueError("attention_mask: padding must precede the prefill (zeros only in its first columns)")
        return attention_mask if not seen else None

    def state_size(self, seq_len: int, softmax_fractions: Mapping[int, float] | None = None) -> int:
        """Real numbers of mixer state kept per sequence after seq_len tokens, summed over layers; a NAtS-L layer's
        KV grows with its softmax fraction: ``softmax_fractions[layer index]`` (e.g. measured by a
        ``RoutingRecorder``), else its default (0.5)."""
        fractions = softmax_fractions or {}
        return sum(blk.mixer.state_size(seq_len, softmax_fraction=fractions[i]) if i in fractions
                   else blk.mixer.state_size(seq_len) for i, blk in enumerate(self.model.layers))

    def routing_layers(self) -> dict[int, TokenMixer]:
        """NAtS-L layers only: {layer index: mixer}, the layers a ``RoutingRecorder`` attaches to
        (``layers/natsl/routing.py``: forced routing and the measured softmax fractions)."""
        return {i: blk.mixer for i, blk in enumerate(self.model.layers) if isinstance(blk.mixer, NatsLAttention)}

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        cache: HybridCache | None = None,
        past_key_values: HybridCache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        return_dict: bool | None = None,
        cu_seqlens: torch.Tensor | None = None,
        **kwargs,
    ) -> HybridCausalLMOutput:
        """cu_seqlens [N + 1]: packed documents in one row (input_ids [1, T], ``ops/common/varlen.py``): every layer
        restarts at each document (states, convolutions, attention, RoPE positions, NAtS-L chunks). DECISION: the
        offsets are passed explicitly (fla's rule: an explicit cu_seqlens wins); they are not derived from
        position_ids. Packed calls start from an empty state (a cache given raises); use_cache defaults to False,
        True returns a cache whose row i continues document i (``seen_tokens`` = the longest document's length).
        Labels are used as given: the trainer decides what the last token of a document predicts.
        attention_mask [B, T']: left padding (class docstring); labels at padding should be -100.
        position_ids [B or 1, T'] (in kwargs): checked against the positions above, not used (class docstring)."""
        # transformers <= 5.2x passes past_key_values=, newer releases pass cache=: accept both, refuse a conflict.
        if cache is not None and past_key_values is not None and cache is not past_key_values:
            raise ValueError("got different objects for cache= and past_key_values=; pass one of them")
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, HybridCache):
            raise ValueError(f"cache must be a HybridCache (from model.init_cache or a previous output), got "
                             f"{type(cache).__name__}")
        t = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        if (position_ids := kwargs.pop("position_ids", None)) is not None:
            check_position_ids(position_ids, t, attention_mask, cache, cu_seqlens)
        pad_mask = self._padded_prefill(attention_mask, cache, cu_seqlens, t) if attention_mask is not None else None
        if use_cache is None:
            use_cache = cache is not None or (self.config.use_cache and not self.training and cu_seqlens is None)
        if pad_mask is not None:  # pack the rows' tokens into documents (class docstring)
            input_ids, inputs_embeds = (None if z is None else pack_rows(z, pad_mask)
                                        for z in (input_ids, inputs_embeds))
            cache, cu_seqlens = None, cu_seqlens_from_lengths((pad_mask != 0).sum(1), device=pad_mask.device)
        h, new_cache, hidden = self.model(input_ids, inputs_embeds, cache=cache, use_cache=use_cache,
                                          output_hidden_states=bool(output_hidden_states), cu_seqlens=cu_seqlens)
        if pad_mask is not None:
            h = unpack_rows(h, pad_mask)
            hidden = None if hidden is None else tuple(unpack_rows(z, pad_mask) for z in hidden)
            if new_cache is not None:  # HF counts the padding: row b's own tokens are the last lens[b] of t
                new_cache = HybridCache(new_cache.states, t, t - (pad_mask != 0).sum(1))
        h = h[:, -logits_to_keep:] if logits_to_keep else h
        logits = self.lm_head(h)
        loss = None if labels is None else self.compute_loss(logits, labels, num_items_in_batch)
        return _causal_lm_output(loss=loss, logits=logits, cache=new_cache, hidden_states=hidden)

    def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor,
                     num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        """Next-token cross-entropy in float32 of logits [B, T, vocab] against labels [B, T] (-100 ignored): the mean
        over the counted targets, or their sum / ``num_items_in_batch`` (HF Trainer's gradient accumulation). Its own
        method so that ``training.compile_model(scope="blocks")`` can compile it as one region."""
        shift_logits = logits[:, :-1].float().reshape(-1, logits.shape[-1])
        shift_labels = labels[:, 1:].reshape(-1).to(logits.device)
        if num_items_in_batch is not None:
            return F.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="sum") / num_items_in_batch
        return F.cross_entropy(shift_logits, shift_labels, ignore_index=-100)
