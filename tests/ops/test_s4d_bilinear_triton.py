"""Triton backend of the bilinear S4D core vs the float64 reference (chunk form), forward and every gradient.

Runs the kernels through the Triton interpreter on CPU (``triton_device.py`` sets TRITON_INTERPRET=1 when no GPU is
present), in float32 at tiny shapes; on a CUDA machine the same tests run compiled (tf32 matmuls,
looser tolerance). Skipped when triton does not import.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from triton_device import DEVICE as DEV

from hybrid_attention.ops.s4d_bilinear import chunk_s4d_bilinear, s4d_bilinear
from hybrid_attention.ops.s4d_bilinear.triton import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable")

if HAS_TRITON:
    from hybrid_attention.ops.s4d_bilinear.triton import ops as s4d_ops
    from hybrid_attention.ops.s4d_bilinear.triton import triton_s4d_bilinear
    from hybrid_attention.ops.s4d_bilinear.triton.config import DEFAULT_CONFIG, S4DBilinearConfig

F64, C128 = torch.float64, torch.complex128
TOL = 1e-4 if DEV == "cpu" else 5e-3  # relative L2 error of float32 kernels (tf32 matmuls on a GPU: 2.3e-3 seen)


def make_params(H: int, M: int, g: torch.Generator, *, re_min: float = -5.0, im_max: float = 50.0):
    """log_lam [H, M] (Re log-uniform in [re_min, -1e-3] with both extremes forced in, Im uniform in ±im_max),
    complex Gaussian B [H, M] and C [H, M, M] (E|C_ij|² = 1/M), all float64 / complex128."""
    re = -torch.exp(torch.empty(H, M, dtype=F64).uniform_(math.log(1e-3), math.log(-re_min), generator=g))
    im = torch.empty(H, M, dtype=F64).uniform_(-im_max, im_max, generator=g)
    re[:, 0], re[:, 1] = re_min, -1e-3  # a mode that underflows within a chunk and one that barely decays
    B = 0.3 * torch.randn(H, M, dtype=C128, generator=g)
    C = torch.randn(H, M, M, dtype=C128, generator=g) / math.sqrt(M)
    return torch.complex(re, im), B, C


def make_case(Bsz: int, T: int, H: int, R: int, M: int, seed: int, with_state: bool):
    g = torch.Generator().manual_seed(seed)
    log_lam, B, C = make_params(H, M, g)
    a = torch.randn(Bsz, T, H, R, dtype=F64, generator=g)
    b = torch.randn(Bsz, T, H, R, dtype=F64, generator=g)
    init = 0.3 * torch.randn(Bsz, H, M, 2 * R, dtype=C128, generator=g) if with_state else None
    return a, b, log_lam, B, C, init


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error of x against the float64 reference."""
    x = x.detach().to(ref.device, ref.dtype)
    return ((x - ref).norm() / ref.norm().clamp(min=1e-30)).item()


