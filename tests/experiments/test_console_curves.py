"""console_curves reads the per-epoch test accuracy of recall models back from device-call console logs: models are
assigned to the task whose line follows them, a cut model to the task whose start line precedes it (in older logs:
the suite's next task), a resumed model's epochs join its earlier ones, and a model that starts again at epoch 1
replaces the earlier attempt."""

import json
from pathlib import Path

from hybrid_attention.experiments.console_curves import main, parse_logs

TASKS = ["mqar_t256", "mqar_t1024", "passkey"]


def _epoch(lr: str, e: int, acc: float) -> str:
    return f"  gdn d=128 lr={lr} epoch {e}: loss 8.300, test accuracy {acc:.3f} (seconds: train 1.0)"


def test_cut_resumed_and_rerun_models(tmp_path: Path):
    first = [  # call 1: the first attempt at mqar_t256 (later re-run), cut in its lr 0.003 model
        "[1/1] gdn seed 0", _epoch("0.001", 1, 0.0), _epoch("0.001", 2, 0.1), _epoch("0.003", 1, 0.0),
        "warnings and other lines are ignored"]
    second = [  # call 2: mqar_t256 from scratch (both lrs), then mqar_t1024 cut after epoch 2
        "[1/2] softmax seed 1", _epoch("0.001", 1, 0.5), "  softmax seed 1 mqar_t256: accuracy 0.500 (3 s)",
        "[2/2] gdn seed 0", _epoch("0.001", 1, 0.2), _epoch("0.001", 2, 0.3), _epoch("0.003", 1, 0.4),
        "  gdn seed 0 mqar_t256: accuracy 0.400 (9 s)", _epoch("0.001", 1, 0.0), _epoch("0.001", 2, 0.05)]
    third = [  # call 3: mqar_t1024 resumed after epoch 1 (its epoch 2 is run again), then passkey
        "[1/1] gdn seed 0", "  gdn d=128 lr=0.001: resumed after epoch 1 (test accuracy 0.000)",
        _epoch("0.001", 2, 0.06), _epoch("0.001", 3, 0.07), "  gdn seed 0 mqar_t1024: accuracy 0.070 (9 s)",
        _epoch("0.003", 1, 0.09), "  gdn seed 0 passkey: accuracy 0.090 (2 s)"]
    fourth = [  # call 4 (the runner's task start lines, session 25): passkey alone (--tasks), cut after epoch 1
        "[1/1] gdn seed 1", "  gdn seed 1 passkey: training", _epoch("0.003", 1, 0.11)]
    logs = []
    for i, lines in enumerate((first, second, third, fourth), 1):
        logs.append(tmp_path / f"console_session30_call{i}_lane0.log")
        logs[-1].write_text("\n".join(lines) + "\n")
    curves = parse_logs(logs, TASKS)
    acc = {k: [(e["epoch"], e["accuracy"]) for e in v] for k, v in curves.items()}
    assert acc == {
        ("softmax", 1, "mqar_t256", 0.001): [(1, 0.5)],
        ("gdn", 0, "mqar_t256", 0.001): [(1, 0.2), (2, 0.3)],  # the re-run replaced call 1's attempt
        ("gdn", 0, "mqar_t256", 0.003): [(1, 0.4)],
        ("gdn", 0, "mqar_t1024", 0.001): [(1, 0.0), (2, 0.06), (3, 0.07)],  # cut in call 2, resumed in call 3
        ("gdn", 0, "passkey", 0.003): [(1, 0.09)],
        ("gdn", 1, "passkey", 0.003): [(1, 0.11)],  # its start line names it (the suite's first task otherwise)
    }
    out = tmp_path / "curves.png"
    main([str(tmp_path), "--suite", str(Path(__file__).resolve().parents[2] / "configs" / "experiments"
                                         / "credible_recall.yaml"), "--out", str(out)])
    assert out.stat().st_size > 0


def test_the_runners_own_log_reads_back_as_its_stored_history(tmp_path: Path):
    # the parser follows the trainer's and runner's log lines (not a format of its own): a real toy run's console
    # gives exactly the per-epoch history its row stored
    from hybrid_attention.experiments import load_suite, run_suite

    suites = Path(__file__).resolve().parents[2] / "configs" / "experiments"
    small = [f"recall_tasks.passkey.{k}={v}" for k, v in
             (("train_examples", 64), ("test_examples", 32), ("epochs", 2), ("seq_len", 32))]
    suite = load_suite(suites / "recall_cpu.yaml", [f"out_dir={tmp_path}", "seeds=[0]", "recall_only=[passkey]",
                                                    *small])
    suite.cells = [suite.cell("softmax")]
    lines: list[str] = []
    run_suite(suite, log=lines.append)
    log = tmp_path / "console_session1_call1_lane0.log"
    log.write_text("\n".join(lines) + "\n")
    row = json.loads((tmp_path / "cells" / "softmax" / "seed0" / "recall_passkey.json").read_text())
    curves = parse_logs([log], ["mqar", "passkey"])
    got = curves[("softmax", 0, "passkey", row["lr"])]
    assert [(e["epoch"], e["accuracy"]) for e in got] == [(h["epoch"], round(h["accuracy"], 3)) for h in row["history"]]
