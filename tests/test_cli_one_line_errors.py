"""Errors that reach the user as one ``error:`` line and a non-zero exit: a recall sweep with a mixer that does not
exist, a perplexity window longer than the tokens to score, an lm-eval task that is unknown or whose data cannot be
loaded; under torchrun the first failing rank reports once."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hybrid_attention.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.options={hidden_size: 32, num_heads: 2, head_dim: 16, state_size: 8, chunk_size: 8}",
        "data.max_bytes=200000", "data.val_fraction=0.2", "data.seq_len=32", "data.val_tokens=1024",
        "train.batch_size=2", "train.steps=1", "train.progress=false", "train.eval_every=0",
        "train.checkpoint_every=0", "optim.warmup_steps=1", "model.layers=[softmax]"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("errors") / "run"
    assert main(["train", str(REPO / "configs" / "tiny_cpu.yaml"), *TINY, f"train.out_dir={out}"]) == 0
    return out


def _one_line(err: str) -> str:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_mqar_with_an_unknown_mixer(capsys, tmp_path):
    out = tmp_path / "sweep"
    assert main(["eval", "mqar", "mixers=[foo]", f"out_dir={out}"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "'foo' is not a mixer" in err and "softmax" in err
    assert not out.exists()  # checked before anything is written


def test_ppl_window_longer_than_the_tokens(capsys, tiny_run):
    assert main(["eval", "ppl", "--checkpoint", str(tiny_run), "--seq-len", "100000", "--tokens", "1000"]) == 2
    assert "--seq-len 100000: longer than --tokens 1000" in _one_line(capsys.readouterr().err)
    assert main(["eval", "ppl", "--checkpoint", str(tiny_run), "--seq-len", "100000"]) == 2
    assert "validation tokens to score" in _one_line(capsys.readouterr().err)


def test_lm_eval_unknown_task(capsys, tiny_run):
    pytest.importorskip("lm_eval")
    assert main(["eval", "lm-eval", "--checkpoint", str(tiny_run), "--tasks", "no_such_task_xyz"]) == 2
    assert "--tasks: lm-eval has no task no_such_task_xyz" in _one_line(capsys.readouterr().err)


def test_lm_eval_offline_task_data(tiny_run, tmp_path):
    pytest.importorskip("lm_eval")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "hybrid_attention.cli", "eval", "lm-eval", "--checkpoint", str(tiny_run),
                        "--tasks", "lambada_openai", "--limit", "2"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    line = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
    assert len(line) == 1 and "the task data could not be loaded" in line[0] and "Traceback" not in r.stderr


def test_torchrun_reports_the_first_failing_rank_once(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", "29500")
    lines = []
    for rank in (1, 0):  # both ranks read the same bad config; rank 1 happens to fail first
        monkeypatch.setenv("RANK", str(rank))
        assert main(["eval", "mqar", "epochz=1"]) == 2
        lines.append(capsys.readouterr().err)
    assert "unknown key 'epochz'" in _one_line(lines[0]) and lines[1] == ""

    import hybrid_attention.cli as cli

    def collective_fails(a):
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(cli, "_cmd_info", collective_fails)
    assert main(["info", "x"]) == 1  # a rank whose collective failed after another rank's error: one short line
    assert _one_line(capsys.readouterr().err) == "error: rank 0 stopped after another rank's error (RuntimeError)\n"


def test_single_process_bug_keeps_its_traceback(monkeypatch):
    import hybrid_attention.cli as cli

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(cli, "_cmd_info", lambda a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["info", "x"])


def test_markers_of_finished_runs_are_removed(monkeypatch, tmp_path):
    from hybrid_attention.rank_errors import claim_error_report

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    stale = tmp_path / f"hybrid-attention-error-{done.pid}-0-localhost-1234"
    alive = tmp_path / f"hybrid-attention-error-{os.getpid()}-0-localhost-1234"
    stale.write_text("1")
    alive.write_text("1")
    assert claim_error_report()
    assert not stale.exists() and alive.exists()
    assert not claim_error_report()  # this run's own marker stays until its agent exits
