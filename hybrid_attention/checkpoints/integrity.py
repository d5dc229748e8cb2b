"""Integrity of what a run writes: per-directory manifests (size + sha256 of every file), atomic writes, finiteness;
every problem is a :class:`CheckpointError`."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from hybrid_attention.errors import DataError
from hybrid_attention.files import hash_file

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "hybrid-attention-manifest"
MANIFEST_VERSION = 1


class CheckpointError(DataError):
    """A checkpoint or model folder that cannot be used: damaged, incomplete, not writable, or not fitting the model.

    Every problem with a checkpoint or model folder is a :class:`CheckpointError`: a :class:`DataError`, so the CLI
    prints it as one ``error: ...`` line (exit status 2) like any other data problem.
    """


class CheckpointDamaged(CheckpointError):
    """A checkpoint whose files fail a check (manifest, size, sha256, parse, finiteness). ``file`` and ``check`` say
    which file and what failed."""

    def __init__(self, path: Path, file: str, check: str):
        self.path, self.file, self.check = Path(path), file, check
        super().__init__(f"{self.path} is damaged: {file}: {check}")

    @property
    def short(self) -> str:
        """``step-00000008 (model.safetensors: sha256 mismatch)``: for notes that list several checkpoints."""
        return f"{self.path.name} ({self.file}: {self.check})"


class CheckpointMismatch(CheckpointError):
    """An intact checkpoint that does not fit the model it is loaded into (vocabulary, layer shapes)."""


class NonFiniteState(CheckpointError):
    """Non-finite values in the tensors about to be written (a diverged run): nothing was written."""


class NewerFormat(CheckpointError):
    """A folder written by a newer version of this library (its ``manifest.json`` version or its ``config.json``
    ``config_revision`` is above what this code reads): refused, never read by this version's rules, never reported
    verified. Not damage: a resume does not fall back past it, and it is never moved aside."""


def newer_format(path: Path, field: str, value: object, supported: int) -> NewerFormat | None:
    """The :class:`NewerFormat` of ``path`` whose ``field`` holds ``value`` where this code reads up to ``supported``
    (None when ``value`` is not an integer above ``supported``; the readers report other values)."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= supported:
        return None
    return NewerFormat(f"{path}: {field} {value}, written by a newer version of hybrid_attention (this one reads "
                       f"{field} {supported} at most); upgrade hybrid_attention to load it")


def check_manifest_version(mpath: Path, doc: dict) -> None:
    """Raise :class:`NewerFormat` when manifest ``doc`` (read from ``mpath``) is newer than ``MANIFEST_VERSION``, and
    :class:`CheckpointDamaged` when its version is not a positive integer."""
    version = doc.get("version")
    newer = newer_format(mpath, "version", version, MANIFEST_VERSION)
    if newer is not None:
        raise newer
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointDamaged(mpath.parent, MANIFEST, f"version {version!r}, expected a positive integer")


def fsync_dir(path: Path) -> None:
    """Make a rename / file creation inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: Path, doc: object) -> None:
    """``path`` holds either its old content or all of ``doc`` (tmp + fsync + os.replace + fsync of the folder)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_manifest(directory: Path, **extra) -> dict:
    """Hash (and fsync) every regular file of ``directory`` (recursively) into ``manifest.json``, written last.

    ``manifest.json`` is written last into a directory that is itself complete (a checkpoint's ``.tmp-step-…``, the
    final model's ``.tmp-final``), through ``manifest.json.tmp`` + fsync + ``os.replace`` + fsync of the directory, so a
    manifest that exists describes files that were fully written and flushed. :func:`verify_manifest` re-checks every
    listed file (present, size, sha256) and names the first one that fails.
    """
    files = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and p.name not in (MANIFEST, MANIFEST + ".tmp"):
            size, sha = hash_file(p, fsync=True)
            files[p.relative_to(directory).as_posix()] = {"size": size, "sha256": sha}
    doc = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, **extra, "files": files}
    write_json_atomic(directory / MANIFEST, doc)
    return doc


