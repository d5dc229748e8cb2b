"""A tiny trained run shared by the evaluation tests (a few steps on a slice of the embedded corpus)."""

import shutil

import pytest

from hybrid_attention.config.run_config import load_config
from hybrid_attention.training.trainer import train


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval_run") / "run"
    cfg = load_config(None, [
        "model.layers=[interdomain, softmax]",
        "model.options={hidden_size: 32, num_heads: 2, head_dim: 16, state_size: 8, chunk_size: 8}",
        "data.max_bytes=400000", "data.val_fraction=0.2", "data.seq_len=32", "data.val_tokens=1024",
        "train.batch_size=4", "train.steps=6", "train.progress=false", "train.plots=false", "train.eval_every=0",
        "train.device=cpu", "optim.warmup_steps=2", f"train.out_dir={out}",
    ])
    train(cfg, quiet=True)
    return out


@pytest.fixture
def run(tiny_run, tmp_path):
    """A private copy of the shared tiny run (final/ + checkpoints/step-00000006 + tokenizer/)."""
    dst = tmp_path / "run"
    shutil.copytree(tiny_run, dst)
    return dst
