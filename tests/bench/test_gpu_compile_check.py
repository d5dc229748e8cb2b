"""The compile check's gradient rule (benchmarks/gpu_compile_check.judge_grads): within the plain bar of eager, or as
close to the float32 gradient as eager bf16 is; a wrong compiled gradient fails either way."""

from __future__ import annotations

import torch

from benchmarks.gpu_compile_check import GRAD_BAR, judge_grads


def _noisy(x: torch.Tensor, rel: float, seed: int) -> torch.Tensor:
    e = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))
    return x + rel * x.norm() / e.norm() * e


def test_bf16_level_noise_outside_the_plain_bar_passes_against_float32():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    g_e, g_c = _noisy(x, 0.045, 1), _noisy(x, 0.045, 2)  # two independent roundings: ~6.4% apart, each 4.5% from x
    ok, worst, name, ratio = judge_grads({"a": g_c}, {"a": g_e}, {"a": x})
    assert worst > GRAD_BAR and name == "a"
    assert ok and 0.8 < ratio < 1.25


def test_a_wrong_compiled_gradient_fails():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    g_e = _noisy(x, 0.045, 1)
    ok, _, _, ratio = judge_grads({"a": 1.3 * x}, {"a": g_e}, {"a": x})
    assert not ok and ratio > 5
    ok, _, _, _ = judge_grads({"a": g_e * float("nan")}, {"a": g_e}, {"a": x})
    assert not ok


def test_without_a_float32_reference_the_plain_bar_decides():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    assert judge_grads({"a": _noisy(x, 0.01, 2)}, {"a": x}, None)[0]
    assert not judge_grads({"a": _noisy(x, 0.08, 2)}, {"a": x}, None)[0]