def delete_tree(path: Path) -> None:
    """``shutil.rmtree`` that a Ctrl-C does not cut short: an interrupted delete is finished, then re-raised."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def publish_folder(final: Path, fill: Callable[[Path], None], **manifest) -> None:
    """Put folder ``final`` in place whole: ``fill(tmp)`` writes its files into the new folder ``.tmp-<name>`` beside
    it, :func:`write_manifest` (``manifest`` its extra fields) goes last, and one ``os.replace`` is the commit point.
    An existing ``final`` waits as ``.old-<name>`` until the new one is in place, then is deleted. Any exception or
    Ctrl-C before the rename removes ``.tmp-<name>``, puts the old copy back and goes on to the caller."""
    tmp, aside = final.with_name(f".tmp-{final.name}"), final.with_name(f".old-{final.name}")
    try:
        for old in (tmp, aside):  # a killed process's leftovers
            if old.exists():
                shutil.rmtree(old, ignore_errors=True)
        tmp.mkdir(parents=True)
        fill(tmp)
        write_manifest(tmp, **manifest)
        if final.exists():
            os.replace(final, aside)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if aside.exists() and not final.exists():
            os.replace(aside, final)
        raise
    try:
        fsync_dir(final.parent)
    finally:
        delete_tree(aside)


def verify_manifest(directory: Path, required: Iterable[str] = (), only: Iterable[str] | None = None) -> bool:
    """Check every file listed in ``directory/manifest.json`` (or just those in ``only``); False when there is no
    manifest (an older folder).

    Raises CheckpointDamaged naming the first file that is missing, has the wrong size or the wrong sha256, and for
    a ``required`` file that the manifest does not list; NewerFormat for a manifest of a newer version (its entries are
    not read by this version's rules).
    """
    directory = Path(directory)
    mpath = directory / MANIFEST
    if not mpath.exists():
        return False
    try:
        doc = json.loads(mpath.read_text())
        files = doc["files"]
        if doc.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError("not a manifest of this library")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointDamaged(directory, MANIFEST, f"unreadable ({e})") from e
    check_manifest_version(mpath, doc)
    for name in required:
        if name not in files:
            raise CheckpointDamaged(directory, name, "not listed in manifest.json")
    wanted = None if only is None else set(only)
    for name, entry in files.items():
        if wanted is not None and name not in wanted:
            continue
        if not isinstance(entry, dict):
            raise CheckpointDamaged(directory, MANIFEST, f"bad entry for {name}")
        p = directory / name
        if not p.is_file():
            raise CheckpointDamaged(directory, name, "missing")
        try:
            size, sha = hash_file(p)
        except OSError as e:
            raise CheckpointDamaged(directory, name, f"unreadable ({e.strerror or e})") from e
        if size != entry.get("size"):
            raise CheckpointDamaged(directory, name, f"size {size} bytes, manifest says {entry.get('size')}")
        if sha != entry.get("sha256"):
            raise CheckpointDamaged(directory, name, "sha256 mismatch (content changed since it was written)")
    return True


def nonfinite_count(tensors: Iterable[torch.Tensor]) -> int:
    """How many values of ``tensors`` (floating point only; DTensors: the local shard) are NaN or infinite."""
    bad = 0
    for t in tensors:
        if hasattr(t, "to_local"):
            t = t.to_local()
        if not torch.is_tensor(t) or not t.is_floating_point() or t.numel() == 0:
            continue
        bad += int((~torch.isfinite(t)).sum())
    return bad


def first_nonfinite(tensors: dict[str, torch.Tensor]) -> tuple[str, int] | None:
    """(key, count) of the first tensor holding NaN/inf values, or None when all are finite."""
    for k, t in tensors.items():
        n = nonfinite_count([t])
        if n:
            return k, n
    return None


def max_abs(tensors: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """max |x| over the local values of ``tensors`` as a 0-d float tensor (NaN propagates): one fused reduction,
    cheap enough for every optimizer step. None when there is nothing to check."""
    local = []
    for t in tensors:
        t = t.detach()
        if hasattr(t, "to_local"):
            t = t.to_local()
        if t.is_floating_point() and t.numel():
            local.append(t)
    if not local:
        return None
    # optimizer states mix devices (AdamW's `step` counters are 0-d CPU tensors beside CUDA moments): reduce on an
    # accelerator when there is one, so one small copy per CPU value and no host sync
    dev = next((t.device for t in local if t.device.type != "cpu"), local[0].device)
    norms = torch._foreach_norm(local, math.inf)
    return torch.stack([n.float().to(dev, non_blocking=True) for n in norms]).max()
