"""Helpers of the pin tests (tests/experiments/test_*_pins.py): the suites with GPU results and their runs."""

from collections.abc import Iterator
from pathlib import Path

from hybrid_attention.config.run_config import RunConfig
from hybrid_attention.experiments import Suite

ROOT = Path(__file__).resolve().parents[2]
WITH_GPU_RESULTS = sorted(p.name[: -len("_gpu")] for p in (ROOT / "results").glob("*_gpu") if p.is_dir())
"""Suites with a ``results/<suite>_gpu`` directory."""


def lm_runs(suite: Suite) -> Iterator[tuple[str, int, RunConfig]]:
    """(cell name, seed, validated RunConfig) of every language-model run of the suite."""
    for cell in suite.cells:
        if suite.uses_lm(cell):
            for seed in suite.cell_seeds(cell):
                yield cell.name, seed, suite.run_config(cell, seed, Path("/tmp/unused"))
