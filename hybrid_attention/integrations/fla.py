"""fla-style faces of the token mixers: drop-in layers for model code written for flash-linear-attention (fla), with
fla's constructor keywords and call (the contract and an example: ``_FLAFace``)."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import torch

from hybrid_attention import layers
from hybrid_attention.integrations.cache import LayerCache, is_fla_cache, read_state, store_state
from hybrid_attention.integrations.fla_ops import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from hybrid_attention.models.padding import (
    RowStates,
    left_padding_lengths,
    mixer_per_document,
    mixer_per_row,
    pack_rows,
    unpack_rows,
)
from hybrid_attention.ops.common.varlen import cu_seqlens_from_lengths

__all__ = [
    "MODES",
    "GatedDeltaNet",
    "InterdomainAttention",
    "LayerCache",
    "NatsLAttention",
    "S4DMixer",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
]

# fla's `mode` -> the backend name every layer of the library takes
MODES = {"chunk": "auto", "fused_recurrent": "naive"}


def _backend_option(name: str, mode: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``backend`` set from ``mode`` unless given; ValueError (one line) for an unknown mode."""
    if mode not in MODES:
        raise ValueError(f"{name}: mode must be one of {', '.join(repr(m) for m in MODES)}, got {mode!r}")
    return {"backend": MODES[mode], **options}


def _refuse(name: str, ok: bool, field: str, allowed: str, got: Any) -> None:
    if not ok:
        raise ValueError(f"{name}: {field} must be {allowed} (fla's option is not implemented here), got {got!r}")


def _lists_options(layer: type, *exclude: str) -> Callable[[type], type]:
    """Append the wrapped layer's remaining constructor keywords and their defaults to a face's docstring, so that
    ``help()`` lists every argument the face accepts."""
    def decorate(face: type) -> type:
        taken = set(inspect.signature(face.__init__).parameters) | set(exclude) | {"self", "hidden_size"}
        opts = [f"{p.name}={p.default!r}" for p in inspect.signature(layer.__init__).parameters.values()
                if p.name not in taken and p.default is not inspect.Parameter.empty]
        text = (f"Options of ``{layer.__module__}.{layer.__name__}`` (keyword ``**options``, defaults): "
                + ", ".join(opts) + ".")
        face.__doc__ += "\n" + textwrap.fill(text, 116, initial_indent="    ", subsequent_indent="    ") + "\n"
        return face
    return decorate


