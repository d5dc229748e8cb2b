"""Hostile model folders: no trust prompt, no foreign code, no pickles, no symlink out of the run; one line each.

The terminal tests run the real CLI under a pseudo-terminal (transformers only asks "[y/N]" when stdin is a tty) and
answer "y" if asked, so a prompt that appears also shows whether the folder's code would run.
"""

import json
import os
import pty
import re
import select
import shutil
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from hybrid_attention.checkpoints.integrity import CheckpointError, write_manifest
from hybrid_attention.checkpoints.model_folder import FolderRefused, check_folder
from hybrid_attention.cli import main
from hybrid_attention.data.tokenizer import load_tokenizer
from hybrid_attention.evaluation.loading import load_model
from hybrid_attention.models import HybridForCausalLM


def _plant_code(folder, config_name, marker):
    """``config_name`` gets an auto_map naming ``evil.py``, which writes ``marker`` when imported."""
    cfg = folder / config_name
    doc = json.loads(cfg.read_text())
    cls = "AutoTokenizer" if config_name == "tokenizer_config.json" else "AutoModelForCausalLM"
    doc["auto_map"] = {cls: ["evil.EvilClass", None] if cls == "AutoTokenizer" else "evil.EvilClass"}
    if config_name == "tokenizer_config.json":
        doc["tokenizer_class"] = "EvilClass"
    cfg.write_text(json.dumps(doc))
    (folder / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n"
                                    "from transformers import PreTrainedTokenizerFast as EvilClass\n")
    write_manifest(folder, kind="final")  # a manifest proves nothing about intent: whoever wrote the folder signs it


def _run_in_terminal(argv, timeout=120.0, code=None):
    """(exit status, everything the terminal showed) of ``python -m hybrid_attention.cli argv`` (with ``code``:
    ``python -c code``) under a pty."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, *(["-c", code] if code is not None else
                                                    ["-m", "hybrid_attention.cli", *argv])])
    out, answered, deadline = b"", False, time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if fd in ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if b"[y/N]" in out and not answered:
                os.write(fd, b"y\n")
                answered = True
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


@pytest.mark.parametrize("config_name, argv", [
    ("tokenizer_config.json", ["info", "{dir}"]),
    ("tokenizer_config.json", ["generate", "--checkpoint", "{dir}", "--prompt", "x", "--max-new-tokens", "2"]),
    ("config.json", ["eval", "ppl", "--checkpoint", "{dir}", "--tokens", "64", "--device", "cpu"]),
])
def test_remote_code_folder_is_refused_without_a_prompt(run, tmp_path, config_name, argv):
    folder = run / "final"
    marker = tmp_path / "imported.txt"
    _plant_code(folder, config_name, marker)
    rc, shown = _run_in_terminal([a.format(dir=folder) for a in argv])
    lines = [line for line in shown.splitlines() if line.strip()]
    assert "[y/N]" not in shown and "custom code" not in shown, shown
    assert not marker.exists()
    assert rc == 2 and len(lines) == 1, shown
    assert lines[0].startswith("error: ") and config_name in lines[0] and "'auto_map'" in lines[0]


@pytest.mark.parametrize("config_name", ["tokenizer_config.json", "config.json"])
def test_python_loaders_refuse_remote_code(run, tmp_path, config_name):
    marker = tmp_path / "imported.txt"
    _plant_code(run / "final", config_name, marker)
    with pytest.raises(FolderRefused, match=rf"final/{config_name}: field 'auto_map'"):
        load_model(run / "final")
    with pytest.raises(FolderRefused, match=rf"final/{config_name}: field 'auto_map'"):
        load_model(run)  # the run directory loads final/
    if config_name == "tokenizer_config.json":
        with pytest.raises(FolderRefused, match="auto_map"):
            load_tokenizer(run / "final")
    assert not marker.exists()


def _readme_loading_lines() -> list[str]:
    """The Python block of the README that loads ``runs/tiny_cpu/final``, line by line."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL) if "runs/tiny_cpu/final" in b)
    return block.splitlines()


