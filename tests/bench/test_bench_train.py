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
from benchmarks.mixer_flops import MIXER_FLOP_NAMES, macs_per_token_head, mixer_forward_flops
from benchmarks.train_speed import LARGE, PAPER_125M, add_ratios, config_of, flops_per_step, plan
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
    large = [r for r in rows if r["name"] in LARGE and r["T"] == 4096]
    assert {r["name"] for r in large} == set(LARGE) and {r["variant"] for r in large} == {
        "eager", "compiled", "compiled+blocks", "compiled+graphs", "eager+ckpt", "compiled+ckpt",
        "compiled+blocks+ckpt"}
    assert not [r for r in plan(quick=True) if r["name"] in LARGE]
    assert {r["name"] for r in plan(models=["gdn", "gdn-340m"])} == {"gdn", "gdn-340m"}
    with pytest.raises(ValueError, match="--models accepts"):
        plan(models=["nope"])
    assert TARGETS["train"] == {"train": "train_speed"}


def test_long_context_rows():
    """The 340M presets at 2×16384 and 1×32768 and the 125M paper pair (+ s4d) at 8×2048 and 1×32768, compiled per
    block by default, every checkpointed variant on request; out of the quick plan."""
    long = [r for r in plan() if r["T"] > 4096 or r["name"] in PAPER_125M]
    assert {(r["name"], r["B"], r["T"]) for r in long} == {
        *((n, b, t) for n in LARGE for b, t in ((2, 16384), (1, 32768))),
        *((n, b, t) for n in PAPER_125M for b, t in ((8, 2048), (1, 32768)))}
    assert {r["variant"] for r in long} == {"compiled+blocks"}
    assert not [r for r in plan(quick=True) if r["name"] in PAPER_125M]
    picked = plan(models=["softmax-125m", "interdomain-125m"], shapes=[(1, 32768)],
                  variants=["compiled+blocks", "compiled+blocks+ckpt", "eager+varlen"])
    assert {(r["name"], r["variant"]) for r in picked} == {
        (n, v) for n in ("softmax-125m", "interdomain-125m") for v in ("compiled+blocks", "compiled+blocks+ckpt")}
    for name in PAPER_125M:  # the presets themselves, the mixer of the name in every layer
        cfg = config_of(name)
        assert set(cfg.mixer_types) == {name.split("-")[0]} and cfg.hidden_size == 768 and len(cfg.mixer_types) == 12


