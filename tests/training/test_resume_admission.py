"""A resume reads its checkpoints and tokenizer only through ``model_folder``'s check (no code, no pickles, no link),
refuses with one line and writes nothing, and warns about a checkpoint without a manifest in the load side's words."""

from __future__ import annotations

import json
import shutil

import pytest
from training_helpers import tiny_overrides

from hybrid_attention.checkpoints import step_checkpoints as checkpoint
from hybrid_attention.checkpoints.model_folder import unverified_warning
from hybrid_attention.cli import main
from hybrid_attention.data.tokenizer import byte_tokenizer, train_bpe_tokenizer
from hybrid_attention.training.run_lock import LOCK_NAME

STEP = "step-00000002"


def _tree(root):
    """(path, bytes, mtime) of every entry under ``root`` and of ``root`` itself, the lock file aside (it holds the
    PID of the last process that took it)."""
    out = [(".", b"", root.stat().st_mtime_ns)]
    for p in sorted(root.rglob("*")):
        if p.name == LOCK_NAME:
            continue
        data = p.read_bytes() if p.is_file() and not p.is_symlink() else b""
        out.append((str(p.relative_to(root)), data, p.lstat().st_mtime_ns))
    return out


def _cfg(out) -> str:
    """An empty config file beside the run folder (every setting comes from the overrides)."""
    cfg = out.parent / "empty.yaml"
    cfg.touch()
    return str(cfg)


def _args(out, *extra):
    return ["train", _cfg(out), *tiny_overrides(out, "train.steps=4", "train.checkpoint_every=1",
                                                "train.keep_checkpoints=1", "train.save_final=false", *extra)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A two-step run (checkpoints step-1 and step-2 kept) that every test copies."""
    base = tmp_path_factory.mktemp("finished")
    out = base / "run"
    assert main(["train", _cfg(out), *tiny_overrides(out, "train.steps=2", "train.checkpoint_every=1",
                                              "train.save_final=false")]) == 0
    return out


@pytest.fixture
def run(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out, symlinks=True)
    return out


def _refused(out, capsys, *extra) -> str:
    before = _tree(out)
    capsys.readouterr()
    assert main([*_args(out, *extra), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert _tree(out) == before
    return err


def test_planted_code_in_a_checkpoint_is_refused_on_resume(run, capsys):
    (run / "checkpoints" / STEP / "hook.py").write_text("raise SystemExit('imported')\n")
    err = _refused(run, capsys)
    assert f"{STEP}/hook.py: a model folder holds no code" in err


def test_pickle_in_a_checkpoint_is_refused_on_resume(run, capsys):
    (run / "checkpoints" / STEP / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    err = _refused(run, capsys)
    assert f"{STEP}/pytorch_model.bin: a pickled weight file" in err


def test_auto_map_in_a_checkpoint_is_refused_on_resume(run, capsys):
    (run / "checkpoints" / STEP / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "hook.Model"}}))
    err = _refused(run, capsys)
    assert f"{STEP}/config.json: field 'auto_map' names code to import" in err


def test_auto_map_in_the_run_tokenizer_is_refused_on_resume(run, capsys):
    cfg_path = run / "tokenizer" / "tokenizer_config.json"
    doc = json.loads(cfg_path.read_text())
    doc["auto_map"] = {"AutoTokenizer": ["hook.Tok", None]}
    cfg_path.write_text(json.dumps(doc))
    err = _refused(run, capsys)
    assert "tokenizer/tokenizer_config.json: field 'auto_map' names code to import" in err


def test_nested_link_in_a_checkpoint_is_refused_and_nothing_rotated(run, capsys, tmp_path):
    """A link one folder down in a checkpoint: the rotation/deletion check walks the whole checkpoint, as the load
    check does (both are ``model_folder.refuse_links``)."""
    precious = tmp_path / "precious.txt"
    precious.write_text("keep\n")
    sub = run / "checkpoints" / STEP / "extra"
    sub.mkdir()
    (sub / "notes.txt").symlink_to(precious)
    err = _refused(run, capsys)
    assert f"{STEP}/extra/notes.txt is a symbolic link" in err
    assert precious.read_text() == "keep\n"
    assert not hasattr(checkpoint, "refuse_symlinks")  # one implementation of the symlink test


def test_missing_tokenizer_with_another_vocabulary_writes_nothing(tmp_path, capsys):
    """tokenizer/ deleted and the configured tokenizer folder now holds another vocabulary (the config is unchanged,
    so the binding-field check passes): the vocabulary check refuses before tokenizer/ is written again."""
    tok_dir = tmp_path / "tok"
    byte_tokenizer().save_pretrained(str(tok_dir))
    out = tmp_path / "run"
    assert main(["train", _cfg(out), *tiny_overrides(out, f"data.tokenizer={tok_dir}", "train.steps=2",
                                              "train.save_final=false")]) == 0
    shutil.rmtree(out / "tokenizer")
    shutil.rmtree(tok_dir)
    bpe = train_bpe_tokenizer(["the quick brown fox jumps over the lazy dog " * 50] * 20, 300)
    bpe.save_pretrained(str(tok_dir))
    assert len(bpe) != len(byte_tokenizer())
    err = _refused(out, capsys, f"data.tokenizer={tok_dir}")
    assert "has vocab_size" in err and "resume with the run's own tokenizer" in err
    assert not (out / "tokenizer").exists()


def test_unverified_checkpoint_warns_in_the_load_side_words(run, capsys):
    (run / "checkpoints" / STEP / "manifest.json").unlink()
    capsys.readouterr()
    assert main([*_args(run, "train.steps=3"), "--resume"]) == 0
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).splitlines()
    assert unverified_warning(run / "checkpoints" / STEP) in lines
    assert not any("older version" in line for line in lines)


@pytest.mark.parametrize("where", [STEP, "step-00000001"])
def test_a_checkpoint_of_a_newer_version_is_refused_on_resume(run, capsys, where):
    """Not damage to fall back past: the resume is refused, nothing is moved aside or rotated."""
    manifest = run / "checkpoints" / where / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "version": 99}))
    err = _refused(run, capsys)
    assert f"{where}/manifest.json: version 99, written by a newer version of hybrid_attention" in err


@pytest.mark.parametrize("name, field", [("manifest.json", "version"), ("config.json", "config_revision")])
def test_a_final_model_of_a_newer_version_is_refused_on_resume(run, capsys, name, field):
    """A resume would replace final/ at its end: a final/ written by a newer version is refused before anything."""
    (run / "final").mkdir()
    (run / "final" / name).write_text(json.dumps({"format": "hybrid-attention-manifest", field: 99, "files": {}}))
    err = _refused(run, capsys)
    assert f"final/{name}: {field} 99, written by a newer version of hybrid_attention" in err
