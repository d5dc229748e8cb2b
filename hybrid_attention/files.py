"""File helpers shared by the data shards and the checkpoints (a leaf module: standard library only)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["hash_file"]


def hash_file(path: Path, fsync: bool = False) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of ``path``; ``fsync`` also flushes the file to disk."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            size += len(chunk)
        if fsync:
            os.fsync(f.fileno())
    return size, h.hexdigest()