@pytest.mark.parametrize("config_name", ["tokenizer_config.json", "config.json"])
def test_the_readme_python_route_refuses_remote_code_without_a_prompt(run, tmp_path, config_name):
    """The README's loading lines, run under a terminal on a folder planting code: the library loader and
    AutoModelForCausalLM refuse it with one line, AutoTokenizer shows no "[y/N]" prompt; the code never runs."""
    marker = tmp_path / "imported.txt"
    _plant_code(run / "final", config_name, marker)
    lines = [line.replace("runs/tiny_cpu", str(run)) for line in _readme_loading_lines()]
    imports = [line for line in lines if line.startswith(("import ", "from "))]
    assert any("trust_remote_code" in line for line in _readme_text_near_loading())
    for use in ("load_model(", "AutoModelForCausalLM.from_pretrained(", "AutoTokenizer.from_pretrained("):
        code = "\n".join([*imports, *(line for line in lines if use in line)]) + "\nprint('LOADED')\n"
        rc, shown = _run_in_terminal(None, code=code)
        assert "[y/N]" not in shown and "custom code" not in shown, shown
        assert not marker.exists(), (use, shown)
        if use == "AutoTokenizer.from_pretrained(":  # transformers' tokenizer route: the folder's code is ignored
            assert rc == 0 and "LOADED" in shown, shown
        else:
            assert rc == 1 and "LOADED" not in shown and "FolderRefused" in shown, shown
            assert f"{config_name}: field 'auto_map' names code to import" in shown


def _readme_text_near_loading() -> list[str]:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = text.index("runs/tiny_cpu/final")
    return text[start:start + 2000].splitlines()


def test_auto_classes_refuse_what_the_loaders_refuse(run):
    (run / "final" / "modeling_extra.py").write_text("raise SystemExit('imported')\n")
    with pytest.raises(FolderRefused, match="modeling_extra.py: a model folder holds no code"):
        AutoModelForCausalLM.from_pretrained(run / "final")
    (run / "final" / "modeling_extra.py").unlink()
    (run / "final" / "model.pt").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(FolderRefused, match="model.pt: a pickled weight file"):
        HybridForCausalLM.from_pretrained(run / "final")
    (run / "final" / "model.pt").unlink()
    assert isinstance(AutoModelForCausalLM.from_pretrained(run / "final"), HybridForCausalLM)


def test_tokenizer_config_may_not_point_outside(run, tmp_path):
    shutil.copy(run / "final" / "tokenizer.json", tmp_path / "elsewhere.json")
    cfg = run / "tokenizer" / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "tokenizer_file": str(tmp_path / "elsewhere.json")}))
    with pytest.raises(FolderRefused, match=r"tokenizer_config.json: field 'tokenizer_file' names .*outside"):
        load_tokenizer(run / "tokenizer")


