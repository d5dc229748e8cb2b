"""PNG plots of runs, sweeps and evaluations (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402


def plot_training_curves(records: Sequence[dict[str, Any]], out_dir: Path, title: str = "") -> list[Path]:
    """``loss.png`` (train and validation loss vs step), ``ppl.png`` (validation perplexity vs step), ``lr.png``,
    ``grad_norm.png`` and ``tokens_per_s.png`` (the logged learning rate, gradient norm and throughput vs step)."""
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
        plain_log_axis(ax.yaxis)
    ax.set(xlabel="step", ylabel="validation perplexity", title=title or "perplexity")
    ax.grid(alpha=0.3)
    paths.append(save_figure(fig, out_dir / "ppl.png"))
    for key, name, ylabel, log in (("lr", "lr.png", "learning rate", False),
                                   ("grad_norm", "grad_norm.png", "gradient norm (before clipping)", True),
                                   ("tok_per_s", "tokens_per_s.png", "training tokens/s", False)):
        pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        fig, ax = plt.subplots(figsize=(6, 4))
        if pts:
            ax.plot(*zip(*pts), lw=1)
            if log and min(p[1] for p in pts) > 0:
                ax.set_yscale("log")
                plain_log_axis(ax.yaxis)
        ax.set(xlabel="step", ylabel=ylabel, title=title or ylabel)
        ax.grid(alpha=0.3)
        paths.append(save_figure(fig, out_dir / name))
    return paths


def plain_number(v: float, _pos=None) -> str:
    """A tick label: "80", "0.5", "4096", "16k", "2M" (never "8×10¹")."""
    if v <= 0 or not math.isfinite(v):
        return ""
    if v >= 1e6 and v % 1e6 == 0:
        return f"{v / 1e6:.0f}M"
    if v >= 1e4 and v % 1e3 == 0:
        return f"{v / 1e3:.0f}k"
    return f"{int(v)}" if v == int(v) else f"{v:g}"


class _PlainLogLocator(matplotlib.ticker.Locator):
    """Major ticks of a log axis: 1, 2, 5 x 10^k (base 10) or the powers of 2 (base 2); where fewer than three of
    them fall in view (a range within about a decade, e.g. perplexities from 8 to 14, which would be labelled at 10
    alone), up to six evenly spaced round numbers instead."""

    def __init__(self, base: int) -> None:
        from matplotlib.ticker import LogLocator, MaxNLocator

        self.log = LogLocator(base=base, subs=(1.0, 2.0, 5.0) if base == 10 else (1.0,))
        self.linear = MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10])

    def set_axis(self, axis) -> None:
        super().set_axis(axis)
        self.log.set_axis(axis)
        self.linear.set_axis(axis)

    def __call__(self):
        return self.tick_values(*self.axis.get_view_interval())

    def tick_values(self, vmin: float, vmax: float):
        vmin, vmax = min(vmin, vmax), max(vmin, vmax)
        ticks = self.log.tick_values(vmin, vmax)
        if vmin <= 0 or sum(vmin <= t <= vmax for t in ticks) >= 3:
            return ticks
        return [t for t in self.linear.tick_values(vmin, vmax) if t > 0]


def plain_log_axis(axis, base: int = 10) -> None:
    """Tick labels of a log-scaled matplotlib axis as plain numbers (:func:`plain_number`): base 10 at 1, 2, 5 x
    10^k, base 2 at the powers of 2, and evenly spaced round numbers where those give fewer than three labels in
    view (:class:`_PlainLogLocator`); no minor labels.

    Args:
        axis: ``ax.xaxis`` or ``ax.yaxis`` of a log-scaled axes.
        base: the scale's base (10 or 2).
    """
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_locator(_PlainLogLocator(base))
    axis.set_major_formatter(FuncFormatter(plain_number))
    axis.set_minor_formatter(NullFormatter())


def plot_series(
    series: dict[str, Sequence[tuple[float, float]]],
    path: Path,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = False,
    logy: bool = False,
    markers: bool = True,
    chance: float | None = None,
    mark_x: float | None = None,
) -> Path:
    """One line per named series of (x, y) points (``markers=False`` for dense curves); log axes labelled with plain
    numbers; ``chance``: a dashed horizontal line at that y (the accuracy of guessing); ``mark_x``: a dotted vertical
    line at that x (e.g. the training tokens at which runs are compared)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in series.items():
        pts = [p for p in pts if p[1] is not None]
        if pts:
            ax.plot(*zip(*pts), "o-" if markers else "-", label=name, lw=1.5 if markers else 1.0)
    if chance is not None:
        ax.axhline(chance, color="gray", ls="--", lw=1, label=f"chance ({chance:.2g})")
    if mark_x is not None:
        ax.axvline(mark_x, color="gray", ls=":", lw=1)
    if logx:
        ax.set_xscale("log", base=2)
        plain_log_axis(ax.xaxis, base=2)
    if logy:
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
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
