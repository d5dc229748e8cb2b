"""``--tasks`` (``recall_only``): a run can train one recall task of several cells; a cell's result.json is
written only once all of its tasks are done, and the report shows the finished tasks of unfinished runs."""

import json
from pathlib import Path

import pytest

from hybrid_attention.config.schema import ConfigError
from hybrid_attention.experiments import load_suite, run_suite
from hybrid_attention.experiments import runner as runner_mod
from hybrid_attention.experiments.cli import main
from hybrid_attention.experiments.runner import machine_description

SUITES = Path(__file__).resolve().parents[2] / "configs" / "experiments"


def fake_trainer(calls: list):
    """train_and_eval stand-in: records (task, mixer) and returns a fixed accuracy per task."""
    def train_and_eval(rc, mixer, d_model, lr, device, log=None, resume_dir=None):
        calls.append((rc.task, mixer))
        acc = {"mqar": 0.25, "passkey": 0.75}[rc.task]
        history = [{"epoch": 1, "loss": 2.0, "accuracy": 0.1, "seq_len": rc.seq_len},
                   {"epoch": 2, "loss": 1.0, "accuracy": acc, "seq_len": rc.seq_len}]
        return {"task": rc.task, "mixer": mixer, "d_model": d_model, "lr": lr, "accuracy": acc, "seconds": 1.0,
                "history": history}
    return train_and_eval


def _suite(out: Path, *extra: str):
    suite = load_suite(SUITES / "recall.yaml", ["profile=cpu", f"out_dir={out}", "seeds=[0]", *extra])
    suite.cells = [suite.cell("softmax")]
    return suite


def test_a_task_at_a_time_finishes_the_cell_when_all_are_done(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(runner_mod, "train_and_eval", fake_trainer(calls))
    run_dir = tmp_path / "cells" / "softmax" / "seed0"
    doc = run_suite(_suite(tmp_path, "recall_only=[passkey]"), log=lambda *_: None)
    assert {t for t, _ in calls} == {"passkey"}
    assert (run_dir / "recall_passkey.json").exists() and not (run_dir / "recall_mqar.json").exists()
    assert not (run_dir / "result.json").exists()  # the cell is not finished: mqar is left
    s = doc["summary"]["softmax"]
    assert s["unfinished_seeds"] == [0] and s["recall"]["passkey"]["mean"] == 0.75 and s["recall"]["mqar"] is None
    row = next(line for line in (tmp_path / "results.md").read_text().splitlines() if line.startswith("| softmax"))
    assert "unfinished: seed 0" in row and "–" in row and "0.750" in row
    # the finished task's machine and per-epoch accuracy reach the report before the run has a result.json
    assert doc["machines"] == [machine_description()]
    assert doc["total_run_wall_s"] == doc["unfinished_recall_s"] == 1.0  # the passkey model's training seconds
    assert "Sum of run wall times: 1 s (1 s of it: the finished recall models" in (tmp_path / "results.md").read_text()
    assert s["recall_history"]["passkey"] == [{"seed": 0, "lr": 3e-3, "task": "passkey", "history": [
        {"epoch": 1, "loss": 2.0, "accuracy": 0.1, "seq_len": 64}, {"epoch": 2, "loss": 1.0, "accuracy": 0.75,
                                                                    "seq_len": 64}]}]
    assert s["recall_history"]["mqar"] == [] and (tmp_path / "recall_curves.png").stat().st_size > 0

    calls.clear()
    doc = run_suite(_suite(tmp_path), log=lambda *_: None)
    assert {t for t, _ in calls} == {"mqar"}  # passkey is read back, not trained again
    result = json.loads((run_dir / "result.json").read_text())
    assert {t: r["accuracy"] for t, r in result["recall"].items()} == {"mqar": 0.25, "passkey": 0.75}
    assert "unfinished_seeds" not in doc["summary"]["softmax"]
    hist = doc["summary"]["softmax"]["recall_history"]
    assert [h["history"][-1]["accuracy"] for h in (*hist["mqar"], *hist["passkey"])] == [0.25, 0.75]


def test_unknown_task_names_fail_with_one_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"recall_only \(--tasks\).*tasks: mqar, passkey"):
        _suite(tmp_path, "recall_only=[mqar, nope]")
    assert main([str(SUITES / "recall.yaml"), "profile=cpu", f"out_dir={tmp_path}", "--tasks", "nope",
                 "--only", "softmax"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "recall_only (--tasks)" in err[0] and "nope" in err[0]


def test_parallel_workers_with_tasks_left_are_not_failures(tmp_path):
    """jobs=2 (one subprocess per run, the real trainer at toy sizes): a worker that finished its --tasks is counted
    done, not failed, and leaves its task result without a result.json."""
    small = [f"recall_tasks.passkey.{k}={v}" for k, v in
             (("train_examples", 64), ("test_examples", 32), ("epochs", 1), ("seq_len", 32))]
    suite = _suite(tmp_path, "seeds=[0, 1]", "recall_only=[passkey]", *small)
    lines: list = []
    doc = run_suite(suite, log=lines.append, jobs=2)
    assert doc["failed"] == [] and not any("FAILED" in ln or ": failed" in ln for ln in lines), lines
    assert sum("done, tasks left" in ln for ln in lines) == 2, lines
    for seed in (0, 1):
        run_dir = tmp_path / "cells" / "softmax" / f"seed{seed}"
        assert (run_dir / "recall_passkey.json").exists() and not (run_dir / "result.json").exists()
    assert doc["summary"]["softmax"]["unfinished_seeds"] == [0, 1]


def test_a_cell_finished_from_tasks_trained_elsewhere_names_their_machines(tmp_path, monkeypatch):
    """A cell's three tasks trained by two processes on different machines: the process that later finds them all
    on disk writes result.json, which must name the GPU that trained them."""
    calls: list = []
    monkeypatch.setattr(runner_mod, "train_and_eval", fake_trainer(calls))
    run_suite(_suite(tmp_path), log=lambda *_: None)  # trains both tasks here
    run_dir = tmp_path / "cells" / "softmax" / "seed0"
    for i, task in enumerate(["mqar", "passkey"]):  # as if another machine had trained each of them
        path = run_dir / f"recall_{task}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "machine": f"gpu box {i}"}))
    (run_dir / "result.json").unlink()
    calls.clear()
    doc = run_suite(_suite(tmp_path), log=lambda *_: None)
    assert calls == []  # nothing trained again
    assert json.loads((run_dir / "result.json").read_text())["machine"] == "gpu box 0; gpu box 1"
    assert doc["machines"] == ["gpu box 0; gpu box 1"]
    result = json.loads((run_dir / "result.json").read_text())  # their model seconds (1 s each) count in its wall time
    assert result["recall_read_back_s"] == 2.0 and 2.0 <= result["wall_s"] < 3.0
