"""The opt-in token cache (``HYBRID_ATTENTION_TOKEN_CACHE``, data/token_cache.py) of whole encoded splits."""

import numpy as np
import pytest

from hybrid_attention.data import lm_data, train_bpe_tokenizer
from hybrid_attention.data.lm_data import encode_split
from hybrid_attention.data.token_cache import ENV, documents_key
from hybrid_attention.data.tokenizer import byte_tokenizer, encode_documents

DOCS = [f"document {i}: the quick brown fox jumps over the lazy dog {i * 7}" for i in range(40)]


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(DOCS, vocab_size=300)


def test_unset_caches_nothing(tmp_path, monkeypatch, tok):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert np.array_equal(encode_split(tok, DOCS), encode_documents(tok, DOCS))
    assert list(tmp_path.iterdir()) == []


def test_second_call_reads_the_file_and_equals_encoding(tmp_path, monkeypatch, tok):
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    first = encode_split(tok, DOCS)
    assert np.array_equal(first, encode_documents(tok, DOCS))
    files = list((tmp_path / "cache").iterdir())
    assert len(files) == 1 and files[0].suffix == ".npy"

    def no_encoding(*args, **kwargs):
        raise AssertionError("the cached split was encoded again")

    monkeypatch.setattr(lm_data, "encode_documents", no_encoding)
    again = encode_split(tok, DOCS)
    assert again.dtype == np.int32 and np.array_equal(again, first)


def test_a_damaged_file_is_recomputed(tmp_path, monkeypatch, tok):
    monkeypatch.setenv(ENV, str(tmp_path))
    ids = encode_split(tok, DOCS)
    (path,) = tmp_path.glob("*.npy")
    path.write_bytes(path.read_bytes()[:40])  # cut short
    assert np.array_equal(encode_split(tok, DOCS), ids)
    assert np.array_equal(np.load(path), ids)  # replaced by a whole file
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_key_covers_tokenizer_separator_documents_and_their_boundaries(tok):
    base = documents_key(tok.backend_tokenizer.to_str(), 1, ["ab", "c"])
    assert base == documents_key(tok.backend_tokenizer.to_str(), 1, ["ab", "c"])
    other_tok = train_bpe_tokenizer(DOCS[:10], vocab_size=280)
    assert base != documents_key(other_tok.backend_tokenizer.to_str(), 1, ["ab", "c"])
    assert base != documents_key(tok.backend_tokenizer.to_str(), 2, ["ab", "c"])
    assert base != documents_key(tok.backend_tokenizer.to_str(), 1, ["a", "bc"])  # same text, other boundary
    assert base != documents_key(tok.backend_tokenizer.to_str(), 1, ["c", "ab"])  # order


def test_byte_tokenizer_stays_uncached(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    byte = byte_tokenizer()
    assert np.array_equal(encode_split(byte, DOCS), encode_documents(byte, DOCS))
    assert list(tmp_path.iterdir()) == []
