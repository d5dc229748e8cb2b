"""Experiment suites: several mixers/configs x seeds on the same data and token budget, resumable, with a report.

``python -m hybrid_attention.experiments SUITE.yaml [key=value ...]`` (or ``hybrid-attention experiment ...``);
see :mod:`hybrid_attention.experiments.suite` for the YAML schema and :func:`run_suite` for what is written.
Importing the package (or ``.cli`` for ``add_parser``) is cheap: matplotlib and the trainer load on first use.
"""

from __future__ import annotations

_EXPORTS = {"Suite": "suite", "load_suite": "suite", "run_suite": "runner", "write_report": "report"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
