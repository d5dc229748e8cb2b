"""The trainer on other data setups: local files + a BPE tokenizer saved with the run; clear data errors."""

import sys

import pytest
from training_helpers import tiny_config

from hybrid_attention.data import DataError, load_tokenizer
from hybrid_attention.data.corpus import hf_streaming_documents, stdlib_root
from hybrid_attention.evaluation.loading import load_model
from hybrid_attention.training.trainer import train


def test_local_folder_with_bpe_tokenizer(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("json/__init__.py", "json/decoder.py", "json/encoder.py", "textwrap.py", "string.py"):
        (corpus / (name.replace("/", "_") + ".txt")).write_text((stdlib_root() / name).read_text())
    run = tmp_path / "run"
    cfg = tiny_config(run, "data.source=local", f"data.paths=[{corpus}]", "data.tokenizer=bpe",
                      "data.bpe_vocab_size=400", "data.val_fraction=0.3", "data.val_tokens=256",
                      "train.steps=2", "train.device=cpu")
    res = train(cfg, quiet=True)
    tok = load_tokenizer(run / "tokenizer")
    assert len(tok) == 400 and res.model.config.vocab_size == 400
    loaded = load_model(run)
    assert len(loaded.tokenizer) == 400 and loaded.model.config.vocab_size == 400
    assert res.val is not None and res.val.bpb is not None


def test_tokenizer_larger_than_model_vocab(tmp_path):
    cfg = tiny_config(tmp_path, "train.steps=1", "train.device=cpu",
                      "model.options={hidden_size: 32, num_heads: 2, head_dim: 16, vocab_size: 100}")
    with pytest.raises(DataError, match="tokenizer has 259 tokens but the model vocab_size is 100"):
        train(cfg, quiet=True)


def test_hf_streaming_needs_the_data_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(DataError, match=r"pip install 'hybrid_attention\[data\]'"):
        next(hf_streaming_documents("HuggingFaceFW/fineweb-edu"))
