"""The Interdomain benchmarks' parameters and inputs are a function of their seed, so the dry run's float64 check sees
the same draw on every run."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.interdomain_ops import make_inputs, make_params  # noqa: E402


def test_params_and_inputs_repeat_for_a_seed():
    for a, b in zip(make_params(3, 16, 7, "cpu"), make_params(3, 16, 7, "cpu"), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(make_inputs(1, 9, 2, 16, 16, 5, "cpu"), make_inputs(1, 9, 2, 16, 16, 5, "cpu"), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(make_params(3, 16, 7, "cpu")[0], make_params(3, 16, 8, "cpu")[0])
