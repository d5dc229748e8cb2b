"""``GatedDeltaConfig(buffer_dtype="bf16")``: bf16 w / u / S_n / vn buffers and bf16 operands of the state and output
kernels' dots, against the float64 reference; ``buffer_dtype="auto"`` (the default)
picks it for bf16 / fp16 activations and keeps the fp32 launch for fp32 ones.

Runs on CPU under the Triton interpreter (``TRITON_INTERPRET=1``) or on CUDA. The interpreter's ``tl.dot`` multiplies
bf16's uint16 storage as integers and its fp32 -> bf16 cast truncates (triton 3.6 / 3.9), so the kernels emulate the
GPU there (``kernels._bf16``: fp32 tensors holding the round-to-nearest-even bf16 value; products of two bf16 values
are exact in fp32): the interpreter runs the GPU's rounding, up to the order of the fp32 sums.

Tolerance ``BF16_TOL = 2e-2`` (relative error norm, outputs, final state and every gradient): bf16 keeps 8
significant bits, unit roundoff u = 2^-9 ~ 2e-3; a dot with both operands rounded carries ~2u per product, and the
state forward rounds w, S and vn each chunk (the gates decay the older errors, so they do not grow with T). Observed
in the interpreter: 2e-5 .. 4e-3 at T = 63 / 200 (K = V = 32); 2e-2 (~10u) is that with a 5x margin, and still
100x below an O(1) error (a wrong buffer or a missed chunk; the NaN-poisoned buffers catch unwritten elements).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from test_gated_delta_triton import BF16_TOL, NAMES, make_case, rel, run_both
from test_varlen_triton import GDN_NAMES, LENGTHS, _gdn_inputs, _gdn_separate, _grads, _leaf, _loss
from triton_device import DEVICE, INTERPRET

from hybrid_attention.ops.common.varlen import cu_seqlens_from_lengths
from hybrid_attention.ops.gated_delta import chunk_gated_delta, gated_delta
from hybrid_attention.ops.gated_delta.triton import HAS_TRITON as TRITON_AVAILABLE
from hybrid_attention.ops.gated_delta.triton import GatedDeltaConfig, triton_gated_delta
from hybrid_attention.ops.gated_delta.triton import function as F
from hybrid_attention.ops.gated_delta.triton.config import DEFAULT_CONFIG
from hybrid_attention.ops.gated_delta.triton.kernels import _bf16
from hybrid_attention.ops.natsl_mixed import natsl_mixed

pytestmark = [
    pytest.mark.skipif(not TRITON_AVAILABLE, reason="triton is not installed"),
    pytest.mark.triton,  # CUDA, or the CPU interpreter (triton_device.py)
]
BF16 = GatedDeltaConfig(buffer_dtype="bf16", poison=True)
BF16_DH_TOL = 3e-2  # bwdk_dots="bf16": dh stored in bf16 (test_bf16_activations_and_wide_tiles)


def test_buffer_dtype_field():
    """The default is "auto" (the activations' precision); a bad value is refused naming the field."""
    assert DEFAULT_CONFIG.buffer_dtype == "auto"
    assert GatedDeltaConfig() == GatedDeltaConfig(buffer_dtype="auto") == DEFAULT_CONFIG
    with pytest.raises(ValueError, match=r"buffer_dtype must be one of auto, fp32, bf16, got 'fp16'"):
        GatedDeltaConfig(buffer_dtype="fp16")
    with pytest.raises(ValueError, match="buffer_dtype"):
        dataclasses.replace(DEFAULT_CONFIG, buffer_dtype="bfloat16")
    with pytest.raises(ValueError, match=r"seqb_dots must be one of fp32, bf16, got 'tf32'"):
        GatedDeltaConfig(seqb_dots="tf32")


@pytest.mark.parametrize("buffer_dtype,seqb_dots,act,stages,bf16_dots", [
    ("auto", "bf16", torch.bfloat16, 2, True), ("auto", "bf16", torch.float32, 1, False),
    ("bf16", "fp32", torch.float32, 1, False), ("fp32", "bf16", torch.bfloat16, 1, False),
])
def test_state_backward_stages_follow_its_dots(buffer_dtype, seqb_dots, act, stages, bf16_dots):
    """The state backward is pipelined (``seqb_stages_bf16`` = 2) only when its dots take bf16 operands; an fp32-dot
    launch keeps ``seqb_stages`` = 1 (2 stages there gave wrong gradients on the H200: GatedDeltaConfig)."""
    tiles = F._Tiles(128, 256, GatedDeltaConfig(buffer_dtype=buffer_dtype, seqb_dots=seqb_dots), act, 6)
    assert (tiles.seqb["num_stages"], tiles.seqb["BF16"]) == (stages, bf16_dots)


@pytest.mark.parametrize("buffer_dtype,act,low", [
    ("fp32", torch.float32, torch.float32), ("bf16", torch.float32, torch.bfloat16),
    ("auto", torch.float32, torch.float32), ("auto", torch.bfloat16, torch.bfloat16),
    ("auto", torch.float16, torch.bfloat16), ("fp32", torch.bfloat16, torch.float32),
])
def test_saved_buffer_dtypes(buffer_dtype, act, low):
    """bf16 mode stores exactly w, u, S_n and vn in bf16; G, r, X and the final state stay fp32. "auto" is bf16 mode
    for bf16 / fp16 activations (q, k, v) and fp32 mode for fp32 ones."""
    inputs, _, _ = make_case(1, 40, 2, 16, 32, 16, "random", True, seed=4)
    q, k, v, g, beta, commit, S0 = (x.to(DEVICE) for x in inputs)
    q, k, v = (x.to(act) for x in (q, k, v))
    cfg = GatedDeltaConfig(buffer_dtype=buffer_dtype)
    _, Sfin, saved = F._launch_fwd(q, k, v, g, beta, commit, S0, 0.25, True, True, 16, True, cfg)
    G, rq, rk, X, w, states, vn = saved
    assert [t.dtype for t in (w, states, vn)] == [low] * 3, (buffer_dtype, act)
    assert [t.dtype for t in (G, rq, rk, X, Sfin)] == [torch.float32] * 5


def test_default_equals_explicit_fp32():
    """With fp32 activations the default launch ("auto") and an explicit ``buffer_dtype="fp32"`` give bit-identical
    outputs and gradients (the fp32 path is the pre-bf16 code: ``_bf16`` is the identity there and the backward's
    casts are no-ops; the fp32 tolerance tests of test_gated_delta_triton.py run this path)."""
    inputs, do, dS = make_case(1, 37, 2, 16, 32, 16, "random", True, seed=21)
    a, _ = run_both(inputs, do, dS, 16, True, config=GatedDeltaConfig(buffer_dtype="fp32", poison=True))
    b, _ = run_both(inputs, do, dS, 16, True)  # gated_delta(backend="triton"): DEFAULT_CONFIG
    for name, x, y in zip(NAMES, a, b):
        assert torch.equal(x, y), name
    # seqb_dots="bf16" acts only with bf16 buffers: with fp32 ones the launch is the fp32 one, bit for bit
    c, _ = run_both(inputs, do, dS, 16, True, config=GatedDeltaConfig(buffer_dtype="fp32", seqb_dots="bf16"))
    for name, x, y in zip(NAMES, a, c):
        assert torch.equal(x, y), name


def test_public_ops_pass_buffer_dtype_to_the_kernels():
    """``gated_delta(..., buffer_dtype=)`` and ``natsl_mixed(..., buffer_dtype=)`` (what the GDN / NAtS-L layers'
    pin reaches) launch the kernels with that precision: with fp32 activations "fp32" is the default launch bit for
    bit, "bf16" moves the output by bf16 rounding (nonzero, within BF16_TOL of fp32), and both ops agree."""
    inputs, _, _ = make_case(1, 37, 2, 16, 32, 16, "random", True, seed=5)
    q, k, v, g, beta, commit, S0 = (x.to(DEVICE) for x in inputs)
    gen = torch.Generator().manual_seed(6)
    qa, ka, va = (torch.randn(1, 37, 4, 8, generator=gen).to(DEVICE) for _ in range(3))
    routing = torch.randint(0, 2, (1, 3, 2), generator=gen).float().to(DEVICE)
    out = {}
    for bd in ("auto", "fp32", "bf16"):
        o, _ = gated_delta(q, k, v, g, beta, commit=commit, chunk_size=16, initial_state=S0, backend="triton",
                           buffer_dtype=bd)
        o_m, _, _ = natsl_mixed(q, k, v, g, beta, commit, qa, ka, va, routing, chunk_size=16, group_size=2,
                                initial_state=S0, backend="triton", buffer_dtype=bd)
        assert torch.equal(o, o_m), bd
        out[bd] = o
    assert torch.equal(out["auto"], out["fp32"])
    assert 1e-6 < rel(out["bf16"], out["fp32"]) < BF16_TOL
    for fn in (lambda: gated_delta(q, k, v, g, beta, backend="reference", buffer_dtype="half"),
               lambda: natsl_mixed(q, k, v, g, beta, commit, qa, ka, va, routing, chunk_size=16, group_size=2,
                                   backend="reference", buffer_dtype="half")):
        with pytest.raises(ValueError, match=r"buffer_dtype must be one of auto, fp32, bf16, got 'half'"):
            fn()


@pytest.mark.parametrize(
    "T,commit_kind,decay_uncommitted,with_s0,C",
    [
        (63, "random", True, True, 16),
        (63, "relaxed", False, True, 16),
        (200, "random", True, True, 16),
        (200, "none", True, False, 64),  # the blocked inverse, one partial chunk, no commit mask
    ],
)
@pytest.mark.parametrize("seqb_dots", ["fp32", "bf16"])
def test_bf16_matches_reference_all_gradients(T, commit_kind, decay_uncommitted, with_s0, C, seqb_dots):
    # seqb_dots="bf16": the state backward's three dots on bf16 operands as well (GatedDeltaConfig.seqb_dots)
    inputs, do, dS = make_case(1, T, 2, 32, 32, C, commit_kind, with_s0, seed=2000 + T)
    tri, ref = run_both(inputs, do, dS, C, decay_uncommitted, config=dataclasses.replace(BF16, seqb_dots=seqb_dots))
    for name, a, b in zip(NAMES, tri, ref):
        if b is None:
            assert a is None, name
            continue
        assert torch.isfinite(a).all(), name
        assert rel(a.cpu(), b) < BF16_TOL, (name, rel(a.cpu(), b))


@pytest.mark.parametrize("options", [
    {}, dict(seqf_bv=32, seqf_warps=8, seqf_stages=2), dict(seqb_dots="bf16", seqb_scale="tile", seqb_warps=4),
    dict(local_dv="bwd_local"), dict(bwdk_dots="bf16"), dict(local_dv="bwd_local", bwdk_dots="bf16")])
def test_bf16_activations_and_wide_tiles(options):
    """bf16 q / k / v (the layer's dtype; o, dq, dk, dv come back bf16) with the default state tile, the wider
    candidate (seqf_bv 32 with 8 warps, 2 stages; V = 64: two V tiles), the "tile" state backward and the bf16
    backward options (``local_dv``, ``bwdk_dots``), against float64 on the same bf16 values."""
    inputs, do, dS = make_case(1, 70, 1, 32, 64, 16, "relaxed", True, seed=8)
    q, k, v = (x.bfloat16() for x in inputs[:3])
    g, beta, commit, S0 = inputs[3:]
    ref_xs = [x.detach().double().requires_grad_() for x in (q, k, v, g, beta, commit, S0)]
    o_ref, S_ref = chunk_gated_delta(*ref_xs[:5], commit=ref_xs[5], chunk_size=16, initial_state=ref_xs[6],
                                     output_final_state=True)
    ref = [o_ref, S_ref, *torch.autograd.grad((o_ref * do.double()).sum() + (S_ref * dS.double()).sum(), ref_xs)]
    cfg = dataclasses.replace(BF16, **options)
    xs = [x.detach().to(DEVICE).clone().requires_grad_() for x in (q, k, v, g, beta, commit, S0)]
    o, S = triton_gated_delta(*xs[:5], commit=xs[5], chunk_size=16, initial_state=xs[6], output_final_state=True,
                              config=cfg)
    assert o.dtype == torch.bfloat16
    grads = torch.autograd.grad((o.float() * do.to(DEVICE)).sum() + (S * dS.to(DEVICE)).sum(), xs)
    assert grads[0].dtype == torch.bfloat16
    # bwdk_dots="bf16" stores dh in bf16, which rounds the terms of the chunk sums behind dcommit and dg (the "bf16
    # operands in the key-side backward" rows of benchmarks/README.md): its bar is BF16_DH_TOL
    tol = BF16_DH_TOL if options.get("bwdk_dots") == "bf16" else BF16_TOL
    for name, a, b in zip(NAMES, [o, S, *grads], ref):
        assert torch.isfinite(a).all() and rel(a.cpu(), b) < tol, (name, rel(a.cpu(), b))


def test_bf16_packed_matches_separate():
    """Packed documents (lengths 1, 5, 16, 37 at C = 16) with commit mask and initial states, bf16 buffers."""
    inputs = _gdn_inputs(LENGTHS, "random", True, seed=11)
    ref_xs = [_leaf(x, torch.float64, "cpu") for x in inputs]
    o_ref, S_ref = _gdn_separate(ref_xs, LENGTHS, True)
    g_ref = _grads(_loss(o_ref, S_ref), ref_xs)
    xs = [_leaf(x, torch.float32, DEVICE) for x in inputs]
    q, k, v, g, beta, commit, S0 = xs
    o, S = triton_gated_delta(q, k, v, g, beta, commit=commit, chunk_size=16, initial_state=S0,
                              output_final_state=True, config=BF16,
                              cu_seqlens=cu_seqlens_from_lengths(LENGTHS).to(DEVICE))
    g_tri = _grads(_loss(o.double(), S.double()), xs)
    for name, a, b in zip(GDN_NAMES, [o, S, *g_tri], [o_ref, S_ref, *g_ref], strict=True):
        assert torch.isfinite(a).all(), name
        assert (a.double().cpu() - b).norm() / max(b.norm().item(), 1.0) < BF16_TOL, name


@triton.jit
def _round(x_ptr, y_ptr, z_ptr, N: tl.constexpr):
    """y = _bf16(x) with the interpreter's emulation (fp32 holding the rounded value), z the same stored to bf16."""
    r = tl.arange(0, N)
    y = _bf16(tl.load(x_ptr + r), True, True)
    tl.store(y_ptr + r, y)
    tl.store(z_ptr + r, y)


def test_bf16_rounding_emulation_matches_torch():
    """``kernels._bf16`` under the interpreter rounds exactly like torch's fp32 -> bf16 (nearest even: ties, carries
    into the exponent, overflow to inf, subnormals), keeps NaN, and the value stores exactly into a bf16 buffer."""
    if not INTERPRET:
        pytest.skip("the emulation is the interpreter's path")
    n = 1 << 14
    x = torch.randn(n, generator=torch.Generator().manual_seed(0)) * torch.logspace(-42, 38, n)
    x[:8] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, float("nan"), float("inf"), -float("inf"),
                          3.3895e38, 0.0])
    x[8:24] = (torch.arange(16, dtype=torch.int32) * 0x8000 + 0x3F7F_0000).view(torch.float32)  # ties, carries
    y, z = torch.empty(n), torch.empty(n, dtype=torch.bfloat16)
    _round[(1,)](x, y, z, n)
    ref = x.bfloat16()
    nan = ref.isnan()
    assert torch.equal(y.isnan(), nan) and torch.equal(z.isnan(), nan)
    assert torch.equal(y.bfloat16()[~nan].view(torch.int16), ref[~nan].view(torch.int16))
    # the interpreter's own fp32 -> bf16 store cast flushes bf16 subnormals (< 2^-126) to zero (the GPU keeps them):
    # a difference far below any value these kernels store
    normal = ~nan & ((ref.float().abs() >= 2.0**-126) | (ref == 0))
    assert torch.equal(z[normal].view(torch.int16), ref[normal].view(torch.int16))


