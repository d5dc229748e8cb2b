"""Folders written by a newer version of the library: a ``manifest.json`` version above ``MANIFEST_VERSION`` or a
``config.json`` ``config_revision`` above ``CONFIG_REVISION`` is refused with one line on every load route (the
commands, the Python loaders, transformers' Auto classes) and never reported verified."""

import json
import shutil

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from hybrid_attention.checkpoints.integrity import (
    MANIFEST_VERSION,
    CheckpointDamaged,
    NewerFormat,
    write_manifest,
)
from hybrid_attention.cli import main
from hybrid_attention.evaluation.loading import load_model
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.models.configuration import CONFIG_REVISION

STEP = "step-00000006"
COMMANDS = [
    ["info", "{dir}"],
    ["generate", "--checkpoint", "{dir}", "--prompt", "x", "--max-new-tokens", "2"],
    ["eval", "ppl", "--checkpoint", "{dir}", "--tokens", "64", "--device", "cpu"],
    ["eval", "length", "--checkpoint", "{dir}", "--tokens", "64", "--multipliers", "1", "--device", "cpu"],
]


def _set(path, **fields):
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))


def _refused(capsys, argv, folder):
    capsys.readouterr()
    rc = main([a.format(dir=folder) for a in argv])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), (rc, out, err)
    assert "verified" not in out
    return lines[0]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:2]))
@pytest.mark.parametrize("where", ["run", "final"])
def test_newer_manifest_in_final_is_refused(run, capsys, argv, where):
    _set(run / "final" / "manifest.json", version=MANIFEST_VERSION + 98)
    line = _refused(capsys, argv, run if where == "run" else run / "final")
    assert f"final/manifest.json: version {MANIFEST_VERSION + 98}, written by a newer version" in line


@pytest.mark.parametrize("where", ["run", "step"])
def test_newer_manifest_in_a_checkpoint_is_refused(run, capsys, where):
    shutil.rmtree(run / "final")
    _set(run / "checkpoints" / STEP / "manifest.json", version=99)
    line = _refused(capsys, ["info", "{dir}"], run if where == "run" else run / "checkpoints" / STEP)
    assert f"{STEP}/manifest.json: version 99, written by a newer version" in line
    assert (run / "checkpoints" / STEP).is_dir()  # not moved aside: a newer checkpoint is not damage


@pytest.mark.parametrize("argv", COMMANDS[:3], ids=lambda a: " ".join(a[:2]))
def test_newer_config_revision_is_refused(run, capsys, argv):
    final = run / "final"
    _set(final / "config.json", config_revision=CONFIG_REVISION + 98)
    write_manifest(final, kind="final")  # signed: the sizes and checksums match, the revision still refuses
    line = _refused(capsys, argv, run)
    assert f"config_revision {CONFIG_REVISION + 98}, written by a newer version" in line


def test_python_routes_refuse_newer_folders(run):
    final = run / "final"
    _set(final / "config.json", config_revision=99)
    write_manifest(final, kind="final")
    for load in (AutoConfig.from_pretrained, AutoModelForCausalLM.from_pretrained, HybridConfig.from_pretrained,
                 HybridForCausalLM.from_pretrained, load_model):
        with pytest.raises(ValueError, match="config_revision 99, written by a newer version"):
            load(final)
    _set(final / "config.json", config_revision=CONFIG_REVISION)
    write_manifest(final, kind="final")
    _set(final / "manifest.json", version=99)
    for load in (AutoModelForCausalLM.from_pretrained, HybridForCausalLM.from_pretrained, load_model):
        with pytest.raises(NewerFormat, match="manifest.json: version 99, written by a newer version"):
            load(final)


@pytest.mark.parametrize("value", ["1", True, 0, -3, 1.5, None])
def test_a_manifest_version_that_is_not_a_version_is_damage(run, value):
    _set(run / "final" / "manifest.json", version=value)
    with pytest.raises(CheckpointDamaged, match=r"manifest.json: version .*expected a positive integer"):
        load_model(run / "final")


@pytest.mark.parametrize("value", ["1", True, -1, 1.5])
def test_a_config_revision_that_is_not_a_revision_is_refused(value):
    with pytest.raises(ValueError, match="config_revision must be an integer"):
        HybridConfig.from_preset("tiny", config_revision=value)
