"""The hybrid-attention command: demo within its budget, train/eval/generate/info on a tiny run, clear errors."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid_attention.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.options={hidden_size: 32, num_heads: 2, head_dim: 16, state_size: 8, chunk_size: 8}",
        "data.max_bytes=400000", "data.val_fraction=0.2", "data.seq_len=32", "data.val_tokens=1024",
        "train.batch_size=4", "train.steps=4", "train.progress=false", "train.eval_every=0",
        "train.checkpoint_every=2", "optim.warmup_steps=1"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.mark.slow
def test_demo_with_a_30_second_budget(tmp_path):
    t = time.time()
    r = subprocess.run([sys.executable, "-m", "hybrid_attention.cli", "demo", "--minutes", "0.5", "--out",
                        str(tmp_path)], env=_env(), capture_output=True, text=True, timeout=240)
    wall = time.time() - t
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    for column in ("params", "state@256", "val ppl", "loss@", "ppl@512", "ppl@1024", "train tok/s"):
        assert column in out
    for mixer in ("softmax", "interdomain", "s4d"):
        assert any(line.startswith(mixer + " ") for line in out.splitlines()), out
    assert "sample from the best model" in out
    assert (tmp_path / "length_sweep.png").exists() and (tmp_path / "train_loss.png").exists()
    assert (tmp_path / "softmax" / "loss.png").exists() and (tmp_path / "softmax" / "final").is_dir()
    assert wall < 120, f"demo took {wall:.0f} s for a 30 s budget"


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", str(REPO / "configs" / "tiny_cpu.yaml"), *TINY, f"train.out_dir={out}",
                 "model.layers=[s4d, softmax]"]) == 0
    return out


def test_train_writes_the_run_directory(cli_run):
    names = {p.name for p in cli_run.iterdir()}
    assert {"config.yaml", "metrics.jsonl", "checkpoints", "final", "tokenizer", "loss.png", "ppl.png"} <= names
    assert len(list((cli_run / "checkpoints").iterdir())) == 2  # keep_checkpoints=2 of the shipped config


def test_eval_generate_info(cli_run, capsys, tmp_path):
    assert main(["eval", "ppl", "--checkpoint", str(cli_run), "--device", "cpu"]) == 0
    assert "bits/byte" in capsys.readouterr().out
    assert main(["eval", "length", "--checkpoint", str(cli_run), "--multipliers", "1", "2", "4", "--tokens", "1024",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "x train" in out and (tmp_path / "length_sweep.png").exists()
    assert main(["generate", "--checkpoint", str(cli_run), "--prompt", "import", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.startswith("import")
    assert main(["info", str(cli_run), "--seq-lens", "64", "128"]) == 0
    out = capsys.readouterr().out
    assert "parameters:" in out and "s4d, softmax" in out
    assert main(["eval", "passkey", "--checkpoint", str(cli_run), "--lengths", "128", "--depths", "0.5",
                 "--trials", "1"]) == 0
    assert "accuracy" in capsys.readouterr().out


def test_eval_mqar_sweep(capsys, tmp_path):
    assert main(["eval", "mqar", "--config", str(REPO / "configs" / "mqar_cpu.yaml"), "mixers=[softmax]",
                 "d_models=[32]", "seq_len=32", "vocab_size=64", "num_kv_pairs=2", "train_examples=32",
                 "test_examples=16", "epochs=1", f"out_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "softmax" in out


def test_resume_requires_flag_and_errors_are_one_line(cli_run, capsys):
    assert main(["train", str(cli_run / "config.yaml")]) == 2
    err = capsys.readouterr().err
    assert "already has checkpoints; pass --resume" in err and err.count("\n") == 1
    assert main(["train", str(REPO / "configs" / "tiny_cpu.yaml"), "train.stepz=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: config error: unknown key 'train.stepz'") and err.count("\n") == 1
    assert main(["eval", "ppl", "--checkpoint", "/nonexistent/run"]) == 2
    assert "no such checkpoint" in capsys.readouterr().err
    assert main(["eval", "mqar", "epochz=1"]) == 2
    assert "unknown key 'epochz'" in capsys.readouterr().err


def test_resume_of_a_finished_run_is_a_no_op(cli_run, capsys):
    assert main(["train", str(cli_run / "config.yaml"), "--resume"]) == 0
    captured = capsys.readouterr()
    assert "resumed from" in captured.out + captured.err


def test_bench_rejects_unknown_sections(capsys):
    assert main(["bench", "ops", "--only", "interdomain", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "natsl" in err and "s4d" in err
