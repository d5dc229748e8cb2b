"""Warmup + cosine schedule and the optimizer's parameter groups."""

import math

import pytest
import torch

from hybrid_attention.config.run_config import OptimSection
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.training.optimizer import build_optimizer
from hybrid_attention.training.schedule import WarmupCosine, warmup_cosine_scheduler


def test_warmup_cosine_shape():
    f = WarmupCosine(warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(60) == pytest.approx(0.55) and f(110) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 120))


def test_ssm_group_keeps_its_cap_under_the_schedule():
    model = HybridForCausalLM(HybridConfig.from_preset("tiny", layers="interdomain"))
    opt = build_optimizer(model, OptimSection(lr=1e-2, warmup_steps=0))
    sched = warmup_cosine_scheduler(opt, 0, 100, 0.1)
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["ssm"]["lr"] == pytest.approx(1e-3) and groups["ssm"]["weight_decay"] == 0
    assert groups["decay"]["weight_decay"] == pytest.approx(0.1)
    for _ in range(50):
        opt.step()
        sched.step()
    ratio = groups["ssm"]["lr"] / groups["decay"]["lr"]
    assert ratio == pytest.approx(0.1) and groups["decay"]["lr"] < 1e-2
    n = sum(len(g["params"]) for g in opt.param_groups)
    assert n == len(list(model.parameters()))
    assert math.isfinite(groups["ssm"]["lr"])
    assert isinstance(opt, torch.optim.AdamW)
