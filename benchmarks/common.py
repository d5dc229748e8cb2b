"""Shared helpers of the GPU benchmark sections (`hybrid-attention bench ...`).

Every benchmark section is a function that appends its rows to a shared ``results`` dict and prints as it goes, so
that one device call runs everything and a failure in one section still leaves the numbers of the others.
``BENCH_DRYRUN=1`` (with ``TRITON_INTERPRET=1`` on a CPU machine) runs the sections at tiny shapes: a smoke test of
the benchmark code itself, not a measurement.
"""

from __future__ import annotations

import functools
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "DRYRUN",
    "DEVICE",
    "log",
    "elapsed",
    "guarded",
    "bench_ms",
    "peak_mb",
    "rel_rms",
    "sync",
    "budget_left",
    "fla_gdn",
]

DRYRUN = os.environ.get("BENCH_DRYRUN") == "1"
DEVICE = "cuda" if torch.cuda.is_available() and not DRYRUN else "cpu"
_T_START = time.time()
# Soft wall-clock budget (seconds) shared by all sections of one invocation: sections skip their optional parts when
# it is spent, so that a device call ends inside its time limit with every table printed.
BUDGET_S = float(os.environ.get("BENCH_BUDGET_S", "540"))


def log(*args: Any) -> None:
    """print() with flush (device logs are read as they stream)."""
    print(*args, flush=True)


def elapsed() -> float:
    """Seconds since this process imported the benchmark helpers."""
    return time.time() - _T_START


def budget_left() -> float:
    """Seconds left of ``BENCH_BUDGET_S``."""
    return BUDGET_S - elapsed()


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


def sync() -> None:
    """Wait for the GPU (no-op on the CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bench_ms(fn: Callable[[], Any], warmup: int = 10, rep: int = 60, grad_to_none: list | None = None) -> float:
    """Median milliseconds of ``fn()`` (triton.testing.do_bench on CUDA; one timed call on the CPU dry run)."""
    if DEVICE == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="median"))
    t0 = time.time()
    fn()
    return (time.time() - t0) * 1e3


def peak_mb(fn: Callable[[], Any], relative: bool = True) -> float:
    """Peak CUDA memory (MB) allocated while ``fn()`` runs (nan on the CPU); with ``relative`` (default), above what
    was allocated just before (weights and anything else alive), else the absolute peak."""
    if DEVICE != "cuda":
        fn()
        return float("nan")
    sync()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if relative else 0
    fn()
    sync()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def fla_gdn() -> Callable | None:
    """fla's ``chunk_gated_delta_rule`` when fla is importable (a carried wheel on the device; never a runtime
    dependency of the library), else None."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as exc:
        log(f"  fla not installed ({exc.__class__.__name__}): skipped")
        return None
    return chunk_gated_delta_rule


def rel_rms(a: torch.Tensor, b: torch.Tensor, abs_floor: float = 1e-20) -> float:
    """Relative RMS error ||a - b|| / ||b|| computed in b's dtype (b is the float64 reference); when ||b|| is below
    ``abs_floor`` (a state decayed below float32 range) the absolute error is returned instead."""
    a = a.detach().to(b.device, b.dtype)
    nb = b.norm()
    if nb < abs_floor:
        return (a - b).norm().item()
    return ((a - b).norm() / nb).item()
