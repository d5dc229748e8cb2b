"""PNG plots of one checkpoint: passkey accuracy by depth and length, RULER scores by length, NAtS-L softmax fraction by
layer and head."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from hybrid_attention.plots import plt, save_figure


def plot_passkey(rows: Sequence[dict], path: Path, title: str = "passkey retrieval") -> Path:
    """Accuracy against the needle's depth, one line per prompt length (rows of ``passkey_accuracy``:
    {length, depth, accuracy, ...})."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for length in sorted({r["length"] for r in rows}):
        pts = sorted((r["depth"], r["accuracy"]) for r in rows if r["length"] == length)
        ax.plot(*zip(*pts), "o-", label=f"{length} tokens")
    ax.set(xlabel="depth of the passkey (0: start of the filler, 1: end)", ylabel="accuracy (whole key)",
           ylim=(-0.02, 1.05), title=title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_routing(routing: Mapping[str | int, Sequence[float]], path: Path, title: str) -> Path:
    """Heat map of the softmax fraction per layer (rows) and decision head (columns), each cell labelled;
    ``routing``: {layer: [fraction per head]}."""
    layers = [str(k) for k in routing]
    values = list(routing.values())
    heads = max(len(v) for v in values)
    grid = [[v[h] if h < len(v) else float("nan") for h in range(heads)] for v in values]
    fig, ax = plt.subplots(figsize=(max(4.5, 1.5 + 0.7 * heads), max(3.0, 1.5 + 0.5 * len(layers))))
    im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if math.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="w" if v < 0.6 else "k", fontsize=8)
    ax.set_xticks(range(heads), [str(h) for h in range(heads)])
    ax.set_yticks(range(len(layers)), layers)
    ax.set(xlabel="decision head", ylabel="layer")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="softmax fraction")
    return save_figure(fig, path, dpi=100)


def plot_ruler(result: Mapping, path: Path, title: str = "RULER") -> Path:
    """Score against context length, one line per task and the average over the tasks in black (``result`` of
    ``evaluation.ruler.evaluate_ruler``: {"scores": {task: {length: score}}, "average": {length: score}})."""
    from hybrid_attention.plots import plain_log_axis

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for task, by_length in result["scores"].items():
        pts = sorted(by_length.items())
        ax.plot(*zip(*pts), "o-", lw=1, ms=3, label=task)
    ax.plot(*zip(*sorted(result["average"].items())), "o-", color="black", lw=2.5, label="average")
    if len(result["average"]) > 1:
        ax.set_xscale("log", base=2)
        plain_log_axis(ax.xaxis, base=2)
    ax.set(xlabel="context length (tokens)", ylabel="score (fraction of the answers found)", ylim=(-0.02, 1.05),
           title=title)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
