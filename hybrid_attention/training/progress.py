"""Progress of a training run or the demo: tqdm's bar on a terminal, one plain line every ``every_s`` seconds when
stderr is a file or a pipe (a log), where tqdm's redraws pile up (1.5 MB of log for a 10-minute demo)."""

from __future__ import annotations

import shutil
import sys
import time
from typing import IO, Any

from tqdm.auto import tqdm

DEFAULT_EVERY_S = 30.0


class LineProgress:
    """The part of tqdm's interface that the trainer and the demo use (``n``, ``total``, ``update``,
    ``set_postfix``, ``set_description_str``, ``close``), printed as one line per ``every_s`` seconds and once at
    ``close``: ``desc: n/total unit (pct%), elapsed, rate[, postfix]``, or ``desc`` alone when ``counts`` is False
    (a caller whose description already says how far it is, as the demo's does)."""

    def __init__(self, total: int, initial: int = 0, desc: str = "", unit: str = "step",
                 every_s: float = DEFAULT_EVERY_S, stream: IO[str] | None = None, counts: bool = True):
        self.total, self.n, self.desc, self.unit, self.every_s = total, initial, desc, unit, every_s
        self.counts = counts
        self.stream = stream if stream is not None else sys.stderr
        self.postfix = ""
        self._start = self._last = time.monotonic()
        self._start_n = initial
        self._closed = False

    def _line(self) -> str:
        if not self.counts:
            return self.desc + (f", {self.postfix}" if self.postfix else "")
        elapsed = time.monotonic() - self._start
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = (self.n - self._start_n) / elapsed if elapsed > 0 else 0.0
        head = f"{self.desc}: " if self.desc else ""
        tail = f", {self.postfix}" if self.postfix else ""
        return f"{head}{self.n}/{self.total} {self.unit}{pct}, {elapsed:.0f} s, {rate:.3g} {self.unit}/s{tail}"

    def _maybe_print(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= self.every_s:
            self._last = now
            print(self._line(), file=self.stream, flush=True)

    def update(self, n: int = 1) -> None:
        """Advance by ``n``; prints when ``every_s`` seconds passed since the last line."""
        self.n += n
        self._maybe_print()

    def set_postfix(self, **values: Any) -> None:
        """``key=value`` pairs shown at the end of the next line."""
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def set_description_str(self, desc: str) -> None:
        """The text before the counts; prints when a line is due."""
        self.desc = desc
        self._maybe_print()

    def close(self) -> None:
        """The final line (once)."""
        if not self._closed:
            self._closed = True
            self._maybe_print(force=True)


def progress_bar(total: int, initial: int = 0, desc: str = "", unit: str = "step", disable: bool = False,
                 every_s: float = DEFAULT_EVERY_S, stream: IO[str] | None = None, counts: bool = True,
                 **tqdm_kwargs: Any):
    """tqdm on a terminal (``tqdm_kwargs`` passed on), :class:`LineProgress` otherwise; a disabled tqdm when
    ``disable``. ``stream``: where the bar goes (default stderr, which decides terminal or not); ``counts``: the
    plain line shows the counts, elapsed time and rate after the description (False: the description alone)."""
    stream = stream if stream is not None else sys.stderr
    if disable or stream.isatty():
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, file=stream, **tqdm_kwargs)
    return LineProgress(total, initial, desc, unit, every_s, stream, counts)


def fit_to_terminal(text: str, reserved: int, stream: IO[str] | None = None) -> str:
    """``text`` cut (ending in "…") so that it and ``reserved`` more columns fit on one terminal line (80 columns
    when the width is unknown); a bar line that wraps is redrawn as a new line on every update."""
    width = shutil.get_terminal_size((80, 24)).columns
    room = max(10, width - reserved - 1)
    return text if len(text) <= room else text[: room - 1] + "…"
