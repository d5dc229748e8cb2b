"""Exact resume: a CPU run killed with SIGKILL mid-training and resumed ends bit-identical to an uninterrupted run."""

import json
import signal
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file
from training_helpers import cli_cmd, cli_env, tiny_overrides

from hybrid_attention.config.run_config import load_config, save_config

STEPS = 24


def _config_file(out_dir):
    """The run's YAML config (written beside the run directory)."""
    cfg = load_config(None, tiny_overrides(out_dir, f"train.steps={STEPS}", "train.checkpoint_every=4",
                                           "train.keep_checkpoints=2", "train.eval_every=12"))
    path = out_dir.parent / f"{out_dir.name}.yaml"
    save_config(cfg, path)
    return str(path)


def _losses(run_dir):
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical(tmp_path):
    ref_dir, kill_dir = tmp_path / "reference", tmp_path / "killed"
    env = cli_env()
    reference = subprocess.Popen(cli_cmd("train", _config_file(ref_dir)), env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    victim = subprocess.Popen(cli_cmd("train", _config_file(kill_dir)), env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    # Kill once the second checkpoint exists: mid-training, with at least one checkpoint to resume from.
    deadline = time.time() + 240
    while not (kill_dir / "checkpoints" / "step-00000008").exists():
        assert victim.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    assert not (kill_dir / "final").exists()

    resumed = subprocess.run(cli_cmd("train", _config_file(kill_dir), "--resume"), env=env, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout + resumed.stderr
    out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, out

    a = load_file(str(ref_dir / "final" / "model.safetensors"))
    b = load_file(str(kill_dir / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run"
    assert _losses(ref_dir) == _losses(kill_dir)
    assert sorted(_losses(kill_dir)) == list(range(1, STEPS + 1))
