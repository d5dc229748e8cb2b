"""One error report per distributed run: under ``torchrun`` every rank reaches the CLI's error handler, and the ranks
that fail in their next collective would bury the first one's clear line under long tracebacks."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path


def world_rank() -> tuple[int, int]:
    """``(WORLD_SIZE, RANK)`` from torchrun's environment; ``(1, 0)`` in a single process."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1), int(os.environ.get("RANK", "0") or 0)


def _marker() -> Path:
    key = "-".join([str(os.getppid()), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
                    os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")])
    return Path(tempfile.gettempdir()) / f"hybrid-attention-error-{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}"


def _remove_stale_markers(folder: Path) -> None:
    """Markers of runs whose torchrun agent has exited (the name's first number is its process id)."""
    for marker in folder.glob("hybrid-attention-error-*"):
        pid = marker.name.split("-")[3]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            marker.unlink(missing_ok=True)
        except OSError:  # another user's process, or no permission to ask: leave it
            pass


def claim_error_report() -> bool:
    """True when this process should report its error: always in a single process; under torchrun only for the
    first rank of the run to call it (on one machine; a multi-node run reports once per node).

    The first rank of a run to fail creates a marker file (``O_EXCL``, so exactly one wins) and reports; a later rank
    of the same run prints nothing for a user error (its line is the same or a consequence) and one short line for any
    other exception. A run is identified by the torchrun agent that started its ranks (their parent process), its
    restart count and its master port, so that a marker never silences another run; markers of runs whose agent has
    exited are removed by the next run that reports. A single process always reports.
    """
    world, rank = world_rank()
    if world <= 1:
        return True
    _remove_stale_markers(_marker().parent)
    try:
        fd = os.open(_marker(), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError:  # no writable temporary folder: every rank reports rather than none
        return True
    os.write(fd, str(rank).encode())
    os.close(fd)
    return True
