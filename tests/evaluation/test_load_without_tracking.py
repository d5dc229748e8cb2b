"""A finished run is read without what only its training needed: a run trained with ``train.tensorboard: true`` (or
from a tokenizer directory that has since moved) loads for ``eval``, ``generate`` and ``info`` on a machine without
tensorboard; ``train`` still refuses the same config there with one line."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import yaml

from hybrid_attention.cli import main
from hybrid_attention.config.run_config import load_config
from hybrid_attention.config.schema import ConfigError
from hybrid_attention.evaluation.loading import load_model


@pytest.fixture
def tracked_run(tiny_run, tmp_path, monkeypatch):
    """A copy of the shared tiny run whose config.yaml says it was trained with TensorBoard from a tokenizer
    directory that no longer exists, on a machine where tensorboard cannot be imported."""
    dst = tmp_path / "run"
    shutil.copytree(tiny_run, dst)
    doc = yaml.safe_load((dst / "config.yaml").read_text())
    doc["train"]["tensorboard"] = True
    doc["data"]["tokenizer"] = str(tmp_path / "moved_tokenizer")
    (dst / "config.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` raises ImportError
    return dst


def test_load_model_skips_the_training_only_checks(tracked_run):
    loaded = load_model(tracked_run, log=lambda line: None)
    assert loaded.run_config.train.tensorboard is True and loaded.source == tracked_run / "final"
    with pytest.raises(ConfigError, match="data.tokenizer"):  # training from that config still refuses
        load_config(tracked_run / "config.yaml")
    with pytest.raises(ConfigError, match="train.tensorboard = true needs the tensorboard package"):
        load_config(tracked_run / "config.yaml", ["data.tokenizer=byte"])


@pytest.mark.parametrize("argv", [
    ["info", "{run}", "--json", "--seq-lens", "64"],
    ["eval", "ppl", "--checkpoint", "{run}", "--tokens", "64", "--device", "cpu", "--json"],
    ["generate", "--checkpoint", "{run}", "--prompt", "def ", "--max-new-tokens", "3", "--greedy", "--device", "cpu"],
])
def test_eval_generate_and_info_read_the_run(tracked_run, capsys, argv):
    assert main([a.format(run=tracked_run) for a in argv]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    if "--json" in argv:
        json.loads(out.strip().splitlines()[-1])
    else:
        assert out.startswith("def ")
