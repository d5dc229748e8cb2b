"""Run folder safety: one process per out_dir (an OS lock that dies with its process), out_dir that is a file,
an unwritable out_dir; each refused with one line and nothing written."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from training_helpers import cli_cmd, cli_env, tiny_overrides

from hybrid_attention.cli import main
from hybrid_attention.training.run_lock import LOCK_NAME


def _config(tmp_path):
    cfg = tmp_path / "empty.yaml"
    cfg.write_text("")
    return cfg


def _wait_for_lock(proc: subprocess.Popen, lock, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        # the lock is taken before config.yaml is written: wait for both
        if lock.exists() and lock.read_text().strip() == str(proc.pid) and (lock.parent / "config.yaml").exists():
            return
        time.sleep(0.2)
    raise AssertionError("the first run did not take the lock")


def test_second_run_refused_while_first_holds_lock_and_kill9_leaves_no_stale_lock(tmp_path):
    out, cfg = tmp_path / "run", _config(tmp_path)
    first = subprocess.Popen(cli_cmd("train", str(cfg), *tiny_overrides(out, "train.steps=1000000",
                                                                         "train.checkpoint_every=0")),
                             env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_lock(first, out / LOCK_NAME)
        config_before = (out / "config.yaml").read_bytes()
        second = subprocess.run(cli_cmd("train", str(cfg), *tiny_overrides(out, "train.steps=2")),
                                env=cli_env(), capture_output=True, text=True, timeout=300)
        assert second.returncode == 2
        err = second.stderr.strip()
        assert "\n" not in err and f"in use by another train process (PID {first.pid})" in err
        assert first.poll() is None  # the first run goes on
        assert (out / "config.yaml").read_bytes() == config_before
        assert not (out / "checkpoints").exists()
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    # the lock died with its process: the file is still there, a new run takes it
    assert (out / LOCK_NAME).exists()
    assert main(["train", str(cfg), *tiny_overrides(out, "train.steps=1", "train.save_final=false")]) == 0
    assert (out / "checkpoints" / "step-00000001").is_dir()


def test_lock_released_after_a_run_in_process(tmp_path, capsys):
    out, cfg = tmp_path / "run", _config(tmp_path)
    assert main(["train", str(cfg), *tiny_overrides(out, "train.steps=1", "train.save_final=false")]) == 0
    assert main(["train", str(cfg), *tiny_overrides(out, "train.steps=2", "train.save_final=false"),
                 "--resume"]) == 0


@pytest.mark.parametrize("under", [False, True])
def test_out_dir_that_is_a_file(tmp_path, capsys, under):
    f = tmp_path / "file"
    f.write_text("keep")
    out = f / "run" if under else f
    assert main(["train", str(_config(tmp_path)), *tiny_overrides(out, "train.steps=1")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "train.out_dir" in err and "a file, not a folder" in err
    assert f.read_text() == "keep"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder; chmod cannot simulate it")
def test_read_only_out_dir(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert main(["train", str(_config(tmp_path)), *tiny_overrides(ro / "run", "train.steps=1")]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "is not writable" in err
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_unwritable_out_dir_one_line(tmp_path, capsys, monkeypatch):
    """The same refusal when the lock file cannot be created (simulated: works as root too)."""
    real_open = os.open

    def deny(path, *args, **kwargs):
        if str(path).endswith(LOCK_NAME):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    assert main(["train", str(_config(tmp_path)), *tiny_overrides(tmp_path / "run", "train.steps=1")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is not writable (Permission denied)" in err


def _tree(root):
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


@pytest.fixture(scope="module")
def other_run(tmp_path_factory):
    """A finished run whose checkpoints another folder links to."""
    base = tmp_path_factory.mktemp("other")
    out = base / "run"
    assert main(["train", str(_config(base)), *tiny_overrides(out, "train.steps=2", "train.checkpoint_every=1",
                                                              "train.save_final=false")]) == 0
    return out


def test_symlinked_step_refused_on_resume(tmp_path, capsys, other_run):
    out, cfg = tmp_path / "run", _config(tmp_path)
    assert main(["train", str(cfg), *tiny_overrides(out, "train.steps=1", "train.save_final=false")]) == 0
    link = out / "checkpoints" / "step-00000005"
    link.symlink_to(other_run / "checkpoints" / "step-00000002")
    before, other_before = _tree(out), _tree(other_run)
    capsys.readouterr()
    assert main(["train", str(cfg), *tiny_overrides(out, "train.steps=6", "train.save_final=false"), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{link} is a symbolic link" in err
    assert _tree(out) == before and _tree(other_run) == other_before


@pytest.mark.parametrize("resume", [False, True])
def test_symlinked_checkpoints_folder_never_rotated(tmp_path, capsys, other_run, resume):
    out, cfg = tmp_path / "run", _config(tmp_path)
    out.mkdir()
    (out / "checkpoints").symlink_to(other_run / "checkpoints", target_is_directory=True)
    other_before = _tree(other_run)
    capsys.readouterr()
    args = ["train", str(cfg), *tiny_overrides(out, "train.steps=4", "train.checkpoint_every=1",
                                               "train.keep_checkpoints=1", "train.save_final=false")]
    assert main(args + (["--resume"] if resume else [])) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "checkpoints is a symbolic link" in err
    assert _tree(other_run) == other_before


def _finished_run(tmp_path):
    out, cfg = tmp_path / "run", _config(tmp_path)
    assert main(["train", str(cfg), *tiny_overrides(out, "train.steps=1", "train.save_final=false")]) == 0
    return out, cfg


def test_read_only_checkpoints_folder_on_resume_simulated(tmp_path, capsys, monkeypatch):
    """A checkpoints/ folder that refuses new files (simulated by the probe's writer: works as root too)."""
    import tempfile

    from hybrid_attention.training import run_lock

    out, cfg = _finished_run(tmp_path)
    real = tempfile.NamedTemporaryFile

    def read_only(*args, dir=None, **kwargs):
        if str(dir).endswith("checkpoints"):
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(run_lock.tempfile, "NamedTemporaryFile", read_only)
    before = _tree(out)
    capsys.readouterr()
    assert main(["train", str(cfg), *tiny_overrides(out, "train.steps=2", "train.save_final=false"), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"is not writable ({out / 'checkpoints'}: Permission denied)" in err
    assert [t for t in _tree(out) if not t[0].endswith(LOCK_NAME)] == [t for t in before if
                                                                       not t[0].endswith(LOCK_NAME)]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder; chmod cannot simulate it")
@pytest.mark.parametrize("folder", ["", "checkpoints"])
def test_read_only_run_folder_on_resume(tmp_path, capsys, folder):
    out, cfg = _finished_run(tmp_path)
    (out / folder).chmod(0o555)
    try:
        capsys.readouterr()
        assert main(["train", str(cfg), *tiny_overrides(out, "train.steps=2", "train.save_final=false"),
                     "--resume"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "is not writable" in err
    finally:
        (out / folder).chmod(0o755)


@pytest.mark.parametrize("name", [LOCK_NAME, "metrics.jsonl", "config.yaml"])
def test_linked_run_entry_refused_and_target_untouched(tmp_path, capsys, name):
    out, cfg = _finished_run(tmp_path)
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious\n")
    (out / name).unlink()
    (out / name).symlink_to(target)
    capsys.readouterr()
    assert main(["train", str(cfg), *tiny_overrides(out, "train.steps=2", "train.save_final=false"), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{name} is a symbolic link" in err
    assert target.read_text() == "precious\n"
