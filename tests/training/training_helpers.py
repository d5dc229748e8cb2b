"""Helpers of the training tests: a tiny, fast configuration on a slice of the embedded corpus; subprocess glue."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from hybrid_attention.config.run_config import load_config

REPO = Path(__file__).resolve().parents[2]

TINY = [
    "model.preset=tiny",
    "model.layers=interdomain",
    "model.options={hidden_size: 32, num_heads: 2, head_dim: 16, state_size: 8, chunk_size: 8}",
    "data.max_bytes=400000",
    "data.val_fraction=0.2",
    "data.seq_len=32",
    "data.val_tokens=1024",
    "train.batch_size=4",
    "train.progress=false",
    "train.plots=false",
    "train.log_every=1",
    "train.eval_every=0",
    "optim.warmup_steps=2",
    "optim.lr=3.0e-3",
]


def tiny_overrides(out_dir: Path, *extra: str) -> list[str]:
    return [*TINY, f"train.out_dir={out_dir}", *extra]


def tiny_config(out_dir: Path, *extra: str):
    """The tiny RunConfig writing to ``out_dir``."""
    return load_config(None, tiny_overrides(out_dir, *extra))


def cli_env() -> dict[str, str]:
    """Environment for a ``python -m hybrid_attention.cli`` subprocess: the repo importable, one thread each."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "hybrid_attention.cli", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
