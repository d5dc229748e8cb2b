"""``data.source: local`` reads the common text formats of a documentation folder (.txt, .md, .rst, .html / .htm
with tags stripped, .jsonl, .parquet; .py when asked) and reports files read and skipped, by reason, in one line."""

from __future__ import annotations

import gzip

import pytest

from hybrid_attention.data.config import DataConfig
from hybrid_attention.data.corpus import local_corpus
from hybrid_attention.data.lm_data import load_corpus
from hybrid_attention.errors import DataError


@pytest.fixture
def docs(tmp_path):
    root = tmp_path / "doc"
    (root / "sub").mkdir(parents=True)
    (root / "guide.md").write_text("# Guide\n\nMarkdown text about sockets.\n")
    (root / "sub" / "api.rst").write_text("API\n===\n\nreST text about files.\n")
    (root / "page.html").write_text("<html><head><title>t</title><style>p {color: red}</style></head><body>"
                                    "<nav>Home | Next</nav><p>Visible &amp; kept</p><script>var x = 1;</script>"
                                    "</body></html>")
    (root / "old.HTM").write_text("<p>upper-case suffix</p>")
    (root / "notes.txt").write_text("plain notes\n")
    (root / "tool.py").write_text("def f():\n    return 1\n")
    (root / "blank.html").write_text("<html><body><script>only code</script></body></html>")
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "logo.png").write_bytes(b"\x89PNG\r\n")
    (root / "changelog.gz").write_bytes(gzip.compress(b"x"))
    (root / "copyright").write_text("no suffix\n")
    return root


def _all(corpus) -> list[str]:
    return corpus.train + corpus.validation


def test_a_documentation_folder_is_read_and_counted(docs):
    c = local_corpus([docs], val_fraction=0.3)
    text = "\n".join(_all(c))
    assert "Markdown text" in text and "reST text" in text and "plain notes" in text and "upper-case" in text
    page = next(t for t in _all(c) if "Visible" in t)
    assert page == "Visible & kept"  # tags, script, style and navigation dropped, entities decoded
    assert "def f" not in text  # .py only when asked
    assert c.files_read == 5
    assert c.skipped == {"of other types (.gz 1, .png 1, .py 1, no suffix 1)": 4, "not UTF-8": 1, "without text": 1}
    line = c.describe()
    assert "\n" not in line and "files: 5 read, 6 skipped (4 of other types (.gz 1, .png 1, .py 1, no suffix 1); " \
        "1 not UTF-8; 1 without text)" in line


def test_python_sources_when_asked(docs):
    c = local_corpus([docs], val_fraction=0.3, suffixes=[".md", ".rst", ".txt", ".html", ".htm", ".py"])
    assert c.files_read == 6 and any("def f" in t for t in _all(c))
    with pytest.raises(DataError, match=r"data.local_suffixes = \['.md', '.pdf'\]: allowed values are .txt, .md"):
        local_corpus([docs], suffixes=[".md", ".pdf"])


def test_the_config_field_reaches_the_reader(docs):
    c = load_corpus(DataConfig(source="local", paths=[str(docs)], val_fraction=0.3,
                               local_suffixes=[".py", ".md", ".rst", ".txt", ".htm", ".html"]))
    assert c.files_read == 6 and any("def f" in t for t in _all(c))


def test_a_named_file_must_be_readable(docs):
    with pytest.raises(DataError, match="cannot read .*latin1.txt"):
        local_corpus([docs / "latin1.txt"])
    with pytest.raises(DataError, match="unsupported file type: .*logo.png"):
        local_corpus([docs / "logo.png"])
