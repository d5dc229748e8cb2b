"""Damaged or mismatched model folders: eval, generate and info stop with one ``error:`` line naming the problem."""

import json
import shutil

import pytest

from hybrid_attention.checkpoints.integrity import CheckpointDamaged, CheckpointError, CheckpointMismatch
from hybrid_attention.cli import main
from hybrid_attention.data.tokenizer import byte_tokenizer
from hybrid_attention.evaluation.loading import load_model


def _truncate(p):
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _flip(p, offset=-5):
    b = bytearray(p.read_bytes())
    b[offset] ^= 0xFF
    p.write_bytes(bytes(b))


def _one_error_line(capsys):
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_final_has_a_manifest_and_loads(run):
    doc = json.loads((run / "final" / "manifest.json").read_text())
    assert doc["kind"] == "final" and {"config.json", "model.safetensors"} <= set(doc["files"])
    assert load_model(run).source.name == "final"


@pytest.mark.parametrize("name, damage, check", [
    ("model.safetensors", _truncate, "size"),
    ("model.safetensors", _flip, "sha256 mismatch"),
    ("config.json", _truncate, "size"),
    ("config.json", lambda p: p.unlink(), "missing"),
])
def test_damaged_final_is_one_error(run, name, damage, check):
    damage(run / "final" / name)
    with pytest.raises(CheckpointDamaged) as e:
        load_model(run)
    msg = str(e.value)
    assert "\n" not in msg and f"final is damaged: {name}: {check}" in msg and "--checkpoint" in msg


@pytest.mark.parametrize("name, damage", [("model.safetensors", _truncate), ("config.json", _truncate),
                                          ("model.safetensors", lambda p: p.write_bytes(b""))])
def test_damaged_final_without_manifest_is_still_one_error(run, name, damage):
    (run / "final" / "manifest.json").unlink()
    damage(run / "final" / name)
    with pytest.raises(CheckpointError) as e:
        load_model(run / "final")
    assert "\n" not in str(e.value) and "cannot load the model" in str(e.value)


def test_damaged_checkpoint_dir_is_one_error(run):
    ckpt = run / "checkpoints" / "step-00000006"
    _flip(ckpt / "model.safetensors")
    with pytest.raises(CheckpointDamaged, match=r"step-00000006 is damaged: model.safetensors: sha256 mismatch"):
        load_model(ckpt)
    _flip(ckpt / "optimizer.safetensors")  # evaluation needs only the model file
    _flip(ckpt / "model.safetensors")
    assert load_model(ckpt).source == ckpt


def test_run_without_final_uses_the_newest_intact_checkpoint(run):
    shutil.rmtree(run / "final")
    newer = run / "checkpoints" / "step-00000007"
    shutil.copytree(run / "checkpoints" / "step-00000006", newer)
    _truncate(newer / "model.safetensors")
    notes = []
    loaded = load_model(run, log=notes.append)
    assert loaded.source.name == "step-00000006"
    assert len(notes) == 1 and "step-00000007 (model.safetensors: size" in notes[0]


def _bigger_tokenizer(d):
    tok = byte_tokenizer()
    tok.add_tokens(["foo", "bar"])
    tok.save_pretrained(str(d))


@pytest.mark.parametrize("where", ["final", "checkpoint"])
def test_tokenizer_that_does_not_fit_is_one_line(run, where):
    (run / "final" / "manifest.json").unlink()  # with it, the swapped files are reported as changed (tested above)
    _bigger_tokenizer(run / "final")
    _bigger_tokenizer(run / "tokenizer")
    target = run if where == "final" else run / "checkpoints" / "step-00000006"
    with pytest.raises(CheckpointMismatch) as e:
        load_model(target)
    msg = str(e.value)
    assert "\n" not in msg and "261 tokens" in msg and "vocab_size 259" in msg


@pytest.mark.parametrize("argv", [
    ["info", "{dir}"],
    ["generate", "--checkpoint", "{dir}", "--prompt", "x", "--max-new-tokens", "2", "--device", "cpu"],
    ["eval", "ppl", "--checkpoint", "{dir}", "--device", "cpu", "--tokens", "256"],
])
def test_cli_prints_one_line_for_damaged_and_mismatched_folders(run, capsys, argv):
    (run / "final" / "config.json").write_text("{")
    capsys.readouterr()
    assert main([a.format(dir=run) for a in argv]) == 2
    assert "final is damaged: config.json" in _one_error_line(capsys)
    ckpt = run / "checkpoints" / "step-00000006"
    _bigger_tokenizer(run / "tokenizer")
    assert main([a.format(dir=ckpt) for a in argv]) == 2
    line = _one_error_line(capsys)
    assert "261 tokens" in line and "vocab_size 259" in line
