"""The training loop shared by the LM trainer and the recall tasks: numbered units of training, hooks, a stopping rule.

A unit is whatever the caller trains at a time: one optimizer step (``Trainer``) or one epoch of them (recall). After
each unit the due hooks run in their order (evaluation before checkpoint, so that a checkpoint holds the evaluated
state), then the stopping rule is read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class Hook:
    """``run(i)`` after unit ``i`` when it is due: every ``every``-th unit (0: never by count), after the last unit,
    and whenever ``pending()`` is true (a checkpoint put off from an earlier unit)."""

    run: Callable[[int], object]
    every: int = 1
    pending: Callable[[], bool] | None = None

    def due(self, i: int, last: bool) -> bool:
        """Whether the hook runs after unit ``i`` (``last``: it is the final unit)."""
        return last or (self.every > 0 and i % self.every == 0) or (self.pending is not None and self.pending())


@dataclass
class TrainingLoop:
    """Units ``1 .. last()`` of one run, each followed by its due ``hooks``; ``stop(i)`` (read after the hooks of unit
    ``i``) ends the run early. ``last`` is read afresh after every unit: a run's length may change while it runs."""

    unit: Callable[[int], object]
    last: Callable[[], int]
    hooks: Sequence[Hook] = ()
    stop: Callable[[int], bool] | None = None

    def advance(self, i: int) -> bool:
        """Run unit ``i`` and its due hooks; returns whether the run ends after it."""
        self.unit(i)
        last = i >= self.last()
        for hook in self.hooks:
            if hook.due(i, last):
                hook.run(i)
        return last or (self.stop is not None and self.stop(i))

    def run(self, done: int = 0) -> int:
        """Run units ``done + 1, ...`` until the run ends; returns the number of the last unit run (``done`` when
        none is left)."""
        i = done
        while i < self.last():
            i += 1
            if self.advance(i):
                break
        return i