def test_ratios_against_the_same_size_softmax_model():
    rows = [dict(name="softmax", B=16, T=2048, variant="compiled", tok_s=200.0),
            dict(name="gdn", B=16, T=2048, variant="compiled", tok_s=100.0),
            dict(name="gdn", B=16, T=2048, variant="compiled+graphs", tok_s=120.0),  # no softmax row of this variant
            dict(name="transformer-340m", B=1, T=32768, variant="compiled+blocks", tok_s=10.0),
            dict(name="gdn-340m", B=1, T=32768, variant="compiled+blocks", tok_s=25.0),
            dict(name="softmax-125m", B=1, T=32768, variant="compiled+blocks", error="OutOfMemoryError"),
            dict(name="interdomain-125m", B=1, T=32768, variant="compiled+blocks", tok_s=50.0)]
    got = [r["vs_base"] for r in add_ratios(rows)]
    assert got == [1.0, 0.5, None, 1.0, 2.5, None, None]


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
    assert label == "6N+mixers"
    gdn_layer = model.model.layers[1].mixer
    gdn_fwd = mixer_forward_flops("gdn", gdn_layer, T)
    assert flops == pytest.approx(6 * n * B * T + 6 * 2 * B * T * T * 32 / 2 + 3 * B * gdn_fwd)  # 2 x 16 wide attn
    # packed documents (the varlen rows): each mixer per document, softmax Σ len² (B rows of T = B documents of T)
    assert flops_per_step(model, B, T, torch.tensor([0, T, 2 * T]))[0] == pytest.approx(flops)
    halves = torch.tensor([0, T // 2, T, 3 * T // 2, 2 * T])
    assert flops_per_step(model, B, T, halves)[0] == pytest.approx(
        6 * n * B * T + 6 * 2 * 4 * (T // 2) ** 2 * 32 / 2 + 3 * B * gdn_fwd)  # the GDN count is linear in T
    every = HybridForCausalLM(HybridConfig.from_preset("tiny", layers=list(MIXER_FLOP_NAMES), hidden_size=32,
                                                       num_heads=2, head_dim=16, chunk_size=8))
    flops_all, label_all = flops_per_step(every, B, T)
    assert label_all == "6N+mixers" and flops_all > 6 * n * B * T


def test_gdn_flop_count_matches_the_reference_chunk_form():
    """The GDN count equals the matmul FLOPs that torch's FlopCounterMode sees in the chunk-parallel reference, plus
    the two triangular solves (w, u) and the inverse, which the reference does without a counted matmul."""
    from torch.utils.flop_counter import FlopCounterMode

    from hybrid_attention.ops.gated_delta import gated_delta

    Bsz, T, H, K, V, L = 1, 256, 2, 32, 48, 32
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(Bsz, T, H, K, generator=g), torch.randn(Bsz, T, H, K, generator=g)
    v = torch.randn(Bsz, T, H, V, generator=g)
    gate, beta = -torch.rand(Bsz, T, H, generator=g), torch.rand(Bsz, T, H, generator=g)
    with FlopCounterMode(display=False) as counter:
        gated_delta(q, torch.nn.functional.normalize(k, dim=-1), v, gate, beta, chunk_size=L, backend="reference")
    uncounted = 2 * T * H * (L * (K + V) + L * L / 3)
    assert counter.get_total_flops() + uncounted == pytest.approx(
        2 * T * H * macs_per_token_head("gdn", T=T, L=L, R=K, D=V))


def test_mixer_flop_counts_scale_as_their_algorithms():
    per = {kind: macs_per_token_head(kind, T=1024, L=64, M=64, R=64, D=64) for kind in MIXER_FLOP_NAMES[:-1]}
    assert per["softmax"] == 2 * 512 * 64  # causal: T/2 keys on average, QKᵀ and PV
    assert macs_per_token_head("softmax", T=2048, R=64) == 2 * per["softmax"]  # grows with T
    for kind in ("interdomain", "s4d", "s4d_bilinear", "gdn"):  # fixed-size state: per-token work independent of T
        assert macs_per_token_head(kind, T=4096, L=64, M=64, R=64, D=64) == per[kind]
    assert per["s4d"] < per["interdomain"] < per["s4d_bilinear"]  # linear read < query read < M×M read per channel
    with pytest.raises(ValueError, match="kind must be one of"):
        macs_per_token_head("nope", T=8)


def test_train_bench_dryrun(tmp_path):
    env = {**os.environ, "BENCH_DRYRUN": "1", "TRITON_INTERPRET": "1", "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.train_speed", "--models", "gdn",
                           "natsl-hybrid-340m", "--shapes", "2x64", "4x32", "1x64"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "train_speed.json").read_text())
    assert res["errors"] == [], res["errors"]
    got = {(r["name"], r["variant"]) for r in res["rows"]}
    assert got == {("gdn", "eager"), ("gdn", "compiled"), ("gdn", "compiled+blocks"), ("gdn", "compiled+graphs"),
                   ("gdn", "eager+varlen"), ("gdn", "compiled+varlen"), ("natsl-hybrid-340m", "eager"),
                   ("natsl-hybrid-340m", "compiled"), ("natsl-hybrid-340m", "compiled+blocks"),
                   ("natsl-hybrid-340m", "compiled+graphs"), ("natsl-hybrid-340m", "eager+ckpt"),
                   ("natsl-hybrid-340m", "compiled+ckpt"), ("natsl-hybrid-340m", "compiled+blocks+ckpt")}
    assert all(r["tok_s"] > 0 and r["step_ms"] > 0 for r in res["rows"])
    assert [r["documents"] > 1 for r in res["rows"] if r["variant"].endswith("+varlen")] == [True, True]
    assert "| model | layers | B×T | variant |" in proc.stdout


def test_train_bench_dryrun_long_rows_with_profile(tmp_path):
    """The 125M pair at the long shape, plain and checkpointed, each row profiled: ratios against softmax-125m of the
    same variant and the split of the step (kernel time, idle, launches, top kernels) in the JSON and the output."""
    env = {**os.environ, "BENCH_DRYRUN": "1", "TRITON_INTERPRET": "1", "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.train_speed", "--models", "softmax-125m",
                           "interdomain-125m", "--shapes", "1x128", "--variants", "compiled+blocks",
                           "compiled+blocks+ckpt", "--profile", "1"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "train_speed.json").read_text())
    assert res["errors"] == [], res["errors"]
    rows = {(r["name"], r["variant"]): r for r in res["rows"]}
    assert set(rows) == {(n, v) for n in ("softmax-125m", "interdomain-125m")
                         for v in ("compiled+blocks", "compiled+blocks+ckpt")}
    for (_, variant), r in rows.items():
        base = rows[("softmax-125m", variant)]
        assert r["vs_base"] == pytest.approx(r["tok_s"] / base["tok_s"])
        prof = r["profile"]
        assert prof["launches"] > 0 and prof["kernel_ms"] > 0 and 0 <= prof["gap_share"] <= 1
        assert prof["top"] and all(0 < share <= 1 for *_, share in prof["top"])
        assert sum(prof["categories"].values()) == pytest.approx(prof["kernel_ms"])
    assert "| tokens/s | vs base |" in proc.stdout
    assert proc.stdout.count("launches/step") == 4 and proc.stdout.count("by kind (ms/step):") == 4


@pytest.mark.parametrize("name, kind", [
    ("_chunk_bwd", "mixer op"),
    ("_bwd_k_kernel", "mixer op"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_3", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_bf16_128x64>", "matmul"),
    ("triton_tem_fused_mm_0", "matmul"),
    ("triton_poi_fused__to_copy_add_mul_0", "fused glue"),
    ("triton_red_fused_rms_norm_1", "fused glue"),
    ("triton_per_fused_sum_2", "fused glue"),
    ("triton_poi_fused__scaled_dot_product_flash_attention_view_3", "fused glue"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "elementwise"),
    ("some_unknown_kernel", "other"),
])
def test_profile_kernel_kinds(name, kind):
    from benchmarks.profile_train import CATEGORIES, kernel_category

    assert kernel_category(name) == kind and kind in CATEGORIES
