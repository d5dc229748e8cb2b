"""Shared test settings: deterministic seeds, single-threaded torch (CI: 2 cores, 2 xdist workers) and the device of
the Triton tests (``triton_device.py``: CUDA when a GPU exists, else CPU tensors through the interpreter)."""

import pytest
import torch
import triton_device  # first: sets TRITON_INTERPRET before triton is imported anywhere

torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "triton: runs Triton kernels on the `device` fixture's device (skipped when "
                                       "triton is missing, or with neither CUDA nor TRITON_INTERPRET=1)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("triton") is not None and triton_device.SKIP_REASON:
        pytest.skip(triton_device.SKIP_REASON)


@pytest.fixture
def device() -> torch.device:
    """Where tensors given to a Triton backend live: CUDA on a GPU machine, the CPU under the interpreter. Skips the
    test where neither runs (as the ``triton`` marker)."""
    if triton_device.SKIP_REASON:
        pytest.skip(triton_device.SKIP_REASON)
    return torch.device(triton_device.DEVICE)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
