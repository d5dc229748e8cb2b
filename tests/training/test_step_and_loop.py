"""The shared optimizer step (training/step.py) and training loop (training/loop.py): order, accumulation, skipping,
hook timing and the stopping rule."""

import math

import pytest
import torch

from hybrid_attention.training.loop import Hook, TrainingLoop
from hybrid_attention.training.step import optimizer_step


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def test_accumulation_matches_one_batch_of_the_mean_loss():
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    one, opt1, sched1 = _setup()
    optimizer_step(one, opt1, sched1, lambda a: ((one(x) - y) ** 2).mean(), grad_clip=0)
    two, opt2, sched2 = _setup()
    with torch.no_grad():
        halves = [((two(x[4 * a: 4 * a + 4]) - y[4 * a: 4 * a + 4]) ** 2).mean() for a in range(2)]
    result = optimizer_step(two, opt2, sched2, lambda a: ((two(x[4 * a: 4 * a + 4]) - y[4 * a: 4 * a + 4]) ** 2).mean(),
                            accum=2, grad_clip=0)
    for p1, p2 in zip(one.parameters(), two.parameters()):
        torch.testing.assert_close(p1, p2)
    torch.testing.assert_close(result.loss, (halves[0] + halves[1]) / 2)  # the mean over micro-batches
    assert result.applied and all(p.grad is None for p in two.parameters())  # zero_grad(set_to_none=True)
    assert sched2.last_epoch == 1


def test_clipping_bounds_the_update_and_reports_the_unclipped_norm():
    model, opt, sched = _setup()
    before = [p.detach().clone() for p in model.parameters()]
    result = optimizer_step(model, opt, sched, lambda a: 1000.0 * model(torch.ones(1, 4)).sum(), grad_clip=1.0)
    step = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    assert float(result.grad_norm) > 100  # the norm before clipping
    assert float(step.norm()) == pytest.approx(0.1 * 1.0, rel=1e-5)  # lr times the clipped norm


def test_a_nonfinite_loss_skips_the_update_but_not_the_schedule():
    model, opt, sched = _setup()
    before = [p.detach().clone() for p in model.parameters()]
    called = []
    result = optimizer_step(model, opt, sched, lambda a: model(torch.ones(1, 4)).sum() * math.inf,
                            skip_nonfinite=True, after_update=lambda: called.append(1))
    assert not result.applied and called == []
    for b, p in zip(before, model.parameters()):
        assert torch.equal(b, p)
    assert sched.last_epoch == 1 and opt.param_groups[0]["lr"] == pytest.approx(0.05)


def test_after_update_sees_the_new_weights_and_the_step_learning_rate():
    model, opt, sched = _setup()
    seen = []

    def after():
        seen.append((opt.param_groups[0]["lr"], all(p.grad is not None for p in model.parameters())))

    optimizer_step(model, opt, sched, lambda a: model(torch.ones(1, 4)).sum(), after_update=after)
    assert seen == [(0.1, True)]  # before zero_grad and the scheduler step


def test_loop_runs_hooks_in_order_when_due_and_after_the_last_unit():
    events = []
    pending = {"flag": False}

    def unit(i):
        events.append(("unit", i))
        pending["flag"] = i == 2  # unit 2 asks for a checkpoint out of turn

    loop = TrainingLoop(unit, last=lambda: 5, hooks=[
        Hook(lambda i: events.append(("eval", i)), every=2),
        Hook(lambda i: events.append(("ckpt", i)), every=0, pending=lambda: pending["flag"]),
    ])
    assert loop.run() == 5
    assert events == [("unit", 1), ("unit", 2), ("eval", 2), ("ckpt", 2), ("unit", 3), ("unit", 4), ("eval", 4),
                      ("unit", 5), ("eval", 5), ("ckpt", 5)]


def test_loop_stops_early_resumes_after_done_and_reads_its_length_afresh():
    ran = []
    loop = TrainingLoop(ran.append, last=lambda: 10, stop=lambda i: i == 4)
    assert loop.run(done=2) == 4 and ran == [3, 4]
    assert TrainingLoop(ran.append, last=lambda: 3).run(done=3) == 3 and ran == [3, 4]  # nothing left
    length, grown = {"n": 2}, []

    def unit(i):
        grown.append(i)
        if i == 2:
            length["n"] = 4  # the run is made longer during its last planned unit

    assert TrainingLoop(unit, last=lambda: length["n"]).run() == 4 and grown == [1, 2, 3, 4]
