"""Launch hooks of the benchmarks: per-stage CUDA-event timings and the compiled kernels' resources.

The diagonal-SSM ops take a ``LaunchHooks`` argument (``hybrid_attention.ops.common.triton.hooks``; no-ops by
default); ``StageProfiler`` is the benchmarks' implementation, passed as ``triton_interdomain(..., hooks=prof)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from hybrid_attention.ops.common.triton import interpreting
from hybrid_attention.ops.common.triton.hooks import LaunchHooks

__all__ = ["StageProfiler"]


class StageProfiler(LaunchHooks):
    """Records CUDA events around every stage (when ``timing`` and CUDA is available) and the last compiled kernel
    handle of every launch name (on the GPU; the interpreter returns none)."""

    def __init__(self, timing: bool = True) -> None:
        self.timing = timing and torch.cuda.is_available()
        self.events: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {}
        self.kernels: dict[str, Any] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if not self.timing:
            yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self.events.setdefault(name, []).append((start, end))

    def record(self, name: str, handle: Any) -> None:
        if handle is not None and not interpreting():
            self.kernels[name] = handle

    def summary(self) -> dict[str, float]:
        """{stage: total milliseconds} over the recorded launches (synchronises)."""
        if self.timing:
            torch.cuda.synchronize()
        return {k: sum(s.elapsed_time(e) for s, e in v) for k, v in self.events.items()}

    def resources(self) -> dict[str, tuple[int, int, int]]:
        """{launch: (registers, spills, shared memory bytes)} of the recorded kernels that report them."""
        res = {}
        for name, h in self.kernels.items():
            try:
                res[name] = (h.n_regs, h.n_spills, h.metadata.shared)
            except Exception:  # a handle without the attributes (another triton version)
                pass
        return res
