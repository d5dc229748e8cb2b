"""torch.distributed on CPU (gloo, 2 processes) follows the same loss trajectory as 1 process with the same global
batch: DDP (with and without gradient accumulation) and FSDP2 (including a checkpoint/resume of the sharded run, in two
processes and in one: 2 -> 1)."""

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from training_helpers import free_port, tiny_config

from hybrid_attention.training.trainer import train

STEPS = 4


def _worker(rank: int, world: int, port: int, out_dir: str, extra: tuple[str, ...], resume: bool) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    train(tiny_config(Path(out_dir), *extra), resume=resume, quiet=True)


def _launch(out_dir: Path, extra: tuple[str, ...], resume: bool = False) -> None:
    mp.start_processes(_worker, args=(2, free_port(), str(out_dir), extra, resume), nprocs=2, join=True,
                       start_method="spawn")


def _losses(run_dir):
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if "loss" in r], [r["val_loss"] for r in recs if "val_loss" in r]


@pytest.mark.slow
@pytest.mark.parametrize("parallel,grad_accum", [("ddp", 1), ("ddp", 2), ("fsdp2", 1)])
def test_two_gloo_processes_match_one(tmp_path, parallel, grad_accum):
    # min_lr_ratio=1: a constant lr after warmup, so a run stopped at step 2 and resumed to STEPS follows the same
    # schedule as a run planned for STEPS from the start.
    extra = ("train.batch_size=8", f"train.grad_accum={grad_accum}", "train.device=cpu", f"train.parallel={parallel}",
             "optim.min_lr_ratio=1.0", "train.checkpoint_every=2")
    train(tiny_config(tmp_path / "single", f"train.steps={STEPS}", *extra), quiet=True)
    if parallel == "fsdp2":  # sharded checkpoint round trip: stop at step 2, resume to STEPS
        _launch(tmp_path / "dist", ("train.steps=2", *extra))
        _launch(tmp_path / "dist", (f"train.steps={STEPS}", *extra), resume=True)
    else:
        _launch(tmp_path / "dist", (f"train.steps={STEPS}", *extra))
    (loss1, val1), (loss2, val2) = _losses(tmp_path / "single"), _losses(tmp_path / "dist")
    assert len(loss1) == len(loss2) == STEPS
    assert max(abs(a - b) for a, b in zip(loss1, loss2)) < 1e-5, (loss1, loss2)
    assert abs(val1[-1] - val2[-1]) < 1e-5
    w1 = load_file(str(tmp_path / "single" / "final" / "model.safetensors"))
    w2 = load_file(str(tmp_path / "dist" / "final" / "model.safetensors"))
    assert w1.keys() == w2.keys()
    assert all(torch.allclose(w1[k], w2[k], atol=1e-5) for k in w1)
    assert (tmp_path / "dist" / "checkpoints" / f"step-{STEPS:08d}" / "rng-rank1.safetensors").exists()


@pytest.mark.slow
def test_fsdp2_checkpoint_resumes_in_one_process(tmp_path):
    """2 -> 1: a checkpoint written by two FSDP2 processes (each holding half of every weight and moment) resumes in
    a single process with the same next-step loss and the same trajectory as an uninterrupted single-process run."""
    extra = ("train.batch_size=8", "train.device=cpu", "train.parallel=fsdp2", "optim.min_lr_ratio=1.0")
    train(tiny_config(tmp_path / "single", f"train.steps={STEPS}", *extra), quiet=True)
    _launch(tmp_path / "dist", ("train.steps=2", *extra))
    state = json.loads((tmp_path / "dist" / "checkpoints" / "step-00000002" / "trainer_state.json").read_text())
    assert state["step"] == 2
    res = train(tiny_config(tmp_path / "dist", f"train.steps={STEPS}", *extra), resume=True, quiet=True)
    assert res.steps == STEPS
    (loss1, val1), (loss2, val2) = _losses(tmp_path / "single"), _losses(tmp_path / "dist")
    assert len(loss1) == len(loss2) == STEPS
    assert abs(loss1[2] - loss2[2]) < 1e-5, (loss1, loss2)  # the next step after the checkpoint
    assert max(abs(a - b) for a, b in zip(loss1, loss2)) < 1e-5, (loss1, loss2)
    assert abs(val1[-1] - val2[-1]) < 1e-5
    # the resumed single process wrote its own checkpoint (one RNG file) beside the 2-process one (two)
    ck = tmp_path / "dist" / "checkpoints"
    assert (ck / "step-00000002" / "rng-rank1.safetensors").exists()
    assert not (ck / f"step-{STEPS:08d}" / "rng-rank1.safetensors").exists()


@pytest.mark.parametrize("finished", [True, False])
def test_shutdown_waits_for_every_rank_only_after_a_finished_run(monkeypatch, finished):
    """A rank that finished training waits at a barrier before tearing the process group down (a peer may still be
    inside the last collective); a rank that failed does not (its peers may never arrive)."""
    import torch.distributed as dist

    from hybrid_attention.training.distributed import DistContext, shutdown_distributed

    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: calls.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a, **k: calls.append("destroy"))
    shutdown_distributed(DistContext(rank=1, world_size=2), finished)
    assert calls == (["barrier", "destroy"] if finished else ["destroy"])
