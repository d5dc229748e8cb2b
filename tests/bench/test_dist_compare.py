"""benchmarks.dist_compare (the comparison of benchmarks/two_gpu.sh) on synthetic metrics files: it passes runs within
the tolerance and fails perturbed losses, a perturbed resume, a cut-off run, another global batch, a non-finite loss
and a scaling below the gate; arguments fail with one line naming them. The CPU rehearsal of the whole script (gloo,
two processes) is tests/bench/test_two_gpu_cpu.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.dist_compare import RESUME_RTOL, RTOL, loss_diff, main, read_run

STEPS, TOKENS = 20, 4096


def _curve(step: int) -> float:
    return 2.0 + 3.5 * math.exp(-step / 6)


def _write(run_dir: Path, losses: dict[int, float | None], tok_per_s: float = 1000.0, val: float | None = 2.5,
           tokens: int = TOKENS) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": s, "loss": v, "lr": 1e-3, "grad_norm": 1.0, "tokens": s * tokens,
                         "tok_per_s": tok_per_s, "skipped": 0}) for s, v in sorted(losses.items())]
    if val is not None:
        lines.append(json.dumps({"step": max(losses), "val_loss": val, "val_ppl": math.exp(val), "val_bpb": None}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _layout(root: Path, model: str = "m", rel: float = 1e-4, scaling: float = 1.9, resume_at: int = 10) -> Path:
    """A passing layout: the 2-process runs a relative ``rel`` off the reference, the resume on the fsdp2 curve."""
    ref = {s: _curve(s) for s in range(1, STEPS + 1)}
    _write(root / model / "one", ref, tok_per_s=1000.0)
    _write(root / model / "ddp", {s: v * (1 + rel) for s, v in ref.items()}, tok_per_s=1000.0 * scaling,
           val=2.5 * (1 + rel))
    fsdp2 = {s: v * (1 - rel) for s, v in ref.items()}
    _write(root / model / "fsdp2", fsdp2, tok_per_s=1000.0 * scaling, val=2.5 * (1 - rel))
    _write(root / model / "resume", {s: v for s, v in fsdp2.items() if s > resume_at}, val=2.5 * (1 - rel))
    return root


def _result(root: Path, *args: str) -> tuple[int, dict]:
    rc = main([str(root), "--json", str(root / "out.json"), *args])
    return rc, json.loads((root / "out.json").read_text())


def _row(res: dict, run: str) -> dict:
    return next(r for r in res["rows"] if r["run"] == run)


def test_within_tolerance_passes(tmp_path, capsys):
    rc, res = _result(_layout(tmp_path), "--min-scaling", "1.8", "--resume-models", "m")
    out = capsys.readouterr().out
    assert rc == 0 and res["pass"], out
    assert [r["run"] for r in res["rows"]] == ["one", "ddp", "fsdp2", "resume"]
    ddp = _row(res, "ddp")
    assert ddp["steps"] == STEPS and ddp["max_rel"] == pytest.approx(1e-4, rel=1e-6)
    assert ddp["scaling"] == pytest.approx(1.9) and ddp["tok_per_s"] == pytest.approx(1900.0)
    resume = _row(res, "resume")
    assert resume["next_step"] == 11 and resume["next_rel"] == 0.0 and resume["steps"] == STEPS - 10
    assert "| m | DDP x2 | 20 |" in out and "overall: PASS" in out
    assert res["settings"]["rtol"] == RTOL == 1e-2 and res["settings"]["resume_rtol"] == RESUME_RTOL == 1e-3


def test_perturbed_loss_fails(tmp_path, capsys):
    root = _layout(tmp_path)
    ddp = read_run(root / "m" / "ddp")
    ddp.loss[7] *= 1.02  # 2 % at one step: above the 1e-2 tolerance
    _write(root / "m" / "ddp", ddp.loss, tok_per_s=1900.0)
    rc, res = _result(root)
    assert rc == 1 and not res["pass"]
    row = _row(res, "ddp")
    assert row["result"] == "FAIL" and row["worst_step"] == 7 and row["max_rel"] == pytest.approx(1.0001 * 1.02 - 1)
    assert any("step 7" in n for n in row["notes"])
    assert _row(res, "fsdp2")["result"] == "PASS"
    assert "overall: FAIL" in capsys.readouterr().out
    # the same run passes a looser tolerance, and a tolerance below the 1e-4 drift fails every run
    assert main([str(root), "--rtol", "0.05"]) == 0
    rc, res = _result(_layout(tmp_path / "tight"), "--rtol", "1e-5")
    assert rc == 1 and _row(res, "fsdp2")["result"] == "FAIL"


def test_perturbed_resume_fails(tmp_path):
    root = _layout(tmp_path)
    resumed = read_run(root / "m" / "resume")
    resumed.loss[11] *= 1.005  # within the per-step tolerance, above the resume's 1e-3
    _write(root / "m" / "resume", resumed.loss)
    rc, res = _result(root)
    assert rc == 1
    row = _row(res, "resume")
    assert row["result"] == "FAIL" and row["next_rel"] == pytest.approx(0.005, rel=1e-3)
    assert any("next-step" in n for n in row["notes"])
    assert _row(res, "ddp")["result"] == _row(res, "fsdp2")["result"] == "PASS"


def test_missing_or_cut_off_runs_fail(tmp_path):
    root = _layout(tmp_path)
    cut = {s: v for s, v in read_run(root / "m" / "fsdp2").loss.items() if s <= 12}
    _write(root / "m" / "fsdp2", cut)
    (root / "m" / "resume" / "metrics.jsonl").unlink()
    rc, res = _result(root, "--resume-models", "m")
    assert rc == 1
    assert any("8 step(s) missing (first 13)" in n for n in _row(res, "fsdp2")["notes"])
    assert _row(res, "resume")["result"] == "FAIL"
    rc, res = _result(_layout(tmp_path / "noref"), "--models", "m", "other")
    assert rc == 1 and [r["result"] for r in res["rows"] if r["model"] == "other"] == ["FAIL"] * 3


def test_other_global_batch_and_nonfinite_loss_fail(tmp_path):
    root = _layout(tmp_path)
    ddp = read_run(root / "m" / "ddp")
    _write(root / "m" / "ddp", ddp.loss, tokens=2 * TOKENS)  # twice the global batch, same losses
    fsdp2 = read_run(root / "m" / "fsdp2")
    fsdp2.loss[3] = None  # the trainer logs a non-finite value as null
    _write(root / "m" / "fsdp2", fsdp2.loss)
    rc, res = _result(root)
    assert rc == 1
    assert any("global batch" in n for n in _row(res, "ddp")["notes"])
    assert any("non-finite loss at step 3" in n for n in _row(res, "fsdp2")["notes"])


def test_scaling_gate(tmp_path):
    root = _layout(tmp_path, scaling=1.5)
    assert main([str(root)]) == 0  # reported only
    rc, res = _result(root, "--min-scaling", "1.8")
    assert rc == 1 and any("scaling 1.50x < 1.8x" in n for n in _row(res, "ddp")["notes"])
    _layout(tmp_path, model="gated", scaling=1.9)
    rc, res = _result(root, "--min-scaling", "1.8", "--scaling-models", "gated")
    assert rc == 0 and {r["model"] for r in res["rows"]} == {"m", "gated"}


def test_steady_tokens_per_second_skips_warmup(tmp_path):
    ref = {s: _curve(s) for s in range(1, 11)}
    _write(tmp_path / "r", ref)
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    for r in recs:
        if "loss" in r:
            r["tok_per_s"] = 10.0 if r["step"] <= 2 else (1000.0 if r["step"] % 2 else 500.0)
    (tmp_path / "r" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    run = read_run(tmp_path / "r")
    # steps 3..10: four intervals at 1000 and four at 500 tok/s, equal tokens: 8 T / (4 T/1000 + 4 T/500)
    assert run.steady_tok_per_s(2) == pytest.approx(8 / (4 / 1000 + 4 / 500))
    assert run.steady_tok_per_s(0) < run.steady_tok_per_s(2)
    assert run.steady_tok_per_s(10) is None
    d = loss_diff(run, run)
    assert d.steps == 10 and d.max_abs == 0.0 and not d.problems


@pytest.mark.parametrize("args,match", [
    (["--rtol", "-1"], "--rtol: must be a finite number > 0, got -1"),
    (["--rtol", "x"], "--rtol: 'x' is not a number"),
    (["--skip-steps", "-2"], "--skip-steps: must be >= 0"),
    (["--runs", "zero"], "--runs: invalid choice"),
    (["--scaling-models", "nope"], "--scaling-models nope: not among the models (m)"),
    (["--resume-models", "nope"], "--resume-models nope: not among the models (m)"),
])
def test_bad_arguments_are_one_line(tmp_path, capsys, args, match):
    assert main([str(_layout(tmp_path)), *args]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1 and err.startswith("error: ")


def test_bad_root_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 2
    assert "ROOT" in capsys.readouterr().err
    assert main([str(tmp_path)]) == 2
    assert "no <model>/one/ folder" in capsys.readouterr().err
