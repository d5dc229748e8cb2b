"""Corpus sources and the deterministic hash split."""

import json

import pytest

from hybrid_attention.data import DataError, is_validation, local_corpus, stdlib_corpus


def test_stdlib_split_is_deterministic_and_disjoint():
    a = stdlib_corpus(val_fraction=0.1, max_bytes=2_000_000)
    b = stdlib_corpus(val_fraction=0.1, max_bytes=2_000_000)
    assert a.train == b.train and a.validation == b.validation
    assert a.train and a.validation
    assert not set(a.train) & set(a.validation) - {""}
    assert "corpus stdlib:" in a.describe() and "MB" in a.describe()


def test_split_depends_only_on_key():
    keys = [f"pkg/mod{i}.py" for i in range(2000)]
    frac = sum(is_validation(k, 0.1) for k in keys) / len(keys)
    assert 0.07 < frac < 0.13
    assert [is_validation(k, 0.1) for k in keys] == [is_validation(k, 0.1) for k in keys]


def test_local_files_and_folders(tmp_path):
    (tmp_path / "d").mkdir()
    for i in range(40):
        (tmp_path / "d" / f"{i:02d}.txt").write_text(f"document {i}\n")
    with open(tmp_path / "x.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"line {i}"}) + "\n")
    c = local_corpus([tmp_path / "d", tmp_path / "x.jsonl"], val_fraction=0.2)
    assert len(c.train) + len(c.validation) == 80


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        local_corpus(tmp_path / "missing.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty corpus"):
        local_corpus(tmp_path / "empty")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\xfa not utf-8")
    with pytest.raises(DataError, match="cannot read .*bad.txt"):
        local_corpus(bad)
    j = tmp_path / "bad.jsonl"
    j.write_text('{"content": "x"}\n')
    with pytest.raises(DataError, match="string field 'text'"):
        local_corpus(j)


def test_parquet_needs_pyarrow_or_reads(tmp_path):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        (tmp_path / "a.parquet").write_bytes(b"PAR1")
        with pytest.raises(DataError, match="pyarrow"):
            local_corpus(tmp_path / "a.parquet")
        return
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(50)]}), tmp_path / "a.parquet")
    c = local_corpus(tmp_path / "a.parquet", val_fraction=0.2)
    assert len(c.train) + len(c.validation) == 50
