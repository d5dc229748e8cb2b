"""Autocast off for a block of float32 / float64 math, decided without a Dynamo-untraceable query.

Shared by the S4D-only forms (``ops/s4d``) and the Interdomain glue (``ops/interdomain/readout.py``): their tables and
states are computed outside bf16 autocast.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["AUTOCAST_DEVICES", "autocast_off"]


# The device types with an autocast, decided once at import: ``torch.amp.is_autocast_available`` is a C builtin that
# torch 2.11's Dynamo cannot trace. Called inside the compiled s4d step it breaks the graph in both convolution forms,
# the resumed frames hit Dynamo's recompile limit and run eagerly (H200: 1867 launches per `small` step, kernels
# 35 ms of an 81 ms profiled step). A membership test of a constant set traces.
def _has_autocast(device_type: str) -> bool:
    try:
        return torch.amp.is_autocast_available(device_type)
    except (RuntimeError, ValueError):  # a device type this build does not know
        return False


AUTOCAST_DEVICES = frozenset(d for d in ("cpu", "cuda", "xpu", "mps", "hpu") if _has_autocast(d))


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """``torch.autocast(device_type, enabled=False)``, or a no-op where the device type has no autocast (``meta``:
    the host-sync tests run the layers there, tests/models/test_no_host_sync.py)."""
    if device_type in AUTOCAST_DEVICES:
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()
