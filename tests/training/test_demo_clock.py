"""The demo plans by the clock: re-measured speed, a fair share of the time for every model, within the budget.

Time is simulated (a fake clock that advances by a given cost per step), so these tests are deterministic and fast.
"""

import math
import re

import pytest

from hybrid_attention.training import demo
from hybrid_attention.training.demo import ClockPlan, _water_level, loss_at_tokens


def _simulate(costs, timed, deadline, load=lambda now: 1.0, min_steps=3):
    """Run the plan against a fake clock; ``costs[m]`` seconds per step of m, times ``load(now)``."""
    plan = ClockPlan(timed, min_steps=min_steps)
    now = 0.0
    plan.replan(deadline - now)
    while (m := plan.next_model()) is not None:
        dt = costs[m] * load(now)
        now += dt
        plan.record(m, dt)
        plan.replan(deadline - now)
    return plan, now


def test_water_level():
    assert _water_level([0, 0, 0], 30) == pytest.approx(10)
    assert _water_level([10, 0], 4) == pytest.approx(4)  # the model that is behind gets all of it
    assert _water_level([10, 0], 30) == pytest.approx(20)
    assert _water_level([], 5) == 0


@pytest.mark.parametrize("load", [lambda now: 1.0, lambda now: 1.0 if now < 20 else 6.0,  # load arrives (17% case)
                                  lambda now: 4.0 if now < 30 else 1.0])  # load goes away
def test_every_model_gets_a_fair_share_within_the_budget(load):
    costs = {"softmax": 0.05, "s4d": 0.2, "natsl": 0.6}
    plan, end = _simulate(costs, timed=dict(costs), deadline=120.0, load=load)
    worst_step = max(costs.values()) * 6
    assert end <= 120.0 + worst_step  # never past the deadline by more than about a step
    assert end >= 120.0 - 3 * worst_step  # and the time is used
    assert all(plan.done[m] >= 3 for m in costs)
    spent = list(plan.spent.values())
    assert max(spent) - min(spent) <= 2 * worst_step  # equal training time, so a faster model gets more steps
    assert plan.done["softmax"] > plan.done["s4d"] > plan.done["natsl"]
    assert plan.planned == plan.done  # every model ended at its (last) plan


def test_a_wrong_first_timing_is_corrected():
    costs = {"a": 0.5, "b": 0.5}
    plan, end = _simulate(costs, timed={"a": 0.05, "b": 0.05}, deadline=60.0)  # timed 10x too fast
    assert 59.0 <= end <= 61.0 and plan.done["a"] == pytest.approx(60, abs=3)


def test_a_spike_of_load_does_not_swing_the_plan():
    # two models at 1 s a step with 100 s left; one step of each takes 10 s (another process took the CPU): each
    # model's plan drops once by the time lost and stays there, instead of falling to half and climbing back step by
    # step (the shown "done/planned" jumping while the load passes)
    plan = ClockPlan({"a": 1.0, "b": 1.0}, min_steps=1)
    now, deadline, shown = 0.0, 100.0, {"a": [], "b": []}
    plan.replan(deadline)
    while (m := plan.next_model()) is not None:
        dt = 10.0 if sum(plan.done.values()) in (20, 21) else 1.0
        now += dt
        plan.record(m, dt)
        shown[m].append(plan.replan(deadline - now)[m])
    for m, plans in shown.items():
        after = plans[10:]  # from each model's slow step on
        assert max(after) - min(after) <= 1, (m, plans)
        assert plans[-1] == plan.done[m] and abs(plan.done[m] - 41) <= 1  # 18 s lost: 9 steps fewer each
    assert plan.rate == {"a": 1.0, "b": 1.0}
    plan = ClockPlan({"a": 1.0}, min_steps=1)  # a lasting slow-down moves it within a few steps
    for _ in range(4):
        plan.record("a", 3.0)
    assert plan.rate["a"] == 3.0


def test_too_small_a_budget_still_gives_min_steps():
    plan, end = _simulate({"a": 1.0, "b": 2.0}, timed={"a": 1.0, "b": 2.0}, deadline=0.5, min_steps=2)
    assert plan.done == {"a": 2, "b": 2} and end == pytest.approx(6.0)


def test_loss_at_tokens_weighs_the_window_by_tokens():
    """The mean over ((1 - w) N, N] of the logged interval losses, each weighted by the tokens it shares with it."""
    curve = [(100, 4.0), (200, 3.0), (300, 2.0), (400, 1.0)]  # interval (0, 100] has mean 4.0, ...
    assert loss_at_tokens(curve, 300, window=0.5) == pytest.approx((50 * 3.0 + 100 * 2.0) / 150)  # (150, 300]
    assert loss_at_tokens(curve, 250, window=0.2) == pytest.approx(2.0)  # (200, 250] lies inside one interval
    assert loss_at_tokens(curve, 400, window=1.0) == pytest.approx(2.5)
    assert loss_at_tokens([(100, 4.0), (200, float("nan")), (300, 2.0)], 300, window=0.5) == pytest.approx(2.0)
    assert loss_at_tokens([], 300) is None and loss_at_tokens([(100, float("inf"))], 100) is None


