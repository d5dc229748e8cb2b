"""GPU-only commands on a machine without CUDA: one ``error:`` line and a non-zero exit before any work, unless
``--dryrun`` asks for the CPU smoke run (tiny shapes), which is passed on to every section."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import benchmarks
from hybrid_attention.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ran = []
    monkeypatch.setattr(benchmarks, "run_target", lambda target, only, argv: ran.append((target, only, argv)))
    return ran


@pytest.mark.parametrize("argv", [["bench", "ops"], ["bench", "models"], ["bench", "inference"],
                                  ["bench", "train", "--quick"], ["bench", "ops", "--only", "natsl"]])
def test_bench_without_cuda_is_one_line(no_cuda, capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: bench {argv[1]}: needs a CUDA GPU") and "--dryrun" in err and err.count("\n") == 1
    assert no_cuda == []  # nothing ran


def test_bench_dryrun_runs_on_the_cpu(no_cuda, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter already on: the sections run in this process
    assert main(["bench", "train", "--quick", "--dryrun"]) == 0
    assert no_cuda == [("train", None, ["--quick", "--dryrun"])]


def test_bench_dryrun_switches_the_interpreter_on_in_a_new_process(no_cuda, monkeypatch):
    # the kernels were defined when hybrid_attention was imported, so the dry run runs again with TRITON_INTERPRET=1
    import subprocess

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ran = []

    def child(cmd, env):
        ran.append((cmd, env))
        return subprocess.CompletedProcess(cmd, 3)

    monkeypatch.setattr(subprocess, "run", child)
    assert main(["bench", "ops", "--only", "natsl", "s4d_bilinear", "--dryrun", "--quick"]) == 3  # the child's status
    ((cmd, env),) = ran
    assert cmd == [sys.executable, "-m", "hybrid_attention.cli", "bench", "ops", "--only", "natsl", "s4d_bilinear",
                   "--quick", "--dryrun"]
    assert env["TRITON_INTERPRET"] == "1" and str(ROOT) in env["PYTHONPATH"].split(os.pathsep)
    assert no_cuda == []  # nothing ran in this process


def test_bench_dryrun_without_triton_is_one_line(no_cuda, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton fails, as where it is not installed
    assert main(["bench", "ops", "--dryrun"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: bench ops --dryrun: needs the triton package (its interpreter runs the kernels on the CPU): "
                   "pip install triton (or the `test` / `gpu` extra)\n")
    assert no_cuda == []


def test_a_failed_section_makes_the_exit_status_non_zero(monkeypatch, capsys, tmp_path):
    # the real s4d_bilinear dry run with its correctness section broken: the other section still runs, the command
    # ends with one line naming the failed section and status 1, and a dry run leaves no JSON in the working folder
    from benchmarks import s4d_bilinear_ops

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.chdir(tmp_path)

    def broken(*args, **kwargs):
        raise RuntimeError("kernel launch failed")

    monkeypatch.setattr(s4d_bilinear_ops, "correctness", broken)
    assert main(["bench", "ops", "--only", "s4d_bilinear", "--dryrun", "--quick"]) == 1
    out, err = capsys.readouterr()
    assert "[s4d_bilinear correctness] FAILED: RuntimeError('kernel launch failed')" in out
    assert "s4d_bilinear timing" in out  # the next section ran
    assert err.splitlines()[-1] == ("error: bench ops: 1 section(s) failed: s4d_bilinear (their errors are printed "
                                    "above)")
    assert list(tmp_path.iterdir()) == []


def test_bench_bad_section_is_reported_before_the_device(no_cuda, capsys):
    assert main(["bench", "ops", "--only", "bogus"]) == 2
    assert "accepts" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["models", "interdomain_ops", "natsl_ops", "s4d_bilinear_ops", "train_speed",
                                    "decode_attention_ops", "causal_conv"])
def test_bench_scripts_without_cuda_exit_with_one_line(monkeypatch, module):
    import importlib

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("BENCH_DRYRUN", raising=False)
    mod = importlib.import_module(f"benchmarks.{module}")
    with pytest.raises(SystemExit, match="needs a CUDA GPU.*--dryrun"):
        mod.main([])