class _FLAFace:
    """fla's call contract over a library layer (a ``TokenMixer``): the mixin of every face.

        from hybrid_attention.integrations.fla import GatedDeltaNet, InterdomainAttention, LayerCache
        attn = InterdomainAttention(hidden_size=1024, num_heads=16, layer_idx=0, mode="chunk", state_size=64)
        o, _, cache = attn(x, attention_mask=mask, use_cache=True)   # x [B, T, 1024]; mask [B, T] 0/1, left padding
        step_mask = torch.cat([mask, mask.new_ones(B, 1)], 1)        # generate() extends the mask by a column of ones
        o1, _, cache = attn(x1, attention_mask=step_mask, past_key_values=cache, use_cache=True)   # x1 [B, 1, 1024]
        cache[0], len(cache), cache.get_seq_length(0)                    # layer 0's state, layer slots, tokens seen
        gdn = GatedDeltaNet(hidden_size=1024, num_heads=6, head_dim=128, norm_eps=1e-6, layer_idx=1)  # model's shape
        gdn.load_state_dict(model.model.layers[1].mixer.state_dict())    # a HybridForCausalLM's layer 1, names 1:1
        o, _, cache = gdn(x, past_key_values=cache, use_cache=True)      # one LayerCache serves every layer
        # in fla's own model code (e.g. GatedDeltaNetForCausalLM with block.attn = a face built with layer_idx=i),
        # each face keeps its state in the Cache that the model passes with use_cache=True (the entry's
        # "recurrent_state"):
        out = fla_model(ids, use_cache=True)
        out = fla_model(next_ids, past_key_values=out.past_key_values, use_cache=True)

    Each face is a subclass of the library's layer (``hybrid_attention.layers``) with fla's constructor keywords and
    fla's call ``layer(hidden_states, attention_mask=None, past_key_values=None, use_cache=False,
    output_attentions=False, **kwargs) -> (o, None, past_key_values)``. Its parameters are the layer's, under the same
    names, so ``state_dict`` maps 1:1: key ``model.layers.{i}.mixer.<name>`` of a ``HybridForCausalLM`` is the face's
    ``<name>`` (the constructor arguments must give the layer's shape and ε: fla's defaults differ from the config's).
    The math is the layer's own forward; padding and states follow ``models/padding.py`` (a left-padded
    prefill runs packed, so padding never reaches a state; NAtS-L keeps one state per row after it).

    ``mode``: "chunk" -> ``backend="auto"`` (the Triton chunk kernels for supported CUDA inputs, else the PyTorch chunk
    forms), "fused_recurrent" -> ``backend="naive"`` (the token-by-token recurrences). A ``backend=`` option wins over
    ``mode``. fla switches to its recurrent kernel for short inputs at inference; these layers run every length with
    the backend ``mode`` picks. Op aliases with fla's names, and the one default that differs (q / k ℓ2 normalisation
    inside the op: on in ``ops.gated_delta``, off in fla's ops): ``integrations/fla_ops.py``.
    """

    layer_idx: int | None
    mode: str

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any | None = None,
        use_cache: bool | None = False,
        output_attentions: bool | None = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None, Any]:
        """hidden_states [B, T, hidden] -> (o [B, T, hidden], None, past_key_values).

        attention_mask: [B, T'] 0/1 with T' >= T (HF passes the cached columns too; the last T are this call's), left
            padding only (each row zeros, then ones). It is used on the first call of a layer (no state in the cache):
            the rows are packed so that padding reaches no state; o is 0 at padding. On later calls its last T
            columns must be ones. A mask without zeros is the unpadded path.
        past_key_values: a ``LayerCache``, fla's ``Cache`` (what fla's models pass with ``use_cache=True``; the
            state is its entry's ``recurrent_state``) or None; this layer's state is the one under ``layer_idx``.
        use_cache: store the new state under ``layer_idx`` (a new ``LayerCache`` is made when none is passed).
        output_attentions: accepted for fla's signature; no attention map is returned (None).
        kwargs: ``cu_seqlens [N + 1]`` packs documents in one row (B == 1) as fla's varlen calls do; the others
            (e.g. position_ids: positions follow from the mask and the state) are ignored, as fla's layers do.
        """
        name = type(self).__name__
        cache, keep = past_key_values, bool(use_cache)
        if cache is not None and not isinstance(cache, LayerCache) and not is_fla_cache(cache):
            raise ValueError(f"{name}: past_key_values must be a LayerCache (hybrid_attention.integrations.fla) or "
                             f"fla's Cache, got {type(cache).__name__}")
        if (keep or cache is not None) and self.layer_idx is None:
            raise ValueError(f"{name}: layer_idx must be set to use a cache (states are stored by layer_idx)")
        if keep and cache is None:
            cache = LayerCache()
        state = read_state(cache, self.layer_idx) if cache is not None else None
        b, t = hidden_states.shape[:2]
        cu_seqlens = kwargs.get("cu_seqlens")
        mask = None if attention_mask is None else self._prefill_mask(attention_mask, b, t, state is not None)
        if mask is not None and cu_seqlens is not None:
            raise ValueError(f"{name}: attention_mask with padding and cu_seqlens are exclusive: pass one of them")
        if mask is not None:  # left-padded prefill: the rows' tokens as packed documents (models/padding.py)
            cu = cu_seqlens_from_lengths((mask != 0).sum(1), mask.device)
            y, new_state = self._packed(pack_rows(hidden_states, mask), cu, keep)
            y = unpack_rows(y, mask)
        elif cu_seqlens is not None:
            y, new_state = self._packed(hidden_states, cu_seqlens, keep)
        elif isinstance(state, RowStates):
            y, new_state = mixer_per_row(super().forward, hidden_states, state, keep)
        else:
            y, new_state = super().forward(hidden_states, state, output_state=keep)
        if keep:
            store_state(cache, new_state, self.layer_idx, offset=t)
        return y, None, cache

    def _prefill_mask(self, attention_mask: torch.Tensor, b: int, t: int, has_state: bool) -> torch.Tensor | None:
        """This call's mask columns [B, T] when they hold padding to pack, else None (checks the shape and, after
        a prefill, that the new columns are ones)."""
        name = type(self).__name__
        if attention_mask.dim() != 2 or attention_mask.shape[0] != b or attention_mask.shape[1] < t:
            raise ValueError(f"{name}: attention_mask must be [batch_size={b}, >= {t}] (0 = padding), got shape "
                             f"{tuple(attention_mask.shape)}")
        new = attention_mask[:, -t:]
        if has_state:
            if not bool((new != 0).all()):
                raise ValueError(f"{name}: attention_mask: padding must precede the prefill (zeros only in the "
                                 f"columns of the first call), got zeros among the last {t}")
            return None
        return new if left_padding_lengths(new) is not None else None

    def _packed(self, x: torch.Tensor, cu_seqlens: torch.Tensor, keep: bool) -> tuple[torch.Tensor, Any]:
        """Packed documents x [1, N, hidden] at cu_seqlens, from an empty state -> (y [1, N, hidden], the batched
        decode state whose row i continues document i, or per-row states for a layer without packed states)."""
        if keep and not self.packed_states:
            return mixer_per_document(super().forward, x, cu_seqlens)
        return super().forward(x, None, output_state=keep, cu_seqlens=cu_seqlens)


