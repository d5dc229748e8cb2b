"""Measurements of synthetic recall (MQAR, passkey): logits at the queried positions, accuracy, chance, tables.

Accuracy counts labelled (query) positions only; labels are targets *at* their position (no shift). The training
of the recall models (optimizer, epochs, sweep) is ``training/recall.py``, which reads these.
"""

from __future__ import annotations

from typing import Protocol

import torch

from hybrid_attention.data.mqar import prediction_accuracy
from hybrid_attention.models import HybridForCausalLM

from .tables import format_table


class RecallTask(Protocol):
    """What the measurements read of a recall configuration (``training.recall.RecallConfig``)."""

    task: str
    vocab_size: int


def labels_per_row(y: torch.Tensor) -> int | None:
    """The number of labelled positions (``y != -100``) of every row of y [B, T], or None when rows differ. Both tasks
    have a fixed count (MQAR: ``num_kv_pairs``; passkey: its digits); call it on the CPU copy of the labels."""
    counts = (y != -100).sum(-1)
    return int(counts[0]) if len(counts) and bool((counts == counts[0]).all()) else None


def query_positions(y: torch.Tensor, n: int) -> torch.Tensor:
    """The n labelled positions of each row of y [B, T] in increasing order, [B, n] (rows with exactly n labels:
    ``labels_per_row``). A stable descending sort of the label mask: no data-dependent shape, so no host sync,
    unlike ``y[y != -100]`` (two syncs per training step, which stop the CPU from queueing the next step's kernels
    while the GPU runs this one)."""
    return (y != -100).to(torch.int8).argsort(dim=-1, descending=True, stable=True)[:, :n]


def query_logits(model: HybridForCausalLM, x: torch.Tensor, y: torch.Tensor, backbone=None,
                 pos: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [n, vocab] at the n labelled positions (``y != -100``) of ``x`` [B, T], in row-major order.
    ``backbone``: what runs ``model.model`` (its compiled form in a compiled training step; default ``model.model``).
    ``pos``: ``query_positions(y, n)`` (a gather without host sync; the same logits in the same order).

    The loss and the accuracy read nothing else, and the queries are a small part of a row (MQAR at T = 1024 with 64
    pairs: 64 of 1024), so the [B, T, vocab] logits of the full forward would cost T / n times the unembedding
    FLOPs and memory for nothing (at vocabulary 8192 the unembedding dominates a 2-layer d = 128 model)."""
    # `is None`, not `or`: bool() of a compiled module is len() of the wrapped one (torch's OptimizedModule.__len__),
    # a TypeError for HybridModel
    run = model.model if backbone is None else backbone
    h = run(x, None, cache=None, use_cache=False, output_hidden_states=False, cu_seqlens=None)[0]
    if pos is not None:
        return model.lm_head(h.gather(1, pos[..., None].expand(-1, -1, h.shape[-1])).flatten(0, 1))
    return model.lm_head(h[y != -100])


@torch.no_grad()
def _accuracy(model, x: torch.Tensor, y: torch.Tensor, batch: int, device) -> float:
    """Mean over examples of each example's accuracy on its labelled positions (``prediction_accuracy``)."""
    model.eval()
    accs = []
    for i in range(0, len(x), batch):
        xb, yb = x[i : i + batch].to(device), y[i : i + batch].to(device)
        pred = torch.full_like(yb, -1)
        pred[yb != -100] = query_logits(model, xb, yb).argmax(-1)
        accs.append(prediction_accuracy(pred, yb).cpu())
    model.train()
    return torch.cat(accs).mean().item()


RECALL_COLUMNS = [("mixer", "mixer", ""), ("d_model", "d_model", "d"), ("lr", "best lr", "g"),
                  ("params", "params", ","), ("state_size", "state", ","), ("accuracy", "accuracy", ".3f"),
                  ("epochs", "epochs", "d"), ("seconds", "seconds", ".0f")]


def chance_accuracy(cfg: RecallTask) -> float:
    """Test accuracy of guessing uniformly: MQAR's values are drawn from the upper half of the vocabulary
    (``vocab_size - vocab_size // 2`` tokens), a passkey position is one of 10 digits."""
    return 1.0 / (cfg.vocab_size - cfg.vocab_size // 2) if cfg.task == "mqar" else 0.1


def recall_table(rows: list[dict]) -> str:
    """The sweep's best rows as a text table (``RECALL_COLUMNS``)."""
    return format_table(rows, RECALL_COLUMNS)
