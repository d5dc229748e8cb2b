"""Non-finite losses: the step is skipped and counted; K in a row stop the run with a clear message."""

import json

import pytest
import torch
from training_helpers import tiny_config

from hybrid_attention.models import HybridForCausalLM
from hybrid_attention.training.trainer import TrainingDiverged, train


def _poison(monkeypatch, bad_calls):
    """Make the training forward return a NaN loss on the given (1-based) calls."""
    original = HybridForCausalLM.forward
    calls = {"n": 0}

    def forward(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if kwargs.get("labels") is not None and self.training:
            calls["n"] += 1
            if calls["n"] in bad_calls:
                out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(HybridForCausalLM, "forward", forward)


def test_nonfinite_steps_are_skipped_and_counted(tmp_path, monkeypatch):
    _poison(monkeypatch, {3, 4})
    res = train(tiny_config(tmp_path, "train.steps=6", "train.max_nonfinite=3", "train.device=cpu"), quiet=True)
    assert res.skipped_steps == 2
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r for r in recs if "loss" in r}
    assert by_step[3]["loss"] is None and by_step[4]["loss"] is None  # nothing finite was logged for them
    assert by_step[6]["skipped"] == 2 and by_step[5]["loss"] is not None
    assert all(torch.isfinite(p).all() for p in res.model.parameters())


def test_too_many_nonfinite_steps_stop_the_run(tmp_path, monkeypatch):
    _poison(monkeypatch, set(range(2, 100)))
    with pytest.raises(TrainingDiverged, match=r"3 consecutive steps with a non-finite loss.*lower optim.lr"):
        train(tiny_config(tmp_path, "train.steps=10", "train.max_nonfinite=3", "train.device=cpu"), quiet=True)
