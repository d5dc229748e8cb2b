"""The lm-eval adapter on the bundled offline toy task (skipped when lm-eval is not installed)."""

import importlib.util

import pytest

from hybrid_attention.evaluation.lm_eval_adapter import TOY_TASK, toy_task_dir

HAVE_LM_EVAL = importlib.util.find_spec("lm_eval") is not None and importlib.util.find_spec("accelerate") is not None


def test_toy_task_yaml_points_at_bundled_data(tmp_path):
    d = toy_task_dir(tmp_path)
    text = (d / f"{TOY_TASK}.yaml").read_text()
    path = text.split("test: ")[1].splitlines()[0]
    assert path.endswith("toy_mc.jsonl") and len(open(path).read().splitlines()) >= 10


@pytest.mark.skipif(not HAVE_LM_EVAL, reason="lm-eval[hf] not installed (pip install 'hybrid_attention[eval]')")
def test_lm_eval_runs_toy_task(tiny_run, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from hybrid_attention.evaluation.lm_eval_adapter import run_lm_eval
    from hybrid_attention.evaluation.loading import load_model

    loaded = load_model(tiny_run)
    res = run_lm_eval(loaded.model, loaded.tokenizer, batch_size=4)
    acc = res[TOY_TASK]["acc,none"]
    assert 0 <= acc <= 1
