"""The trainer's guards: resume falls back past damaged checkpoints, divergence never checkpoints non-finite state and
names the last finite checkpoint, write errors and data errors are one line and leave the run folder clean."""

import errno
import json
import math

import pytest
import torch
from training_helpers import tiny_config

import hybrid_attention.checkpoints.step_checkpoints as ckpt_mod
from hybrid_attention.checkpoints.step_checkpoints import (
    CheckpointError,
    CheckpointMismatch,
    checkpoint_dirs,
    read_checkpoint,
)
from hybrid_attention.cli import main
from hybrid_attention.config.run_config import save_config
from hybrid_attention.data import DataError
from hybrid_attention.data.tokenizer import byte_tokenizer
from hybrid_attention.training.distributed import init_distributed
from hybrid_attention.training.trainer import Trainer, TrainingDiverged, train

BASE = ("train.device=cpu", "train.checkpoint_every=2", "train.save_final=false")


def _cfg(out, *extra):
    return tiny_config(out, *BASE, *extra)


def _names(run):
    return [p.name for p in checkpoint_dirs(run / "checkpoints")]


def _all_finite(path):
    data = read_checkpoint(path)  # raises on NaN/inf in model or optimizer tensors
    return all(torch.isfinite(v).all() for v in data.model.values())


def _one_error_line(capsys):
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture
def run4(tmp_path):
    """A finished 4-step run with checkpoints at steps 2 and 4."""
    run = tmp_path / "run"
    train(_cfg(run, "train.steps=4", "train.keep_checkpoints=2"), quiet=True)
    assert _names(run) == ["step-00000002", "step-00000004"]
    return run


def _flip_last_byte(p):
    b = bytearray(p.read_bytes())
    b[-3] ^= 0xFF
    p.write_bytes(bytes(b))


@pytest.mark.parametrize("name, damage, check", [
    ("optimizer.safetensors", _flip_last_byte, "sha256 mismatch"),
    ("rng-rank0.safetensors", lambda p: p.unlink(), "missing"),
    ("trainer_state.json", lambda p: p.write_text(p.read_text()[:40]), "size"),
])
def test_resume_falls_back_to_the_newest_intact_checkpoint(run4, capsys, name, damage, check):
    damage(run4 / "checkpoints" / "step-00000004" / name)
    capsys.readouterr()
    res = train(_cfg(run4, "train.steps=6", "train.keep_checkpoints=2"), resume=True, quiet=True)
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("note: newest checkpoint damaged")]
    assert len(notes) == 1 and f"step-00000004 ({name}: {check}" in notes[0], out
    assert "falling back to step-00000002" in notes[0] and "damaged-step-00000004" in notes[0]
    assert "resumed from" in out and "at step 2" in out
    assert res.steps == 6 and _names(run4) == ["step-00000004", "step-00000006"]
    assert (run4 / "checkpoints" / "damaged-step-00000004" / "model.safetensors").exists()  # kept for inspection
    assert all(_all_finite(p) for p in checkpoint_dirs(run4 / "checkpoints"))