def test_bf16_kernels_compile_for_sm90(monkeypatch):
    """Every forward kernel's bf16 specialisation (unpacked and packed) compiles for sm_90 with the signature
    inductor gives it (i64 ints, fp64 floats), as ``test_triton_scalar_args`` checks for the default launches."""
    if not INTERPRET or os.environ.get("HYBRID_SKIP_AOT"):
        pytest.skip("records launches under the interpreter, then compiles in a subprocess")
    import test_triton_scalar_args as sa

    launches = sa._record_launches(monkeypatch)
    inputs, do, dS = make_case(1, 20, 1, 16, 16, 16, "random", True, seed=3)
    run_both(inputs, do, dS, 16, True, config=BF16)
    ins = _gdn_inputs((3, 17), "random", True, seed=3, H=1, V=16)
    q, k, v, g, beta, commit, S0 = (x.to(DEVICE) for x in ins)
    with torch.no_grad():
        triton_gated_delta(q, k, v, g, beta, commit=commit, chunk_size=16, initial_state=S0, config=BF16,
                           cu_seqlens=cu_seqlens_from_lengths((3, 17)))
    monkeypatch.undo()
    fwd = {"_prep_kernel", "_state_fwd_kernel", "_output_kernel"}
    specs = [sp for sp in sa._aot_spec(launches) if sp["kernel"] in fwd]
    assert {sp["kernel"] for sp in specs} == fwd and all(sp["constexprs"]["BF16"] for sp in specs)
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, "-c", sa.AOT_SCRIPT], input=json.dumps(specs), capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(failed)
