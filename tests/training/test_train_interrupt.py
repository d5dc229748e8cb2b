"""Ctrl-C during training or a save: one line naming the last saved step and the resume command, exit 130, and no
partial checkpoint on disk."""

from __future__ import annotations

import shlex
import signal
import subprocess
import time

from training_helpers import cli_cmd, cli_env, tiny_overrides

from hybrid_attention.checkpoints import step_checkpoints as checkpoint_module
from hybrid_attention.cli import main


def test_sigint_during_training(tmp_path):
    out, cfg = tmp_path / "run", tmp_path / "empty.yaml"
    cfg.write_text("")
    overrides = tiny_overrides(out, "train.steps=1000000", "train.checkpoint_every=3", "train.save_final=false")
    # the default Ctrl-C disposition in the child: a test process started in the background of a non-interactive
    # shell ignores SIGINT, and an ignored signal stays ignored across exec
    proc = subprocess.Popen(cli_cmd("train", str(cfg), *overrides), env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 180
    while not (out / "checkpoints" / "step-00000003").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    last = sorted(p.name for p in (out / "checkpoints").iterdir())[-1]
    step = int(last.split("-")[1])
    assert line.startswith(f"interrupted: the last saved checkpoint is {last} (step {step}) in {out}")
    assert line.endswith(shlex.join(["hybrid-attention", "train", str(cfg), *overrides, "--resume"]))
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]
    # the named command resumes from that step (here with fewer steps, a safe change)
    resume = shlex.split(line.split("resume with: ", 1)[1])[2:]
    resume[resume.index("train.steps=1000000")] = f"train.steps={step + 1}"
    assert main(["train", *resume]) == 0
    assert (out / "checkpoints" / f"step-{step + 1:08d}").is_dir()


def test_interrupt_during_a_save_leaves_no_partial_checkpoint(tmp_path, capsys, monkeypatch):
    out, cfg = tmp_path / "run", tmp_path / "empty.yaml"
    cfg.write_text("")
    real_save = checkpoint_module.save_file
    calls = []

    def save_then_interrupt(tensors, path, *args, **kwargs):
        calls.append(path)
        if "step-00000004" in str(path) and path.endswith("model.safetensors"):
            real_save(tensors, path, *args, **kwargs)  # half the checkpoint is on disk, then Ctrl-C
            raise KeyboardInterrupt
        return real_save(tensors, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "save_file", save_then_interrupt)
    assert main(["train", str(cfg), *tiny_overrides(out, "train.steps=8", "train.checkpoint_every=2",
                                                    "train.save_final=false")]) == 130
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1].startswith("interrupted: the last saved checkpoint is step-00000002 (step 2)")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000002"]


def test_interrupt_before_any_checkpoint(tmp_path, capsys, monkeypatch):
    from hybrid_attention.training import trainer as trainer_module

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module.Trainer, "train_step", interrupt)
    out, cfg = tmp_path / "run", tmp_path / "empty.yaml"
    cfg.write_text("")
    assert main(["train", str(cfg), *tiny_overrides(out, "train.steps=3")]) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"interrupted: no checkpoint was saved in {out}; resume with: hybrid-attention train")


def test_interrupt_while_reading_the_config(tmp_path, capsys, monkeypatch):
    from hybrid_attention.config import run_config as config_module

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(config_module, "load_config", interrupt)
    assert main(["train", "x.yaml"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"
