"""Byte, BPE and saved tokenizers; the byte fast path equals the tokenizers library's encoding."""

import numpy as np
import pytest

from hybrid_attention.data import (
    DataError,
    byte_tokenizer,
    check_vocab,
    encode_documents,
    is_byte_tokenizer,
    load_tokenizer,
    token_byte_lengths,
    train_bpe_tokenizer,
)

DOCS = ["héllo wörld\n\tdef f(x): return 1  # €", "", "import os\nprint(os.sep)\n" * 3]


def test_byte_tokenizer_ids_are_bytes_and_fast_path_matches():
    tok = byte_tokenizer()
    assert len(tok) == 259 and is_byte_tokenizer(tok)
    fast = encode_documents(tok, DOCS)
    slow = []
    for d in DOCS:
        slow += tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert fast.tolist() == slow
    assert list(fast[: len(DOCS[0].encode())]) == list(DOCS[0].encode())
    assert tok.decode(fast[: len(DOCS[0].encode())].tolist()) == DOCS[0]
    lengths = token_byte_lengths(tok)
    assert lengths[:256].tolist() == [1] * 256 and lengths[256:].tolist() == [0, 0, 0]


def test_bpe_train_save_load(tmp_path):
    texts = ["def function_name(argument):\n    return argument + 1\n"] * 50 + ["class Thing:\n    pass\n"] * 50
    tok = train_bpe_tokenizer(texts, vocab_size=300)
    assert 259 < len(tok) <= 300 and not is_byte_tokenizer(tok)
    ids = encode_documents(tok, texts[:2])
    assert len(ids) < len(texts[0]) + len(texts[1])
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    assert encode_documents(again, texts[:2]).tolist() == ids.tolist()
    assert tok.decode(ids[:-1][: ids.tolist().index(tok.eos_token_id)].tolist()) == texts[0]
    lengths = token_byte_lengths(tok)
    body = ids[ids != tok.eos_token_id]
    assert lengths[body].sum() == len((texts[0] + texts[1]).encode())


def test_vocab_mismatch_and_bad_dir(tmp_path):
    with pytest.raises(DataError, match="259 tokens but the model vocab_size is 100"):
        check_vocab(byte_tokenizer(), 100)
    check_vocab(byte_tokenizer(), 259)
    with pytest.raises(DataError, match="cannot load a tokenizer"):
        load_tokenizer(tmp_path)


def test_byte_tokenizer_round_trip_keeps_fast_path(tmp_path):
    byte_tokenizer().save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert is_byte_tokenizer(tok)
    assert np.array_equal(encode_documents(tok, DOCS), encode_documents(byte_tokenizer(), DOCS))
