"""Shared test settings: deterministic seeds and single-threaded torch (CI: 2 cores, 2 xdist workers)."""

import os

import pytest
import torch

# Without a GPU, Triton kernels are tested through the interpreter (fp32, tiny shapes). Must be set before triton is
# imported anywhere. "auto" backends still pick the PyTorch reference on CPU tensors.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
