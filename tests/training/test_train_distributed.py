"""DDP with 2 gloo processes follows the same loss trajectory as 1 process with the same global batch."""

import json
import os

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from training_helpers import free_port, tiny_config

from hybrid_attention.training.trainer import train

STEPS = 4


def _worker(rank: int, world: int, port: int, out_dir: str, extra: tuple[str, ...]) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from pathlib import Path

    train(tiny_config(Path(out_dir), *extra), quiet=True)


def _losses(run_dir):
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if "loss" in r], [r["val_loss"] for r in recs if "val_loss" in r]


@pytest.mark.slow
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_ddp_gloo_two_processes_match_one(tmp_path, grad_accum):
    extra = (f"train.steps={STEPS}", "train.batch_size=8", f"train.grad_accum={grad_accum}", "train.device=cpu")
    train(tiny_config(tmp_path / "single", *extra), quiet=True)
    mp.start_processes(_worker, args=(2, free_port(), str(tmp_path / "ddp"), extra), nprocs=2, join=True,
                       start_method="spawn")
    (loss1, val1), (loss2, val2) = _losses(tmp_path / "single"), _losses(tmp_path / "ddp")
    assert len(loss1) == len(loss2) == STEPS
    assert max(abs(a - b) for a, b in zip(loss1, loss2)) < 1e-5, (loss1, loss2)
    assert abs(val1[-1] - val2[-1]) < 1e-5
    w1 = load_file(str(tmp_path / "single" / "final" / "model.safetensors"))
    w2 = load_file(str(tmp_path / "ddp" / "final" / "model.safetensors"))
    assert all(torch.allclose(w1[k], w2[k], atol=1e-5) for k in w1)
    assert (tmp_path / "ddp" / "checkpoints" / f"step-{STEPS:08d}" / "rng-rank1.safetensors").exists()
