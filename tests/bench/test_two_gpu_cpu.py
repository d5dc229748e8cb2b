"""The CPU rehearsal of benchmarks/two_gpu.sh (``CPU=1``): gloo instead of NCCL, the `tiny` preset, a few steps, the
same commands otherwise (1-process reference, torchrun --nproc-per-node 2 with FSDP2, the FSDP2 2 -> 1 resume) and
benchmarks.dist_compare on the metrics they wrote; then a perturbed loss and a perturbed resume make it FAIL.
DDP is left out here to keep the test under a minute on two cores (the script runs it when ``PARALLEL`` names it, as
by default; tests/training/test_train_distributed.py checks DDP on gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.dist_compare import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_gpu_script_on_cpu(tmp_path, capsys):
    out, runs = tmp_path / "out", tmp_path / "runs"
    env = {**os.environ, "CPU": "1", "OUT": str(out), "RUNS": str(runs), "PYTHON": sys.executable,
           "PARALLEL": "fsdp2", "STEPS": "4", "RESUME_AT": "2", "LIMIT": "300",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(["bash", "benchmarks/two_gpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400)
    log = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, log
    assert "overall: PASS" in proc.stdout and "| tiny | FSDP2 2->1 resume | 2 |" in proc.stdout, log
    checked = (out / "env_check.log").read_text()
    for rank in (0, 1):  # every torchrun worker has NVLink multicast off
        line = next(x for x in checked.splitlines() if x.startswith(f"rank {rank} of 2:"))
        assert all(v in line for v in ("NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
                                       "NVSHMEM_DISABLE_NVLS=1")), line
    res = json.loads((out / "dist_compare.json").read_text())
    rows = {r["run"]: r for r in res["rows"]}
    assert set(rows) == {"one", "fsdp2", "resume"} and res["pass"]
    assert rows["fsdp2"]["steps"] == 4 and rows["fsdp2"]["max_rel"] < 1e-3  # bf16 autocast on the CPU
    assert rows["resume"]["next_step"] == 3 and rows["resume"]["next_rel"] < 1e-5
    assert rows["fsdp2"]["tok_per_s"] > 0 and rows["fsdp2"]["scaling"] > 0
    for name in ("versions.txt", "commands.txt", "table.md", "per_step.txt", "tiny_one_metrics.jsonl",
                 "tiny_fsdp2_metrics.jsonl", "tiny_resume_metrics.jsonl", "tiny_resume.log"):
        assert (out / name).is_file(), name
    assert "resumed from" in (out / "tiny_resume.log").read_text()
    assert not (runs / "tiny" / "fsdp2" / "checkpoints").exists()  # cleaned up after the resume

    args = [str(runs), "--runs", "fsdp2", "--resume-models", "tiny", "--skip-steps", "1"]
    assert main(args) == 0
    metrics = runs / "tiny" / "fsdp2" / "metrics.jsonl"
    good = metrics.read_text()
    recs = [json.loads(x) for x in good.splitlines()]
    for r in recs:
        if r.get("step") == 2 and "loss" in r:
            r["loss"] *= 1.03
    metrics.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    capsys.readouterr()
    assert main(args) == 1
    assert "loss differs by" in capsys.readouterr().out
    metrics.write_text(good)
    resumed = runs / "tiny" / "resume" / "metrics.jsonl"
    recs = [json.loads(x) for x in resumed.read_text().splitlines()]
    recs[0]["loss"] *= 1.002  # the next step after the checkpoint: within 1e-2, not within the resume's 1e-3
    resumed.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert main(args) == 1
    assert "next-step loss differs" in capsys.readouterr().out
