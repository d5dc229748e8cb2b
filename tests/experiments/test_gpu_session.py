"""configs/experiments/gpu_session.sh carries what earlier device calls finished into the call's run directory: the
recall tasks and sweep models of runs that a call's time limit cut (results/<suite>_gpu/cells/*/seed*/recall_*.json),
so that the runner trains only the rest, and the per-epoch checkpoints of cut recall models, there and back as one
tar in <= 15 MiB parts two folders deep; and it shares the CPU cores among the lanes (OMP_NUM_THREADS)."""

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tar_files(parts: list[Path]) -> dict[str, bytes]:
    """{member name: bytes} of the regular files of the tar that ``parts`` (in order) make up."""
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_gpu_session_carries_the_recall_rows_of_cut_runs(tmp_path):
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    cell = tmp_path / "results" / "recall_cpu_gpu" / "cells" / "softmax" / "seed0"
    cell.mkdir(parents=True)
    (cell / "recall_mqar.rows.json").write_text("[]")
    (cell / "recall_passkey.json").write_text("{}")
    # a cut model's per-epoch checkpoint, as it came back from an earlier call: a tar of its run folders (here a
    # 17 MiB file and a JSON) in two parts, in results/<suite>_gpu/resume/
    rel = Path("cells/softmax/seed0/recall_mqar.resume/gdn_d16_lr0.003/step-00000002")
    big = os.urandom(17 * 1024 * 1024)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("optimizer.safetensors", big), ("trainer_state.json", b"{}")):
            info = tarfile.TarInfo(str(rel / name))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        # and a finished task's empty resume folder (session 20's first call exported one), and a finished task's
        # checkpoint carried again (a warm machine's work tree, session 22): neither is exported again
        empty = tarfile.TarInfo("cells/softmax/seed0/recall_copy.resume")
        empty.type = tarfile.DIRTYPE
        tar.addfile(empty)
        stale = tarfile.TarInfo("cells/softmax/seed0/recall_passkey.resume/gdn_d16_lr0.003/step-00000048/x.json")
        stale.size = 2
        tar.addfile(stale, io.BytesIO(b"{}"))
    packed = buf.getvalue()
    carry = tmp_path / "results" / "recall_cpu_gpu" / "resume"
    carry.mkdir()
    (carry / "resume.tar.part-000").write_bytes(packed[: 15 * 1024 * 1024])
    (carry / "resume.tar.part-001").write_bytes(packed[15 * 1024 * 1024 :])
    runs, out = tmp_path / "runs", tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "RUNS": str(runs), "LIMIT": "200", "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "LANE0": "recall_cpu --list",  # --list: the runner prints the cells and runs nothing
           "LANE1": "!python -c \"print('threads', __import__('torch').get_num_threads())\""}
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run(["bash", str(ROOT / "configs" / "experiments" / "gpu_session.sh")], cwd=tmp_path, env=env,
                          check=True, timeout=600, capture_output=True, text=True)
    # two lanes share the cores: each gets half of them as torch threads
    per_lane = max(1, len(os.sched_getaffinity(0)) // 2)  # what nproc counts
    assert f"lanes: 2, OMP_NUM_THREADS={per_lane} per lane" in proc.stdout
    with tarfile.open(out / "artifacts.tgz") as tar:  # the call's logs are in the archive, not beside it
        names = tar.getnames()
        lane1 = tar.extractfile("logs/lane1_cmd.log").read().decode()
    assert f"threads {per_lane}" in lane1 and "logs/lane0_recall_cpu.log" in names
    carried = runs / "recall_cpu" / "cells" / "softmax" / "seed0"
    assert (carried / "recall_mqar.rows.json").read_text() == "[]"
    assert (carried / "recall_passkey.json").read_text() == "{}"
    assert (out / "artifacts.tgz").exists()
    # the checkpoint was unpacked for the runner, and goes back as one tar in <= 15 MiB parts beside the archive;
    # nothing else is left in $OUT (the device tool returns at most 8 files)
    joined = runs / "recall_cpu" / rel
    assert (joined / "optimizer.safetensors").read_bytes() == big
    assert (joined / "trainer_state.json").read_text() == "{}"
    assert sorted(p.name for p in out.iterdir()) == ["artifacts.tgz", "resume_recall_cpu.tar.part-000",
                                                     "resume_recall_cpu.tar.part-001"]
    parts = sorted(out.glob("resume_recall_cpu.tar.part-*"))
    assert [p.stat().st_size for p in parts][0] == 15 * 1024 * 1024
    want = {str(rel / "optimizer.safetensors"): big, str(rel / "trainer_state.json"): b"{}"}
    assert _tar_files(parts) == want
    with tarfile.open(out / "artifacts.tgz") as tar:
        exported = tar.extractfile("logs/resume_recall_cpu.list").read().decode()
    assert exported == "cells/softmax/seed0/recall_mqar.resume\n"
    listing = subprocess.run(["tar", "tzf", str(out / "artifacts.tgz")], capture_output=True, text=True).stdout
    assert ".resume" not in listing

    # scripts/merge_device_results.sh puts what came back where the next call reads it: the run tree over
    # results/<suite>_gpu/, the lane's log as a console log, the parts into an emptied resume/ (the stale part goes)
    (carry / "resume.tar.part-002").write_bytes(b"stale")
    subprocess.run(["bash", str(ROOT / "scripts" / "merge_device_results.sh"), str(out), "recall_cpu", "s1_call1"],
                   cwd=tmp_path, check=True, timeout=120, capture_output=True)
    dest = tmp_path / "results" / "recall_cpu_gpu"
    assert sorted(p.name for p in carry.iterdir()) == ["resume.tar.part-000", "resume.tar.part-001"]
    assert _tar_files(sorted(carry.iterdir())) == want
    assert (dest / "cells" / "softmax" / "seed0" / "recall_mqar.rows.json").read_text() == "[]"
    assert "natsl_hybrid: seeds [0]" in (dest / "console_s1_call1_lane0.log").read_text()  # the --list output
    # and the next call, carrying it, finds the checkpoint again
    runs2, out2 = tmp_path / "runs2", tmp_path / "out2"
    subprocess.run(["bash", str(ROOT / "configs" / "experiments" / "gpu_session.sh")], cwd=tmp_path, check=True,
                   env={**env, "OUT": str(out2), "RUNS": str(runs2)}, timeout=600, capture_output=True)
    assert (runs2 / "recall_cpu" / rel / "optimizer.safetensors").read_bytes() == big


def test_merge_follows_the_exported_resume_list(tmp_path):
    # the call's logs/resume_<suite>.list names what it exported: an empty list (the models finished) removes
    # results/<suite>_gpu/resume/, so finished checkpoints are not carried and exported again; a list whose parts did
    # not come back is an error that leaves resume/ as it was
    def returned(name, listing):
        d = tmp_path / name
        (d / "pack" / "recall_cpu").mkdir(parents=True)
        (d / "pack" / "logs").mkdir()
        (d / "pack" / "logs" / "resume_recall_cpu.list").write_text(listing)
        subprocess.run(["tar", "czf", str(d / "artifacts.tgz"), "-C", str(d / "pack"), "recall_cpu", "logs"],
                       check=True)
        return d

    resume = tmp_path / "results" / "recall_cpu_gpu" / "resume"
    resume.mkdir(parents=True)
    (resume / "resume.tar.part-000").write_bytes(b"old")
    merge = ["bash", str(ROOT / "scripts" / "merge_device_results.sh")]
    lost = subprocess.run([*merge, str(returned("lost", "cells/a/seed0/recall_mqar.resume\n")), "recall_cpu", "t"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert lost.returncode == 2 and "no resume_recall_cpu.tar.part-* came back" in lost.stderr
    assert (resume / "resume.tar.part-000").read_bytes() == b"old"
    subprocess.run([*merge, str(returned("done", "")), "recall_cpu", "t"], cwd=tmp_path, check=True,
                   capture_output=True)
    assert not resume.exists()
