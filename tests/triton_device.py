"""The one device of the Triton tests: CUDA when a GPU exists, else CPU tensors through the Triton interpreter.

``conftest.py`` imports this module before any test module, so ``TRITON_INTERPRET`` is set before triton is
imported anywhere (triton reads it when a kernel is defined: it holds for the whole run). Under the interpreter the
tests use fp32 and tiny shapes; on a GPU the same tests run compiled (tf32 dots: the looser tolerances).
"""

from __future__ import annotations

import importlib.util
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE: str = "cpu" if INTERPRET else "cuda"  # where every tensor given to a Triton backend lives
HAS_TRITON: bool = importlib.util.find_spec("triton") is not None
SKIP_REASON: str | None = (
    "triton is not installed" if not HAS_TRITON
    else None if INTERPRET or torch.cuda.is_available()
    else "needs CUDA or TRITON_INTERPRET=1 (the CPU interpreter)"
)
