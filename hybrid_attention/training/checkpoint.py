"""Training checkpoints without pickle: tensors in safetensors, everything else in JSON, written atomically.

Layout of ``<out_dir>/checkpoints/step-00000100/``::

    model.safetensors        full (unsharded) model state dict
    optimizer.safetensors    optimizer state tensors, keys "<param fqn>/<name>" (e.g. "lm_head.weight/exp_avg")
    rng-rank<r>.safetensors  torch CPU (and CUDA) generator states of rank r
    trainer_state.json       step, optimizer param groups, scheduler, data position, counters, Python/NumPy RNG

A checkpoint is written into ``.tmp-step-…`` and renamed with ``os.replace`` once complete, so a crash never leaves a
half-written ``step-…`` directory; leftover temporary directories are removed on the next save. The last
``keep`` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

_STEP_DIR = re.compile(r"^step-(\d+)$")
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def checkpoint_dirs(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors sharing storage (tied weights): copy the second and later aliases."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for k, v in state.items():
        v = v.detach()
        key = (v.untyped_storage().data_ptr(), v.storage_offset())
        out[k] = v.clone().contiguous() if key in seen else v.contiguous()
        seen.add(key)
    return out


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensor states, JSON states) of every random generator the training loop may touch."""
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    py = random.getstate()
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return tensors, {"python": [py[0], list(py[1]), py[2]], "numpy": [name, keys.tolist(), pos, has_gauss, gauss]}


def set_rng_state(tensors: dict[str, torch.Tensor], js: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    if torch.cuda.is_available():
        cuda = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)
    v, keys, gauss = js["python"]
    random.setstate((v, tuple(keys), gauss))
    name, keys, pos, has_gauss, gauss = js["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))


def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    keep: int,
    rank: int = 0,
    barrier=lambda: None,
) -> Path:
    """Write checkpoint ``step`` (collective under torch.distributed: every rank must call it). Returns its path.

    ``state`` holds JSON-able trainer state (scheduler, data position, counters). Rank 0 writes the model and
    optimizer; every rank writes its RNG states into the shared temporary directory.
    """
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    model_sd = get_model_state_dict(model, options=_FULL)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=_FULL)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for old in root.glob(".tmp-step-*"):
            shutil.rmtree(old, ignore_errors=True)
        tmp.mkdir()
    barrier()
    rng_tensors, rng_json = rng_state()
    save_file({k: v.contiguous() for k, v in rng_tensors.items()}, str(tmp / f"rng-rank{rank}.safetensors"))
    if rank == 0:
        save_file(_unshared(model_sd), str(tmp / "model.safetensors"))
        tensors = {}
        for fqn, s in optim_sd["state"].items():
            for name, v in s.items():
                tensors[f"{fqn}/{name}"] = torch.as_tensor(v).contiguous()
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in optim_sd["param_groups"]]
        doc = {"step": step, "param_groups": groups, "rng": rng_json, **state}
        with open(tmp / "trainer_state.json", "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
    barrier()
    if rank == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in checkpoint_dirs(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int = 0) -> dict:
    """Restore model, optimizer and this rank's RNG from ``path``; returns the JSON trainer state."""
    doc = json.loads((path / "trainer_state.json").read_text())
    set_model_state_dict(model, load_file(str(path / "model.safetensors")), options=_FULL)
    flat = load_file(str(path / "optimizer.safetensors"))
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, v in flat.items():
        fqn, name = key.rsplit("/", 1)
        state.setdefault(fqn, {})[name] = v
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in doc["param_groups"]]
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups}, options=_FULL)
    rng_file = path / f"rng-rank{rank}.safetensors"
    if not rng_file.exists():
        rng_file = path / "rng-rank0.safetensors"
    set_rng_state(load_file(str(rng_file)), doc["rng"])
    return doc
