"""Compressed document shards with a manifest (``write_shards``), and ``data.source: text_dir`` that reads them back
(``iter_text_dir``)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from hybrid_attention.errors import DataError

from ..files import hash_file
from .corpus import Corpus, _add, _check_nonempty

MANIFEST = "manifest.json"
MIB = 1 << 20
_COMPRESSED = (".xz", ".gz", ".zst")
_KINDS = (".jsonl", ".txt")


def _compress(lines: list[bytes], preset: int) -> bytes:
    return lzma.compress(b"".join(lines), preset=preset)


def write_shards(
    documents: Iterable[tuple[str, str, str]],
    out_dir: str | os.PathLike,
    prefix: str = "prose",
    shard_raw_bytes: int = 96 * MIB,
    max_shard_bytes: int = 60 * MIB,
    preset: int = 9,
    extra: dict | None = None,
) -> dict:
    """Write ``(id, source, text)`` documents as ``PREFIX-NNNNN.jsonl.xz`` shards plus ``manifest.json``.

    A shard is JSON lines, one document per line ``{"id": KEY, "source": NAME, "text": ...}``, compressed with xz
    (stdlib ``lzma``). Shards fill up to ``shard_raw_bytes`` of text; a shard whose compressed size would exceed
    ``max_shard_bytes`` is split in two, so every file fits one transfer. ``manifest.json`` lists each shard's sha256,
    compressed and raw bytes and document count, plus the sources (package, version, licence, size).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{prefix}-*.jsonl.xz"):
        old.unlink()
    shards: list[dict] = []

    def flush(lines: list[bytes], n_raw: int) -> None:
        blob = _compress(lines, preset)
        if len(blob) > max_shard_bytes and len(lines) > 1:
            half = len(lines) // 2
            flush(lines[:half], sum(map(len, lines[:half])))
            flush(lines[half:], sum(map(len, lines[half:])))
            return
        if len(blob) > max_shard_bytes:
            raise DataError(f"one document compresses to {len(blob)} bytes, over max_shard_bytes={max_shard_bytes}")
        name = f"{prefix}-{len(shards):05d}.jsonl.xz"
        (out / name).write_bytes(blob)
        shards.append({"file": name, "sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob),
                       "raw_bytes": n_raw, "documents": len(lines)})

    lines: list[bytes] = []
    n_raw = 0
    for key, source, text in documents:
        line = (json.dumps({"id": key, "source": source, "text": text}, ensure_ascii=False) + "\n").encode("utf-8")
        lines.append(line)
        n_raw += len(line)
        if n_raw >= shard_raw_bytes:
            flush(lines, n_raw)
            lines, n_raw = [], 0
    if lines:
        flush(lines, n_raw)
    manifest = {
        "format": "jsonl.xz: one JSON object per line {id, source, text}",
        "shards": shards,
        "total_bytes": sum(s["bytes"] for s in shards),
        "total_raw_bytes": sum(s["raw_bytes"] for s in shards),
        "total_documents": sum(s["documents"] for s in shards),
        **(extra or {}),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def verify_manifest(folder: str | os.PathLike) -> dict | None:
    """Check every shard listed in ``folder/manifest.json`` (present, size, sha256); the manifest, or None if none."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"cannot read {path}: {e}") from e
    for s in manifest.get("shards", []):
        f = folder / s["file"]
        if not f.is_file():
            raise DataError(f"shard {f} is listed in {path} but missing: copy it again")
        size = f.stat().st_size
        if size != s["bytes"]:
            raise DataError(f"shard {f}: {size} bytes, manifest says {s['bytes']}: incomplete copy, copy it again")
        digest = hash_file(f)[1]
        if digest != s["sha256"]:
            raise DataError(f"shard {f}: sha256 {digest[:16]}... does not match the manifest "
                            f"{s['sha256'][:16]}...: corrupted copy, copy it again")
    return manifest


def _open_text(path: Path) -> io.TextIOBase:
    name = path.name
    if name.endswith(".xz"):
        return lzma.open(path, "rt", encoding="utf-8")
    if name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError as e:
            raise DataError(f"reading {path} needs the zstandard module: pip install zstandard") from e
        return io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")), encoding="utf-8")
    return open(path, encoding="utf-8")


def _kind(name: str) -> str | None:
    for c in _COMPRESSED:
        if name.endswith(c):
            name = name[: -len(c)]
            break
    return next((k for k in _KINDS if name.endswith(k)), None)


def text_files(folder: Path) -> list[tuple[str, Path]]:
    """``(relative path, path)`` of the readable text files under ``folder``, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "tokenizer")))  # not the saved tokenizer
        for n in filenames:
            if _kind(n):
                p = Path(dirpath, n)
                out.append((p.relative_to(folder).as_posix(), p))
    return sorted(out)


def iter_text_dir(folder: str | os.PathLike) -> Iterator[tuple[str, str]]:
    """``(key, text)`` of every document in one folder (manifest verified first when present).

    ``text_dir`` reads every ``*.jsonl``/``*.txt`` file of the given folders, plain or ``.gz``/``.xz``/``.zst``
    (``.zst`` needs the ``zstandard`` module), sorted by path; a ``.txt`` file is one document keyed by its path, a JSON
    line by its ``id``. When a folder has ``manifest.json`` every listed shard must be there with the listed sha256:
    a truncated or corrupted copy fails with a one-line error naming the shard.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"data.source=text_dir: no such folder {folder}")
    verify_manifest(folder)
    files = text_files(folder)
    if not files:
        raise DataError(f"data.source=text_dir: no .jsonl/.txt(.gz/.xz/.zst) files in {folder}")
    for rel, path in files:
        try:
            with _open_text(path) as f:
                if _kind(path.name) == ".txt":
                    key = rel
                    for c in _COMPRESSED:
                        key = key.removesuffix(c)
                    yield key, f.read()
                    continue
                for i, line in enumerate(f):
                    if not line.strip():
                        continue
                    rec = json.loads(line)
                    if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                        raise DataError(f"{path}:{i + 1}: expected a JSON object with a string field 'text'")
                    yield str(rec.get("id", f"{rel}:{i}")), rec["text"]
        except DataError:
            raise
        except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, lzma.LZMAError) as e:
            raise DataError(f"cannot read shard {path}: {type(e).__name__}: {e}") from e


def text_dir_corpus(
    folders: str | os.PathLike | Iterable[str | os.PathLike],
    val_fraction: float = 0.05,
    max_bytes: int | None = None,
) -> Corpus:
    """A corpus from folders of shards / text files, split by document key (same split as the source it came from)."""
    if isinstance(folders, (str, os.PathLike)):
        folders = [folders]
    folders = [Path(f) for f in folders]
    corpus = Corpus(source="text_dir:" + ",".join(str(f) for f in folders))
    total = 0
    for folder in folders:
        for key, text in iter_text_dir(folder):
            _add(corpus, key, text, val_fraction)
            total += len(text)
            if max_bytes is not None and total >= max_bytes:
                return _check_nonempty(corpus, corpus.source)
    return _check_nonempty(corpus, corpus.source)
