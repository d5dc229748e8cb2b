"""``hybrid-attention bench`` as a user runs it: the console script finds the clone's benchmarks/ (its sys.path holds
neither the clone nor the working directory), and ``--dryrun`` from a plain shell (no ``TRITON_INTERPRET``) runs the
kernels under the interpreter, passes, and leaves no result file in the working directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybrid_attention.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_console_script_finds_the_benchmarks_of_its_clone(monkeypatch, tmp_path, capsys):
    # the console script's sys.path: the script's folder and site-packages, not the clone; run from another folder
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".") and Path(p).resolve() != ROOT])
    for name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "ops", "--only", "bogus"]) == 2
    err = capsys.readouterr().err  # the sections were found: the bad name is what is reported
    assert err.startswith("error: --only for 'ops' accepts [") and "'interdomain'" in err and "bogus" in err, err
    assert Path(sys.modules["benchmarks"].__file__).resolve() == ROOT / "benchmarks" / "__init__.py"


@pytest.mark.slow
def test_a_dryrun_from_a_plain_shell_passes_and_writes_nothing(tmp_path):
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "OUT", "BENCH_DRYRUN")}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "hybrid_attention.cli", "bench", "ops", "--only", "s4d_bilinear",
                           "--dryrun", "--quick"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "FAIL" not in out and "correctness B=2 T=   40 dot tf32 : PASS" in out, out[-3000:]
    assert list(tmp_path.iterdir()) == []  # no s4d_bilinear_gpu.json in the working directory
