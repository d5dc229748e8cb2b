"""``set_tf32`` sets the process-wide CUDA TF32 flags on a CUDA device only, and the trainer applies ``train.tf32``."""

import pytest
import torch
from training_helpers import tiny_config

from hybrid_attention.device import set_tf32
from hybrid_attention.training import trainer as trainer_mod
from hybrid_attention.training.distributed import init_distributed


def _flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_set_tf32_touches_cuda_only():
    before = _flags()
    try:
        set_tf32(torch.device("cuda"), True)  # the flags are plain globals: settable without a GPU
        assert _flags() == (True, True)
        set_tf32(torch.device("cpu"), False)
        assert _flags() == (True, True)
        set_tf32(torch.device("cuda"), False)
        assert _flags() == (False, False)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("value", [True, False])
def test_trainer_applies_train_tf32(tmp_path, monkeypatch, value):
    calls = []
    monkeypatch.setattr(trainer_mod, "set_tf32", lambda device, enabled: calls.append((device.type, enabled)))
    trainer_mod.Trainer(tiny_config(tmp_path, "train.device=cpu", "train.save_final=false", f"train.tf32={value}"),
                        init_distributed("cpu"), quiet=True)
    assert calls == [("cpu", value)]
