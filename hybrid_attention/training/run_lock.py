"""One process per run folder: an exclusive OS lock on ``<out_dir>/.lock`` held for the whole run (``train`` on its
``train.out_dir``, ``experiment`` on its suite's ``out_dir``).

The lock is ``flock``: the kernel drops it when the process ends in any way (``kill -9`` included), so a lock file
left on disk never blocks a later run. The holder writes its PID into the file, which a refused run names.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path
from typing import IO

from hybrid_attention.config.schema import ConfigError

LOCK_NAME = ".lock"


def check_out_dir(out_dir: Path, field: str = "train.out_dir") -> None:
    """ConfigError (one line naming ``field``) when ``out_dir`` is a regular file or lies under one; reads only."""
    for p in (out_dir, *out_dir.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                where = "is" if p == out_dir else f"lies under {str(p)!r}, which is"
                raise ConfigError(f"config error: {field} = {str(out_dir)!r} {where} a file, not a folder; "
                                  f"choose a folder for {field}")
            return


# what a run writes in its folder; a symbolic link among them would send a write (or a rotation) elsewhere
RUN_ENTRIES = (LOCK_NAME, "config.yaml", "metrics.jsonl", "tokenizer", "checkpoints", "final", "tensorboard", "wandb")


def refuse_linked_entries(out_dir: Path, entries: tuple[str, ...] = RUN_ENTRIES, field: str = "train.out_dir") -> None:
    """ConfigError (one line naming ``field``) when one of the run's own ``entries`` in ``out_dir`` is a symbolic
    link; reads only."""
    for name in entries:
        p = out_dir / name
        if p.is_symlink():
            raise ConfigError(f"config error: {field} = {str(out_dir)!r}: {name} is a symbolic link (to "
                              f"{os.readlink(p)}); a run never writes or deletes through a link: replace it with a "
                              "file or folder of the run")


class RunLock:
    """The held lock of one run folder; :meth:`release` (or the process ending) frees it.

    Args:
        out_dir: the folder (created if needed).
        field: the setting that names the folder, for the error lines (``train.out_dir``; a suite's ``out_dir``).
        process: what holds the folder, for the error lines (``train``, ``experiment``).
        entries: the folder's own entries that may not be symbolic links (:func:`refuse_linked_entries`).
        probe: subfolders whose writability is checked besides ``out_dir`` when they exist.
    """

    def __init__(self, out_dir: Path, field: str = "train.out_dir", process: str = "train",
                 entries: tuple[str, ...] = RUN_ENTRIES, probe: tuple[str, ...] = ("checkpoints",)):
        """Create ``out_dir`` if needed and take its lock; ConfigError (one line) when another process holds it or
        the folder cannot be written."""
        self.field, self.process = field, process
        check_out_dir(out_dir, field)
        refuse_linked_entries(out_dir, entries, field)
        self.path = out_dir / LOCK_NAME
        f = self._acquire(out_dir)
        try:
            f.seek(0)
            f.truncate()
            f.write(f"{os.getpid()}\n")
            f.flush()
            # a run writes config.yaml, metrics.jsonl and checkpoints/ beside the lock: a folder that refuses a new
            # file (read-only, or the lock file alone left writable) is reported here, before any work; the probe
            # puts the folder's times back, so a resume refused later leaves the run folder as it found it
            for folder in (out_dir, *(out_dir / name for name in probe)):
                if folder.is_dir():
                    times = folder.stat()
                    with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
                        pass
                    with contextlib.suppress(OSError):
                        os.utime(folder, ns=(times.st_atime_ns, times.st_mtime_ns))
        except OSError as e:
            f.close()
            where = getattr(e, "filename", None) or out_dir
            raise ConfigError(f"config error: {field} = {str(out_dir)!r} is not writable ({where}: "
                              f"{e.strerror or e})") from e
        self._file: IO[str] | None = f

    def _acquire(self, out_dir: Path) -> IO[str]:
        """Open and flock the lock file. A releasing run may unlink the lock file it created (see :meth:`release`),
        so a lock counts only while the locked file is still the one at ``self.path``; else open it again."""
        for _ in range(3):
            self._created = not self.path.exists()
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
                f = os.fdopen(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644), "r+")
            except OSError as e:
                raise ConfigError(f"config error: {self.field} = {str(out_dir)!r} is not writable "
                                  f"({e.strerror or e})") from e
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "unknown"
                f.close()
                raise ConfigError(f"config error: {self.field} = {str(out_dir)!r} is in use by another "
                                  f"{self.process} process (PID {holder}); wait for it to end or choose another "
                                  f"{self.field}") from None
            try:
                if os.fstat(f.fileno()).st_ino == os.stat(self.path, follow_symlinks=False).st_ino:
                    return f
            except FileNotFoundError:
                pass
            f.close()
        raise ConfigError(f"config error: {self.field} = {str(out_dir)!r}: its lock file keeps being replaced; "
                          "another process is starting and ending runs in it")

    def release(self) -> None:
        """Free the lock. The file stays (an unlocked file blocks nothing), except when this run created it and
        wrote nothing else: a run refused before its first write leaves the folder as it found it."""
        if self._file is not None:
            out_dir = self.path.parent
            if self._created and [p.name for p in out_dir.iterdir()] == [LOCK_NAME]:
                self.path.unlink(missing_ok=True)  # still held: a run that opened it now sees another inode
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
