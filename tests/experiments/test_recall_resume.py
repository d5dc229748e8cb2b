"""A recall task's sweep (mixers x d_models x lrs) keeps each finished model's row at once
(``recall_<task>.rows.json``): a run cut by a time limit trains only the rest next time, and a row of
another model revision is trained again."""

import json

import pytest

from hybrid_attention.experiments import runner as runner_mod
from hybrid_attention.training.recall import RecallConfig


class Cut(Exception):
    pass


def fake_trainer(calls: list, cut_after: int | None = None):
    """train_and_eval stand-in: accuracy from (mixer, d_model, lr); raises Cut after ``cut_after`` calls."""
    def train_and_eval(rc, mixer, d_model, lr, device, log=None, resume_dir=None):
        resume_dir.mkdir(parents=True, exist_ok=True)  # the per-epoch checkpoints of this model
        (resume_dir / "step-00000001").mkdir(exist_ok=True)
        if cut_after is not None and len(calls) == cut_after:
            raise Cut
        calls.append((mixer, d_model, lr))
        acc = {"softmax": 0.5, "gdn": 0.9}[mixer] + lr
        return {"task": rc.task, "mixer": mixer, "d_model": d_model, "lr": lr, "accuracy": acc, "seconds": 1.0}
    return train_and_eval


def test_a_cut_sweep_resumes_with_the_missing_models(tmp_path, monkeypatch):
    rc = RecallConfig(task="mqar", mixers=["softmax", "gdn"], d_models=[32], lrs=[1e-3, 3e-3], device="cpu")
    rows = tmp_path / "recall_mqar.rows.json"
    first: list = []
    monkeypatch.setattr(runner_mod, "train_and_eval", fake_trainer(first, cut_after=3))
    with pytest.raises(Cut):
        runner_mod._recall_sweep(rc, rows, lambda *_: None)
    assert [(r["mixer"], r["lr"]) for r in json.loads(rows.read_text())] == [
        ("softmax", 1e-3), ("softmax", 3e-3), ("gdn", 1e-3)]
    # each model trains with its own resume directory beside the rows; only the cut model's is left
    assert [p.name for p in (tmp_path / "recall_mqar.resume").iterdir()] == ["gdn_d32_lr0.003"]

    second: list = []
    monkeypatch.setattr(runner_mod, "train_and_eval", fake_trainer(second))
    best = runner_mod._recall_sweep(rc, rows, lambda *_: None)
    assert second == [("gdn", 32, 3e-3)]  # only the model the cut run did not finish
    assert (best["mixer"], best["lr"], best["accuracy"]) == ("gdn", 3e-3, 0.903)
    assert "model_revision" not in best and len(json.loads(rows.read_text())) == 4
    # each model's checkpoints go once its row is saved, and the task's folder once every row is
    assert not (tmp_path / "recall_mqar.resume").exists()


def test_rows_of_another_model_revision_are_trained_again(tmp_path, monkeypatch):
    rc = RecallConfig(task="mqar", mixers=["gdn"], d_models=[32], lrs=[1e-3], device="cpu")
    rows = tmp_path / "recall_mqar.rows.json"
    stale = {"task": "mqar", "mixer": "gdn", "d_model": 32, "lr": 1e-3, "accuracy": 1.0, "seconds": 1.0,
             "model_revision": runner_mod.MODEL_REVISION - 1}
    rows.write_text(json.dumps([stale]))
    calls: list = []
    monkeypatch.setattr(runner_mod, "train_and_eval", fake_trainer(calls))
    best = runner_mod._recall_sweep(rc, rows, lambda *_: None)
    assert calls == [("gdn", 32, 1e-3)] and best["accuracy"] == pytest.approx(0.901)
