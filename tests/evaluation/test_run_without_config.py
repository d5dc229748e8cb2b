"""A run folder without its ``config.yaml`` still loads (``final/`` is self-contained; a checkpoint carries its run
config), a refused ``final/`` names the checkpoint to load instead, and what cannot load says what is missing."""

import json
import re
import shutil

import pytest

from hybrid_attention.checkpoints.integrity import write_manifest
from hybrid_attention.cli import main
from hybrid_attention.evaluation.loading import load_model

STEP = "step-00000006"
PPL = ["eval", "ppl", "--checkpoint", "{dir}", "--tokens", "256", "--device", "cpu", "--json"]


def _cli(capsys, argv, folder):
    capsys.readouterr()
    rc = main([a.format(dir=folder) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, [line for line in err.splitlines() if line.strip()]


def test_run_without_config_yaml_loads_final_with_the_saved_run_config(run, capsys):
    rc, with_yaml, _ = _cli(capsys, PPL, run)
    assert rc == 0
    (run / "config.yaml").unlink()
    rc, out, err = _cli(capsys, ["info", "{dir}"], run)
    assert rc == 0 and out.startswith(f"{run / 'final'}\n") and "integrity: verified" in out
    assert err == [f"note: {run} has no config.yaml: loaded {run / 'final'} (model and tokenizer) with the run "
                   f"config saved in {run / 'checkpoints' / STEP / 'trainer_state.json'}"]
    rc, out, _ = _cli(capsys, PPL, run)
    assert rc == 0 and json.loads(out) == json.loads(with_yaml)  # the run's own data settings, not the defaults


@pytest.mark.parametrize("where", ["run", "step"])
def test_run_without_config_yaml_or_final_loads_a_checkpoint(run, capsys, where):
    rc, with_yaml, _ = _cli(capsys, PPL, run / "checkpoints" / STEP)
    assert rc == 0
    (run / "config.yaml").unlink()
    shutil.rmtree(run / "final")
    folder = run if where == "run" else run / "checkpoints" / STEP
    rc, out, err = _cli(capsys, PPL, folder)
    assert rc == 0 and err == [] and json.loads(out) == json.loads(with_yaml)
    assert load_model(folder).source == run / "checkpoints" / STEP


def test_a_checkpoint_without_any_run_config_says_what_is_missing(run, capsys):
    (run / "config.yaml").unlink()
    for ckpt in (run / "checkpoints").iterdir():
        state = ckpt / "trainer_state.json"
        doc = json.loads(state.read_text())
        del doc["config"]
        state.write_text(json.dumps(doc))
        write_manifest(ckpt, kind="checkpoint", step=doc["step"])
    rc, _, err = _cli(capsys, ["info", "{dir}"], run / "checkpoints" / STEP)
    assert rc == 2 and len(err) == 1
    assert f"{run} has no config.yaml and its trainer_state.json holds no config" in err[0]
    assert f"put the run's config.yaml back, or load {run / 'final'}" in err[0]
    rc, out, err = _cli(capsys, ["info", "{dir}"], run)  # final/ needs no run config
    assert rc == 0 and out.startswith(f"{run / 'final'}\n")
    assert len(err) == 1 and "no checkpoint holding the run config" in err[0]


@pytest.mark.parametrize("config_yaml", [True, False])
def test_a_refused_final_names_the_intact_checkpoint(run, capsys, config_yaml):
    if not config_yaml:
        (run / "config.yaml").unlink()
    (run / "final" / "modeling_extra.py").write_text("raise SystemExit('imported')\n")
    ckpt = run / "checkpoints" / STEP
    for argv in (["info", "{dir}"], PPL):
        rc, out, err = _cli(capsys, argv, run)
        assert rc == 2 and out == "" and len(err) == 1, err
        assert "final/modeling_extra.py: a model folder holds no code" in err[0]
        assert f"the run's newest intact checkpoint is {ckpt}: pass --checkpoint {ckpt}" in err[0]
    rc, out, _ = _cli(capsys, ["info", "{dir}"], ckpt)  # the named folder loads
    assert rc == 0 and out.startswith(f"{ckpt}\n")


def test_a_refused_final_skips_damaged_checkpoints_in_its_pointer(run, capsys):
    (run / "final" / "model.pt").write_bytes(b"\x80\x04K\x01.")
    older = run / "checkpoints" / "step-00000003"
    shutil.copytree(run / "checkpoints" / STEP, older)
    with open(run / "checkpoints" / STEP / "model.safetensors", "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\xff" * 8)
    rc, _, err = _cli(capsys, ["info", "{dir}"], run)
    assert rc == 2 and len(err) == 1
    assert "final/model.pt: a pickled weight file" in err[0]
    assert re.search(rf"newest intact checkpoint is {re.escape(str(older))}:", err[0]), err
    shutil.rmtree(older)
    rc, _, err = _cli(capsys, ["info", "{dir}"], run)
    assert rc == 2 and len(err) == 1 and err[0].endswith("; the run has no intact checkpoint to load instead")
