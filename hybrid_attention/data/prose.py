"""``data.source: prose``: English prose and technical prose from Debian packages (``ProseSource``), read in their
shipped formats."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hybrid_attention.errors import DataError

from . import formats
from .corpus import Corpus, _add, _check_nonempty

MIN_DOC_CHARS = 64  # shorter documents (stubs, empty index pages) are dropped


@dataclass(frozen=True)
class ProseSource:
    """One source of the prose corpus.

    Every source is one Debian package (main, DFSG-free), found under each root in ``data.paths`` either as an installed
    tree (``ROOT/usr/share/...``, e.g. ROOT = ``/``) or as one extracted package per folder
    (``ROOT/PACKAGE/usr/share/...``, what ``scripts/build_prose_corpus.py --fetch`` lays out with ``apt-get download`` +
    ``dpkg-deb -x``, nothing installed). A document is one file (one page, one man page, one POD file), or ~40 kB of
    consecutive entries of a dictionary; its key ``SOURCE/relative/path`` (``SOURCE/NNNNN`` for dictionary chunks)
    decides the train/validation split by hash (:func:`hybrid_attention.data.corpus.is_validation`), so the split is the
    same when the documents are read back from shards (``data.source: text_dir``).
    """

    name: str
    package: str  # Debian package that ships the files
    licence: str
    fmt: str  # dictd | text | html | troff | pod
    patterns: tuple[str, ...]  # globs relative to the package root (dictd: the database path without suffix)
    exclude: tuple[str, ...] = ()  # substrings of relative paths to skip
    description: str = ""


# The exact package versions the stored GPU runs were trained on (PROSE.md's table). ``build_prose_corpus.py fetch``
# downloads these versions, so a rebuilt corpus is the same text; several of them come from bookworm-security, which
# a machine sees only after ``apt-get update``. Bump a version only together with new runs.
PACKAGE_VERSIONS: dict[str, str] = {
    "dict-gcide": "0.48.5+nmu2",
    "dict-wn": "1:3.0-37",
    "dict-foldoc": "20230119-1",
    "dict-jargon": "4.4.7-3.1",
    "dict-devil": "1.0-13.1",
    "python3.11-doc": "3.11.2-6+deb12u9",
    "linux-doc-6.1": "6.1.192-3",
    "perl-doc": "5.36.0-7+deb12u4",
    "postgresql-doc-15": "15.20-0+deb12u1",
    "git-doc": "1:2.39.5-0+deb12u3",
    "debian-handbook": "11.20220922",
    "python-django-doc": "3:3.2.25-0+deb12u7",
    "python-sqlalchemy-doc": "1.4.46+ds1-1",
    "gimp-help-en": "2.10.34-2",
    "libreoffice-help-en-us": "4:7.4.7-1+deb12u14",
    "manpages": "6.03-2",
    "manpages-dev": "6.03-2",
    "vim-runtime": "2:9.0.1378-2+deb12u2",
    "debian-policy": "4.6.2.0",
}


PROSE_SOURCES: tuple[ProseSource, ...] = (
    ProseSource("gcide", "dict-gcide", "GPL-3+", "dictd", ("usr/share/dictd/gcide",),
                description="Collaborative International Dictionary of English (Webster's 1913 + additions)"),
    ProseSource("wordnet", "dict-wn", "WordNet-3.0 (BSD-like)", "dictd", ("usr/share/dictd/wn",),
                description="WordNet 3.0 glosses"),
    ProseSource("foldoc", "dict-foldoc", "GFDL-1.1+ (no invariant sections)", "dictd", ("usr/share/dictd/foldoc",),
                description="Free On-line Dictionary of Computing"),
    ProseSource("jargon", "dict-jargon", "public domain", "dictd", ("usr/share/dictd/jargon",),
                description="The Jargon File 4.4.7"),
    ProseSource("devil", "dict-devil", "public domain", "dictd", ("usr/share/dictd/devil",),
                description="Ambrose Bierce, The Devil's Dictionary"),
    ProseSource("python-docs", "python3.11-doc", "PSF-2.0", "text",
                ("usr/share/doc/python3.11/html/_sources/**/*.txt",), description="Python 3.11 docs (reST sources)"),
    ProseSource("linux-docs", "linux-doc-6.1", "GPL-2", "text",
                ("usr/share/doc/linux-doc-6.1/Documentation/**/*.rst.gz",
                 "usr/share/doc/linux-doc-6.1/Documentation/**/*.txt.gz"),
                description="Linux 6.1 kernel documentation (reST / text sources)"),
    ProseSource("perl-docs", "perl-doc", "GPL-1+ or Artistic", "pod", ("usr/share/perl/*/pod/*.pod",),
                description="Perl 5.36 core documentation (POD)"),
    ProseSource("postgresql-docs", "postgresql-doc-15", "PostgreSQL", "html",
                ("usr/share/doc/postgresql-doc-15/html/*.html",), description="PostgreSQL 15 manual (HTML)"),
    ProseSource("git-docs", "git-doc", "GPL-2", "text", ("usr/share/doc/git-doc/**/*.txt",),
                description="Git 2.39 manual (AsciiDoc sources)"),
    ProseSource("debian-handbook", "debian-handbook", "GPL-2+ or CC-BY-SA-3.0", "html",
                ("usr/share/doc/debian-handbook/html/en-US/*.html",),
                description="The Debian Administrator's Handbook, English (HTML)"),
    ProseSource("django-docs", "python-django-doc", "BSD-3-Clause", "html",
                ("usr/share/doc/python-django-doc/html/**/*.html",),
                exclude=("/_modules/", "genindex", "py-modindex", "/search.html"),
                description="Django 3.2 documentation (HTML)"),
    ProseSource("sqlalchemy-docs", "python-sqlalchemy-doc", "Expat", "text",
                ("usr/share/doc/python-sqlalchemy-doc/rst/**/*.rst",),
                description="SQLAlchemy 1.4 documentation (reST sources)"),
    ProseSource("gimp-help", "gimp-help-en", "GFDL-1.2", "html", ("usr/share/gimp/2.0/help/en/**/*.html",),
                description="GIMP 2.10 user manual, English (HTML)"),
    ProseSource("libreoffice-help", "libreoffice-help-en-us", "MPL-2.0", "html",
                ("usr/share/libreoffice/help/en-US/**/*.html",), description="LibreOffice help, en-US (HTML)"),
    ProseSource("man-pages", "manpages", "GPL-2+ / BSD-2-Clause / verbatim (Linux man-pages)", "troff",
                ("usr/share/man/man[1-8]/*.gz",), exclude=("perl", ".3pm"),
                description="Linux man-pages: system calls, files, overviews (troff)"),
    ProseSource("man-pages-dev", "manpages-dev", "GPL-2+ / BSD-2-Clause / verbatim (Linux man-pages)", "troff",
                ("usr/share/man/man[1-8]/*.gz",), exclude=("perl", ".3pm"),
                description="Linux man-pages: C library functions (troff)"),
    ProseSource("vim-docs", "vim-runtime", "Vim", "text", ("usr/share/vim/vim*/doc/*.txt",),
                description="Vim 9.0 help files"),
    ProseSource("debian-policy", "debian-policy", "GPL-2+", "text",
                ("usr/share/doc/debian-policy/policy.html/_sources/*.txt",),
                description="Debian Policy Manual (reST sources)"),
)

_BY_NAME = {s.name: s for s in PROSE_SOURCES}
# Two sources reading the same paths (man-pages, man-pages-dev) are one source on an installed tree: read it once.
_SHARED_PATHS = {"man-pages-dev": "man-pages"}


def get_sources(names: Iterable[str] = ()) -> list[ProseSource]:
    """The named sources (all of them for an empty list), in registry order."""
    names = list(names)
    for n in names:
        if n not in _BY_NAME:
            raise DataError(f"unknown prose source {n!r}; known: {', '.join(_BY_NAME)}")
    return [s for s in PROSE_SOURCES if not names or s.name in names]


def package_root(root: Path, source: ProseSource) -> tuple[Path, bool]:
    """``(tree, per_package)``: ``root/PACKAGE`` when that folder exists (extracted layout), else ``root``."""
    sub = root / source.package
    return (sub, True) if sub.is_dir() else (root, False)


def _missing(source: ProseSource, roots: list[Path]) -> DataError:
    where = ", ".join(str(r) for r in roots)
    return DataError(
        f"prose source {source.name}: no {source.patterns[0]} under {where}; install the Debian package "
        f"{source.package} (apt-get install {source.package}) or extract it with "
        f"scripts/build_prose_corpus.py --fetch DIR"
    )


def source_files(root: Path, source: ProseSource) -> list[tuple[str, Path]]:
    """``(relative path, path)`` of the files of one source under one root, sorted; dictd: the ``.index`` files."""
    tree, _ = package_root(root, source)
    out = []
    for pattern in source.patterns:
        if source.fmt == "dictd":
            idx = tree / (pattern + ".index")
            if idx.is_file():
                out.append((pattern, idx))
            continue
        for p in glob.glob(str(tree / pattern), recursive=True):
            rel = Path(p).relative_to(tree).as_posix()
            if os.path.isfile(p) and not any(x in rel for x in source.exclude):
                out.append((rel, Path(p)))
    return sorted(set(out))


def _dictd_data(index: Path) -> Path:
    base = str(index)[: -len(".index")]
    for suffix in (".dict.dz", ".dict"):
        if os.path.isfile(base + suffix):
            return Path(base + suffix)
    raise DataError(f"dictd database {base}: no .dict.dz or .dict next to {index}")


def parse_file(fmt: str, path: Path) -> list[str]:
    """The documents of one file (dictd: its index file) in format ``fmt``.

    * dictd databases (``NAME.index`` + ``NAME.dict.dz``/``NAME.dict``): entries in index order, cut into documents of
      about ``chunk_chars`` characters (an entry never splits).
    * plain text (reST, AsciiDoc, Vim help, ...), optionally ``.gz``: kept as is.
    * HTML: the stdlib ``html.parser``; script/style/head and navigation blocks dropped, entities decoded, the main
      block (``role="main"``, Sphinx ``div.body``, Django ``#docs-content``) kept when the page has one.
    * troff man pages: a minimal macro strip (request lines dropped, font/escape sequences removed, section heads and
      ``.B``/``.I``-style arguments kept as text).
    * POD: command paragraphs reduced to their text, formatting codes (``B<...>``, ``L<text|link>``, ``E<gt>``)
      resolved.
    """
    if fmt == "dictd":
        return formats.chunk_entries(formats.dictd_entries(path, _dictd_data(path)))
    text = formats.read_text(path)
    if fmt == "text":
        return [formats.normalize_whitespace(text)]
    if fmt == "html":
        return [formats.html_to_text(text)]
    if fmt == "troff":
        return [formats.troff_to_text(text)]
    if fmt == "pod":
        return [formats.pod_to_text(text)]
    raise DataError(f"unknown prose format {fmt!r}")


@dataclass
class ProseDocument:
    source: str
    key: str
    text: str


def iter_prose_documents(
    roots: Iterable[str | os.PathLike], names: Iterable[str] = ()
) -> Iterator[ProseDocument]:
    """Every document of the chosen sources, sources in registry order, files sorted; DataError for a missing source."""
    roots = [Path(r) for r in roots] or [Path("/")]
    sources = get_sources(names)
    # Check every source up front so that a missing package fails before minutes of parsing.
    files: dict[str, list[tuple[str, Path]]] = {}
    for s in sources:
        found = [f for r in roots for f in source_files(r, s)]
        if not found:
            raise _missing(s, roots)
        files[s.name] = found
    for s in sources:
        twin = _SHARED_PATHS.get(s.name)
        if twin in files and not any(package_root(r, s)[1] for r in roots):
            continue  # installed tree: the twin source already read these files
        for rel, path in files[s.name]:
            docs = parse_file(s.fmt, path)
            for i, text in enumerate(docs):
                if len(text) < MIN_DOC_CHARS:
                    continue
                key = f"{s.name}/{rel}" if len(docs) == 1 and s.fmt != "dictd" else f"{s.name}/{rel}#{i:05d}"
                yield ProseDocument(s.name, key, text)


def prose_corpus(
    roots: Iterable[str | os.PathLike],
    val_fraction: float = 0.05,
    max_bytes: int | None = None,
    names: Iterable[str] = (),
) -> Corpus:
    """The prose documents as an in-memory corpus split by document key (``max_bytes``: a deterministic prefix)."""
    roots = [Path(r) for r in roots] or [Path("/")]
    corpus = Corpus(source="prose:" + ",".join(str(r) for r in roots))
    total = 0
    for doc in iter_prose_documents(roots, names):
        _add(corpus, doc.key, doc.text, val_fraction)
        total += len(doc.text)
        if max_bytes is not None and total >= max_bytes:
            break
    return _check_nonempty(corpus, corpus.source)
