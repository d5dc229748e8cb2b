"""Triton gated delta rule vs the float64 chunk reference: outputs, final states and every gradient.

Runs on CPU under the Triton interpreter (``TRITON_INTERPRET=1``, fp32, tiny shapes) or on CUDA; skipped with a reason
otherwise. Fresh random inputs per case, odd lengths (partial last chunk), random / relaxed / absent commit masks,
both rollback variants, with and without initial state.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from triton_device import DEVICE

from hybrid_attention.ops.gated_delta import chunk_gated_delta, gated_delta
from hybrid_attention.ops.gated_delta.triton import DEFAULT_CONFIG, GatedDeltaConfig, triton_gated_delta
from hybrid_attention.ops.gated_delta.triton import HAS_TRITON as TRITON_AVAILABLE
from hybrid_attention.ops.gated_delta.triton import function as F

pytestmark = [
    pytest.mark.skipif(not TRITON_AVAILABLE, reason="triton is not installed"),
    pytest.mark.triton,  # CUDA, or the CPU interpreter (triton_device.py)
]
TOL = 2e-5 if DEVICE == "cpu" else 5e-3  # interpreter: exact fp32 dots (observed ~3e-7); GPU: tf32 dots
BF16_TOL = 2e-2  # bf16 buffers: ~10 bf16 unit roundoffs (derivation: test_gated_delta_bf16.py's docstring)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def make_case(B, T, H, K, V, C, commit_kind, with_s0, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    g = -0.6 * torch.rand(B, T, H, generator=gen)
    beta = torch.rand(B, T, H, generator=gen)
    S0 = torch.randn(B, H, K, V, generator=gen) if with_s0 else None
    N = math.ceil(T / C)
    commit = {
        "none": None,
        "random": torch.randint(0, 2, (B, N, H), generator=gen).float(),
        "relaxed": torch.rand(B, N, H, generator=gen),
        "zeros": torch.zeros(B, N, H),
    }[commit_kind]
    do = torch.randn(B, T, H, V, generator=gen)
    dS = torch.randn(B, H, K, V, generator=gen)
    return [q, k, v, g, beta, commit, S0], do, dS


def run_both(inputs, do, dS, C, decay_uncommitted, use_l2=True, config=None):
    """Triton (through ``gated_delta``, or ``triton_gated_delta(config=config)`` when given) and the float64
    reference on the same inputs: [o, final_state, *input grads] of each."""
    results = []
    for backend, dtype, dev in (("triton", torch.float32, DEVICE), ("reference", torch.float64, "cpu")):
        xs = [x.detach().to(dev, dtype).clone().requires_grad_() if x is not None else None for x in inputs]
        q, k, v, g, beta, commit, S0 = xs
        kw = dict(commit=commit, chunk_size=C, initial_state=S0, output_final_state=True,
                  decay_uncommitted=decay_uncommitted, use_qk_l2norm=use_l2)
        if config is not None and backend == "triton":
            o, S = triton_gated_delta(q, k, v, g, beta, config=config, **kw)
        else:
            o, S = gated_delta(q, k, v, g, beta, backend=backend, **kw)
        ((o * do.to(dev, dtype)).sum() + (S * dS.to(dev, dtype)).sum()).backward()
        results.append([o, S] + [x.grad if x is not None else None for x in xs])
    return results


NAMES = ["o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dcommit", "dS0"]


@pytest.mark.parametrize(
    "T,commit_kind,decay_uncommitted,with_s0",
    [
        (1, "random", True, True),
        (7, "relaxed", False, True),
        (7, "none", True, False),
        (33, "random", True, True),
        (33, "random", False, False),
        (33, "relaxed", True, True),
        (48, "zeros", False, True),
    ],
)
def test_matches_reference_all_gradients(T, commit_kind, decay_uncommitted, with_s0):
    inputs, do, dS = make_case(2, T, 2, 16, 32, 16, commit_kind, with_s0, seed=1000 + T)
    tri, ref = run_both(inputs, do, dS, 16, decay_uncommitted)
    for name, a, b in zip(NAMES, tri, ref):
        if b is None:
            assert a is None, name
            continue
        assert torch.isfinite(a).all(), name
        assert rel(a.cpu(), b) < TOL, (name, rel(a.cpu(), b))


def test_tiled_dims_and_no_l2():
    # K > BK and V > BV exercise the tile loops; C = 32; no l2 norm (raw q, k with small values)
    inputs, do, dS = make_case(1, 70, 1, 80, 72, 32, "relaxed", True, seed=7)
    inputs[0] = inputs[0] * 0.1
    inputs[1] = inputs[1] * 0.1
    for use_l2 in (True, False):
        tri, ref = run_both(inputs, do, dS, 32, True, use_l2=use_l2)
        for name, a, b in zip(NAMES, tri, ref):
            assert rel(a.cpu(), b) < TOL, (use_l2, name, rel(a.cpu(), b))


@pytest.mark.parametrize("C", [64, 128])
def test_large_chunks_blocked_inverse(C):
    # C = 64 / 128: 4 / 8 diagonal 16x16 blocks in the blocked (I + A)^{-1}
    inputs, do, dS = make_case(1, 2 * C + 22, 1, 16, 16, C, "relaxed", True, seed=C)
    tri, ref = run_both(inputs, do, dS, C, C == 64)
    for name, a, b in zip(NAMES, tri, ref):
        assert rel(a.cpu(), b) < TOL, (name, rel(a.cpu(), b))


@pytest.mark.skipif(DEVICE == "cpu", reason="a CUDA codegen check (the interpreter runs the small shapes' code path)")
@pytest.mark.parametrize("K,V", [(64, 128), (128, 256)])
@pytest.mark.parametrize("variant", [{}, dict(seqb_scale="tile", seqb_warps=4), dict(seqb_scale="tile", seqb_bv=32),
                                     dict(buffer_dtype="bf16"), dict(buffer_dtype="bf16", seqb_dots="fp32"),
                                     dict(seq_wide_grid=1), dict(buffer_dtype="bf16", seq_wide_grid=1),
                                     dict(fin_bk=32), dict(fin_bk=64), dict(buffer_dtype="bf16", local_dv="bwd_local"),
                                     dict(buffer_dtype="bf16", bwdk_dots="bf16"),
                                     dict(buffer_dtype="bf16", bwdk_dots="bf16", local_dv="state_bwd")])
def test_model_head_shapes_on_cuda(K, V, variant):
    # the heads of `small` (64 / 128) and of the 340m models (128 / 256) at chunk 64, the default launch configuration
    # and the "tile" state backward, which passes every small-shape test on CUDA and the interpreter but hits an
    # illegal memory access at K = 128, V = 256 with 16-wide / 8-warp tiles (triton 3.6, sm_90) -- codegen, not
    # indexing; that launch is not tested here (it takes the CUDA context down)
    inputs, do, dS = make_case(1, 200, 2, K, V, 64, "random", True, seed=K)
    # (fp32 inputs: "auto" keeps fp32 buffers; the last two variants force the bf16 buffers that bf16 activations
    # get, the last with fp32 state-backward dots: wrong gradients on the H200 when that launch has 2 stages)
    cfg = dataclasses.replace(DEFAULT_CONFIG, **variant) if variant else None
    tol = BF16_TOL if variant.get("buffer_dtype") == "bf16" else TOL
    tri, ref = run_both(inputs, do, dS, 64, True, config=cfg)
    for name, a, b in zip(NAMES, tri, ref):
        assert rel(a.cpu(), b) < tol, (name, rel(a.cpu(), b))


@pytest.mark.parametrize("commit_kind,decay_uncommitted", [("random", True), ("relaxed", False), ("none", True)])
def test_state_backward_tile_scale_matches_reference(commit_kind, decay_uncommitted):
    # GatedDeltaConfig.seqb_scale = "tile": the per-token scales on the [C, BV] side of the state backward's dots
    inputs, do, dS = make_case(2, 45, 2, 16, 32, 16, commit_kind, True, seed=45)
    cfg = dataclasses.replace(DEFAULT_CONFIG, seqb_scale="tile")
    tri, ref = run_both(inputs, do, dS, 16, decay_uncommitted, config=cfg)
    for name, a, b in zip(NAMES, tri, ref):
        if b is None:
            continue
        assert rel(a.cpu(), b) < TOL, (name, rel(a.cpu(), b))


@pytest.mark.parametrize("commit_kind,decay_uncommitted,options", [
    ("random", True, dict(local_dv="bwd_local")),
    ("random", True, dict(local_dv="state_bwd")),
    ("relaxed", False, dict(local_dv="state_bwd", seqb_scale="tile")),
    ("none", True, dict(local_dv="state_bwd")),
    ("random", True, dict(local_dv="state_bwd", seqb_dots="fp32")),
    ("random", True, dict(local_dv="bwd_local", bwdk_dots="bf16")),
    ("relaxed", False, dict(local_dv="state_bwd", bwdk_dots="bf16")),
    ("none", True, dict(local_dv="bwd_local", bwdk_dots="bf16")),
])
def test_bf16_backward_options_match_reference(commit_kind, decay_uncommitted, options):
    # the backward options of bf16 buffers: local_dv="state_bwd" (bwd_local stores scale (P⊙D)ᵀ per chunk, the state
    # backward forms dvn_local from it) or "bwd_local" (bwd_local writes dvn_local), and bwdk_dots="bf16" (bwd_k's
    # products on bf16 operands, dh stored bf16); every buffer starts as NaN, so an element a kernel leaves unwritten
    # would surface
    inputs, do, dS = make_case(2, 45, 2, 16, 32, 16, commit_kind, True, seed=47)
    cfg = GatedDeltaConfig(buffer_dtype="bf16", poison=True, **options)
    tiles = F._Tiles(16, 32, cfg, torch.float32, 4)
    # the local form needs the state backward's bf16 dots (seqb_dots="fp32" keeps bwd_local's [T, V] buffer)
    local = options["local_dv"] == "state_bwd" and options.get("seqb_dots", "bf16") == "bf16"
    assert (tiles.local_pd, tiles.bwdk_bf16) == (local, "bwdk_dots" in options)
    tri, ref = run_both(inputs, do, dS, 16, decay_uncommitted, config=cfg)
    for name, a, b in zip(NAMES, tri, ref):
        if b is None:
            continue
        assert torch.isfinite(a).all() and rel(a.cpu(), b) < BF16_TOL, (name, rel(a.cpu(), b))


@pytest.mark.parametrize("buffer_dtype,act,on", [
    ("auto", torch.bfloat16, True), ("bf16", torch.float32, True), ("auto", torch.float32, False),
    ("fp32", torch.bfloat16, False)])
def test_bf16_backward_options_follow_the_buffers(buffer_dtype, act, on):
    # local_dv="state_bwd" and bwdk_dots="bf16" act with bf16 buffers only: an fp32 call keeps bwd_local's [T, V]
    # buffer, fp32 products in bwd_k and an fp32 dh; the default configuration forms dvn_local in the state backward
    # with bf16 buffers and keeps bwd_k's fp32 products
    cfg = GatedDeltaConfig(buffer_dtype=buffer_dtype, local_dv="state_bwd", bwdk_dots="bf16")
    tiles = F._Tiles(128, 256, cfg, act, 24)
    assert (tiles.local_pd, tiles.bwdk_bf16, tiles.bwdk["BF16"], tiles.seqb["DH_BF16"]) == (on, on, on, on)
    default = F._Tiles(128, 256, GatedDeltaConfig(buffer_dtype=buffer_dtype), act, 24)
    assert (default.local_pd, default.bwdk_bf16) == (on, False)
    for kept in (GatedDeltaConfig(buffer_dtype=buffer_dtype, local_dv="bwd_local"),
                 GatedDeltaConfig(buffer_dtype=buffer_dtype, seqb_dots="fp32")):
        assert not F._Tiles(128, 256, kept, act, 24).local_pd


@pytest.mark.parametrize("commit_kind,decay_uncommitted", [("random", True), ("relaxed", False)])
def test_wide_state_tiles_match_reference(commit_kind, decay_uncommitted):
    # seq_wide_grid = 1 with bf16 buffers: the state kernels take the 32-wide value tiles at any grid (V = 64: two)
    inputs, do, dS = make_case(2, 45, 2, 16, 64, 16, commit_kind, True, seed=46)
    cfg = dataclasses.replace(DEFAULT_CONFIG, seq_wide_grid=1, buffer_dtype="bf16")
    assert F._Tiles(16, 64, cfg, torch.float32, 4).BVB == 32
    tri, ref = run_both(inputs, do, dS, 16, decay_uncommitted, config=cfg)
    for name, a, b in zip(NAMES, tri, ref):
        if b is None:
            continue
        assert rel(a.cpu(), b) < BF16_TOL, (name, rel(a.cpu(), b))


@pytest.mark.parametrize("n_seq,width", [(24, 32), (128, 32), (16, 32), (15, 16), (6, 16), (1, 16)])
def test_state_tile_width_follows_the_grid(n_seq, width):
    # the 340m heads (V = 256), bf16 buffers: wide tiles while sequences x heads x 256 / 32 >= seq_wide_grid (128)
    tiles = F._Tiles(128, 256, DEFAULT_CONFIG, torch.bfloat16, n_seq)
    assert (tiles.BVS, tiles.BVB) == (width, width)
    narrow = F._Tiles(128, 256, dataclasses.replace(DEFAULT_CONFIG, seq_wide_grid=0), torch.bfloat16, n_seq)
    assert (narrow.BVS, narrow.BVB) == (DEFAULT_CONFIG.seqf_bv, DEFAULT_CONFIG.seqb_bv)


@pytest.mark.parametrize("buffer_dtype,act", [("auto", torch.float32), ("fp32", torch.bfloat16)])
def test_float32_buffers_keep_narrow_state_tiles(buffer_dtype, act):
    # the float32 state forward's 32-wide tile at K = 128 exceeds sm_90's shared memory: narrow at any grid
    cfg = dataclasses.replace(DEFAULT_CONFIG, buffer_dtype=buffer_dtype, seq_wide_grid=1)
    tiles = F._Tiles(128, 256, cfg, act, 128)
    assert (tiles.BVS, tiles.BVB) == (DEFAULT_CONFIG.seqf_bv, DEFAULT_CONFIG.seqb_bv)


def test_config_rejects_unknown_scale_side():
    with pytest.raises(ValueError, match="seqb_scale must be one of qk, tile"):
        dataclasses.replace(DEFAULT_CONFIG, seqb_scale="k")
    with pytest.raises(ValueError, match="bwdk_dots must be one of fp32, bf16, got 'tf32'"):
        dataclasses.replace(DEFAULT_CONFIG, bwdk_dots="tf32")
    with pytest.raises(ValueError, match="local_dv must be one of bwd_local, state_bwd, got 'output'"):
        dataclasses.replace(DEFAULT_CONFIG, local_dv="output")


def test_chunk128_supported_only_for_small_heads():
    # support.py: chunk 128 stops at K 32 (shared memory / illegal access at the 340m heads on the H200)
    from hybrid_attention.ops.gated_delta.triton import supported

    v = torch.empty(1, 8, 1, 64, device=DEVICE)
    for K, C, ok in [(16, 128, True), (32, 128, True), (64, 128, False), (128, 128, False), (128, 64, True),
                     (256, 16, True), (512, 16, False)]:
        assert supported(torch.empty(1, 8, 1, K, device=DEVICE), v, C) is ok, (K, C)


def test_forward_only_and_dispatch():
    inputs, _, _ = make_case(1, 20, 2, 16, 16, 16, "random", True, seed=3)
    q, k, v, g, beta, commit, S0 = (x.to(DEVICE) for x in inputs)
    with torch.no_grad():
        o1, s1 = gated_delta(q, k, v, g, beta, commit=commit, chunk_size=16, initial_state=S0,
                             output_final_state=True, backend="triton")
        o2, _ = gated_delta(q, k, v, g, beta, commit=commit, chunk_size=16, initial_state=S0, backend="triton")
    o3, s3 = chunk_gated_delta(*(x.double().cpu() for x in (q, k, v, g, beta)), commit=commit.double().cpu(),
                               chunk_size=16, initial_state=S0.double().cpu(), output_final_state=True)
    assert rel(o1.cpu(), o3) < TOL and rel(s1.cpu(), s3) < TOL
    assert torch.equal(o1, o2)
    assert o1.dtype == v.dtype and s1.dtype == torch.float32


def test_split_call_equals_one_call():
    # a prefix call's final state continues exactly (what decode / continued prefill rely on)
    inputs, _, _ = make_case(1, 40, 2, 16, 16, 16, "random", True, seed=5)
    q, k, v, g, beta, commit, S0 = (x.to(DEVICE) for x in inputs)
    kw = dict(chunk_size=16, output_final_state=True, backend="triton")
    with torch.no_grad():
        o, s = gated_delta(q, k, v, g, beta, commit=commit, initial_state=S0, **kw)
        a, b = slice(0, 32), slice(32, 40)
        o1, s1 = gated_delta(q[:, a], k[:, a], v[:, a], g[:, a], beta[:, a], commit=commit[:, :2], initial_state=S0,
                             **kw)
        o2, s2 = gated_delta(q[:, b], k[:, b], v[:, b], g[:, b], beta[:, b], commit=commit[:, 2:], initial_state=s1,
                             **kw)
    assert rel(torch.cat([o1, o2], 1).cpu(), o.cpu()) < TOL
    assert rel(s2.cpu(), s.cpu()) < TOL


def test_bf16_inputs_run_and_stay_close():
    inputs, do, _ = make_case(1, 33, 2, 32, 32, 16, "random", True, seed=9)
    q, k, v = (x.to(DEVICE, torch.bfloat16) for x in inputs[:3])
    g, beta, commit, S0 = (x.to(DEVICE) for x in inputs[3:])
    with torch.no_grad():
        o, s = gated_delta(q, k, v, g, beta, commit=commit, chunk_size=16, initial_state=S0, output_final_state=True,
                           backend="triton")
    ref_o, ref_s = chunk_gated_delta(*(x.double().cpu() for x in (q, k, v, g, beta)), commit=commit.double().cpu(),
                                     chunk_size=16, initial_state=S0.double().cpu(), output_final_state=True)
    assert o.dtype == torch.bfloat16
    # bf16 activations: the default ("auto") stores w / u / S_n / vn in bf16 too (test_gated_delta_bf16.py); the
    # final state stays fp32 but is updated from bf16-rounded operands: ~10 bf16 unit roundoffs, as the bf16 tests
    assert rel(o.cpu(), ref_o) < BF16_TOL and rel(s.cpu(), ref_s) < BF16_TOL


# ---------------------------------------------------------------------------------------------------------------------
# chunk attention (the NAtS-L softmax branch): block-sparse Triton kernels vs the dense float64 oracle


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    """Relative error norm; absolute when the reference norm is below 1 (e.g. dq of a single token is exactly 0)."""
    den = max(b.double().norm().item(), 1.0)
    return (a.double().cpu() - b.double()).norm().item() / den < tol


@pytest.mark.parametrize(
    "B,T,Hs,G,C,frac,bias",
    [
        (2, 33, 4, 2, 16, 0.5, True),
        (1, 70, 2, 1, 16, 1.0, True),
        (1, 70, 2, 2, 16, 0.0, True),
        (1, 1, 2, 2, 16, 0.5, True),
        (2, 100, 4, 2, 16, 0.3, True),
        (1, 100, 2, 2, 32, 0.6, False),
    ],
)
def test_chunk_attention_triton_matches_dense(B, T, Hs, G, C, frac, bias):
    from hybrid_attention.ops.chunk_attention import chunk_attention

    gen = torch.Generator().manual_seed(T + 17 * Hs)
    q, k = torch.randn(B, T, Hs, 16, generator=gen), torch.randn(B, T, Hs, 16, generator=gen)
    v = torch.randn(B, T, Hs, 32, generator=gen)
    N = math.ceil(T / C)
    routing = torch.rand(B, N, Hs // G, generator=gen) < frac
    rb = 0.3 * torch.randn(B, N, Hs // G, generator=gen) if bias else None  # nonzero bias: forward effect too
    do = torch.randn(B, T, Hs, 32, generator=gen)
    res = []
    for backend, dtype, dev in (("triton", torch.float32, DEVICE), ("naive", torch.float64, "cpu")):
        xs = [x.detach().to(dev, dtype).clone().requires_grad_() for x in (q, k, v)]
        b_ = rb.detach().to(dev, dtype).clone().requires_grad_() if bias else None
        o = chunk_attention(*xs, routing.to(dev), chunk_size=C, group_size=G, routing_bias=b_, backend=backend)
        (o * do.to(dev, dtype)).sum().backward()
        res.append([o] + [x.grad for x in xs] + ([b_.grad] if bias else []))
    for name, a, b in zip(["o", "dq", "dk", "dv", "d_routing_bias"], *res):
        assert torch.isfinite(a).all(), name
        assert _close(a, b, TOL), name


def test_poisoned_buffers_are_fully_written():
    """Every kernel-written buffer starts as NaN: any element a kernel forgets to write would surface."""
    from hybrid_attention.ops.chunk_attention.triton import ChunkAttentionConfig, triton_chunk_attention

    inputs, do, dS = make_case(1, 37, 2, 16, 16, 16, "random", True, seed=21)
    tri, ref = run_both(inputs, do, dS, 16, True, config=GatedDeltaConfig(poison=True))
    for name, a, b in zip(NAMES, tri, ref):
        assert torch.isfinite(a).all() and rel(a.cpu(), b) < TOL, name
    q = torch.randn(1, 37, 2, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 37, 2, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(1, 37, 2, 16, device=DEVICE, requires_grad=True)
    rb = torch.zeros(1, 3, 1, device=DEVICE, requires_grad=True)
    routing = torch.tensor([[[True], [False], [True]]], device=DEVICE)
    o = triton_chunk_attention(q, k, v, routing, chunk_size=16, group_size=2, routing_bias=rb,
                               config=ChunkAttentionConfig(poison=True))
    o.square().sum().backward()
    for t in (o, q.grad, k.grad, v.grad, rb.grad):
        assert torch.isfinite(t).all()


def test_decode_step_matches_token_loop():
    """Fused single-token step (state in place) over several tokens == the reference on the whole sequence."""
    from hybrid_attention.ops.gated_delta import naive_gated_delta
    from hybrid_attention.ops.gated_delta.triton import triton_gated_delta_step

    inputs, _, _ = make_case(2, 5, 2, 40, 24, 16, "none", True, seed=31)
    q, k, v, g, beta, _, S0 = inputs
    ref_o, ref_S = naive_gated_delta(*(x.double() for x in (q, k, v, g, beta)), initial_state=S0.double(),
                                     output_final_state=True)
    S = S0.to(DEVICE).contiguous().clone()
    outs = []
    for t in range(5):
        o, S2 = triton_gated_delta_step(*(x[:, t].to(DEVICE) for x in (q, k, v, g, beta)), S)
        assert S2 is S  # in place
        outs.append(o)
    assert rel(torch.stack(outs, 1).cpu(), ref_o) < TOL
    assert rel(S.cpu(), ref_S) < TOL


_CHUNK128_PROBE = """
import sys, torch
sys.path[:0] = [{root!r}, {root!r} + "/tests"]
from tests.ops.test_gated_delta_triton import make_case, run_both, rel
inputs, do, dS = make_case(1, 300, 2, 32, 64, 128, "random", True, seed=128)
tri, ref = run_both(inputs, do, dS, 128, True)
torch.cuda.synchronize()
print(max(rel(a.cpu(), b) for a, b in zip(tri, ref) if b is not None))
"""


@pytest.mark.skipif(DEVICE == "cpu", reason="a CUDA codegen check (the interpreter runs the small shapes' code path)")
def test_chunk128_largest_supported_heads_on_cuda():
    # chunk 128 is a public value; at the 340m heads (K 128 / V 256) the kernels run out of shared memory (fp32) or
    # hit an illegal access (bf16, 8 warps, 32-wide tiles), so `supported` stops at K 32 there (support.py). The
    # largest supported heads run in a child process (an illegal access takes the CUDA context down), forward and
    # backward vs float64; the 340m heads fall back to the PyTorch chunk form
    import subprocess
    import sys
    from pathlib import Path

    from hybrid_attention.ops.gated_delta.triton import supported

    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", _CHUNK128_PROBE.format(root=root)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.split()[-1]) < TOL, out.stdout
    q, v = torch.empty(1, 8, 1, 128, device="cuda"), torch.empty(1, 8, 1, 256, device="cuda")
    assert not supported(q, v, 128) and supported(q, v, 64) and supported(q[..., :32], v, 128)
