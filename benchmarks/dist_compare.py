"""Compare distributed training runs with their one-process reference (``benchmarks/two_gpu.sh``).

Reads the ``metrics.jsonl`` files the trainer writes (``train.log_every=1``: one ``{"step", "loss", "tokens",
"tok_per_s", ...}`` record per optimizer step, plus a final ``val_loss`` record) from this layout::

    ROOT/<model>/one/       one process (one GPU), global batch B           the reference
    ROOT/<model>/ddp/       torchrun --nproc-per-node 2, train.parallel=ddp,   same global batch B and seed
    ROOT/<model>/fsdp2/     torchrun --nproc-per-node 2, train.parallel=fsdp2, same global batch B and seed
    ROOT/<model>/resume/    optional: one process resumed from fsdp2's step-K checkpoint (K < steps), its
                            metrics.jsonl holding only the steps after K

and prints one table: per run the max abs / max relative loss difference over every step (and its step), the final
validation loss difference, steady tokens/s (global tokens over wall time of the steps after ``--skip-steps``), the
scaling against the reference, and PASS/FAIL; per resume the next-step (K+1) loss difference against the
uninterrupted fsdp2 run and the continuation's max relative difference. ``--per-step`` adds every step's losses.
Exit status 0 when every row passes, 1 when one fails, 2 for a bad argument (one ``error:`` line naming it).
Only the standard library is used (no torch import: it runs in well under a second).

Tolerances (defaults; see ``RTOL`` / ``RESUME_RTOL``): every step's loss within relative ``--rtol 1e-2`` of the
reference, the resumed run's next-step loss within relative ``--resume-rtol 1e-3`` of the uninterrupted run.

Why 1e-2 per step (bf16 autocast over fp32 master weights, fp32 loss, fp32 gradient all-reduce): both runs start
from the same seeded fp32 weights and see the same global batches, so they differ only in rounding. The two-process
runs multiply half the batch per device (other GEMM tilings and reduction orders, so different bf16 roundings of
activations and gradients; bf16's unit roundoff is u = 2^-8 = 3.9e-3 per element) and add the two halves' gradients
in another order. A step's loss is an fp32 mean over B·L token losses (32K on the GPU), so the forward's per-element
roundings mostly average out and step 1, before any update, should agree far below u. What grows is the weight
difference the perturbed updates leave; the loss is smooth in the weights, so over 50 short, warmed-up steps it
moves the loss by much less than u. Measured so far only on the CPU (gloo, bf16 autocast, `tiny`): max relative
difference 8.6e-8 at step 1 and ≈ 2e-5 over 12 steps. 1e-2 (≈ 2.5 u) leaves two to three orders of magnitude for
larger models and GPU kernels, yet a real fault moves the loss by more: a rank training on the wrong shard or
without the gradient all-reduce, a stale or unloaded state after a resume, or another data order shows up as the
batch-to-batch spread of the loss (per-cent level once the model has left ln(vocab); the per-step listing shows it)
or as a jump back towards ln(vocab). What no loss comparison sees: faults that Adam's scale invariance hides
(gradients summed instead of averaged). If a GPU run's measured max relative difference comes within ~3x of the
tolerance, the drift, not a bug, is the likely cause (loss spikes amplify it): look at the per-step listing before
tightening or loosening it.
The resume check is tighter (1e-3, ≈ u/4) because the resumed step K+1 runs the forward on exactly the fp32 weights
the checkpoint holds, so only that one step's forward rounding differs, with no accumulated drift (CPU: 8.7e-8).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RTOL = 1e-2  # every step's loss, relative to the reference (bf16 autocast; see the module docstring)
RESUME_RTOL = 1e-3  # the resumed run's next-step loss, relative to the uninterrupted run
SKIP_STEPS = 5  # steps left out of the throughput (allocator / cuBLAS / NCCL warm-up)
RUNS = ("ddp", "fsdp2")


class CompareError(ValueError):
    """A bad argument or an unreadable input; the message is one line naming it."""


@dataclass
class Run:
    """The training records of one run directory (``loss`` by step, ``tokens`` by step, final validation loss)."""

    path: Path
    loss: dict[int, float | None] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    tok_per_s: dict[int, float] = field(default_factory=dict)
    val_loss: float | None = None

    def steady_tok_per_s(self, skip: int) -> float | None:
        """Global tokens over wall time of the logged intervals that end after step ``skip`` (None when there are
        none). An interval's tokens are the growth of the cumulative ``tokens`` since the previous record, so the
        first record (whose interval start is unknown in a resumed run) never counts."""
        steps = [s for s in sorted(self.tok_per_s) if s in self.tokens]
        tokens = seconds = 0.0
        for prev, s in zip(steps, steps[1:]):
            done, rate = self.tokens[s] - self.tokens[prev], self.tok_per_s[s]
            if s > skip and rate > 0 and done > 0:
                tokens += done
                seconds += done / rate
        return tokens / seconds if seconds > 0 else None


def read_run(path: Path) -> Run | None:
    """The run in ``path`` (None when it has no metrics.jsonl). Lines cut by a crash are ignored."""
    f = Path(path) / "metrics.jsonl"
    if not f.is_file():
        return None
    run = Run(Path(path))
    for line in f.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            continue
        s = rec["step"]
        if "loss" in rec:
            run.loss[s] = rec["loss"] if isinstance(rec["loss"], (int, float)) else None
            if isinstance(rec.get("tokens"), int):
                run.tokens[s] = rec["tokens"]
            if isinstance(rec.get("tok_per_s"), (int, float)):
                run.tok_per_s[s] = float(rec["tok_per_s"])
        if "val_loss" in rec:
            run.val_loss = rec["val_loss"] if isinstance(rec["val_loss"], (int, float)) else None
    return run


@dataclass
class Diff:
    """Loss differences of a run against a reference over the steps they share."""

    steps: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst_step: int | None = None
    problems: list[str] = field(default_factory=list)


def loss_diff(ref: Run, run: Run, steps: Sequence[int] | None = None) -> Diff:
    """Per-step |loss - ref| and |loss - ref| / |ref| over ``steps`` (default: every step of ``ref``); problems:
    steps missing on either side, non-finite losses, a different number of tokens at a step (another global batch)."""
    want = sorted(ref.loss) if steps is None else list(steps)
    d = Diff()
    missing = [s for s in want if s not in run.loss]
    if missing:
        d.problems.append(f"{len(missing)} step(s) missing (first {missing[0]})")
    extra = sorted(set(run.loss) - set(ref.loss))
    if extra:
        d.problems.append(f"{len(extra)} step(s) the reference lacks (first {extra[0]})")
    for s in want:
        a, b = ref.loss.get(s), run.loss.get(s)
        if s not in run.loss or s not in ref.loss:
            continue
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            d.problems.append(f"non-finite loss at step {s} ({a} vs {b})")
            continue
        if s in ref.tokens and s in run.tokens and ref.tokens[s] != run.tokens[s]:
            d.problems.append(f"{run.tokens[s]} tokens by step {s}, the reference {ref.tokens[s]} (global batch)")
        d.steps += 1
        ab = abs(b - a)
        rel = ab / max(abs(a), 1e-12)
        d.max_abs = max(d.max_abs, ab)
        if d.worst_step is None or rel > d.max_rel:
            d.max_rel, d.worst_step = rel, s
    if not d.steps and not d.problems:
        d.problems.append("no loss records")
    return d


def _rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return abs(b - a) / max(abs(a), 1e-12)


@dataclass
class Row:
    """One line of the table."""

    model: str
    run: str
    steps: int = 0
    max_abs: float | None = None
    max_rel: float | None = None
    worst_step: int | None = None
    val_rel: float | None = None
    tok_per_s: float | None = None
    scaling: float | None = None
    next_step: int | None = None  # resume rows: the first step after the checkpoint
    next_abs: float | None = None
    next_rel: float | None = None
    result: str = "PASS"
    notes: list[str] = field(default_factory=list)

    def fail(self, why: str) -> None:
        self.result = "FAIL"
        self.notes.append(why)

    def take_diff(self, d: Diff, rtol: float, what: str) -> None:
        """Record the loss comparison ``d`` and fail on its problems or on a relative difference above rtol
        (``what``: the message's subject, e.g. "loss")."""
        self.steps, self.max_abs, self.max_rel, self.worst_step = d.steps, d.max_abs, d.max_rel, d.worst_step
        for p in d.problems:
            self.fail(p)
        if d.steps and d.max_rel > rtol:
            self.fail(f"{what} differs by {d.max_rel:.2e} relative at step {d.worst_step} (> {rtol:g})")


def compare_model(root: Path, model: str, rtol: float = RTOL, resume_rtol: float = RESUME_RTOL,
                  min_scaling: float | None = None, skip: int = SKIP_STEPS, need_resume: bool = False,
                  runs: Sequence[str] = RUNS) -> list[Row]:
    """The rows of ``root/model``: the reference, each of ``runs`` against it, the resume (when present or
    ``need_resume``). ``min_scaling`` (None: reported only) gates tokens/s of each run over the reference's."""
    base = Path(root) / model
    ref = read_run(base / "one")
    head = Row(model, "one")
    if ref is None or not ref.loss:
        head.fail(f"no training records in {base / 'one' / 'metrics.jsonl'}")
        rows = [head] + [Row(model, r) for r in runs]
        for r in rows[1:]:
            r.fail("no reference")
        return rows
    head.steps, head.tok_per_s, head.result = len(ref.loss), ref.steady_tok_per_s(skip), "ref"
    head.scaling = 1.0 if head.tok_per_s else None
    rows = [head]
    dist: dict[str, Run] = {}
    for name in runs:
        row = Row(model, name)
        rows.append(row)
        run = read_run(base / name)
        if run is None:
            row.fail(f"no {base / name / 'metrics.jsonl'}")
            continue
        dist[name] = run
        row.take_diff(loss_diff(ref, run), rtol, "loss")
        row.val_rel = _rel(ref.val_loss, run.val_loss)
        if row.val_rel is None:
            row.fail("no finite final validation loss on both sides")
        elif row.val_rel > rtol:
            row.fail(f"final validation loss differs by {row.val_rel:.2e} relative (> {rtol:g})")
        row.tok_per_s = run.steady_tok_per_s(skip)
        if row.tok_per_s and head.tok_per_s:
            row.scaling = row.tok_per_s / head.tok_per_s
        if min_scaling is not None:
            if row.scaling is None:
                row.fail(f"no tokens/s after step {skip} to compute the scaling")
            elif row.scaling < min_scaling:
                row.fail(f"scaling {row.scaling:.2f}x < {min_scaling:g}x")
    resumed = read_run(base / "resume")
    if resumed is not None or need_resume:
        rows.append(_resume_row(model, base, resumed, dist.get("fsdp2"), rtol, resume_rtol))
    return rows


def _resume_row(model: str, base: Path, resumed: Run | None, full: Run | None, rtol: float,
                resume_rtol: float) -> Row:
    row = Row(model, "resume")
    if resumed is None or not resumed.loss:
        row.fail(f"no training records in {base / 'resume' / 'metrics.jsonl'}")
        return row
    if full is None:
        row.fail("no uninterrupted fsdp2 run to compare with")
        return row
    steps = sorted(resumed.loss)
    k1 = steps[0]
    row.next_step = k1
    last = max(full.loss)
    if steps[-1] != last:
        row.notes.append(f"continued to step {steps[-1]}, the fsdp2 run to {last}")
    a, b = full.loss.get(k1), resumed.loss.get(k1)
    row.next_rel = _rel(a, b)
    if row.next_rel is None:
        row.fail(f"no finite loss at step {k1} on both sides ({a} vs {b})")
    else:
        row.next_abs = abs(b - a)
        if row.next_rel > resume_rtol:
            row.fail(f"next-step loss differs by {row.next_rel:.2e} relative (> {resume_rtol:g})")
    row.take_diff(loss_diff(full, resumed, steps=[s for s in sorted(full.loss) if s >= k1]), rtol, "continuation")
    row.val_rel = _rel(full.val_loss, resumed.val_loss)
    if row.val_rel is not None and row.val_rel > rtol and steps[-1] == last:
        row.fail(f"final validation loss differs by {row.val_rel:.2e} relative (> {rtol:g})")
    return row


_LABELS = {"one": "1 process (reference)", "ddp": "DDP x2", "fsdp2": "FSDP2 x2", "resume": "FSDP2 2->1 resume"}


def _e(x: float | None) -> str:
    return "–" if x is None else f"{x:.1e}"


def table(rows: Sequence[Row]) -> str:
    """The markdown table of ``rows``."""
    out = ["| model | run | steps | max abs Δloss | max rel Δloss (step) | rel Δ val loss | next-step rel Δ "
           "| tok/s | × ref | result |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        worst = f"{_e(r.max_rel)} ({r.worst_step})" if r.max_rel is not None else "–"
        nxt = f"{_e(r.next_rel)} (step {r.next_step})" if r.next_step is not None else "–"
        tps = f"{r.tok_per_s:,.0f}" if r.tok_per_s else "–"
        sc = f"{r.scaling:.2f}" if r.scaling is not None else "–"
        res = r.result + (": " + "; ".join(r.notes) if r.notes else "")
        out.append(f"| {r.model} | {_LABELS.get(r.run, r.run)} | {r.steps} | {_e(r.max_abs)} | {worst} | "
                   f"{_e(r.val_rel)} | {nxt} | {tps} | {sc} | {res} |")
    return "\n".join(out)


def per_step(root: Path, model: str) -> str:
    """Every step's loss of the reference and of each run found (differences relative to the reference; the
    resume's against fsdp2)."""
    base = Path(root) / model
    ref = read_run(base / "one")
    if ref is None:
        return f"{model}: no reference"
    runs = {n: r for n in (*RUNS, "resume") if (r := read_run(base / n)) is not None}
    lines = [f"{model}: step, reference loss, then per run: loss (relative difference)"]
    for s in sorted(ref.loss):
        parts = [f"{s:5d}", f"{ref.loss[s]:.6f}" if ref.loss[s] is not None else "None"]
        for n, r in runs.items():
            base_loss = runs["fsdp2"].loss.get(s) if n == "resume" and "fsdp2" in runs else ref.loss[s]
            b = r.loss.get(s)
            rel = _rel(base_loss, b)
            parts.append(f"{n} {b:.6f} ({_e(rel)})" if isinstance(b, float) else f"{n} –")
        lines.append("  ".join(parts))
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of the usage block
        raise CompareError(f"{self.prog}: {message}")


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


def _non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m benchmarks.dist_compare", description=__doc__.split("\n\n")[0])
    p.add_argument("root", type=Path, help="folder holding <model>/{one,ddp,fsdp2[,resume]}/metrics.jsonl")
    p.add_argument("--models", nargs="+", help="models (sub-folders of ROOT) in table order [every sub-folder "
                   "with a one/ folder, sorted]")
    p.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS),
                   help="the 2-process runs expected beside each reference [ddp fsdp2]")
    p.add_argument("--rtol", type=_positive, default=RTOL, help=f"per-step relative loss tolerance [{RTOL:g}]")
    p.add_argument("--resume-rtol", type=_positive, default=RESUME_RTOL,
                   help=f"relative tolerance of the resumed next-step loss [{RESUME_RTOL:g}]")
    p.add_argument("--min-scaling", type=_positive, default=None,
                   help="required tokens/s of each 2-process run over the reference, for --scaling-models "
                        "[none: reported only]")
    p.add_argument("--scaling-models", nargs="+", default=None,
                   help="models the --min-scaling gate applies to [every model]")
    p.add_argument("--resume-models", nargs="+", default=(), help="models that must have a resume/ run")
    p.add_argument("--skip-steps", type=_non_negative_int, default=SKIP_STEPS,
                   help=f"first steps left out of tokens/s [{SKIP_STEPS}]")
    p.add_argument("--per-step", action="store_true", help="also print every step's losses")
    p.add_argument("--json", type=Path, default=None, help="write the rows and settings to this file")
    p.add_argument("--markdown", type=Path, default=None, help="write the table to this file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table; 0 when every row passes, 1 when one fails, 2 (one ``error:`` line) for a bad argument."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    if not a.root.is_dir():
        raise CompareError(f"ROOT {a.root}: not a directory")
    models = a.models or sorted(p.name for p in a.root.iterdir() if (p / "one").is_dir())
    if not models:
        raise CompareError(f"ROOT {a.root}: no <model>/one/ folder in it (pass --models)")
    for flag, names in (("--scaling-models", a.scaling_models or ()), ("--resume-models", a.resume_models)):
        unknown = [m for m in names if m not in models]
        if unknown:
            raise CompareError(f"{flag} {' '.join(unknown)}: not among the models ({', '.join(models)})")
    gated = set(models if a.scaling_models is None else a.scaling_models)
    rows: list[Row] = []
    for m in models:
        rows += compare_model(a.root, m, a.rtol, a.resume_rtol, a.min_scaling if m in gated else None,
                              a.skip_steps, need_resume=m in a.resume_models, runs=a.runs)
    text = table(rows)
    ok = all(r.result != "FAIL" for r in rows)
    scaling = (f"tokens/s over the steps after {a.skip_steps}; scaling gate "
               + (f">= {a.min_scaling:g}x for {', '.join(sorted(gated))}" if a.min_scaling else "off"))
    summary = (f"tolerance: every step's loss within {a.rtol:g} relative of the 1-process run at the same global "
               f"batch and seed (and the final validation loss); resume: next-step loss within {a.resume_rtol:g} "
               f"relative of the uninterrupted FSDP2 run; {scaling}\n"
               f"overall: {'PASS' if ok else 'FAIL'}")
    if a.per_step:
        for m in models:
            print(per_step(a.root, m) + "\n")
    print(text)
    print(summary)
    if a.markdown:
        a.markdown.write_text(text + "\n\n" + summary + "\n")
    if a.json:
        settings: dict[str, Any] = {"rtol": a.rtol, "resume_rtol": a.resume_rtol, "min_scaling": a.min_scaling,
                                    "scaling_models": sorted(gated), "skip_steps": a.skip_steps}
        a.json.write_text(json.dumps({"settings": settings, "pass": ok, "rows": [asdict(r) for r in rows]},
                                     indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
