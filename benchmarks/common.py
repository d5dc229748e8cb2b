"""Shared helpers of the GPU benchmark sections (`hybrid-attention bench ...`).

Every benchmark section is a function that appends its rows to a shared ``results`` dict and prints as it goes, so
that one invocation runs everything and a failure in one section still leaves the numbers of the others.

Nothing here reads the environment at import: each script's ``main(argv)`` builds its parser with
``bench_parser`` (``--dryrun``, ``--budget-s``, ``--out``, ``--quick``, ``--sweep``; the first three default to
``BENCH_DRYRUN``, ``BENCH_BUDGET_S``, ``OUT``, read there and then), turns the parsed flags into one frozen
``BenchSettings`` and passes it down to its sections. ``--dryrun`` (with ``TRITON_INTERPRET=1`` on a CPU machine)
runs the sections at tiny shapes: a smoke test of the benchmark code itself, not a measurement.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "DEFAULT_BUDGET_S",
    "DECODE_ATTENTION_BUDGET_S",
    "INTERDOMAIN_OPS_BUDGET_S",
    "NATSL_OPS_BUDGET_S",
    "BenchSettings",
    "bench_parser",
    "require_cuda",
    "failures",
    "exit_status",
    "log",
    "elapsed",
    "guarded",
    "section",
    "bench_ms",
    "peak_mb",
    "rel_rms",
    "config_with",
    "sync",
    "fla_gdn",
]

_T_START = time.time()
# Soft wall-clock budget (seconds) shared by all sections of one invocation (measured from the process's first import
# of this module): sections skip their optional parts when it is spent, so that a time-limited invocation ends inside
# its limit with every table printed. A script may pass another default to ``bench_parser``; ``--budget-s`` /
# ``BENCH_BUDGET_S`` override both.
DEFAULT_BUDGET_S = 540.0
# The scripts that default to less than the one budget, as margins below it (the values of their former literals;
# each is its script's default only, overridden by --budget-s / BENCH_BUDGET_S as DEFAULT_BUDGET_S is).
# decode_attention_ops: 240 s (300 s under), the budget it was written with (a correctness pass and a sweep of one
# kernel that stops when the budget is spent: it needs much less than a whole call).
DECODE_ATTENTION_BUDGET_S = DEFAULT_BUDGET_S - 300.0
# interdomain_ops: 440 s (100 s under). Its sections stop at fixed fractions of the budget (sweep 0.35, correctness
# 0.75, timing 0.9), and those fractions were tuned against 440 s.
INTERDOMAIN_OPS_BUDGET_S = DEFAULT_BUDGET_S - 100.0
# natsl_ops: 420 s (120 s under), the length its sections were sized for (its sweep stops when the budget is spent).
NATSL_OPS_BUDGET_S = DEFAULT_BUDGET_S - 120.0


@dataclass(frozen=True)
class BenchSettings:
    """The run settings of one benchmark invocation, built once in a script's ``main`` and passed to its sections.

    dryrun: tiny shapes on the CPU (a smoke test of the benchmark code); budget_s: the soft wall-clock budget in
    seconds (see ``budget_left``); out: the folder the JSON results go to (None: none are written, a dry run's
    default).
    """

    dryrun: bool = False
    budget_s: float = DEFAULT_BUDGET_S
    out: str | None = "."

    @property
    def device(self) -> str:
        """"cuda" when a GPU is visible and this is not a dry run, else "cpu"."""
        return "cuda" if torch.cuda.is_available() and not self.dryrun else "cpu"

    def budget_left(self) -> float:
        """Seconds left of ``budget_s`` (since the process started its benchmarks)."""
        return self.budget_s - elapsed()

    def out_path(self, name: str) -> str:
        """The path of result file ``name`` under ``out`` (which must be set)."""
        if self.out is None:
            raise ValueError(f"no results folder to write {name} into: pass --out or set OUT")
        return os.path.join(self.out, name)

    def write_json(self, name: str, data: Any) -> str | None:
        """Write ``data`` as ``<out>/<name>`` (written aside, then renamed: whole or absent); returns the path, or
        None without writing when ``out`` is None."""
        if self.out is None:
            return None
        os.makedirs(self.out, exist_ok=True)
        path = self.out_path(name)
        with open(path + ".tmp", "w") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(path + ".tmp", path)
        return path

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchSettings:
        """The settings of flags parsed by a ``bench_parser`` parser; exits with one line when no GPU is visible and
        this is not a dry run (:func:`require_cuda`). Without ``--out`` / ``OUT`` the results go to the working
        directory, and a dry run writes none."""
        require_cuda(args.dryrun)
        out = args.out if args.out is not None else (None if args.dryrun else ".")
        return cls(dryrun=args.dryrun, budget_s=args.budget_s, out=out)


def require_cuda(dryrun: bool) -> None:
    """Exit (status 1, one line on stderr) unless a CUDA GPU is visible or ``dryrun`` is set: a benchmark measures a
    GPU, and on a CPU its kernels fail or its compiled rows run for minutes without printing."""
    if not dryrun and not torch.cuda.is_available():
        raise SystemExit("error: this benchmark needs a CUDA GPU and none is visible; --dryrun (or BENCH_DRYRUN=1) "
                         "runs it at tiny shapes on the CPU as a smoke test of the code, not a measurement")


def bench_parser(description: str, budget_s: float = DEFAULT_BUDGET_S, prog: str | None = None
                 ) -> argparse.ArgumentParser:
    """The flags every benchmark script takes; call it from ``main`` (the defaults read the environment then).

    ``--quick`` (fewer lengths) and ``--sweep`` (launch-config sweeps where a script has one) are what
    ``hybrid-attention bench`` passes to every section; ``--dryrun`` defaults to ``BENCH_DRYRUN=1``, ``--budget-s``
    to ``BENCH_BUDGET_S`` or ``budget_s``, ``--out`` to ``OUT`` (unset: None, which ``BenchSettings.from_args`` reads
    as the working directory, or as no files for a dry run).
    """
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--quick", action="store_true", help="fewer lengths / rows")
    p.add_argument("--sweep", action="store_true", help="also sweep launch configurations where there is a sweep")
    p.add_argument("--dryrun", action="store_true", default=os.environ.get("BENCH_DRYRUN") == "1",
                   help="tiny shapes on the CPU: a smoke test of the script (default: BENCH_DRYRUN=1)")
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("BENCH_BUDGET_S", budget_s)),
                   help=f"soft wall-clock budget in seconds (default: BENCH_BUDGET_S or {budget_s:g})")
    p.add_argument("--out", default=os.environ.get("OUT"),
                   help="folder of the JSON results (default: $OUT, else the working directory; a dry run writes "
                        "none unless given)")
    return p


def failures(results: Any) -> list[str]:
    """What failed in a run's results: its ``"errors"`` (sections or rows that raised) and every row anywhere in it
    with ``"pass": False`` (a correctness check past its bar)."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("pass") is False:
                found.append("check failed: " + ", ".join(f"{k}={v}" for k, v in node.items()
                                                          if isinstance(v, (str, int)) and not isinstance(v, bool)))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    if isinstance(results, dict):
        found += [str(e) for e in results.get("errors") or []]
    walk({k: v for k, v in results.items() if k != "errors"} if isinstance(results, dict) else results)
    return found


