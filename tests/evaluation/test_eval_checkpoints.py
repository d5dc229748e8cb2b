"""Loading runs in every accepted layout; generate, info, passkey on a trained tiny model."""

import pytest

from hybrid_attention.data import DataError
from hybrid_attention.evaluation.generation import generate_text
from hybrid_attention.evaluation.info import format_info, model_info
from hybrid_attention.evaluation.loading import load_model
from hybrid_attention.evaluation.passkey import passkey_accuracy, passkey_table


def test_load_every_layout(tiny_run):
    a = load_model(tiny_run)
    b = load_model(tiny_run / "final")
    c = load_model(sorted((tiny_run / "checkpoints").iterdir())[-1])
    assert a.run_config is not None and a.source.name == "final"
    assert c.source.name.startswith("step-")
    sa, sc = a.model.state_dict(), c.model.state_dict()
    assert all((sa[k] == sc[k]).all() for k in sa)
    assert len(b.tokenizer) == 259


def test_missing_path(tmp_path):
    with pytest.raises(DataError, match="no such checkpoint"):
        load_model(tmp_path / "nope")
    with pytest.raises(DataError, match="holds no model"):
        load_model(tmp_path)


def test_generate_info_passkey(tiny_run):
    loaded = load_model(tiny_run)
    text = generate_text(loaded.model, loaded.tokenizer, "import ", max_new_tokens=20, seed=1)
    again = generate_text(loaded.model, loaded.tokenizer, "import ", max_new_tokens=20, seed=1)
    assert isinstance(text, str) and text == again
    greedy = generate_text(loaded.model, loaded.tokenizer, "def", max_new_tokens=10, do_sample=False)
    assert isinstance(greedy, str)
    info = model_info(loaded.model, loaded.tokenizer, seq_lens=(64, 128), sample_text="x = 1\n" * 10)
    assert info["layers"] == ["interdomain", "softmax"]
    assert info["state_size"][128] > info["state_size"][64]  # the softmax layer's KV cache grows
    assert "parameters:" in format_info(info)
    rows = passkey_accuracy(loaded.model, loaded.tokenizer, lengths=(256, 512), depths=(0.0, 1.0), trials=2)
    assert len(rows) == 4 and all(0 <= r["accuracy"] <= 1 for r in rows)
    assert all(r["prompt_tokens"] <= r["length"] for r in rows)
    assert "accuracy" in passkey_table(rows)