def test_all_checkpoints_damaged_is_one_error_line(run4, capsys):
    for p in checkpoint_dirs(run4 / "checkpoints"):
        (p / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint to resume from") as e:
        train(_cfg(run4, "train.steps=6"), resume=True, quiet=True)
    assert "\n" not in str(e.value) and "step-00000002 (model.safetensors: size 0 bytes" in str(e.value)
    cfg_file = run4.parent / "run.yaml"
    save_config(_cfg(run4, "train.steps=6"), cfg_file)
    capsys.readouterr()
    assert main(["train", str(cfg_file), "--resume"]) == 2
    assert "no intact checkpoint" in _one_error_line(capsys)


def _trainer(run, *extra):
    return Trainer(_cfg(run, *extra), init_distributed("cpu"), quiet=True)


def test_lr_inf_stops_at_once_and_keeps_the_last_finite_checkpoint(tmp_path):
    run = tmp_path / "run"
    tr = _trainer(run, "train.steps=10", "train.keep_checkpoints=1")
    for _ in range(4):
        tr.train_step()
    assert _names(run) == ["step-00000004"]
    for g in tr.optimizer.param_groups:  # what optim.lr=inf did (the config now refuses it)
        g["lr"] = math.inf
    tr.scheduler.base_lrs = [math.inf] * len(tr.scheduler.base_lrs)
    with pytest.raises(TrainingDiverged, match=r"step 5: the optimizer step \(lr inf\) made \d+ weight\(s\) "
                                               r"non-finite; the last finite checkpoint is .*step-00000004"):
        tr.train_step()
    with pytest.raises(TrainingDiverged, match="not written"):  # and nothing non-finite can be saved afterwards
        tr.checkpoint()
    assert _names(run) == ["step-00000004"] and _all_finite(run / "checkpoints" / "step-00000004")


def test_lr_1e6_dead_model_is_never_checkpointed_and_exits_1(run4, capsys):
    """lr=1e6: one finite step leaves huge (finite) weights, every later gradient is NaN; the checkpoints due during
    that streak are not written, so rotation (keep 1) cannot drop the last good one; the CLI exits 1 naming it."""
    cfg_file = run4.parent / "run.yaml"
    # the resumed run continues the 4-step schedule past its end at min_lr_ratio (0.1) x optim.lr: lr 1e6 from step 5
    save_config(_cfg(run4, "train.steps=20", "train.keep_checkpoints=1", "optim.lr=1e7", "train.max_nonfinite=3"),
                cfg_file)
    capsys.readouterr()
    assert main(["train", str(cfg_file), "--resume"]) == 1
    line = _one_error_line(capsys)
    assert "consecutive steps with a non-finite loss or gradient" in line
    assert "last finite checkpoint is" in line and "step-00000004" in line
    assert _names(run4) == ["step-00000002", "step-00000004"]  # nothing written, nothing rotated away
    assert _all_finite(run4 / "checkpoints" / "step-00000004")


def test_non_finite_optimizer_state_is_not_checkpointed(tmp_path):
    run = tmp_path / "run"
    tr = _trainer(run, "train.steps=10")
    tr.train_step()
    tr.train_step()  # checkpoint step-2
    state = next(iter(tr.optimizer.state.values()))
    state["exp_avg_sq"].fill_(math.inf)
    with pytest.raises(TrainingDiverged, match=r"0 weight\(s\) and \d+ optimizer state value\(s\) are non-finite, "
                                               r"so checkpoint step-00000002 was not written; the last finite "
                                               r"checkpoint is .*step-00000002"):
        tr.checkpoint()
    assert _all_finite(run / "checkpoints" / "step-00000002")


def test_disk_full_while_checkpointing_is_one_line(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    cfg_file = tmp_path / "run.yaml"
    save_config(_cfg(run, "train.steps=4"), cfg_file)
    real, calls = ckpt_mod.save_file, {"n": 0}

    def save_file(tensors, filename, *a, **k):
        if filename.endswith("optimizer.safetensors"):
            calls["n"] += 1
            if calls["n"] == 2:  # the second checkpoint, after its model file was written
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, filename, *a, **k)

    monkeypatch.setattr(ckpt_mod, "save_file", save_file)
    capsys.readouterr()
    assert main(["train", str(cfg_file)]) == 2
    line = _one_error_line(capsys)
    assert "could not write checkpoint step-00000004" in line and "No space left on device (ENOSPC)" in line
    assert "step-00000002 is intact" in line
    assert _names(run) == ["step-00000002"] and not list((run / "checkpoints").glob(".tmp-*"))
    assert _all_finite(run / "checkpoints" / "step-00000002")


def test_disk_full_while_saving_the_final_model(tmp_path, monkeypatch):
    from hybrid_attention.models import HybridForCausalLM

    run = tmp_path / "run"
    monkeypatch.setattr(HybridForCausalLM, "save_pretrained",
                        lambda self, *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(CheckpointError, match=r"could not write the final model .*No space left on device.*"
                                              r"partial copy was removed"):
        train(tiny_config(run, "train.device=cpu", "train.steps=2"), quiet=True)
    assert not (run / "final").exists() and not (run / ".tmp-final").exists()
    assert _names(run) == ["step-00000002"]


@pytest.mark.parametrize("extra", [
    ("data.source=local", "data.paths=[/nonexistent/corpus]"),
    ("data.tokenizer={tmp}/not_a_tokenizer",),  # a folder, but no tokenizer in it
    ("data.seq_len=100000",),
])
def test_a_data_error_leaves_nothing_in_the_run_folder(tmp_path, extra):
    run = tmp_path / "run"
    (tmp_path / "not_a_tokenizer").mkdir()
    extra = [x.format(tmp=tmp_path) for x in extra]
    with pytest.raises(DataError):
        train(tiny_config(run, "train.device=cpu", "train.steps=2", *extra), quiet=True)
    assert not run.exists()
    run.mkdir()  # an existing (empty) folder stays empty
    with pytest.raises(DataError):
        train(tiny_config(run, "train.device=cpu", "train.steps=2", *extra), quiet=True)
    assert list(run.iterdir()) == []


def test_resume_with_a_tokenizer_of_another_size_is_one_line(run4, capsys):
    tok = byte_tokenizer()
    tok.add_tokens(["foo", "bar"])
    tok.save_pretrained(str(run4 / "tokenizer"))
    config_before = (run4 / "config.yaml").read_text()
    with pytest.raises(CheckpointMismatch) as e:
        train(_cfg(run4, "train.steps=6"), resume=True, quiet=True)
    assert (run4 / "config.yaml").read_text() == config_before  # a failed resume leaves the run's config alone
    msg = str(e.value)
    assert "\n" not in msg and "vocab_size 259" in msg and "261 tokens" in msg
    metrics = [json.loads(x) for x in (run4 / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in metrics) == 4  # the failed resume did not touch the run's log