def test_a_python_file_alone_is_refused(run):
    (run / "final" / "modeling_extra.py").write_text("raise SystemExit('imported')\n")
    with pytest.raises(FolderRefused, match=r"modeling_extra.py: a model folder holds no code"):
        load_model(run)


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.pth", "last.ckpt"])
def test_pickled_weights_are_refused(run, capsys, name):
    (run / "final" / name).write_bytes(b"\x80\x04K\x01.")  # pickle of the int 1
    assert main(["info", str(run / "final")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and name in err[0] and "safetensors only" in err[0], err


def test_a_folder_with_only_pickled_weights_is_refused(run):
    final = run / "final"
    (final / "model.safetensors").rename(final / "pytorch_model.bin")
    (final / "manifest.json").unlink()
    with pytest.raises(FolderRefused, match="pytorch_model.bin: a pickled weight file; .*safetensors only"):
        load_model(final)


def test_symlinks_out_of_the_run_are_refused(run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(run, other)
    weights = run / "final" / "model.safetensors"
    weights.unlink()
    weights.symlink_to(other / "final" / "model.safetensors")
    with pytest.raises(FolderRefused, match=r"final/model.safetensors: a symlink to .*other.*outside"):
        load_model(run)
    shutil.rmtree(run / "final")
    step = run / "checkpoints" / "step-00000006"
    shutil.rmtree(step)
    step.symlink_to(other / "checkpoints" / "step-00000006")
    with pytest.raises(FolderRefused, match=r"step-00000006: a symlink to .*outside"):
        load_model(run)  # the newest checkpoint of the run
    with pytest.raises(FolderRefused, match=r"step-00000006: a symlink to .*outside"):
        load_model(step)  # the checkpoint named directly
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(other / "checkpoints")
    with pytest.raises(FolderRefused, match=r"checkpoints: a symlink to .*outside"):
        load_model(run)


def test_symlinks_inside_the_run_are_accepted(run):
    tok = run / "final" / "tokenizer.json"
    tok.unlink()
    tok.symlink_to(run / "tokenizer" / "tokenizer.json")
    check_folder(run / "final", run)
    assert load_model(run).source == run / "final"


def _err_lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_missing_manifest_warns_on_every_path(run, tmp_path):
    logged = []
    loaded = load_model(run, log=logged.append)
    assert loaded.verified and logged == []
    bare = tmp_path / "bare"
    shutil.copytree(run / "final", bare)
    (bare / "manifest.json").unlink()
    (run / "final" / "manifest.json").unlink()
    (run / "checkpoints" / "step-00000006" / "manifest.json").unlink()
    for path in (run, run / "final", bare, run / "checkpoints" / "step-00000006", "run without final"):
        if path == "run without final":  # the run's newest checkpoint
            shutil.rmtree(run / "final")
            path = run
        logged.clear()
        loaded = load_model(path, log=logged.append)
        assert not loaded.verified
        assert logged == [f"warning: {loaded.source} has no manifest.json: loaded without size/checksum verification"]
    assert loaded.source.name == "step-00000006"


def test_info_says_whether_the_folder_is_verified(run, capsys):
    assert main(["info", str(run), "--seq-lens", "64"]) == 0
    out = capsys.readouterr().out
    assert "integrity: verified (manifest.json" in out
    (run / "final" / "manifest.json").unlink()
    assert main(["info", str(run), "--seq-lens", "64", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verified"] is False
    assert "has no manifest.json" in captured.err
    assert main(["info", str(run), "--seq-lens", "64"]) == 0
    assert "integrity: unverified (no manifest.json" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["config.json", "manifest.json", "tokenizer.json"])
def test_a_fifo_is_refused_without_blocking(run, name):
    target = run / "final" / name
    target.unlink()
    os.mkfifo(target)
    with pytest.raises(FolderRefused, match=rf"final/{name}: not a regular file"):
        load_model(run / "final")


def test_a_manifest_naming_files_outside_is_refused(run):
    manifest = run / "final" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["files"]["../../../etc/hostname"] = {"size": 1, "sha256": "0" * 64}
    manifest.write_text(json.dumps(doc))
    with pytest.raises(FolderRefused, match=r"manifest.json: lists ../../../etc/hostname, outside the folder"):
        load_model(run)


def test_an_oversized_config_is_refused_unparsed(run):
    cfg = run / "final" / "config.json"
    doc = json.loads(cfg.read_text())
    cfg.write_text(json.dumps({**doc, "auto_map": {"AutoModel": "evil.EvilClass"}}) + " " * (16 << 20))
    with pytest.raises(FolderRefused, match=r"final/config.json: 16,7\d\d,\d\d\d bytes, more than any config"):
        load_model(run)


def test_a_config_of_the_wrong_shape_is_one_line(run):
    cfg = run / "final" / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "text_config": {"hidden_size": 8}}))
    (run / "final" / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"cannot load the model in .*final: .*to_dict"):
        load_model(run / "final")


def test_a_hub_cache_snapshot_may_link_to_its_blobs(run, tmp_path):
    repo = tmp_path / "hub" / "models--someone--tiny"
    snap = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in (run / "final").iterdir():
        blob = repo / "blobs" / f"blob-{f.name}"
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    assert load_tokenizer(snap) is not None and load_model(snap).verified
    (snap / "tokenizer.json").unlink()
    (snap / "tokenizer.json").symlink_to(run / "final" / "tokenizer.json")  # out of the cached repository
    with pytest.raises(FolderRefused, match=r"0123abc/tokenizer.json: a symlink to .*outside .*models--someone--tiny"):
        load_tokenizer(snap)


@pytest.mark.parametrize("field, value", [("vocab_size", 2_000_000_000), ("num_hidden_layers", 100_000)])
def test_a_config_that_lies_about_sizes_is_one_line_without_allocating(run, capsys, field, value):
    cfg = run / "final" / "config.json"
    doc = json.loads(cfg.read_text())
    if field == "num_hidden_layers":
        doc["layers"] = doc["layers"] * (value // len(doc["layers"]))
    cfg.write_text(json.dumps({**doc, field: value}))
    (run / "final" / "manifest.json").unlink()
    start = time.monotonic()
    assert main(["info", str(run / "final")]) == 2
    err = _err_lines(capsys)
    assert len(err) == 1 and "model.safetensors" in err[0], err
    assert ("vocab_size 2000000000" in err[0]) if field == "vocab_size" else ("num_hidden_layers 100000" in err[0])
    assert time.monotonic() - start < 60


def test_a_run_config_that_lies_about_sizes_is_one_line_without_allocating(run, capsys):
    shutil.rmtree(run / "final")  # the run's checkpoint is built from config.yaml
    cfg = run / "config.yaml"
    cfg.write_text(cfg.read_text().replace("hidden_size: 32", "hidden_size: 1000000"))
    start = time.monotonic()
    assert main(["info", str(run)]) == 2
    err = _err_lines(capsys)
    assert len(err) == 1 and "step-00000006 does not fit the model built from the config" in err[0], err
    assert time.monotonic() - start < 60  # a real model of that width needs terabytes


def test_a_tokenizer_beside_pickled_weights_loads_but_not_the_model(run):
    (run / "final" / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    assert len(load_tokenizer(run / "final")) == 259  # the tokenizer loader reads no weight file
    with pytest.raises(FolderRefused, match="safetensors only"):
        load_model(run / "final")