def low(x: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """Fresh leaf on DEV: real tensors in ``dtype``, complex ones in complex64."""
    if x is None:
        return None
    y = x.to(torch.complex64) if x.is_complex() else x.to(dtype)
    return y.to(DEV).detach().requires_grad_()


def check_against_reference(a, b, log_lam, B, C, init, *, chunk_size: int, dtype=torch.float32, tol: float = TOL,
                            config=None, cu_seqlens=None):
    """Outputs, final state and the gradient of every input of triton_s4d_bilinear (launch configuration ``config``,
    an ``S4DBilinearConfig``; None = the registered op's defaults; packed documents if ``cu_seqlens``) vs float64
    chunk_s4d_bilinear, for a random linear functional of (o, final state)."""
    ref_in = [x.clone().requires_grad_() if x is not None else None for x in (a, b, log_lam, B, C, init)]
    o_ref, s_ref = chunk_s4d_bilinear(
        *ref_in[:5], initial_state=ref_in[5], output_final_state=True, chunk_size=chunk_size, cu_seqlens=cu_seqlens
    )
    tri_in = [low(x, dtype) for x in (a, b, log_lam, B, C, init)]
    cu = cu_seqlens.to(DEV) if cu_seqlens is not None else None
    o, s = triton_s4d_bilinear(*tri_in[:5], initial_state=tri_in[5], output_final_state=True, chunk_size=chunk_size,
                               config=config, cu_seqlens=cu)
    assert o.shape == o_ref.shape and o.dtype == dtype
    assert s.shape == s_ref.shape and s.dtype == torch.complex64
    assert torch.isfinite(o).all() and torch.isfinite(torch.view_as_real(s)).all()
    assert rel(o, o_ref) < tol, ("o", rel(o, o_ref))
    assert rel(s, s_ref) < tol, ("final state", rel(s, s_ref))
    g = torch.Generator().manual_seed(7)
    w_o = torch.randn(o_ref.shape, dtype=F64, generator=g)
    w_s = torch.randn(s_ref.shape, dtype=C128, generator=g)
    loss_ref = (o_ref * w_o).sum() + (s_ref * w_s.conj()).real.sum()
    loss = (o.double() * w_o.to(DEV)).sum() + (s.to(C128) * w_s.to(DEV).conj()).real.sum()
    names = ("a", "b", "log_lam", "B", "C", "initial_state")
    wrt_ref = [x for x in ref_in if x is not None]
    wrt = [x for x in tri_in if x is not None]
    grads_ref = torch.autograd.grad(loss_ref, wrt_ref)
    grads = torch.autograd.grad(loss, wrt)
    for name, gr, gt in zip([n for n, x in zip(names, ref_in) if x is not None], grads_ref, grads):
        assert gt.dtype == (torch.complex64 if gr.is_complex() else dtype), name
        assert torch.isfinite(torch.view_as_real(gt) if gt.is_complex() else gt).all(), name
        assert rel(gt, gr) < tol * 10, (f"d{name}", rel(gt, gr))  # gradients: longer sums, 10x the output tolerance


@pytest.mark.parametrize("with_state", [False, True], ids=["zero0", "state0"])
@pytest.mark.parametrize("T", [1, 17, 40])
def test_triton_matches_reference(T, with_state):
    """T not a multiple of the chunk (16): a partial last chunk, several chunks, one token; two batch rows at T=17
    (the table gradients are summed over batch, chunks and channel tiles)."""
    Bsz = 2 if T == 17 else 1
    check_against_reference(*make_case(Bsz, T, 2, 16, 16, 100 * T + with_state, with_state), chunk_size=16)


def test_triton_odd_sizes():
    """M < 16 and R not a power of two (masked tiles), chunk 32, one batch row."""
    check_against_reference(*make_case(1, 45, 1, 20, 8, 5, True), chunk_size=32)


def test_triton_other_backward_variants():
    """The single-launch backward readout (bwd_split flipped) together with the other shared state path (the
    shared scans' fuse_dz flipped) gives the same gradients."""
    d = DEFAULT_CONFIG
    cfg = S4DBilinearConfig(bwd_split=not d.bwd_split, fuse_dz=not d.fuse_dz)
    check_against_reference(*make_case(1, 21, 2, 16, 16, 3, True), chunk_size=16, config=cfg)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_triton_table_gradients_several_programs(packed):
    """The table gradients (d log λ, dB, dC) and d initial_state are sums over many readout programs' partial slots:
    several batch rows (or packed documents, one shorter than a chunk), several chunks with a partial last one
    (T = 37, chunk 16) and three channel tiles with a masked last one (R = 40, JT = 16), both backward launch forms,
    every kernel buffer NaN-poisoned first (a slot no program writes would show up)."""
    H, R, M = 2, 40, 16
    for split in (True, False):
        cfg = S4DBilinearConfig(JT=16, bwd_split=split, poison=True)
        if packed:
            lengths = (5, 20, 12)
            a, b, log_lam, B, C, _ = make_case(1, sum(lengths), H, R, M, 31, False)
            init = 0.3 * torch.randn(len(lengths), H, M, 2 * R, dtype=C128, generator=torch.Generator().manual_seed(32))
            cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
            check_against_reference(a, b, log_lam, B, C, init, chunk_size=16, config=cfg, cu_seqlens=cu)
        else:
            check_against_reference(*make_case(2, 37, H, R, M, 30, True), chunk_size=16, config=cfg)


def test_triton_bf16_chunk_states():
    """state_dtype="bf16" (the chunk states stored in bf16, the recurrence and every gradient float32) with an initial
    state and a partial last chunk, NaN-poisoned buffers: within bf16 tolerances of the float64 reference."""
    case = make_case(2, 40, 2, 16, 16, 43, True)
    check_against_reference(*case, chunk_size=16, tol=5e-3, config=S4DBilinearConfig(state_dtype="bf16", poison=True))


def test_triton_bf16_inputs():
    """bf16 activations: float32 state math, output in bf16 (tolerance set by the bf16 rounding of o and da, db)."""
    a, b, log_lam, B, C, init = make_case(1, 23, 2, 16, 16, 9, True)
    a, b = a.bfloat16().double(), b.bfloat16().double()  # the reference sees the same rounded inputs
    check_against_reference(a, b, log_lam, B, C, init, chunk_size=16, dtype=torch.bfloat16, tol=1e-2)


def test_triton_no_final_state_and_poisoned_buffers():
    """output_final_state=False returns None; with every kernel buffer NaN-filled first, nothing unwritten leaks."""
    a, b, log_lam, B, C, init = make_case(1, 19, 1, 16, 16, 11, True)
    ins = [low(x) for x in (a, b, log_lam, B, C, init)]
    o, s = triton_s4d_bilinear(*ins[:5], initial_state=ins[5], chunk_size=16, config=S4DBilinearConfig(poison=True))
    assert s is None
    o.square().sum().backward()
    o_ref, _ = chunk_s4d_bilinear(a, b, log_lam, B, C, initial_state=init, chunk_size=16)
    assert rel(o, o_ref) < TOL
    for x in ins:
        assert torch.isfinite(torch.view_as_real(x.grad) if x.grad.is_complex() else x.grad).all()


def test_triton_empty_sequence():
    a, b, log_lam, B, C, init = make_case(1, 0, 1, 16, 16, 13, True)
    ins = [low(x) for x in (a, b, log_lam, B, C, init)]
    o, s = triton_s4d_bilinear(*ins[:5], initial_state=ins[5], output_final_state=True, chunk_size=16)
    assert o.shape == (1, 0, 1, 16)
    assert torch.allclose(s.cpu().to(C128), init, atol=1e-6)


def test_backend_switch():
    """backend='triton' runs the kernels on CPU tensors (interpreter); 'auto' keeps the reference on the CPU; bad
    names and float64 inputs to the triton backend raise ValueError."""
    a, b, log_lam, B, C, _ = make_case(1, 17, 1, 16, 16, 17, False)
    o_ref, _ = chunk_s4d_bilinear(a, b, log_lam, B, C, chunk_size=16)
    o_tri, _ = s4d_bilinear(*[low(x) for x in (a, b, log_lam, B, C)], chunk_size=16, backend="triton")
    assert rel(o_tri, o_ref) < TOL
    if DEV == "cpu":
        assert torch.equal(s4d_bilinear(a, b, log_lam, B, C, chunk_size=16, backend="auto")[0], o_ref)
    with pytest.raises(ValueError, match="backend must be one of .*'triton'"):
        s4d_bilinear(a, b, log_lam, B, C, backend="cuda")
    with pytest.raises(ValueError, match="float64"):
        triton_s4d_bilinear(a, b, log_lam, B, C)


def test_custom_op_opcheck():
    """Schema, fake (meta) implementation and autograd registration of the registered forward op."""
    g = torch.Generator().manual_seed(4)
    H, M, R, BT = 1, 16, 16, 16
    a, b = (torch.randn(1, 9, H, R, generator=g).to(DEV).requires_grad_() for _ in range(2))
    ll = torch.stack([-torch.rand(H, M, generator=g), torch.randn(H, M, generator=g)], 1).to(DEV).requires_grad_()
    bb = torch.randn(H, 2, M, generator=g).to(DEV).requires_grad_()
    cc = (0.2 * torch.randn(H, 2, M, M, generator=g)).to(DEV).requires_grad_()
    kk = (0.2 * torch.randn(H, 2, M, BT, generator=g)).to(DEV).requires_grad_()
    init = torch.randn(1, H, 2, M, 2 * R, generator=g).to(DEV).requires_grad_()
    torch.library.opcheck(
        s4d_ops.s4d_bilinear_fwd_op,
        (a, b, ll, bb, cc, kk, init, None, None, None, 16, True),
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )


@pytest.mark.skipif(DEV == "cuda", reason="the dry run is the CPU smoke test of the GPU benchmark")
def test_benchmark_dry_run(tmp_path):
    """``benchmarks.s4d_bilinear_ops`` at tiny shapes on the CPU (BENCH_DRYRUN=1, interpreter): every
    section runs, the correctness check passes and the JSON has correctness, timing and sweep rows."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, BENCH_DRYRUN="1", TRITON_INTERPRET="1", OUT=str(tmp_path))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.s4d_bilinear_ops"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "s4d_bilinear_gpu.json").read_text())
    assert res["errors"] == [], res["errors"]
    kinds = {r["kind"] for r in res["s4d_bilinear"]}
    assert kinds == {"correctness", "timing", "sweep"}
    assert all(r["pass"] for r in res["s4d_bilinear"] if r["kind"] == "correctness")
    assert {r["op"] for r in res["s4d_bilinear"] if r["kind"] == "timing"} == {
        "triton_s4d_bilinear",
        "interdomain_triton",
        "reference_chunk_s4d_bilinear",
    }
