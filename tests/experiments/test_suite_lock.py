"""One ``experiment`` per suite folder: a second run on the ``out_dir`` of a running suite is refused with one line and
a non-zero exit and touches nothing; a suite run with a failed cell exits non-zero."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid_attention.config.schema import ConfigError
from hybrid_attention.experiments import load_suite, run_suite
from hybrid_attention.experiments import runner as runner_mod
from hybrid_attention.experiments.cli import main
from hybrid_attention.training.run_lock import LOCK_NAME

ROOT = Path(__file__).resolve().parents[2]
SUITE = str(ROOT / "configs" / "experiments" / "interdomain_vs_s4d.yaml")
ONE_CELL = ["profile=cpu", "base.data.seq_len=32", "base.data.val_tokens=512", "base.data.max_bytes=1000000",
            "base.train.batch_size=4", "eval.length_tokens=512", "eval.length_multipliers=[1]", "seeds=[0]",
            "cells=[{name: softmax, overrides: {model: {layers: softmax}}}, "
            "{name: s4d, overrides: {model: {layers: s4d}}}]", "reference=softmax"]
REPORT = ("results.md", "results.json", "ppl_bars.png")


def _tree(root: Path) -> list:
    """(path, bytes, mtime) of every entry under ``root``."""
    out = []
    for p in sorted(root.rglob("*")):
        data = p.read_bytes() if p.is_file() else b""
        out.append((str(p.relative_to(root)), data, p.lstat().st_mtime_ns))
    return out


def test_a_second_run_on_a_running_suite_is_refused_and_touches_nothing(tmp_path, capsys):
    out = tmp_path / "suite"
    out.mkdir()
    for name in REPORT:  # the report of an earlier session of the suite
        (out / name).write_text(f"earlier {name}\n")
    first = subprocess.Popen([sys.executable, "-m", "hybrid_attention.experiments", SUITE, *ONE_CELL,
                              "base.train.steps=100000", f"out_dir={out}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        live = out / "cells" / "softmax" / "seed0"
        deadline = time.monotonic() + 120
        while not (live / "metrics.jsonl").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first.poll() is None and (live / "metrics.jsonl").exists(), "the first run did not start training"
        report = {name: (out / name).read_bytes() for name in REPORT}
        capsys.readouterr()
        for extra in ([], ["--report-only"], ["--only", "s4d"]):
            assert main([SUITE, *ONE_CELL, "base.train.steps=2", f"out_dir={out}", *extra]) == 2
            err = capsys.readouterr().err.strip()
            assert "\n" not in err and f"out_dir = '{out}' is in use by another experiment process (PID " \
                f"{first.pid})" in err, err
        assert not (live / "error.txt").exists() and not (out / "cells" / "s4d").exists()
        assert {name: (out / name).read_bytes() for name in REPORT} == report
        assert first.poll() is None  # the first run trains on
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)


def test_the_suite_lock_is_refused_in_run_suite_and_freed_after(tmp_path):
    out = tmp_path / "suite"
    suite = load_suite(SUITE, [*ONE_CELL, f"out_dir={out}"])
    with runner_mod.suite_lock(suite):
        before = _tree(out)
        with pytest.raises(ConfigError, match="is in use by another experiment process"):
            run_suite(suite, log=lambda *_: None)
        assert _tree(out) == before
    assert not (out / LOCK_NAME).exists()  # a lock that only created the folder leaves it as it found it


def test_a_failed_cell_makes_the_suite_exit_non_zero(tmp_path, capsys, monkeypatch):
    def broken(suite, cell, seed, run_dir, cache, log):
        if cell.name == "s4d":
            raise RuntimeError("broken cell")
        return real(suite, cell, seed, run_dir, cache, log)

    real = runner_mod._train_lm
    monkeypatch.setattr(runner_mod, "_train_lm", broken)
    out = tmp_path / "suite"
    for extra in ([], ["--only", "s4d"]):
        capsys.readouterr()
        assert main([SUITE, *ONE_CELL, "base.train.steps=2", f"out_dir={out}", *extra]) == 1
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: 1 run(s) failed: s4d seed 0"), captured.err
        assert "Failed (error.txt in these run directories): cells/s4d/seed0" in captured.out  # the report
    assert (out / "cells" / "softmax" / "seed0" / "result.json").exists()
    assert main([SUITE, *ONE_CELL, f"out_dir={out}", "--report-only"]) == 0  # reporting is not a failed run