class _FakeTime:
    def __init__(self):
        self.now = 1000.0

    def perf_counter(self):
        return self.now


def test_run_demo_plans_by_the_clock(monkeypatch, tmp_path):
    """The whole demo on tiny models and a fake clock: every model trains, for its share of the time; the table says
    how many steps each got; the progress line (in a log) counts seconds against the budget, once."""
    import io

    from hybrid_attention.training import progress
    from hybrid_attention.training.trainer import Trainer

    clock = _FakeTime()
    costs = {"softmax": 0.25, "s4d": 1.0}  # fake seconds per step
    log = io.StringIO()  # not a terminal: the plain progress line, every update
    monkeypatch.setattr(demo, "time", clock)
    monkeypatch.setattr(demo, "progress_bar", lambda total, **kw: progress.progress_bar(total, stream=log, every_s=0,
                                                                                         **kw))
    monkeypatch.setattr(demo, "_time_steps", lambda cfg, data, device: costs[cfg.model.layers])
    real_step = Trainer.train_step

    def step(self):
        clock.now += costs[self.cfg.model.layers]
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", step)
    opts = demo.DemoOptions(minutes=1.0, device="cpu", out=str(tmp_path), mixers=("softmax", "s4d"), seq_len=32,
                            batch_size=2, max_bytes=1_000_000, sample_tokens=4, min_steps=2)
    res = demo.run_demo(opts, log=lambda *a: None)
    # budget 60 s, reserve 0.05 * 60 + 5 + 8 * 1.25 = 18 s: about 42 s of training, half for each model
    assert res["steps"]["softmax"] == pytest.approx(84, abs=3) and res["steps"]["s4d"] == pytest.approx(21, abs=2)
    assert res["seconds"] <= 60.0
    assert res["tokens"] == {m: n * 2 * 32 for m, n in res["steps"].items()}
    header, _, *lines = res["table"].splitlines()
    assert "steps" in header and "train tokens" in header
    assert any(line.startswith("softmax ") and f" {res['steps']['softmax']} " in line for line in lines)
    # beside the equal-time results: every model's training loss at the tokens the slowest one reached
    n_eq = min(res["tokens"].values())
    assert res["equal_tokens"] == n_eq == res["tokens"]["s4d"]
    assert f"loss@{n_eq:,} tok" in header and f"at the {n_eq:,} training tokens every model reached" in res["table"]
    for row in res["rows"]:
        recs = demo.read_metrics(tmp_path / row["model"] / "metrics.jsonl")
        curve = [(r["tokens"], r["loss"]) for r in recs if r.get("loss") is not None]
        assert row["loss_eq"] == pytest.approx(loss_at_tokens(curve, n_eq)) and math.isfinite(row["loss_eq"])
        line = next(line for line in lines if line.startswith(row["model"] + " "))
        assert f" {row['loss_eq']:.3f} " in line
    softmax_curve = [(r["tokens"], r["loss"]) for r in demo.read_metrics(tmp_path / "softmax" / "metrics.jsonl")
                     if r.get("loss") is not None]
    assert softmax_curve[-1][0] > 2 * n_eq  # softmax went on training: its column reads an earlier point
    lines = log.getvalue().splitlines()  # the progress lines
    assert lines and all(line.startswith("demo: ") and line.count("/60 s") == 1 and " s/s" not in line
                         for line in lines), lines[:3]
    assert re.fullmatch(r"demo: 0/60 s, 1:00 left; softmax 1/84 \d+\.\d\d s4d 0/21 -", lines[0]), lines[0]
    assert all(re.match(r"demo: \d+/60 s, [01]:[0-5]\d left; ", line) for line in lines), lines
    assert lines[-1].endswith("evaluated s4d")
    saved = (tmp_path / "s4d" / "config.yaml").read_text()
    assert f"steps: {res['steps']['s4d']}" in saved  # the saved config says how long the run was


def test_the_demo_sample_is_not_mostly_whitespace():
    # a tiny model's continuation of code can be runs of indentation: another seed is tried (up to three), and the
    # most visible of them is kept when none reaches half
    from hybrid_attention.training.demo import readable_sample, visible_share

    samples = {0: "\n" + " " * 40 + "x\n\n", 1: "return self._x\n", 2: "never asked"}
    seeds = []

    def generate(seed):
        seeds.append(seed)
        return samples[seed]

    assert readable_sample(generate, 0) == "return self._x\n" and seeds == [0, 1]
    assert visible_share(samples[0]) < 0.1 and visible_share("ab  ") == 0.5 and visible_share("") == 0.0
    spaces = {5: " " * 10 + "a", 6: " " * 3 + "ab", 7: "\n" * 9}
    assert readable_sample(spaces.__getitem__, 5) == "   ab"  # none reaches half: the most visible
    assert readable_sample(spaces.__getitem__, 7, tries=1) == "\n" * 9