@_lists_options(layers.GatedDeltaNet)
class GatedDeltaNet(_FLAFace, layers.GatedDeltaNet):
    """Gated DeltaNet with fla's ``GatedDeltaNet`` constructor and call (fla's defaults: head_dim 256, norm_eps 1e-5;
    the library layer's are 128 and 1e-6). Parameters: ``layers.GatedDeltaNet``'s, same names.

    Args:
        hidden_size: model width D (input and output [B, T, D]).
        expand_v: value head width / head_dim.
        head_dim: q / k head width d_k.
        num_heads: heads H (q, k, v and decay per head).
        num_v_heads: None or num_heads (fla's grouped value heads are not implemented).
        mode: "chunk" | "fused_recurrent" (``_FLAFace``: mapped to backend "auto" | "naive").
        use_gate: the swish output gate g_proj.
        use_short_conv: True (the layer always convolves q, k, v).
        allow_neg_eigval: False (β in (0, 1)).
        conv_size: ShortConvolution kernel width.
        conv_bias: False (the convolutions have no bias).
        layer_idx: the layer's slot in the ``LayerCache`` (needed with a cache).
        norm_eps: ε of the output RMSNorm.
    """

    def __init__(
        self,
        hidden_size: int = 2048,
        expand_v: float = 2.0,
        head_dim: int = 256,
        num_heads: int = 6,
        num_v_heads: int | None = None,
        mode: str = "chunk",
        use_gate: bool = True,
        use_short_conv: bool = True,
        allow_neg_eigval: bool = False,
        conv_size: int = 4,
        conv_bias: bool = False,
        layer_idx: int | None = None,
        norm_eps: float = 1e-5,
        **options: Any,
    ) -> None:
        name = type(self).__name__
        _refuse(name, num_v_heads in (None, num_heads), "num_v_heads", f"None or num_heads ({num_heads})", num_v_heads)
        _refuse(name, use_short_conv, "use_short_conv", "True", use_short_conv)
        _refuse(name, not allow_neg_eigval, "allow_neg_eigval", "False", allow_neg_eigval)
        _refuse(name, not conv_bias, "conv_bias", "False", conv_bias)
        super().__init__(hidden_size, num_heads=num_heads, head_dim=head_dim, expand_v=expand_v, conv_size=conv_size,
                         use_gate=use_gate, norm_eps=norm_eps, **_backend_option(name, mode, options))
        self.layer_idx, self.mode = layer_idx, mode


