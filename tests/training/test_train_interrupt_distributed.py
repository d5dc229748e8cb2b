"""Ctrl-C in a two-process run (gloo, CPU): the terminal interrupts the whole process group and torchrun forwards a
second SIGINT to each worker; the ranks end with exit 130, one ``interrupted:`` line between them, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from training_helpers import cli_cmd, cli_env, free_port, tiny_overrides


def _rank_env(rank: int, port: str) -> dict[str, str]:
    """The environment torchrun gives worker ``rank`` of two."""
    return dict(cli_env(), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=port)


@pytest.mark.parametrize("forwarded", [False, True])
def test_sigint_to_the_process_group_of_two_ranks(tmp_path, forwarded):
    out, cfg = tmp_path / "run", tmp_path / "empty.yaml"
    cfg.write_text("")
    cmd = cli_cmd("train", str(cfg), *tiny_overrides(out, "train.device=cpu", "train.steps=1000000",
                                                     "train.checkpoint_every=3", "train.save_final=false"))
    port = str(free_port())
    procs: list[subprocess.Popen] = []
    for rank in (0, 1):  # one process group, as under a terminal
        group = {"process_group": procs[0].pid if procs else 0}
        procs.append(subprocess.Popen(cmd, env=_rank_env(rank, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, **group))
    try:
        deadline = time.monotonic() + 180
        while not (out / "checkpoints" / "step-00000003").is_dir():
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, \
                [p.communicate() for p in procs]
            time.sleep(0.1)
        os.killpg(procs[0].pid, signal.SIGINT)  # Ctrl-C at the terminal
        if forwarded:  # the launcher's own SIGINT to each worker, right after
            time.sleep(0.05)
            for p in procs:
                p.send_signal(signal.SIGINT)
        errs = [p.communicate(timeout=60)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [130, 130], errs
    text = "".join(errs)
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted: the last saved checkpoint is step-"), text
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]


def test_a_finished_two_rank_run_reports_once(tmp_path):
    out, cfg = tmp_path / "run", tmp_path / "empty.yaml"
    cfg.write_text("")
    cmd = cli_cmd("train", str(cfg), *tiny_overrides(out, "train.device=cpu", "train.steps=2"))
    port = str(free_port())
    procs = [subprocess.Popen(cmd, env=_rank_env(rank, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "".join(outs).count("done: 2 steps") == 1, outs
