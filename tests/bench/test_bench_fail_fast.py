"""GPU-only commands on a machine without CUDA: one ``error:`` line and a non-zero exit before any work, unless
``--dryrun`` asks for the CPU smoke run (tiny shapes), which is passed on to every section."""

from __future__ import annotations

import pytest
import torch

import benchmarks
from hybrid_attention.cli import main


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
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert main(["bench", "train", "--quick", "--dryrun"]) == 0
    assert no_cuda == [("train", None, ["--quick", "--dryrun"])]
    import os

    assert os.environ["TRITON_INTERPRET"] == "1"


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
