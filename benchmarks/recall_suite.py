"""The command line shared by the recall-suite benchmarks (``recall_speed``, ``recall_gradcheck``): which suite, which
of its cells and tasks, which variants, and the (cell, task, config) rows they select."""

from __future__ import annotations

import argparse

from hybrid_attention.experiments.suite import load_suite


def add_selection_args(p: argparse.ArgumentParser, variants: tuple[str, ...]) -> None:
    """``--suite``, ``--profile``, ``--cells``, ``--tasks`` and ``--variants`` (choices: ``variants``, default all)."""
    p.add_argument("--suite", default="configs/experiments/credible_recall.yaml")
    p.add_argument("--profile", default=None, help="a profile of the suite, e.g. cpu (default: the suite as written)")
    p.add_argument("--cells", nargs="*", default=None, help="cell names (default: every cell of the suite)")
    p.add_argument("--tasks", nargs="*", default=None, help="task names of the suite (default: every task)")
    p.add_argument("--variants", nargs="+", default=list(variants), choices=variants)


def selected_tasks(args: argparse.Namespace, overrides: dict | None = None) -> list[tuple[str, str, dict]]:
    """(cell name, task name, RecallConfig fields with ``overrides`` on top) of seed 0, for the cells and tasks that
    ``args`` selects, in suite order. An unknown cell name exits with one line naming the suite's cells."""
    suite = load_suite(args.suite, profile=getattr(args, "profile", None))
    cells = [c for c in suite.cells if args.cells is None or c.name in args.cells]
    if args.cells and len(cells) != len(args.cells):
        known = ", ".join(c.name for c in suite.cells)
        raise SystemExit(f"--cells: unknown cell in {args.cells}; the suite has {known}")
    return [(cell.name, task, {**d, **(overrides or {})})
            for cell in cells for task, d in suite.recall_configs(cell, seed=0).items()
            if args.tasks is None or task in args.tasks]
