"""May this folder be loaded: the one check every model, checkpoint and tokenizer folder passes before it is read
(``admit``; the rules at ``check_folder``)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from hybrid_attention.errors import DataError

__all__ = ["FolderRefused", "admit", "check_folder", "refuse_links", "refuse_newer", "run_folder",
           "unverified_warning"]

REMOTE_CODE_FIELDS = ("auto_map", "custom_pipelines")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_CONFIG_BYTES = 16 << 20  # a config.json is ~1 KB and a manifest ~1 KB; a larger one is refused, not parsed


class FolderRefused(DataError):
    """A folder that must not be loaded (code to import, pickled weights, a symlink out of it, a foreign path)."""


def _inside(target: str, scope: str) -> bool:
    return target == scope or target.startswith(scope.rstrip(os.sep) + os.sep)


LOAD_REFUSAL = "refusing to load a model folder through a link out of it"


def refuse_links(folder: str | os.PathLike, scope: str | os.PathLike | None = None, why: str = LOAD_REFUSAL,
                 error: type[DataError] | None = None) -> None:
    """Raise ``error`` (default :class:`FolderRefused`; one line naming the link and ``why``) when ``folder`` is, or
    holds at any depth, a symbolic link resolving outside ``scope``; ``scope=None``: any symbolic link at all (a run's
    checkpoints are rotated and deleted, never through a link). Reads only; never follows a link while walking."""
    folder, err = Path(folder), error or FolderRefused
    root = os.path.realpath(scope) if scope is not None else None

    def refused(p: str) -> DataError:
        if root is None:
            return err(f"{p} is a symbolic link (to {os.readlink(p)}): {why}")
        return err(f"{p}: a symlink to {os.path.realpath(p)}, outside {scope}: {why}")

    if folder.is_symlink() if root is None else not _inside(os.path.realpath(folder), root):
        raise refused(str(folder))
    if not folder.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            if os.path.islink(p) and (root is None or not _inside(os.path.realpath(p), root)):
                raise refused(p)


def _check_files(folder: Path, weights: bool) -> None:
    for dirpath, _, filenames in os.walk(folder, followlinks=False):
        for name in sorted(filenames):
            p = Path(dirpath) / name
            try:
                mode = os.stat(p).st_mode
            except OSError:
                mode = None  # a dangling link: the loader reports the file as missing
            if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
                raise FolderRefused(f"{p}: not a regular file (a FIFO, socket or device); a model folder holds "
                                    "regular files only")
            if name.endswith(".py"):
                raise FolderRefused(f"{p}: a model folder holds no code; this library never imports code from one")
            if weights and name.lower().endswith(PICKLE_SUFFIXES):
                raise FolderRefused(f"{p}: a pickled weight file; model folders are loaded from safetensors only "
                                    "(model.safetensors)")


def _read_config(p: Path) -> dict | None:
    """The JSON object in ``p``; None for what the loader itself reports (unreadable, not JSON, not an object) and
    for a non-regular file (refused by :func:`_check_files`, never opened here: a FIFO would block)."""
    try:
        st = os.stat(p)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    if st.st_size > MAX_CONFIG_BYTES:
        raise FolderRefused(f"{p}: {st.st_size:,} bytes, more than any config this library reads "
                            f"({MAX_CONFIG_BYTES:,})")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _outside(value: str) -> bool:
    rel = Path(value)
    return rel.is_absolute() or ".." in rel.parts


def _check_configs(folder: Path) -> None:
    manifest = _read_config(folder / "manifest.json")
    files = manifest.get("files") if manifest is not None else None
    for name in files if isinstance(files, dict) else ():
        if _outside(str(name)):
            raise FolderRefused(f"{folder / 'manifest.json'}: lists {name}, outside the folder")
    for p in sorted(folder.glob("*config.json")):
        doc = _read_config(p)
        if doc is None:
            continue
        for field in REMOTE_CODE_FIELDS:
            if field in doc:
                raise FolderRefused(f"{p}: field {field!r} names code to import (remote code); this library never "
                                    "runs code from a model folder: remove the field to load the folder")
        if p.name == "tokenizer_config.json":
            for key, value in doc.items():
                if key.endswith(("_file", "_files")) and isinstance(value, str) and value:
                    if _outside(value):
                        raise FolderRefused(f"{p}: field {key!r} names {value}, outside the folder; a tokenizer is "
                                            "loaded from its own folder only")


def refuse_newer(folder: str | os.PathLike, config_revision: int | None = None) -> None:
    """Raise :class:`~hybrid_attention.checkpoints.integrity.NewerFormat` (one line naming the file) when ``folder``
    was written by a newer version of this library: its ``manifest.json`` version is above ``MANIFEST_VERSION``, or
    (``config_revision``: the newest revision the caller reads, ``models.configuration.CONFIG_REVISION``) its
    ``config.json`` ``config_revision`` is above that. Reads only those small files; a missing or unreadable one
    passes (the loaders report it). A ``HybridConfig`` refuses a newer ``config_revision`` itself, wherever one is
    built."""
    from hybrid_attention.checkpoints.integrity import MANIFEST_VERSION, newer_format

    folder = Path(folder)
    checks = [("manifest.json", "version", MANIFEST_VERSION)]
    if config_revision is not None:
        checks.append(("config.json", "config_revision", config_revision))
    for name, field, supported in checks:
        doc = _read_config(folder / name)
        newer = newer_format(folder / name, field, doc.get(field), supported) if doc is not None else None
        if newer is not None:
            raise newer


def run_folder(path: str | os.PathLike) -> Path | None:
    """The training run folder that ``path`` is or belongs to, told by its layout (``config.yaml`` may be missing):
    ``path`` itself when it holds ``config.yaml``; ``<run>`` for ``<run>/checkpoints/step-…``; the parent of a folder
    beside ``config.yaml`` or ``checkpoints/`` (``<run>/final``, ``<run>/tokenizer``); ``path`` itself when it holds
    ``final/`` or ``checkpoints/``. None: a model folder on its own."""
    path = Path(path)
    if (path / "config.yaml").exists():
        return path
    if path.parent.name == "checkpoints" and path.name.startswith("step-"):
        return path.parent.parent
    if (path.parent / "config.yaml").exists() or (path.parent / "checkpoints").is_dir():
        return path.parent
    if (path / "final").is_dir() or (path / "checkpoints").is_dir():
        return path
    return None


def default_scope(folder: Path) -> Path:
    """Where the links of ``folder`` may lead when no scope is given: the run folder it is part of
    (:func:`run_folder`), the cached repository (``models--…/``) of a Hugging Face hub snapshot (``…/snapshots/<rev>``,
    files linking to ``blobs/``), else the folder itself."""
    repo = folder.parent.parent
    if folder.parent.name == "snapshots" and repo.name.startswith("models--") and (repo / "blobs").is_dir():
        return repo
    return run_folder(folder) or folder


def check_folder(folder: str | os.PathLike, scope: str | os.PathLike | None = None, weights: bool = True) -> None:
    """Raise :class:`FolderRefused` (one line naming the file) when ``folder`` names code to import, holds pickled
    weights (``weights=False``: not checked, for a folder read only for its tokenizer) or non-regular files, names a
    file outside itself, or is or holds a symlink resolving outside ``scope`` (a run directory for its ``final/``,
    ``checkpoints/step-*`` and ``tokenizer/``; default :func:`default_scope`: the run folder it is part of, else the
    folder itself).

    A folder is refused with one :class:`FolderRefused` line naming the file and the reason when it

      * names code to import: an ``auto_map`` / ``custom_pipelines`` field in a ``*config.json``, or any ``*.py`` file
        (the library never runs code from a model folder; its Hugging Face calls pass ``trust_remote_code=False``),
      * holds a pickled weight file (``*.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``, ``*.pkl``, ``*.pickle``): safetensors
        only,
      * is, or holds, a symlink resolving outside its scope (the folder itself, the run directory it belongs to, or for
        a snapshot in the Hugging Face hub cache, ``models--…/``, whose ``blobs/`` its files link to),
      * names a file outside itself in a ``*_file`` field of ``tokenizer_config.json`` or in ``manifest.json``,
      * holds something other than regular files and folders (a FIFO would block the reader), or a ``*config.json`` /
        ``manifest.json`` larger than any this library writes,
      * fails its ``manifest.json`` check (size and sha256 of every listed file, see ``checkpoints.integrity``).

    A folder whose ``manifest.json`` was written by a newer version of this library (:func:`refuse_newer`) is refused
    with one ``NewerFormat`` line (a ``CheckpointError``; with ``weights=False`` it is not checked: a tokenizer is read
    by transformers' rules); a newer ``config.json`` ``config_revision`` is refused where the config is built.

    A folder without ``manifest.json`` passes with one warning line (:func:`unverified_warning`): its bytes are
    unchecked.
    """
    folder = Path(folder)
    refuse_links(folder, scope if scope is not None else default_scope(folder))
    _check_configs(folder)
    _check_files(folder, weights)
    if weights:
        refuse_newer(folder)


def unverified_warning(folder: str | os.PathLike) -> str:
    """The warning line of a folder loaded without ``manifest.json``, the same on every load path."""
    return f"warning: {folder} has no manifest.json: loaded without size/checksum verification"


def admit(folder: str | os.PathLike, scope: str | os.PathLike | None = None, required: Iterable[str] = (),
          only: Iterable[str] | None = None, log: Callable[[str], None] | None = None) -> bool:
    """May ``folder`` be loaded: :func:`check_folder`, then its ``manifest.json`` (``required``: files the manifest
    must list; ``only``: check just these). Returns True when a manifest was present and every checked file matched,
    False (after logging :func:`unverified_warning` to ``log``) when there is no manifest. Raises FolderRefused or
    CheckpointDamaged (both one line)."""
    from hybrid_attention.checkpoints.integrity import verify_manifest

    check_folder(folder, scope)
    verified = verify_manifest(Path(folder), required=required, only=only)
    if not verified and log is not None:
        log(unverified_warning(folder))
    return verified
