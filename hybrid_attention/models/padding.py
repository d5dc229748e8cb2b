"""Left-padded batches (HF ``padding_side="left"``: every row zeros, then ones up to the last column), decided once
here: a padded prefill packs each row's tokens as one document (``cu_seqlens``), runs the packed forward and scatters
the outputs back with zeros at the padding, so padding never reaches a layer or a state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hybrid_attention.layers.base import TokenMixer
from hybrid_attention.ops.common.varlen import positions_in_document


def left_padding_lengths(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """attention_mask [B, T] -> the token count of every row [B] (int64), or None when it holds no zero (the fast
    path: the mask is then ignored). Raises ``ValueError`` (one line naming attention_mask) unless left padding.

    DECISION: one host read of a device mask per call (both flags at once), not none: which path runs
    (the batched one, or packing the rows into documents: a data-dependent token count, per-row decode states for
    NAtS-L) and the error for a bad mask depend on its values. Taking the packed path for every mask would not
    remove the read (packing sizes by the count of ones) and would make unpadded batches pay the varlen path."""
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [B, T], got shape {tuple(attention_mask.shape)}")
    valid = attention_mask != 0
    if valid.shape[1] == 0:
        return None
    bad = (valid[:, :-1] & ~valid[:, 1:]).any(1) | ~valid[:, -1]
    no_zero, any_bad = torch.stack([valid.all(), bad.any()]).tolist()  # one host read
    if no_zero:
        return None
    if any_bad:
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"attention_mask must be left padding (each row: zeros, then ones up to the last column; "
                         f"padding_side='left'), got row {row} = {attention_mask[row].tolist()}")
    return valid.sum(1)


def check_position_ids(position_ids: torch.Tensor, t: int, attention_mask: torch.Tensor | None, cache: Any,
                       cu_seqlens: torch.Tensor | None) -> None:
    """DECISION: position_ids [B or 1, t] are checked, not used: positions follow from cu_seqlens (each document from
    0), else the attention_mask [B, seen + t] (row b's k-th token at k - 1, the cumulative count of ones; a mask of
    another width is not read), else the cache (``HybridCache.next_positions``: seen_tokens - pad[b] onwards; from 0
    without a cache). Entries at padding (mask 0) are not checked (HF fills them with 0 or 1). Raises ``ValueError``
    (one line naming position_ids) on a wrong shape or any other mismatch; one host sync."""
    if position_ids.dim() != 2 or position_ids.shape[1] != t:
        raise ValueError(f"position_ids must be [batch_size or 1, {t}] (the new tokens), got shape "
                         f"{tuple(position_ids.shape)}")
    device = position_ids.device
    check = None  # [B, t] bool: the entries to compare (None: all)
    if cu_seqlens is not None:
        expected = positions_in_document(cu_seqlens).to(device)[None]
    elif attention_mask is not None and attention_mask.shape[1] == t + (cache.seen_tokens if cache else 0):
        valid = attention_mask.to(device) != 0
        expected, check = (valid.cumsum(-1) - 1)[:, -t:], valid[:, -t:]
    elif cache is not None:
        expected = cache.next_positions(t, device)
    else:
        expected = torch.arange(t, device=device)[None]
    try:
        expected, got = torch.broadcast_tensors(expected, position_ids)
    except RuntimeError:
        raise ValueError(f"position_ids of shape {tuple(position_ids.shape)} do not match the batch of "
                         f"{expected.shape[0]} rows") from None
    wrong = expected != got if check is None else (expected != got) & check.expand_as(got)
    if bool(wrong.any()):
        row = int(wrong.any(1).nonzero()[0, 0])
        raise ValueError(f"position_ids must equal the positions that attention_mask / the cache / cu_seqlens imply "
                         f"(each row counts its own tokens from 0; padding is not checked): row {row} got "
                         f"{got[row].tolist()}, expected {expected[row].tolist()}")


def pack_rows(z: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The valid tokens of z [B, T, ...] (left padded) in row order: [1, N, ...], N = the mask's count of ones."""
    return z[attention_mask != 0][None]


def unpack_rows(z: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack_rows``: z [1, N, ...] -> [B, T, ...], zeros at the padding positions."""
    valid = attention_mask != 0
    out = z.new_zeros(*valid.shape, *z.shape[2:])
    out[valid] = z[0]
    return out


@dataclass
class RowStates:
    """One decode state per row (each of batch one) of a mixer without per-document packed states.

    Mixers whose packed call returns per-document states (``TokenMixer.packed_states``) assemble their ordinary
    batched decode state from them (row i = document i, per-row positions inside the state). The others (NAtS-L: its
    partial chunk buffer has one phase for all rows) run their prefill one document at a time and keep one state per
    row here: their decode steps then run row by row (exact, not batched)."""

    rows: list[Any]


def mixer_per_document(mixer: TokenMixer, x: torch.Tensor, cu_seqlens: torch.Tensor) -> tuple[torch.Tensor,
                                                                                              RowStates]:
    """Packed prefill of a mixer without ``packed_states``: x [1, N, hidden] of documents at cu_seqlens [B + 1],
    each run alone from an empty state -> (y [1, N, hidden], RowStates of B states)."""
    offs = cu_seqlens.tolist()
    outs = [mixer(x[:, a:b], None, output_state=True) for a, b in zip(offs[:-1], offs[1:], strict=True)]
    return torch.cat([y for y, _ in outs], 1), RowStates([st for _, st in outs])


def mixer_per_row(mixer: TokenMixer, x: torch.Tensor, state: RowStates, keep: bool) -> tuple[torch.Tensor,
                                                                                            RowStates | None]:
    """Continue every row from its own state: x [B, T, hidden] -> (y [B, T, hidden], RowStates or None)."""
    outs = [mixer(x[i : i + 1], st, output_state=keep) for i, st in enumerate(state.rows)]
    return torch.cat([y for y, _ in outs], 0), (RowStates([st for _, st in outs]) if keep else None)
