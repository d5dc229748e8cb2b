"""Per-epoch checkpoints of one recall model (``recall.train_and_eval``), so that a model cut by a time limit or a
preemption resumes at its last finished epoch instead of starting over."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hybrid_attention.checkpoints.step_checkpoints import (
    NonFiniteState,
    apply_checkpoint,
    newest_intact,
    save_checkpoint,
)

from .schedule import load_scheduler_state, scheduler_state

if TYPE_CHECKING:
    from .recall import RecallConfig

__all__ = ["fingerprint", "restore_epoch", "save_epoch"]

# RecallConfig fields that do not change one model's trajectory: the sweep's lists (the model's own mixer / d / lr
# are in the fingerprint), where it runs, whether and how its step is compiled, where its sweep writes
_NOT_TRAJECTORY = ("mixers", "d_models", "lrs", "device", "compile", "compile_mode", "out_dir")
_STATE_KEYS = ("epoch", "scheduler", "generator", "seconds", "loss", "accuracy", "fingerprint")


def fingerprint(cfg: RecallConfig, mixer: str, d_model: int, lr: float) -> dict[str, Any]:
    """What decides one model's training: the config without ``_NOT_TRAJECTORY``, plus mixer, width and lr."""
    cfg_d = {k: v for k, v in asdict(cfg).items() if k not in _NOT_TRAJECTORY}
    # as it reads back from the checkpoint's JSON (tuples become lists), so that the comparison is exact
    return _comparable(json.loads(json.dumps({"config": cfg_d, "mixer": mixer, "d_model": d_model, "lr": lr})))


def _comparable(stored: dict) -> dict:
    """A fingerprint with its config's None values left out: ``fingerprint`` writes it so and the stored one is read
    so, so that a field added with a None default (e.g. short_num_kv_pairs) keeps checkpoints written
    without it resumable."""
    cfg_d = {k: v for k, v in stored.get("config", {}).items() if v is not None}
    return {**stored, "config": cfg_d}


def save_epoch(root: Path, epoch: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
               sched: torch.optim.lr_scheduler.LRScheduler, gen: torch.Generator, fp: dict, seconds: float,
               loss: float, accuracy: float, log=None, history: list[dict] | None = None) -> None:
    """Checkpoint ``root/step-<epoch>`` (the previous epoch's is removed once it is complete). A non-finite model
    or optimizer state writes nothing (one log line): a diverged model is left to finish its epochs, not resumed.

    The checkpoint is the trainer's own format (``checkpoints/step_checkpoints.py``: safetensors + JSON, atomic,
    verified on read, never written with a non-finite tensor), one step directory per epoch, the last one kept; its
    JSON state adds what the recall loop needs: the epoch, the scheduler, the permutation generator, the seconds
    trained so far, the last loss and accuracy, the per-epoch ``history`` and the fingerprint ``fp``.

    DECISION: a checkpoint per epoch, because a recall model's full budget can be longer than a time-limited job (a
    2-layer d 128 NAtS-L Hybrid on MQAR T 256: ~190 s per lr compiled, 48 epochs) and what survives a cut is every
    finished epoch."""
    state = {"epoch": epoch, "scheduler": scheduler_state(sched), "generator": gen.get_state().tolist(),
             "seconds": seconds, "loss": loss, "accuracy": accuracy, "fingerprint": fp, "history": history or []}
    try:
        save_checkpoint(root, epoch, model, opt, state, keep=1)
    except NonFiniteState as e:
        if log:
            log(f"  no resume checkpoint: {e}")


def restore_epoch(root: Path, model: torch.nn.Module, opt: torch.optim.Optimizer,
                  sched: torch.optim.lr_scheduler.LRScheduler, gen: torch.Generator, fp: dict,
                  log=None) -> dict[str, Any] | None:
    """Load the newest intact checkpoint under ``root`` with fingerprint ``fp`` into model, optimizer, scheduler and
    generator; returns its JSON state (epoch, seconds, loss, accuracy, history: the per-epoch rows so far, empty
    in checkpoints that have none, ...), or None to start fresh. A checkpoint whose fingerprint differs (another
    config, mixer, width or lr) is ignored, and a damaged one falls back to an older intact one or to a fresh
    start."""
    if not root.is_dir():
        return None
    data, damaged = newest_intact(root, state_keys=_STATE_KEYS)
    for d in damaged:
        if log:
            log(f"  resume: skipped a damaged checkpoint ({d})")
    if data is None:
        return None
    if _comparable(data.doc["fingerprint"]) != fp:
        if log:
            log(f"  resume: {data.path} belongs to another config or model; starting fresh")
        return None
    doc = apply_checkpoint(data, model, opt)
    load_scheduler_state(sched, doc["scheduler"])
    gen.set_state(torch.tensor(doc["generator"], dtype=torch.uint8))
    return doc
