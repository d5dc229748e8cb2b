"""``bench train`` (benchmarks.train_speed): the row plan, the FLOP model, and a CPU dry run of the code
path (toy widths, the eager Dynamo backend for the compiled rows) in a subprocess (the dry-run switch is read at
import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import TARGETS
from benchmarks.train_speed import LARGE, flops_per_step, plan
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.models.mixers import MIXER_BUILDERS

ROOT = Path(__file__).resolve().parents[2]


def test_plan_covers_every_mixer_and_the_340m_presets():
    rows = plan()
    small = {(r["name"], r["B"], r["T"], r["variant"]) for r in rows if r["name"] in MIXER_BUILDERS}
    assert {r[0] for r in small} == set(MIXER_BUILDERS)
    assert all(not v.endswith("+ckpt") for *_, v in small)
    for variant in ("eager+varlen", "compiled+varlen"):
        assert {(r[1], r[2]) for r in small if r[3] == variant} == {(16, 2048)}  # the first small shape only
    large = [r for r in rows if r["name"] in LARGE]
    assert {r["name"] for r in large} == set(LARGE) and {r["variant"] for r in large} == {"eager", "compiled",
                                                                                          "compiled+graphs",
                                                                                          "eager+ckpt", "compiled+ckpt"}
    assert not [r for r in plan(quick=True) if r["name"] in LARGE]
    assert {r["name"] for r in plan(models=["gdn", "gdn-340m"])} == {"gdn", "gdn-340m"}
    with pytest.raises(ValueError, match="--models accepts"):
        plan(models=["nope"])
    assert TARGETS["train"] == {"train": "train_speed"}


def test_document_mix():
    from benchmarks.train_speed import document_mix

    cu = document_mix(16 * 2048, 2048)
    lengths = (cu[1:] - cu[:-1]).tolist()
    assert cu[0] == 0 and cu[-1] == 16 * 2048 and cu.dtype == torch.int32
    assert all(1 <= n <= 2048 for n in lengths) and all(n >= 16 for n in lengths[:-1])
    assert 100 < sorted(lengths)[len(lengths) // 2] < 600  # median near 256
    assert torch.equal(cu, document_mix(16 * 2048, 2048))  # seeded


def test_flop_model():
    cfg = HybridConfig.from_preset("tiny", layers=["softmax", "gdn"], hidden_size=32, num_heads=2, head_dim=16,
                                   chunk_size=8)
    model = HybridForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    B, T = 2, 64
    flops, label = flops_per_step(model, B, T)
    assert label == "6N+attn"
    assert flops == pytest.approx(6 * n * B * T + 6 * 2 * B * T * T * 32 / 2)  # one softmax layer, 2 x 16 wide
    gdn = HybridForCausalLM(HybridConfig.from_preset("tiny", layers="gdn", hidden_size=32, num_heads=2, head_dim=16,
                                                     chunk_size=8))
    assert flops_per_step(gdn, B, T)[1] == "6N only"
    # packed documents (the varlen rows): the attention term counts Σ len² (B rows of T = B documents of T: equal)
    assert flops_per_step(model, B, T, torch.tensor([0, T, 2 * T]))[0] == pytest.approx(flops)
    halves = torch.tensor([0, T // 2, T, 3 * T // 2, 2 * T])
    assert flops_per_step(model, B, T, halves)[0] == pytest.approx(6 * n * B * T + 6 * 2 * 4 * (T // 2) ** 2 * 32 / 2)


def test_train_bench_dryrun(tmp_path):
    env = {**os.environ, "BENCH_DRYRUN": "1", "TRITON_INTERPRET": "1", "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.train_speed", "--models", "gdn",
                           "natsl-hybrid-340m"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "train_speed.json").read_text())
    assert res["errors"] == [], res["errors"]
    got = {(r["name"], r["variant"]) for r in res["rows"]}
    assert got == {("gdn", "eager"), ("gdn", "compiled"), ("gdn", "compiled+graphs"), ("gdn", "eager+varlen"),
                   ("gdn", "compiled+varlen"), ("natsl-hybrid-340m", "eager"),
                   ("natsl-hybrid-340m", "compiled"), ("natsl-hybrid-340m", "compiled+graphs"),
                   ("natsl-hybrid-340m", "eager+ckpt"), ("natsl-hybrid-340m", "compiled+ckpt")}
    assert all(r["tok_s"] > 0 and r["step_ms"] > 0 for r in res["rows"])
    assert [r["documents"] > 1 for r in res["rows"] if r["variant"].endswith("+varlen")] == [True, True]
    assert "| model | layers | B×T | variant |" in proc.stdout