@_lists_options(layers.InterdomainAttention)
class InterdomainAttention(_FLAFace, layers.InterdomainAttention):
    """Interdomain Attention with fla-style keywords and call. Parameters: ``layers.InterdomainAttention``'s, same
    names.

    Args:
        hidden_size: model width D (input and output [B, T, D]).
        num_heads: heads H.
        head_dim: head width d_h (default hidden_size // num_heads).
        mode: "chunk" | "fused_recurrent" (``_FLAFace``: mapped to backend "auto" | "naive").
        layer_idx: the layer's slot in the ``LayerCache`` (needed with a cache).
        norm_eps: ε of the key / value RMSNorms.
    """

    def __init__(
        self,
        hidden_size: int = 2048,
        num_heads: int = 16,
        head_dim: int | None = None,
        mode: str = "chunk",
        layer_idx: int | None = None,
        norm_eps: float = 1e-6,
        **options: Any,
    ) -> None:
        super().__init__(hidden_size, num_heads=num_heads, head_dim=head_dim, norm_eps=norm_eps,
                         **_backend_option(type(self).__name__, mode, options))
        self.layer_idx, self.mode = layer_idx, mode


@_lists_options(layers.InterdomainAttention, "query_readout", "dual_input", "denominator", "readout", "contraction",
                "rope")
class S4DMixer(_FLAFace, layers.S4DMixer):
    """The S4D-only control with fla-style keywords and call. Parameters: ``layers.S4DMixer``'s, same names. Option
    ``rope`` defaults to False here (no query).

    Args:
        hidden_size: model width D (input and output [B, T, D]).
        num_heads: heads H.
        head_dim: head width d_h (default hidden_size // num_heads).
        mode: "chunk" | "fused_recurrent" (``_FLAFace``: mapped to backend "auto" | "naive").
        layer_idx: the layer's slot in the ``LayerCache`` (needed with a cache).
        norm_eps: ε of the input RMSNorms.
    """

    def __init__(
        self,
        hidden_size: int = 2048,
        num_heads: int = 16,
        head_dim: int | None = None,
        mode: str = "chunk",
        layer_idx: int | None = None,
        norm_eps: float = 1e-6,
        **options: Any,
    ) -> None:
        super().__init__(hidden_size, num_heads=num_heads, head_dim=head_dim, norm_eps=norm_eps,
                         **_backend_option(type(self).__name__, mode, options))
        self.layer_idx, self.mode = layer_idx, mode


@_lists_options(layers.NatsLAttention)
class NatsLAttention(_FLAFace, layers.NatsLAttention):
    """NAtS-L with fla-style keywords and call. Parameters: ``layers.NatsLAttention``'s, same names. After a
    left-padded prefill its cache entry is one state per row (``models.padding.RowStates``; exact, decoded row by
    row).

    Args:
        hidden_size: model width D (input and output [B, T, D]).
        expand_v: value head width / head_dim (GDN branch).
        head_dim: q / k head width of the GDN heads.
        num_heads: GDN heads (= routing decision heads).
        num_attn_heads: softmax heads (a multiple of num_heads dividing num_heads · head_dim; default 2 · num_heads,
            the library layer's ratio of 12 to 6).
        mode: "chunk" | "fused_recurrent" (``_FLAFace``: mapped to backend "auto" | "naive").
        conv_size: ShortConvolution kernel width.
        layer_idx: the layer's slot in the ``LayerCache`` (needed with a cache).
        norm_eps: ε of the RMSNorms.
    """

    def __init__(
        self,
        hidden_size: int = 2048,
        expand_v: float = 2.0,
        head_dim: int = 128,
        num_heads: int = 6,
        num_attn_heads: int | None = None,
        mode: str = "chunk",
        conv_size: int = 4,
        layer_idx: int | None = None,
        norm_eps: float = 1e-6,
        **options: Any,
    ) -> None:
        super().__init__(hidden_size, num_heads=num_heads, head_dim=head_dim, expand_v=expand_v,
                         num_attn_heads=2 * num_heads if num_attn_heads is None else num_attn_heads,
                         conv_size=conv_size, norm_eps=norm_eps,
                         **_backend_option(type(self).__name__, mode, options))
        self.layer_idx, self.mode = layer_idx, mode
