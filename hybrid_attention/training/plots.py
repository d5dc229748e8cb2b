"""PNG plots of a run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_training_curves(records: Sequence[dict[str, Any]], out_dir: Path, title: str = "") -> list[Path]:
    """``loss.png`` (train and validation loss vs step) and ``ppl.png`` (validation perplexity vs step)."""
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"], r["val_ppl"]) for r in records if r.get("val_loss") is not None]
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    if train:
        ax.plot(*zip(*train), label="train", lw=1)
    if val:
        ax.plot([v[0] for v in val], [v[1] for v in val], "o-", label="validation")
    ax.set(xlabel="step", ylabel="loss (nats/token)", title=title or "loss")
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(save_figure(fig, out_dir / "loss.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    if val:
        ax.plot([v[0] for v in val], [v[2] for v in val], "o-")
        ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="validation perplexity", title=title or "perplexity")
    ax.grid(alpha=0.3)
    paths.append(save_figure(fig, out_dir / "ppl.png"))
    return paths


def plot_series(
    series: dict[str, Sequence[tuple[float, float]]],
    path: Path,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = False,
    logy: bool = False,
    markers: bool = True,
) -> Path:
    """One line per named series of (x, y) points (``markers=False`` for dense curves)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in series.items():
        pts = [p for p in pts if p[1] is not None]
        if pts:
            ax.plot(*zip(*pts), "o-" if markers else "-", label=name, lw=1.5 if markers else 1.0)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend()
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def save_figure(fig, path: Path, dpi: int = 110) -> Path:
    """Write `fig` to `path` (parent folders created, tight layout) and close it; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
