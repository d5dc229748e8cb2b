"""The GPU benchmark sections run end to end on the CPU in dry-run mode (tiny shapes, Triton interpreter): a smoke
test of the benchmark code, so that GPU time is not wasted on a bug in it. Each runs in a subprocess because
the dry-run switch is read at import."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _dryrun(module: str, out: Path) -> str:
    env = {**os.environ, "BENCH_DRYRUN": "1", "TRITON_INTERPRET": "1", "OUT": str(out), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_models_bench_dryrun(tmp_path):
    out = _dryrun("benchmarks.models", tmp_path)
    res = json.loads((tmp_path / "models_gpu.json").read_text())
    assert res["errors"] == [], res["errors"]
    # every section produced rows, and the forced NAtS-L fractions are what was asked for
    assert {r["model"] for r in res["prefill"]} == {"natsl-hybrid-340m", "gdn-340m", "transformer-340m"}
    assert len(res["decode"]) >= 6 and len(res["train"]) == 3 and len(res["table12"]) == 6
    half = [r for r in res["prefill"] if r["variant"] == "forced 0.5"]
    assert half and all(r["fraction"] == 0.5 for r in half)
    assert "target training tok/s" in out
    # tiny CPU shapes judge no GPU target: the verdicts say so instead of MET / MISSED
    assert "MISSED" not in out and ": MET" not in out and "(>= 0.8: not judged (dry run))" in out


def test_models_bench_compiled_prefill_dryrun(tmp_path):
    """--prefill-compile: the prefill rows through torch.compile(model) (inductor on the CPU), labelled "compiled"."""
    env = {**os.environ, "BENCH_DRYRUN": "1", "TRITON_INTERPRET": "1", "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.models", "--sections", "prefill", "--prefill-compile",
                           "--prefill-models", "gdn-340m", "--prefill-lengths", "64"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "models_gpu.json").read_text())
    assert res["errors"] == [], res["errors"]
    assert [(r["model"], r["variant"], r["T"]) for r in res["prefill"]] == [("gdn-340m", "compiled", 64)]
    assert res["prefill"][0]["ms"] > 0


@pytest.mark.parametrize("module", ["benchmarks.interdomain_ops"])
def test_ops_bench_dryrun(tmp_path, module):
    out = _dryrun(module, tmp_path)
    assert "FAIL" not in out and "PASS" in out


def test_models_bench_decode_follows_the_given_order(tmp_path):
    """--decode-models runs the presets in the order given, so that a budget cut drops the last-named one."""
    env = {**os.environ, "BENCH_DRYRUN": "1", "TRITON_INTERPRET": "1", "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.models", "--sections", "decode", "--decode-models",
                           "transformer-340m,natsl-hybrid-340m", "--decode-contexts", "64"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "models_gpu.json").read_text())
    assert res["errors"] == [], res["errors"]
    models = [r["model"] for r in res["decode"]]
    assert models and models == sorted(models, key=["transformer-340m", "natsl-hybrid-340m"].index), models
    assert set(models) == {"transformer-340m", "natsl-hybrid-340m"}


def test_models_bench_decode_batch_sizes_filter_the_rows(tmp_path):
    """--decode-batch-sizes 1 keeps only the plan's B = 1 rows (of every preset and NAtS-L fraction asked for)."""
    env = {**os.environ, "BENCH_DRYRUN": "1", "TRITON_INTERPRET": "1", "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.models", "--sections", "decode", "--decode-models",
                           "natsl-hybrid-340m,transformer-340m", "--decode-contexts", "64", "--decode-batch-sizes",
                           "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "models_gpu.json").read_text())
    assert res["errors"] == [], res["errors"]
    rows = [(r["model"], r["fraction"], r["batch_size"]) for r in res["decode"]]
    assert rows == [("natsl-hybrid-340m", 0.25, 1), ("natsl-hybrid-340m", 0.5, 1), ("transformer-340m", None, 1)], rows


def test_recall_speed_dryrun(tmp_path):
    # benchmarks.recall_speed: the suite's cells x tasks (toy sizes on the CPU), one row each with its projection;
    # a bad cell name is one line naming the cells the suite has
    from benchmarks import recall_speed

    recall_speed.main(["--dryrun", "--cells", "softmax", "gdn", "--variants", "eager", "--warmup", "1", "--steps", "2",
                       "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "recall_speed.json").read_text())["rows"]
    assert [(r["cell"], r["task"]) for r in rows] == [(c, t) for c in ("softmax", "gdn")
                                                      for t in ("mqar_t256", "mqar_t1024", "passkey")]
    assert all(r["step_ms"] > 0 and r["steps_per_epoch"] == 16 and r["full_budget_s"] > 0 for r in rows)
    assert all(math.isfinite(r["loss"]) for r in rows)
    recall_speed.main(["--dryrun", "--cells", "softmax", "--tasks", "passkey", "--variants", "eager", "--warmup", "1",
                       "--steps", "2", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "recall_speed.json").read_text())["rows"]
    assert [(r["cell"], r["task"]) for r in rows] == [("softmax", "passkey")]
    with pytest.raises(SystemExit, match="unknown cell.*the suite has softmax, interdomain"):
        recall_speed.main(["--dryrun", "--cells", "softmaxx"])


def test_recall_gradcheck_dryrun(tmp_path):
    # benchmarks.recall_gradcheck: the step of the forced-softmax NAtS-L Hybrid in float32 against its float64 copy
    # (toy sizes on the CPU: both sides run the reference ops, so they agree to float32 rounding)
    from benchmarks import recall_gradcheck

    recall_gradcheck.main(["--dryrun", "--cells", "natsl_hybrid_all_softmax", "--tasks", "mqar_t256", "--variants",
                           "eager", "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "recall_gradcheck.json").read_text())["rows"]
    assert row["ok"] and row["loss_rel"] < 1e-5 and row["worst"] < 1e-3 and row["checked"] > 10, row


def test_recall_gradcheck_pins_the_triton_kernels(tmp_path, monkeypatch):
    # --backend triton: the fp32 model runs the NAtS-L layer's two-branch Triton op (the interpreter here) and still
    # matches its float64 copy, which runs the reference ops
    pytest.importorskip("triton")
    import torch

    import hybrid_attention.layers.natsl.layer as natsl_mod
    from benchmarks import recall_gradcheck

    calls = []
    orig = natsl_mod.natsl_mixed
    monkeypatch.setattr(natsl_mod, "natsl_mixed", lambda *a, **kw: calls.append(a[0].dtype) or orig(*a, **kw))
    recall_gradcheck.main(["--dryrun", "--backend", "triton", "--cells", "natsl_hybrid_all_softmax", "--tasks",
                           "mqar_t256", "--variants", "eager", "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "recall_gradcheck.json").read_text())["rows"]
    assert calls and set(calls) == {torch.float32}  # the Triton op ran, on the fp32 model only
    assert row["ok"] and row["worst"] < 1e-3, row


def test_recall_gradcheck_finds_a_wrong_gradient():
    # the comparison itself: one tensor's gradient off by 10% is reported as the worst, by name; a gradient missing
    # on one side is an error
    import torch

    from benchmarks.recall_gradcheck import grad_errors

    g = torch.Generator().manual_seed(0)
    ref = {"a": torch.randn(4, 4, generator=g, dtype=torch.float64), "b": torch.randn(8, generator=g,
                                                                                        dtype=torch.float64)}
    same = grad_errors({k: v.clone() for k, v in ref.items()}, ref)
    assert same["worst"] == 0.0 and same["total"] == 0.0 and same["checked"] == 2
    off = grad_errors({"a": ref["a"].clone(), "b": 1.1 * ref["b"]}, ref)
    assert off["worst_param"] == "b" and off["worst"] == pytest.approx(0.1) and 0 < off["total"] < 0.1
    with pytest.raises(ValueError, match="different parameters"):
        grad_errors({"a": ref["a"]}, ref)


def test_profile_prefill_dryrun(capsys):
    # benchmarks.profile_prefill on the CPU stand-in model: a header line per (model, variant) and a kernel table
    from benchmarks import profile_prefill

    profile_prefill.main(["--dryrun", "--models", "gdn-340m", "--variants", "eager", "--top", "3"])
    out = capsys.readouterr().out
    assert "### gdn-340m eager T=64: wall" in out and "failed" not in out
    assert out.count("\n| ") == 1 + 3  # the table's header and three kernels


def test_gdn_launch_dryrun(tmp_path):
    """Every GDN launch variant runs the op on the CPU and agrees with the default configuration (a variant whose
    tiles break the kernels would differ or raise here before it costs GPU time)."""
    from benchmarks.gdn_launch import VARIANTS

    out = _dryrun("benchmarks.gdn_launch", tmp_path)
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| 1x80x2x32x64 ")]
    assert [r[2].strip() for r in rows] == list(VARIANTS)
    assert all(float(r[3]) < 1e-5 for r in rows), out
