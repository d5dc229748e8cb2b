"""``hybrid-attention experiment SUITE.yaml [key=value ...]`` and ``python -m hybrid_attention.experiments``."""

from __future__ import annotations

import argparse
import shlex
import sys


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Define the ``experiment`` subcommand on an ``add_subparsers()`` object (sets ``func``)."""
    p = subparsers.add_parser("experiment", help="run an experiment suite (cells x seeds), resumable; writes a "
                              "markdown table, JSON and PNG plots")
    _arguments(p)
    p.set_defaults(func=_cmd_experiment)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", help="suite YAML (configs/experiments/*.yaml)")
    p.add_argument("overrides", nargs="*", help="suite overrides key=value, e.g. seeds=[0] base.train.steps=20")
    p.add_argument("--profile", default=None, metavar="NAME",
                   help="use the suite's profile NAME (its profiles section, e.g. cpu); the name and out_dir get "
                        "the _NAME suffix")
    p.add_argument("--tasks", nargs="+", metavar="TASK",
                   help="train only these recall tasks now (put it before --only); a cell's result is written once "
                        "all its tasks are done")
    p.add_argument("--only", nargs="+", metavar="CELL", help="run only these cells (the report covers all)")
    p.add_argument("--report-only", action="store_true", help="rewrite the report from finished cells; train nothing")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="run N (cell, seed) runs at once, each in its own subprocess on the same device "
                        "(default: the suite's jobs, 1)")
    p.add_argument("--gpus", default=None, metavar="IDS",
                   help="spread the runs over these GPUs of this machine, e.g. 0,1: one worker per run, each with "
                        "CUDA_VISIBLE_DEVICES set to one GPU; --jobs workers at once (default: one per GPU)")
    p.add_argument("--list", action="store_true", help="print the cells and their state, run nothing")
    p.add_argument("--import-results", action="append", default=[], metavar="RESULTS_JSON",
                   help="first copy the finished runs of an earlier report of this suite (its results.json) into "
                        "the suite's out_dir; they are skipped and appear in the report (repeat for several files)")


def _cmd_experiment(a: argparse.Namespace) -> int:
    from pathlib import Path

    from hybrid_attention.config.schema import ConfigError

    from .paths import result_path
    from .report import collect, write_report
    from .runner import import_results, run_suite, suite_lock
    from .suite import load_suite

    if a.jobs is not None and a.jobs < 1:
        raise ConfigError(f"config error: --jobs must be >= 1, got {a.jobs}")
    gpus = parse_gpus(a.gpus) if a.gpus is not None else None
    suite = load_suite(a.suite, a.overrides + ([f"recall_only=[{','.join(a.tasks)}]"] if a.tasks else []),
                       profile=a.profile)
    words = [a.suite, *(["--profile", a.profile] if a.profile else []), *a.overrides]
    command = "python -m hybrid_attention.experiments " + " ".join(shlex.quote(x) for x in words)

    def print_list() -> int:
        for c in suite.cells:
            done = [s for s in suite.cell_seeds(c) if result_path(Path(suite.out_dir), c.name, s).exists()]
            print(f"{c.name}: seeds {suite.cell_seeds(c)}, finished {done}")
        return 0

    if a.list and not a.import_results:  # reads only: allowed while a run holds the folder
        return print_list()
    if a.only:
        unknown = [n for n in a.only if n not in [c.name for c in suite.cells]]
        if unknown:
            hint = ("; overrides (key=value) go before --only, which takes every word after it"
                    if any("=" in n for n in unknown) else "")
            print(f"error: unknown cells {unknown}; cells: {[c.name for c in suite.cells]}{hint}", file=sys.stderr)
            return 2
    # one process per suite folder (runner.suite_lock): a second run on the same out_dir is refused before it
    # imports, trains or reports anything
    with suite_lock(suite):
        for path in a.import_results:
            try:
                import_results(suite, path)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        if a.list:
            return print_list()
        failed: list[str] = []
        if a.report_only:
            doc = collect(suite, command=command)
        elif a.only:
            full = list(suite.cells)
            suite.cells = [c for c in full if c.name in a.only]
            failed = run_suite(suite, command=command, jobs=a.jobs, gpus=gpus, lock=False)["session_failed"]
            suite.cells = full
            doc = collect(suite, command=command)
        else:
            doc = run_suite(suite, command=command, jobs=a.jobs, gpus=gpus, lock=False)
            failed = doc["session_failed"]
        if a.report_only or a.only:
            write_report(suite, doc)
    print((Path(suite.out_dir) / "results.md").read_text())
    if failed:  # the report is written; the command still did not do all it was asked
        print(f"error: {len(failed)} run(s) failed: {', '.join(failed)} (their error.txt or worker.log in "
              f"{Path(suite.out_dir) / 'cells'} says why); run the same command again to retry them", file=sys.stderr)
        return 1
    return 0


def parse_gpus(text: str) -> list[str]:
    """``"0,1"`` -> ``["0", "1"]``; raises ConfigError naming --gpus unless it is distinct non-negative integers."""
    from hybrid_attention.config.schema import ConfigError

    ids = [x.strip() for x in text.split(",")]
    if not all(x.isdigit() for x in ids) or len(set(ids)) != len(ids):
        raise ConfigError(f"config error: --gpus must be distinct GPU indices separated by commas, e.g. 0,1; "
                          f"got {text!r}")
    return ids


def main(argv: list[str] | None = None) -> int:
    from hybrid_attention.config.schema import ConfigError
    from hybrid_attention.errors import DataError

    p = argparse.ArgumentParser(prog="python -m hybrid_attention.experiments", description=__doc__)
    _arguments(p)
    a = p.parse_args(argv)
    try:
        return _cmd_experiment(a)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (e.g. `timeout`): finished runs are kept, the others resume
        print("interrupted: finished runs are kept; run the same command again to resume", file=sys.stderr)
        return 130
