"""How the gap between two cells evolves during training: the seed-paired ratio of their training perplexities
(``paired_gaps``).

    python -m hybrid_attention.experiments.curves results/credible_prose_gpu/cells/interdomain_real \\
        results/credible_natsl_gpu/cells/softmax --out results/credible_prose_gpu/gap_real_vs_softmax.png
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from hybrid_attention.plots import plot_series
from hybrid_attention.training.metrics import read_metrics

__all__ = ["paired_gaps", "train_losses"]


def train_losses(metrics: Path) -> dict[int, tuple[int, float]]:
    """{step: (tokens seen, mean training loss of the window ending there)} of one run's ``metrics.jsonl``."""
    return {r["step"]: (r.get("tokens", 0), r["loss"]) for r in read_metrics(metrics)
            if r.get("loss") is not None and "step" in r}


def _seed_runs(cell_dir: Path) -> dict[str, Path]:
    runs = {p.parent.name: p for p in sorted(cell_dir.glob("seed*/metrics.jsonl"))}
    if not runs:
        raise SystemExit(f"cell folder: no seed*/metrics.jsonl under {cell_dir}")
    return runs


def paired_gaps(cell_a: Path, cell_b: Path) -> tuple[list[str], list[tuple[int, int, list[float]]]]:
    """(seeds, rows): the seeds both cells ran, and per step that every one of those runs logged,
    (step, tokens, [gap per seed]) with gap = exp(L_A - L_B) - 1.

    The report (``report.py``) compares cells at the end of training only. Whether a gap is closing or opening, which
    claim 2's "parity at a larger budget" turns on, is in the training curves: every run's ``metrics.jsonl`` has the
    mean training loss of each logging window (``train.log_every`` steps). For two cells A and B that ran the same data,
    schedule and seeds, the gap at step s in seed k is

        exp(L_A(s, k) - L_B(s, k)) - 1        (the training-perplexity ratio minus 1; > 0: A is worse)

    paired by seed (the same data order and initial draws up to the mixer). It is the training loss of one window of
    batches, not a held-out number, and the learning-rate schedule shapes it (a longer run's gap at the same step would
    differ); read it as the course of the gap within these runs, not as a prediction of a longer one.
    """
    runs_a, runs_b = _seed_runs(cell_a), _seed_runs(cell_b)
    seeds = [s for s in runs_a if s in runs_b]
    if not seeds:
        raise SystemExit(f"cells: no seed in common ({sorted(runs_a)} vs {sorted(runs_b)})")
    a = {s: train_losses(runs_a[s]) for s in seeds}
    b = {s: train_losses(runs_b[s]) for s in seeds}
    steps = sorted(set.intersection(*(set(a[s]) & set(b[s]) for s in seeds)))
    rows = [(st, a[seeds[0]][st][0], [math.exp(a[s][st][1] - b[s][st][1]) - 1 for s in seeds]) for st in steps]
    return seeds, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cell_a", type=Path, help="a cell folder with seed*/metrics.jsonl (the numerator)")
    p.add_argument("cell_b", type=Path, help="the cell it is compared with (the denominator)")
    p.add_argument("--every", type=int, default=4, help="print every N-th logged step (and the last)")
    p.add_argument("--out", type=Path, default=None, help="a PNG of the gap per seed against tokens")
    args = p.parse_args(argv)
    seeds, rows = paired_gaps(args.cell_a, args.cell_b)
    name_a, name_b = args.cell_a.name, args.cell_b.name
    print(f"training-perplexity gap {name_a} vs {name_b}, paired by seed (exp(L_a - L_b) - 1)")
    print("| step | tokens (M) | " + " | ".join(seeds) + " | mean |")
    print("|---:|---:|" + "---:|" * (len(seeds) + 1))
    for i, (step, tokens, gaps) in enumerate(rows):
        if i % args.every == args.every - 1 or i == len(rows) - 1:
            cols = " | ".join(f"{100 * g:+.1f}%" for g in gaps)
            print(f"| {step} | {tokens / 1e6:.1f} | {cols} | {100 * sum(gaps) / len(gaps):+.1f}% |")
    if args.out is not None:
        series = {f"{name_a} vs {name_b}, {s}": [(t / 1e6, 100 * g[k]) for _, t, g in rows]
                  for k, s in enumerate(seeds)}
        plot_series(series, args.out, "training tokens (M)", "training-perplexity gap (%)",
                    title=f"{name_a} vs {name_b}, paired by seed", markers=False)
        print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
