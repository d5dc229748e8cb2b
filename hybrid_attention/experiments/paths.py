"""Where an experiment suite keeps its results: a leaf module shared by the runner (writes) and the report (reads).

``result_path`` used to live in ``runner.py``, which made report -> runner -> report a cycle hidden behind an import
inside a function; both now import it from here.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["result_path"]


def result_path(out: Path, cell: str, seed: int) -> Path:
    """Where a finished (cell, seed) keeps its result; its existence is what "finished" means everywhere."""
    return Path(out) / "cells" / cell / f"seed{seed}" / "result.json"
