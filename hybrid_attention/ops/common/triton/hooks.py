"""Launch hooks: how a benchmark watches the diagonal-SSM ops' launches without module state in the ops.

The host code calls ``hooks.stage(name)`` around each launch group and ``hooks.record(name, handle)`` with each
compiled kernel handle. The default ``NO_HOOKS`` does nothing; a benchmark passes its own subclass (per-stage CUDA
events, registers / spills of the compiled kernels: ``benchmarks/profiling.py``) as an argument of the op's
eager entry point. The registered custom ops always run without hooks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["LaunchHooks", "NO_HOOKS"]


class LaunchHooks:
    """No-op hooks; subclass and override ``stage`` / ``record``."""

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Context around the launches of stage ``name`` (e.g. "state_fwd", "chunk_bwd", "host_reduce")."""
        yield

    def record(self, name: str, handle: Any) -> None:
        """Called with the compiled kernel handle a launch returned (None under the interpreter)."""


NO_HOOKS = LaunchHooks()
