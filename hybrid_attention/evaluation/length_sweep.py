"""Perplexity at several context lengths (by default 1x, 2x, 4x, 8x the training length): table and PNG."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .perplexity import evaluate_lm
from .tables import format_table


def length_sweep(
    model: nn.Module,
    tokens: np.ndarray,
    train_len: int,
    multipliers: Sequence[int] = (1, 2, 4, 8),
    max_tokens: int | None = 65536,
    batch_tokens: int = 8192,
    device: torch.device | str = "cpu",
    byte_lengths: np.ndarray | None = None,
) -> list[dict]:
    """One row per length ``m * train_len``: {multiplier, seq_len, loss, ppl, bpb, tokens}.

    Every length scores the same token prefix (``max_tokens``, raised to one window of the longest length if needed),
    so the rows differ only in how much context each prediction may use.
    """
    budget = max(max_tokens or len(tokens), max(multipliers) * train_len)
    rows = []
    for m in multipliers:
        L = m * train_len
        if len(tokens) < L:
            rows.append({"multiplier": m, "seq_len": L, "loss": None, "ppl": None, "bpb": None, "tokens": 0})
            continue
        s = evaluate_lm(model, tokens, L, batch_size=max(1, batch_tokens // L), device=device,
                        byte_lengths=byte_lengths, max_tokens=budget)
        rows.append({"multiplier": m, "seq_len": L, "loss": s.loss, "ppl": s.ppl, "bpb": s.bpb, "tokens": s.tokens})
    return rows


LENGTH_COLUMNS = [("multiplier", "x train", "d"), ("seq_len", "length", "d"), ("ppl", "ppl", ".3f"),
                  ("bpb", "bits/byte", ".3f"), ("tokens", "tokens", ",")]


def length_table(rows: list[dict]) -> str:
    return format_table(rows, LENGTH_COLUMNS)


def plot_length_sweep(results: dict[str, list[dict]], path: Path, title: str = "perplexity vs context length") -> Path:
    """One line per model name: perplexity against context length (log2 x axis)."""
    from hybrid_attention.plots import plot_series

    series = {name: [(r["seq_len"], r["ppl"]) for r in rows] for name, rows in results.items()}
    return plot_series(series, path, "context length (tokens)", "validation perplexity", title, logx=True, logy=True)