def exit_status(results: Any) -> int:
    """A benchmark script's exit status: 0 when nothing in ``results`` failed (:func:`failures`), else 1 after one
    line counting the failures."""
    found = failures(results)
    if found:
        log(f"FAILED: {len(found)} error(s) or failed check(s); the first: {found[0]}")
    return 1 if found else 0


def training_step(fwd: Callable, opt: torch.optim.Optimizer, ids: torch.Tensor, amp: bool = True,
                  graphs: bool = False, **inputs: Any) -> Callable[[], torch.Tensor]:
    """One full LM training step as a closure: forward (labels = ids) under bf16 autocast when ``amp``, backward,
    ``opt.step()``, ``zero_grad(set_to_none=True)``; returns the loss. ``inputs``: extra model inputs (cu_seqlens).
    ``graphs``: ``fwd`` is compiled with CUDA graphs (mode "reduce-overhead"): each step starts a new cudagraph step."""
    dev = ids.device.type

    def step() -> torch.Tensor:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=amp):
            loss = fwd(ids, labels=ids, **inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def cuda_steps_ms(step: Callable[[], Any], steps: int) -> float:
    """Mean ms of ``steps`` back-to-back calls of ``step``, timed together with CUDA events (CUDA only)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def log(*args: Any) -> None:
    """print() with flush (device logs are read as they stream)."""
    print(*args, flush=True)


def elapsed() -> float:
    """Seconds since this process imported the benchmark helpers."""
    return time.time() - _T_START


def guarded(results: dict, name: str) -> Callable:
    """Decorator: run a section, log its wall time; on an exception log it, record it in ``results["errors"]`` and
    return None instead of raising (one broken section must not hide the others)."""

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.time()
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                log(f"[{name}] FAILED: {exc!r}")
                traceback.print_exc()
                results.setdefault("errors", []).append(f"{name}: {exc!r}")
                return None
            finally:
                log(f"[{name}] {time.time() - t0:.1f} s (total {elapsed():.0f} s)")

        return run

    return deco


def section(name: str) -> Callable:
    """``guarded`` for a section whose first argument is its run's results dict (made by the benchmark's ``main``,
    not module state): an exception is logged and recorded in that dict's ``"errors"``, and the section returns
    None."""

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(results: dict, *args: Any, **kwargs: Any) -> Any:
            return guarded(results, name)(fn)(results, *args, **kwargs)

        return run

    return deco


def sync() -> None:
    """Wait for the GPU (no-op on the CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bench_ms(fn: Callable[[], Any], warmup: int = 10, rep: int = 60, grad_to_none: list | None = None) -> float:
    """Median milliseconds of ``fn()`` (triton.testing.do_bench on CUDA; one timed call on the CPU: the dry run)."""
    if torch.cuda.is_available():
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="median"))
    t0 = time.time()
    fn()
    return (time.time() - t0) * 1e3


