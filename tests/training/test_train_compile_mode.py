"""``train.compile_mode``: the trainer compiles with that mode and, for "reduce-overhead" (CUDA graphs), marks a new
cudagraph step before every micro-batch forward; one process only."""

import dataclasses

import pytest
import torch
from training_helpers import tiny_config

from hybrid_attention.config.schema import ConfigError
from hybrid_attention.training import trainer as trainer_mod
from hybrid_attention.training.distributed import init_distributed


@pytest.mark.parametrize("mode, expect_mode, marks_per_step", [("default", None, 0), ("reduce-overhead",
                         "reduce-overhead", 2), ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs", 0)])
def test_compile_mode_reaches_torch_compile_and_marks_steps(tmp_path, monkeypatch, mode, expect_mode,
                                                            marks_per_step):
    modes, marks = [], []

    def fake_compile(self, *args, **kwargs):  # records the call; the model stays eager (no inductor on the CPU)
        modes.append(kwargs.get("mode"))

    monkeypatch.setattr(torch.nn.Module, "compile", fake_compile)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    cfg = tiny_config(tmp_path, "train.device=cpu", "train.save_final=false", "train.compile=true",
                      "train.compile_scope=model", f"train.compile_mode={mode}", "train.grad_accum=2",
                      "train.steps=2", "train.checkpoint_every=0")
    tr = trainer_mod.Trainer(cfg, init_distributed("cpu"), quiet=True)
    assert modes == [expect_mode]
    tr.train_step()
    tr.train_step()
    assert len(marks) == 2 * marks_per_step  # one per micro-batch (grad_accum = 2) and step


def test_cuda_graphs_refused_with_several_processes(tmp_path):
    cfg = tiny_config(tmp_path, "train.device=cpu", "train.save_final=false", "train.compile=true",
                      "train.compile_mode=reduce-overhead")
    ctx = dataclasses.replace(init_distributed("cpu"), world_size=2)
    with pytest.raises(ConfigError, match=r"train.compile_mode = 'reduce-overhead' .* one process only, got 2"):
        trainer_mod.Trainer(cfg, ctx, quiet=True)
