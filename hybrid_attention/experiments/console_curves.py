"""Recall curves of runs made before recall rows kept their history: test accuracy per epoch, read from console logs.

Since session 22 a recall row stores its per-epoch history and the report draws ``recall_curves.png`` from it. The
rows of earlier sessions hold only the final accuracy; how each model got there (on MQAR at zoology sizes: a plateau
at chance, then a sudden rise at an epoch that differs by mixer and lr) is in the console logs that
``scripts/merge_device_results.sh`` keeps beside the results (``console_session<S>_call<C>_lane<L>[_cut].log``).
This module reads them back. Per log, in order:

    [i/n] <cell> seed <k>                                     a run starts
      <cell> seed <k> <task>: training                        a task starts (logged since session 25)
      <mixer> d=<d> lr=<lr>: resumed after epoch <e> (...)    a model continues from a checkpoint of an earlier call
      <mixer> d=<d> lr=<lr> epoch <e>: loss <l>, test accuracy <a> (...)
      <cell> seed <k> <task>: accuracy <a> (<s> s)            the task's models above are done

Models not followed by their task's line were cut by the call's limit; they belong to the task whose start line
precedes them or, in logs from before that line existed, to the first task of the suite (``tasks``, in order) after
the last one this log finished for that run (wrong for a call that trained a later task alone with ``--tasks``). Logs
are read in name order (session, then call); a model that starts again at epoch 1 in a later log replaces what
earlier logs had (a fresh re-run), and otherwise the later epochs are appended (a resumed model).

    python -m hybrid_attention.experiments.console_curves results/credible_recall_gpu \\
        --suite configs/experiments/credible_recall.yaml --out results/credible_recall_gpu/curves_from_consoles.png
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

__all__ = ["parse_logs"]

_HEADER = re.compile(r"^\[\d+/\d+\] (?P<cell>\S+) seed (?P<seed>\d+)\s*$")
_EPOCH = re.compile(r"^\s+\S+ d=\d+ lr=(?P<lr>[0-9.e+-]+) epoch (?P<epoch>\d+): loss (?P<loss>[0-9.naif+-]+), "
                    r"test accuracy (?P<acc>[0-9.]+)")
_DONE = re.compile(r"^\s+(?P<cell>\S+) seed (?P<seed>\d+) (?P<task>\S+): accuracy ")
_START = re.compile(r"^\s+(?P<cell>\S+) seed (?P<seed>\d+) (?P<task>\S+): training\s*$")

Key = tuple[str, int, str, float]  # (cell, seed, task, lr)


def _log_models(text: str, tasks: list[str]) -> list[tuple[Key, list[dict]]]:
    """The models of one log in order: ((cell, seed, task, lr), [{epoch, loss, accuracy}, ...])."""
    out: list[tuple[Key, list[dict]]] = []
    run: tuple[str, int] | None = None
    pending: dict[float, list[dict]] = {}  # lr -> epochs of the current task's models
    done: list[str] = []  # tasks this log finished for the current run
    started: str | None = None  # the task whose start line came last (None: not logged, or finished)

    def flush(task: str) -> None:
        out.extend(((run[0], run[1], task, lr), eps) for lr, eps in pending.items())
        pending.clear()

    def flush_cut() -> None:
        if run is None or not pending:
            return
        if started is not None:
            flush(started)
            return
        after = max((tasks.index(t) for t in done if t in tasks), default=-1)
        if after + 1 < len(tasks):
            flush(tasks[after + 1])
        pending.clear()

    for line in text.splitlines():
        if m := _HEADER.match(line):
            flush_cut()
            run, done, started = (m["cell"], int(m["seed"])), [], None
        elif run is not None and (m := _START.match(line)) and (m["cell"], int(m["seed"])) == run:
            flush_cut()
            started = m["task"]
        elif run is not None and (m := _EPOCH.match(line)):
            pending.setdefault(float(m["lr"]), []).append(
                {"epoch": int(m["epoch"]), "loss": float(m["loss"]), "accuracy": float(m["acc"])})
        elif run is not None and (m := _DONE.match(line)) and (m["cell"], int(m["seed"])) == run:
            flush(m["task"])
            done.append(m["task"])
            started = None
    flush_cut()
    return out


def parse_logs(logs: list[Path], tasks: list[str]) -> dict[Key, list[dict]]:
    """{(cell, seed, task, lr): epochs in order} over ``logs`` (read in the given order; see the module docstring for
    how cut, resumed and re-run models are joined). ``tasks``: the suite's recall tasks in its order."""
    curves: dict[Key, list[dict]] = {}
    for path in logs:
        for key, eps in _log_models(path.read_text(errors="replace"), tasks):
            if not eps:
                continue
            if eps[0]["epoch"] == 1 or key not in curves:  # a fresh start replaces an earlier attempt
                curves[key] = list(eps)
            else:  # resumed: keep the earlier epochs before its first one here
                curves[key] = [e for e in curves[key] if e["epoch"] < eps[0]["epoch"]] + eps
    return curves


def plot(curves: dict[Key, list[dict]], tasks: list[str], out: Path, title: str) -> Path | None:
    """One panel per task: test accuracy against epoch, one colour per cell, line style per lr."""
    from hybrid_attention.experiments.report import plot_accuracy_curves

    lrs = sorted({k[3] for k in curves})
    panels = {t: [(cell, f"{cell} lr {lr:g}" + (f" seed {seed}" if seed else ""), lrs.index(lr), eps)
                  for (cell, seed, task, lr), eps in curves.items() if task == t] for t in tasks}
    return plot_accuracy_curves(panels, out, title)


def main(argv: list[str] | None = None) -> None:
    from hybrid_attention.experiments.suite import load_suite

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, help="a suite's results folder with console_*.log files")
    p.add_argument("--suite", type=Path, required=True, help="the suite's YAML (its recall tasks, in order)")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = p.parse_args(argv)
    logs = sorted(args.results.glob("console_*.log"))
    if not logs:
        raise SystemExit(f"results: no console_*.log under {args.results}")
    tasks = list(load_suite(args.suite, []).recall_tasks)
    curves = parse_logs(logs, tasks)
    for (cell, seed, task, lr), eps in curves.items():
        last = eps[-1]
        print(f"{cell} seed {seed} {task} lr {lr:g}: {len(eps)} epochs, last {last['epoch']} accuracy "
              f"{last['accuracy']:.3f}")
    print(f"wrote {plot(curves, tasks, args.out, f'{args.results.name}: test accuracy per epoch (console logs)')}")


if __name__ == "__main__":
    main()