def peak_mb(fn: Callable[[], Any], relative: bool = True) -> float:
    """Peak CUDA memory (MB) allocated while ``fn()`` runs (nan on the CPU: the dry run); with ``relative``
    (default), above what was allocated just before (weights and anything else alive), else the absolute peak."""
    if not torch.cuda.is_available():
        fn()
        return float("nan")
    sync()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if relative else 0
    fn()
    sync()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def fla_gdn() -> Callable | None:
    """fla's ``chunk_gated_delta_rule`` when fla is importable (an optional comparison baseline;
    never a runtime dependency of the library), else None."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as exc:
        log(f"  fla not installed ({exc.__class__.__name__}): skipped")
        return None
    return chunk_gated_delta_rule


def kernel_split(fn, leaves: list[torch.Tensor], calls: int = 3) -> dict[str, float]:
    """CUDA ms per call of each kernel ``fn`` launches (the profiler's device time, summed by kernel name without a
    leading ``_`` or trailing ``_kernel``); the ``leaves``' gradients are reset before each call, as ``do_bench``'s
    ``grad_to_none`` does (no accumulation). Kernel time only: the host's launch gaps between kernels, which
    ``do_bench`` counts when an op runs alone, are left out."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            for t in leaves:
                t.grad = None
            fn()
        torch.cuda.synchronize()
    split: dict[str, float] = {}
    for ev in prof.key_averages():
        ms = ev.device_time_total / 1e3 / calls
        if ms > 0:
            name = ev.key.removesuffix("_kernel").lstrip("_")
            split[name] = split.get(name, 0.0) + ms
    return split


def rel_rms(a: torch.Tensor, b: torch.Tensor, abs_floor: float = 1e-20) -> float:
    """Relative RMS error ||a - b|| / ||b|| computed in b's dtype (b is the float64 reference); when ||b|| is below
    ``abs_floor`` (a state decayed below float32 range) the absolute error is returned instead."""
    a = a.detach().to(b.device, b.dtype)
    nb = b.norm()
    if nb < abs_floor:
        return (a - b).norm().item()
    return ((a - b).norm() / nb).item()


def config_with(base: Any, pairs: list[str]) -> Any:
    """The frozen launch config ``base`` with ``KEY=VALUE`` overrides, each typed as the field it replaces (int, bool
    as 0/1, str); an unknown key names the config's fields."""
    import dataclasses

    changes = {}
    fields = {f.name for f in dataclasses.fields(base)}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in fields:
            raise SystemExit(f"--set: {key!r} is not a field of {type(base).__name__} ({', '.join(sorted(fields))})")
        old = getattr(base, key)
        changes[key] = bool(int(value)) if isinstance(old, bool) else type(old)(value)
    return dataclasses.replace(base, **changes)
