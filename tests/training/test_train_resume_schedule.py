"""Resuming with more ``train.steps`` continues the checkpoint's schedule: no lr jump at the resumed step, then the
rule ``optim.extend_schedule`` names (constant at the final lr, or a re-warm and a new cosine), printed once."""

from __future__ import annotations

import json

import pytest
from training_helpers import tiny_config

from hybrid_attention.training.schedule import ExtendedSchedule, WarmupCosine, schedule_from_spec
from hybrid_attention.training.trainer import train

LR, MIN = 3.0e-3, 0.1


def _lrs(run) -> dict[int, float]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["lr"] for r in recs if "lr" in r}


@pytest.fixture
def finished_run(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(out, "train.steps=8", "train.checkpoint_every=4"), quiet=True)
    return out


def test_resume_with_more_steps_holds_the_final_lr(finished_run, capsys):
    before = _lrs(finished_run)
    assert before[8] == pytest.approx(LR * MIN)  # the saved schedule's end
    capsys.readouterr()
    train(tiny_config(finished_run, "train.steps=16"), resume=True, quiet=True)
    out = capsys.readouterr().out
    assert "lr schedule from step 8: the saved schedule to step 8, then constant at its final lr" in out
    after = _lrs(finished_run)
    assert after[8] == before[8]  # records up to the resumed step are kept
    # continuity at the resumed step, then constant (a cosine stretched to 16 steps would give 0.60 x lr at step 9)
    assert all(after[s] == pytest.approx(LR * MIN) for s in range(9, 17))


def test_resume_with_a_new_cosine(finished_run, capsys):
    train(tiny_config(finished_run, "train.steps=16", "optim.extend_schedule=cosine"), resume=True, quiet=True)
    assert "then a re-warm over 2 steps and a new cosine to step 16" in capsys.readouterr().out
    lr = _lrs(finished_run)
    # step k's record holds the lr of step k + 1: re-warm from the final lr up to the peak, then down to the minimum
    # (step 9 itself runs at the half-way re-warm lr, 0.55 x lr; steps 10 and 11 at the peak)
    assert lr[8] == pytest.approx(LR * MIN) and lr[9] == pytest.approx(LR) and lr[10] == pytest.approx(LR)
    assert lr[16] == pytest.approx(LR * MIN) and all(lr[s] > lr[s + 1] for s in range(10, 16))


def test_a_second_extension_continues_the_first():
    first = ExtendedSchedule(WarmupCosine(2, 8, MIN), 16, "cosine")
    spec = {"saved": {"warmup_steps": 2, "total_steps": 8, "min_lr_ratio": MIN}, "extended_to": 16,
            "extend": "cosine"}
    again = ExtendedSchedule(schedule_from_spec(spec), 24, "constant")
    assert [again(s) for s in range(17)] == [first(s) for s in range(17)]
    assert again(20) == pytest.approx(MIN)
    with pytest.raises(ValueError, match="optim.extend_schedule must be one of constant, cosine"):
        ExtendedSchedule(first, 30, "linear")


@pytest.mark.parametrize(("warmup", "warned"), [(8, True), (12, True), (7, False)])
def test_a_warmup_as_long_as_the_run_is_one_warning_line(tmp_path, capsys, warmup, warned):
    # an 8-step run: a warm-up of 8 or more steps never reaches the cosine decay (the lr only rises)
    train(tiny_config(tmp_path / "run", "train.steps=8", f"optim.warmup_steps={warmup}"), quiet=True)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("warning: optim.warmup_steps")]
    assert lines == ([f"warning: optim.warmup_steps = {warmup} >= train.steps = 8: the learning rate only rises and "
                      "never decays; set optim.warmup_steps below 8 (e.g. optim.warmup_steps=1)"] if warned else [])


@pytest.mark.parametrize(("steps", "extend", "warned"), [(10, "cosine", True), (9, "cosine", True),
                                                          (11, "cosine", False), (9, "constant", False)])
def test_a_rewarm_as_long_as_the_extension_is_one_warning_line(finished_run, capsys, steps, extend, warned):
    # the finished run warms up over 2 steps, so a cosine extension of 2 steps or fewer only re-warms
    capsys.readouterr()
    train(tiny_config(finished_run, f"train.steps={steps}", f"optim.extend_schedule={extend}"), resume=True,
          quiet=True)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("warning:")]
    assert lines == ([f"warning: optim.extend_schedule = cosine re-warms over 2 steps but the extension (train.steps 8 "
                      f"-> {steps}) has {steps - 8}: the learning rate only rises after step 8; extend by more than 2 "
                      "steps or use optim.extend_schedule=constant"] if warned else [])
