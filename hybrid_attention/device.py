"""Device resolution: a leaf module (imports only torch) shared by training, evaluation, experiments and the CLI.

A leaf, so that evaluation and the experiment runner need not import training; ``training.distributed`` re-exports
``resolve_device``.
"""

from __future__ import annotations

import torch

__all__ = ["resolve_device", "set_tf32"]


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` picks this process's local GPU.

    On CPU this also turns on flushing of denormal floats (process-wide): decaying SSM states underflow into
    denormals during training, and x86 CPUs compute on those 10-50x slower (measured: an S4D training step of the
    tiny preset took 3-17 s instead of 0.25 s).
    """
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        torch.set_flush_denormal(True)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("train.device=cuda but CUDA is not available; use train.device=cpu or auto")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def set_tf32(device: torch.device, enabled: bool) -> None:
    """On CUDA, whether float32 matmuls and convolutions run on TF32 tensor cores (process-wide
    ``torch.backends.cuda.matmul.allow_tf32`` / ``torch.backends.cudnn.allow_tf32``); a no-op elsewhere.

    DECISION: training turns it on by default (``train.tf32``, ``RecallConfig.tf32``), as nanoGPT does and as the
    training benchmark (benchmarks/train_speed.py) always measured. Under bf16 autocast it only reaches the float32
    matmuls that run with autocast off: the state paths of the S4D-only forms (``ops/s4d``). The recall tasks train
    in float32, where it reaches every matmul. The suites whose GPU results were trained without it pin
    ``tf32: false`` so that later seeds and cells keep their recipe (tests/experiments/test_tf32_pins.py).
    """
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
