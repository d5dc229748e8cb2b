"""Shared test settings: deterministic seeds, float64 oracles, single-threaded torch (CI has 2 cores, xdist 2 workers)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
