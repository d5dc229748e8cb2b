"""One rule for where ``eval`` writes its plots and results: ``--out``, else the run folder of the model (beside
train's plots), whichever of the run's folders ``--checkpoint`` names; a bare Hugging Face folder gets them itself."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from hybrid_attention.cli import main

LENGTH = ["eval", "length", "--tokens", "256", "--multipliers", "1", "2", "--device", "cpu"]
PASSKEY = ["eval", "passkey", "--lengths", "160", "--depths", "0", "--trials", "1", "--device", "cpu"]


@pytest.fixture
def run(tiny_run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(tiny_run, dst)
    return dst


def _new_files(folder, before):
    return sorted(p.name for p in folder.iterdir() if p.name not in before)


@pytest.mark.parametrize("where", ["run", "final", "checkpoint"])
def test_length_and_passkey_write_into_the_run_folder(run, where):
    checkpoint = {"run": run, "final": run / "final", "checkpoint": next((run / "checkpoints").iterdir())}[where]
    before = {p.name for p in run.iterdir()}
    model_files = sorted(p.name for p in checkpoint.iterdir())
    assert main([*LENGTH, "--checkpoint", str(checkpoint)]) == 0
    assert main([*PASSKEY, "--checkpoint", str(checkpoint)]) == 0
    assert _new_files(run, before) == ["length_sweep.png", "passkey.png"]
    if where != "run":  # nothing lands in the model folder
        assert sorted(p.name for p in checkpoint.iterdir()) == model_files


def test_a_bare_model_folder_gets_them_itself(run, tmp_path):
    bare = tmp_path / "model"
    shutil.copytree(run / "final", bare)
    assert main([*LENGTH, "--checkpoint", str(bare)]) == 0
    assert (bare / "length_sweep.png").exists()


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="needs the eval extra (lm-eval)")
def test_lm_eval_follows_the_same_rule(run):
    assert main(["eval", "lm-eval", "--checkpoint", str(run / "final"), "--limit", "4", "--batch-size", "4",
                 "--device", "cpu"]) == 0
    assert (run / "lm_eval_hybrid_toy_mc.json").exists() and not (run / "final" / "lm_eval_hybrid_toy_mc.json").exists()
