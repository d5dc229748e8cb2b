"""Every command-line error is one ``error: ...`` line on stderr with exit status 2; ``--debug`` shows the traceback."""

import pytest
import torch

from hybrid_attention.cli import CLIError, main
from hybrid_attention.config.schema import ConfigError

GEN = ["generate", "--checkpoint", "/nonexistent/run"]  # arguments are checked before the model is loaded


def _one_line_error(capsys, argv, status=2) -> str:
    assert main(argv) == status
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err + captured.out
    return err


@pytest.mark.parametrize("args, pattern", [
    (["--max-new-tokens", "0"], "--max-new-tokens: must be >= 1, got 0"),
    (["--max-new-tokens", "-5"], "--max-new-tokens: must be >= 1, got -5"),
    (["--max-new-tokens", "ten"], "--max-new-tokens: 'ten' is not an integer"),
    (["--temperature", "0"], "--temperature 0: must be > 0 for sampling (or pass --greedy)"),
    (["--temperature", "-1"], "--temperature -1: must be > 0"),
    (["--temperature", "nan"], "--temperature: must be a finite number"),
    (["--top-p", "2"], "--top-p: must be <= 1, got 2"),
    (["--top-p", "0"], "--top-p: must be > 0, got 0"),
    (["--top-k", "-1"], "--top-k: must be >= 0, got -1"),
])
def test_bad_generate_arguments(capsys, args, pattern):
    assert pattern in _one_line_error(capsys, [*GEN, *args])


def test_greedy_needs_no_temperature(capsys):
    # --temperature 0 is fine with --greedy: the next error is the missing checkpoint, not the temperature
    err = _one_line_error(capsys, [*GEN, "--greedy", "--temperature", "0"])
    assert "temperature" not in err and "no such checkpoint" in err


@pytest.mark.parametrize("argv, pattern", [
    (["demo", "--minutes", "0"], "--minutes: must be > 0"),
    (["demo", "--minutes", "inf"], "--minutes: must be a finite number"),
    (["demo", "--seq-len", "0"], "--seq-len: must be >= 1"),
    (["demo", "--batch-size", "-2"], "--batch-size: must be >= 1"),
    (["eval", "length", "--checkpoint", "x", "--multipliers", "1", "0"], "--multipliers: must be >= 1"),
    (["eval", "passkey", "--checkpoint", "x", "--depths", "1.5"], "--depths: must be <= 1"),
    (["eval", "passkey", "--checkpoint", "x", "--trials", "0"], "--trials: must be >= 1"),
    (["eval", "passkey"], "eval passkey needs --checkpoint DIR"),
    (["info", "x", "--seq-lens", "0"], "--seq-lens: must be >= 1"),
    (["info"], "the following arguments are required: dir"),
    (["train"], "the following arguments are required: config"),
    (["nonsense"], "invalid choice: 'nonsense'"),
    (["train", "/nonexistent.yaml"], "cannot read /nonexistent.yaml"),
])
def test_other_bad_arguments(capsys, argv, pattern):
    assert pattern in _one_line_error(capsys, argv)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("argv", [
    ["eval", "ppl", "--checkpoint", "/nonexistent/run", "--device", "cuda"],
    ["eval", "passkey", "--checkpoint", "/nonexistent/run", "--device", "cuda"],
    [*GEN, "--device", "cuda"],
    ["demo", "--device", "cuda"],
])
def test_device_cuda_without_cuda_names_the_flag(capsys, no_cuda, argv):
    err = _one_line_error(capsys, argv)
    assert err == "error: --device cuda: CUDA is not available on this machine; use --device cpu\n"


def test_train_device_cuda_without_cuda_names_the_override_or_the_file(capsys, no_cuda, tmp_path):
    from pathlib import Path

    config = str(Path(__file__).resolve().parents[1] / "configs" / "tiny_cpu.yaml")
    err = _one_line_error(capsys, ["train", config, "train.device=cuda", f"train.out_dir={tmp_path}"])
    assert err.startswith("error: train.device=cuda: CUDA is not available on this machine; use train.device=cpu")
    (tmp_path / "gpu.yaml").write_text("train: {device: cuda}\n")
    err = _one_line_error(capsys, ["train", str(tmp_path / "gpu.yaml")])
    assert f"train.device: cuda in {tmp_path / 'gpu.yaml'}: CUDA is not available" in err
    assert not any(tmp_path.glob("**/config.yaml"))  # nothing was started


def test_run_demo_checks_the_device_too(no_cuda):
    from hybrid_attention.training.demo import DemoOptions, run_demo

    with pytest.raises(ConfigError, match="--device cuda: CUDA is not available"):
        run_demo(DemoOptions(device="cuda"))


def test_demo_unknown_mixer(capsys):
    err = _one_line_error(capsys, ["demo", "--mixers", "softmax", "softmx", "--device", "cpu"])
    assert "--mixers softmx: not a demo mixer; allowed values: softmax, interdomain, s4d" in err


def test_demo_unknown_preset(capsys):
    assert "--preset huge: not a preset; allowed values:" in _one_line_error(capsys, ["demo", "--preset", "huge"])


def test_config_errors_through_the_cli(capsys, tmp_path):
    (tmp_path / "dup.yaml").write_text("train: {steps: 3}\ntrain: {steps: 4}\n")
    assert "duplicate key 'train'" in _one_line_error(capsys, ["train", str(tmp_path / "dup.yaml")])
    (tmp_path / "ok.yaml").write_text("train: {steps: 3}\n")
    assert "optim.lr = nan is not a finite number" in _one_line_error(capsys, ["train", str(tmp_path / "ok.yaml"),
                                                                               "optim.lr=.nan"])
    assert "is not valid YAML" in _one_line_error(capsys, ["train", str(tmp_path / "ok.yaml"), "model.layers=[a"])
    (tmp_path / "mqar.yaml").write_text("- a\n")
    assert "top level must be a mapping" in _one_line_error(capsys, ["eval", "mqar", "--config",
                                                                     str(tmp_path / "mqar.yaml")])


@pytest.mark.parametrize("argv", [["--debug", *GEN, "--top-p", "2"], [*GEN, "--top-p", "2", "--debug"],
                                  ["--debug", *GEN, "--temperature", "0"]])
def test_debug_shows_the_traceback(argv):
    with pytest.raises(CLIError, match="top-p|temperature"):
        main(argv)


def test_debug_shows_the_traceback_of_config_errors(tmp_path):
    (tmp_path / "c.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        main(["train", str(tmp_path / "c.yaml"), "--debug"])


def test_debug_traceback_from_the_command_line(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-m", "hybrid_attention.cli", "--debug", *GEN, "--top-p", "2"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "Traceback (most recent call last)" in r.stderr and "CLIError" in r.stderr
    r = subprocess.run([sys.executable, "-m", "hybrid_attention.cli", *GEN, "--top-p", "2"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
