"""``--resume`` keeps every field that changes the model or its data, and a refused resume writes nothing."""

from __future__ import annotations

import dataclasses

import pytest
from training_helpers import tiny_overrides

from hybrid_attention.cli import main
from hybrid_attention.config.run_config import RunConfig
from hybrid_attention.training.resume_fields import BINDING, SAFE, resume_changes


def _snapshot(root):
    return {p.relative_to(root): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def _train(out, *extra: str, resume: bool = False) -> int:
    cfg = out.parent / "empty.yaml"
    cfg.write_text("")
    return main(["train", str(cfg), *tiny_overrides(out, "train.save_final=false", *extra),
                 *(["--resume"] if resume else [])])


def test_every_config_field_is_classified_once():
    fields = {f"{s.name}.{f.name}" for s in dataclasses.fields(RunConfig)
              for f in dataclasses.fields(s.default_factory())}
    assert fields == BINDING | SAFE
    assert not BINDING & SAFE


def test_changes_split_into_binding_and_safe():
    old = {"model": {"options": {"readout": "a"}}, "train": {"steps": 2}}
    new = {"model": {"options": {"readout": "b"}}, "train": {"steps": 4}}
    binding, safe = resume_changes(old, new)
    assert binding == ["model.options: {'readout': 'a'} -> {'readout': 'b'}"]
    assert safe == ["train.steps: 2 -> 4"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    assert _train(out, "train.steps=2") == 0
    return out


@pytest.mark.parametrize("change", [
    "model.options={hidden_size: 32, num_heads: 2, head_dim: 16, state_size: 8, chunk_size: 16}",
    "data.tokenizer=bpe",
    "data.seq_len=16",
    "data.val_fraction=0.3",
    "train.seed=1",
])
def test_binding_change_refused_and_nothing_written(trained_run, capsys, change):
    before = _snapshot(trained_run)
    capsys.readouterr()
    assert _train(trained_run, "train.steps=3", change, resume=True) == 2
    err = capsys.readouterr().err.strip()
    key = change.split("=")[0]
    assert err.startswith("error: config error: --resume") and key in err and "\n" not in err
    assert "train.steps" not in err  # a safe field is not listed as a reason
    assert _snapshot(trained_run) == before


def test_safe_change_applied_and_listed(tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(out, "train.steps=2") == 0
    capsys.readouterr()
    assert _train(out, "train.steps=3", "train.log_every=2", resume=True) == 0
    text = capsys.readouterr()
    notes = [ln for ln in (text.out + text.err).splitlines() if ln.startswith("note: resuming with changed settings")]
    assert len(notes) == 1 and "train.steps: 2 -> 3" in notes[0] and "train.log_every: 1 -> 2" in notes[0]
    assert (out / "checkpoints" / "step-00000003").is_dir()


@pytest.mark.parametrize("edit", ["delete", "rewrite"])
def test_checkpoint_config_binds_when_config_yaml_is_gone_or_edited(tmp_path, capsys, edit):
    out = tmp_path / "run"
    assert _train(out, "train.steps=1") == 0
    change = "data.seq_len=16"
    if edit == "delete":
        (out / "config.yaml").unlink()
    else:
        (out / "config.yaml").write_text((out / "config.yaml").read_text().replace("seq_len: 32", "seq_len: 16"))
    capsys.readouterr()
    assert _train(out, "train.steps=2", change, resume=True) == 2
    err = capsys.readouterr().err.strip()
    assert "data.seq_len: 32 -> 16" in err and "trainer_state.json" in err and "\n" not in err
