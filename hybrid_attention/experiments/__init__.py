"""Experiment suites: several mixers/configs x seeds on the same data and token budget, resumable, with a report.

``python -m hybrid_attention.experiments SUITE.yaml [key=value ...]`` (or ``hybrid-attention experiment ...``);
see :mod:`hybrid_attention.experiments.suite` for the YAML schema and :func:`run_suite` for what is written.
"""

from .report import write_report
from .runner import run_suite
from .suite import Suite, load_suite

__all__ = ["Suite", "load_suite", "run_suite", "write_report"]
