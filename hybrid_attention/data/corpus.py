"""Text corpora as lists of documents (``Corpus``: the sources), split deterministically into train and validation
by a hash of each document's key (``is_validation``)."""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hybrid_attention.errors import DataError

from .formats import html_to_text

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".html", ".htm", ".jsonl", ".parquet")  # data.source local, by default
LOCAL_SUFFIXES = (*TEXT_SUFFIXES, ".py")  # what data.local_suffixes may name
_PLAIN = (".txt", ".md", ".rst", ".py")
_SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass
class Corpus:
    """Documents of one source, already split. ``n_bytes`` counts UTF-8 bytes of both splits.

    Sources:
      * ``stdlib``: the running interpreter's standard-library ``.py`` files (always present, offline). Files are
        visited in sorted relative-path order; ``site-packages`` and caches are skipped; files that are not UTF-8 are
        skipped and counted.
      * local files, or folders of them: ``.txt`` / ``.md`` / ``.rst`` (one document per file, as is), ``.html`` /
        ``.htm`` (one document per page, tags stripped by the stdlib ``html.parser``: ``formats.html_to_text``),
        ``.jsonl`` (one document per line, text in ``text_field``), ``.parquet`` (one per row, needs ``pyarrow``);
        ``.py`` only when ``data.local_suffixes`` names it. Files of a folder that are of another type, not UTF-8 or
        empty are skipped and counted by reason (``Corpus.describe``); a file named directly must be readable.
    """

    source: str
    train: list[str] = field(default_factory=list)
    validation: list[str] = field(default_factory=list)
    n_skipped: int = 0
    files_read: int = 0  # local: files that gave documents
    skipped: dict[str, int] = field(default_factory=dict)  # local: skipped files by reason

    @property
    def n_bytes(self) -> int:
        return sum(len(t.encode("utf-8")) for t in self.train) + sum(len(t.encode("utf-8")) for t in self.validation)

    def describe(self) -> str:
        """One line: source, documents per split, size in MB (and skipped files, if any)."""
        skipped = f", {self.n_skipped} undecodable files skipped" if self.n_skipped else ""
        if self.files_read or self.skipped:
            by_count = sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0]))
            reasons = "; ".join(f"{n:,} {why}" for why, n in by_count)
            skipped += (f"; files: {self.files_read:,} read, {sum(self.skipped.values()):,} skipped"
                        + (f" ({reasons})" if reasons else ""))
        return (
            f"corpus {self.source}: {len(self.train)} train / {len(self.validation)} validation documents, "
            f"{self.n_bytes / 1e6:.1f} MB{skipped}"
        )


def is_validation(key: str, val_fraction: float) -> bool:
    """Deterministic hash split: True when ``key`` belongs to the validation split.

    The split is by hash: a document goes to validation when the first 8 hex digits of ``sha1(key)`` read as a fraction
    of 2**32 fall below ``val_fraction``; the key is the relative path (plus ``:line``/``:row`` for multi-document
    files). So adding or removing a file never moves another document between splits.
    """
    h = int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:8], 16)
    return h / 2**32 < val_fraction


def _add(corpus: Corpus, key: str, text: str, val_fraction: float) -> None:
    if not text:
        return
    (corpus.validation if is_validation(key, val_fraction) else corpus.train).append(text)


def _check_nonempty(corpus: Corpus, what: str, splits: bool = True) -> Corpus:
    if not splits:  # one text, whatever its split (a haystack of the RULER tasks)
        if not corpus.train and not corpus.validation:
            raise DataError(f"empty corpus: {what} has no text")
        return corpus
    if not corpus.train:
        raise DataError(f"empty corpus: {what} has no training text (validation {len(corpus.validation)} documents)")
    if not corpus.validation:
        raise DataError(
            f"empty validation split: {what} gave no validation document; raise data.val_fraction or add files"
        )
    return corpus


def stdlib_root() -> Path:
    """The standard-library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_corpus(val_fraction: float = 0.05, max_bytes: int | None = None) -> Corpus:
    """The interpreter's standard-library Python sources as a corpus.

    ``max_bytes`` (if set) stops adding files once that many bytes were read, in the same sorted order, so a capped
    corpus is a deterministic prefix of the full one.
    """
    root = stdlib_root()
    corpus = Corpus(source=f"stdlib:{root}")
    total = 0
    for rel in _sorted_files(root, (".py",)):
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            corpus.n_skipped += 1
            continue
        _add(corpus, rel, text, val_fraction)
        total += len(text)
        if max_bytes is not None and total >= max_bytes:
            break
    return _check_nonempty(corpus, f"the standard library at {root}")


def _sorted_files(root: Path, suffixes: tuple[str, ...]) -> list[str]:
    """Relative POSIX paths of files under ``root`` with one of ``suffixes``, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIPPED_DIRS and not d.startswith(".")]
        for name in filenames:
            if name.endswith(suffixes):
                out.append(Path(dirpath, name).relative_to(root).as_posix())
    return sorted(out)


