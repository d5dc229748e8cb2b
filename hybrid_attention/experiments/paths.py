"""Where an experiment suite keeps its results: a leaf module shared by the runner (writes) and the report (reads),
so that neither imports the other."""

from __future__ import annotations

from pathlib import Path

__all__ = ["recall_rows_path", "recall_task_path", "result_path"]


def result_path(out: Path, cell: str, seed: int) -> Path:
    """Where a finished (cell, seed) keeps its result; its existence is what "finished" means everywhere."""
    return Path(out) / "cells" / cell / f"seed{seed}" / "result.json"


def recall_task_path(run_dir: Path, task: str) -> Path:
    """Where a run (``result_path(...).parent``) keeps one finished recall task's best row; it is final once written,
    so the report reads it even while the run's other tasks are left (``--tasks``)."""
    return Path(run_dir) / f"recall_{task}.json"


def recall_rows_path(run_dir: Path, task: str) -> Path:
    """Where a run keeps every finished model of one recall task's sweep (one row per mixer / d_model / lr, each with
    its training seconds), written after each model so that a cut run keeps them."""
    return Path(run_dir) / f"recall_{task}.rows.json"