def _walk(root: Path) -> list[str]:
    """Relative POSIX paths of every file under ``root`` (hidden and cache folders left out), sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIPPED_DIRS and not d.startswith(".")]
        out += [Path(dirpath, name).relative_to(root).as_posix() for name in filenames if not name.startswith(".")]
    return sorted(out)


def _suffix(name: str) -> str:
    return Path(name).suffix.lower() or "no suffix"


def local_corpus(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    val_fraction: float = 0.05,
    text_field: str = "text",
    max_bytes: int | None = None,
    suffixes: Iterable[str] | None = None,
    splits: bool = True,
) -> Corpus:
    """A corpus from local files or folders, read in sorted order.

    ``suffixes``: the file types read (default ``TEXT_SUFFIXES``; ``.py`` too when named), each one of
    ``LOCAL_SUFFIXES`` (DataError naming ``data.local_suffixes`` otherwise). In a folder, files of other types, not
    UTF-8 or without text are skipped and counted by reason in ``Corpus.skipped``. ``splits``: DataError unless both
    splits have text (``False``: unless there is any text at all)."""
    wanted = tuple(s.lower() for s in (suffixes if suffixes is not None else TEXT_SUFFIXES))
    bad = [s for s in wanted if s not in LOCAL_SUFFIXES]
    if bad or not wanted:
        raise DataError(f"data.local_suffixes = {list(wanted)}: allowed values are {', '.join(LOCAL_SUFFIXES)} "
                        "(at least one)")
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = list(paths)
    corpus = Corpus(source="local:" + ",".join(str(p) for p in paths))
    other: dict[str, int] = {}
    files: list[tuple[str, Path, bool]] = []  # key, path, inside a folder (skippable)
    for p in map(Path, paths):
        if p.is_dir():
            for rel in _walk(p):
                if _suffix(rel) in wanted:
                    files.append((f"{p.name}/{rel}", p / rel, True))
                else:
                    other[_suffix(rel)] = other.get(_suffix(rel), 0) + 1
        elif p.is_file():
            if _suffix(p.name) not in wanted:
                raise DataError(f"unsupported file type: {p} (read: {', '.join(wanted)}; data.local_suffixes "
                                f"may name {', '.join(LOCAL_SUFFIXES)})")
            files.append((p.name, p, False))
        else:
            raise DataError(f"no such file or folder: {p}")
    if other:
        top = sorted(other.items(), key=lambda kv: (-kv[1], kv[0]))
        kinds = ", ".join(f"{suf} {n:,}" for suf, n in top[:5]) + (", ..." if len(top) > 5 else "")
        corpus.skipped[f"of other types ({kinds})"] = sum(other.values())
    total = 0
    for key, path, skippable in files:
        try:
            docs = list(_read_documents(path, text_field))
        except DataError as e:
            if not (skippable and isinstance(e.__cause__, UnicodeDecodeError)):
                raise
            corpus.skipped["not UTF-8"] = corpus.skipped.get("not UTF-8", 0) + 1
            continue
        if not any(text.strip() for _, text in docs):
            if not skippable:
                raise DataError(f"{path}: no text in it")
            corpus.skipped["without text"] = corpus.skipped.get("without text", 0) + 1
            continue
        corpus.files_read += 1
        for sub, text in docs:
            _add(corpus, key + sub, text, val_fraction)
            total += len(text)
            if max_bytes is not None and total >= max_bytes:
                return _check_nonempty(corpus, corpus.source, splits)
    return _check_nonempty(corpus, corpus.source, splits)


def _read_documents(path: Path, text_field: str) -> Iterator[tuple[str, str]]:
    """Yield ``(key suffix, text)`` for every document in one file; raise DataError naming the file on failure (an
    undecodable file: with the UnicodeDecodeError as its cause)."""
    suffix = path.suffix.lower()
    try:
        if suffix in _PLAIN:
            yield "", path.read_text(encoding="utf-8")
        elif suffix in (".html", ".htm"):
            yield "", html_to_text(path.read_text(encoding="utf-8"))
        elif suffix == ".jsonl":
            with path.open(encoding="utf-8") as f:
                for i, line in enumerate(f):
                    if line.strip():
                        yield f":{i}", _field(json.loads(line), text_field, f"{path}:{i + 1}")
        elif suffix == ".parquet":
            yield from _read_parquet(path, text_field)
    except DataError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"cannot read {path}: {type(e).__name__}: {e}") from e


def _field(record: object, text_field: str, where: str) -> str:
    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
        raise DataError(f"{where}: expected a JSON object with a string field {text_field!r}")
    return record[text_field]


def _read_parquet(path: Path, text_field: str) -> Iterator[tuple[str, str]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise DataError(f"reading {path} needs pyarrow: pip install pyarrow") from e
    table = pq.read_table(path, columns=[text_field])
    for i, text in enumerate(table.column(text_field).to_pylist()):
        if text:
            yield f":{i}", text


def hf_streaming_documents(
    name: str,
    split: str = "train",
    config: str | None = None,
    text_field: str = "text",
    part: str | None = None,
    val_fraction: float = 0.05,
) -> Iterator[str]:
    """Documents of a Hugging Face dataset, streamed (needs the ``data`` extra and network access).

    ``part`` = "train" or "validation" keeps only that side of the hash split over the document index (the key is
    ``f"{name}:{index}"``); ``None`` keeps everything.
    """
    try:
        import datasets
    except ImportError as e:
        raise DataError("HF datasets streaming needs the optional extra: pip install 'hybrid_attention[data]'") from e
    ds = datasets.load_dataset(name, config, split=split, streaming=True)
    for i, row in enumerate(ds):
        if part is not None and is_validation(f"{name}:{i}", val_fraction) != (part == "validation"):
            continue
        yield _field(row, text_field, f"{name}[{i}]")
