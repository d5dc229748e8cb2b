"""Tests of ``chunk_s4d``, the chunked form of the S4D-only control (ops/s4d/chunk.py), against the float64 token
loop ``naive_s4d``: outputs, final states and every gradient for T not a multiple of the chunk, T below it, T = 0,
several chunk sizes, with and without an initial state, batch > 1; packed documents (cu_seqlens) equal to separate
runs; the multi-level chunk scan; float32 long phases, bf16 autocast and bf16 inputs; no host read (meta device);
torch.compile(fullgraph=True) over two document layouts without a recompile; the dispatcher; bad arguments."""

from __future__ import annotations

import pytest
import torch
from ssm_cases import make_ssm_params, make_state, max_err

import hybrid_attention.ops.s4d.chunk as chunk_mod
from hybrid_attention.ops.common.varlen import cu_seqlens_from_lengths
from hybrid_attention.ops.s4d import chunk_s4d, fft_s4d, naive_s4d, s4d

F64, C128, C64 = torch.float64, torch.complex128, torch.complex64
NAMES = ("a", "b", "log_lam", "B", "C", "w", "initial_state")


def make_inputs(Bsz: int, T: int, H: int, R: int, D: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(Bsz, T, H, R, dtype=F64, generator=g), torch.randn(Bsz, T, H, D, dtype=F64, generator=g)


def _run(fn, leaves, with_state: bool, dy, dfin, **kw):
    """(y, final, grads of every leaf) of fn on fresh leaves; the loss reads y and the final state."""
    leaves = [x.detach().clone().requires_grad_() for x in leaves]
    init = leaves[6] if with_state else None
    y, fin = fn(*leaves[:6], initial_state=init, output_final_state=True, **kw)
    loss = (y * dy).sum() + (fin.conj() * dfin).real.sum()
    used = leaves if with_state else leaves[:6]
    return y.detach(), fin.detach(), torch.autograd.grad(loss, used)


def _compare(ref, got, tol: float = 1e-10):
    (y_n, f_n, g_n), (y_c, f_c, g_c) = ref, got
    assert y_c.shape == y_n.shape and y_c.dtype == y_n.dtype and f_c.shape == f_n.shape and f_c.dtype == f_n.dtype
    assert max_err(y_c, y_n) < tol * max(1.0, y_n.abs().max().item())
    assert max_err(f_c, f_n) < tol * max(1.0, f_n.abs().max().item())
    for name, gn, gc in zip(NAMES, g_n, g_c):
        assert gc.dtype == gn.dtype, name
        assert max_err(gc, gn) < tol * max(1.0, gn.abs().max().item()), name


@pytest.mark.parametrize("Bsz,T,L,with_state", [
    (2, 37, 8, True),  # T not a multiple of L, batch > 1
    (2, 37, 8, False),
    (1, 5, 16, True),  # T < L
    (3, 48, 16, True),  # T a multiple of L
    (1, 45, 1, True),  # one token per chunk: NC = 45 > SCAN_BLOCK, the two-level chunk scan
    (2, 70, 64, True),  # the default chunk size, one partial chunk
], ids=lambda x: str(x))
def test_equals_naive_values_and_gradients(Bsz, T, L, with_state):
    H, R, D, M = 2, 3, 2, 6
    log_lam, B, C, w = make_ssm_params(H, M, 11, with_w=True)
    a, b = make_inputs(Bsz, T, H, R, D, 12)
    init = make_state(Bsz, H, M, R + D, 13)
    g = torch.Generator().manual_seed(14)
    dy = torch.randn(Bsz, T, H, R + D, dtype=F64, generator=g)
    dfin = torch.randn(Bsz, H, M, R + D, dtype=C128, generator=g)
    leaves = (a, b, log_lam, B, C, w, init)
    ref = _run(naive_s4d, leaves, with_state, dy, dfin)
    assert ref[0].abs().max() > 1e-1
    _compare(ref, _run(chunk_s4d, leaves, with_state, dy, dfin, chunk_size=L))


def test_empty_sequence():
    H, M, R, D = 2, 4, 3, 2
    log_lam, B, C, w = make_ssm_params(H, M, 0, with_w=True)
    init = make_state(2, H, M, R + D, 2)
    a, b = make_inputs(2, 0, H, R, D, 1)
    y, s = chunk_s4d(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True)
    assert y.shape == (2, 0, H, R + D) and torch.equal(s, init)
    y, s = chunk_s4d(a, b, log_lam, B, C, w, output_final_state=True)
    assert s.shape == init.shape and not s.abs().any()
    assert chunk_s4d(a, b, log_lam, B, C, w)[1] is None


def test_pieces_equal_single_call():
    """T tokens at once == T1 tokens, then the rest from the carried state (chunk boundaries move with the split)."""
    H, R, D, M, T = 2, 2, 3, 6, 29
    log_lam, B, C, w = make_ssm_params(H, M, 31, with_w=True, im_max=100.0)
    a, b = make_inputs(1, T, H, R, D, 32)
    init = make_state(1, H, M, R + D, 33)
    full, s_full = chunk_s4d(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True, chunk_size=4)
    for split in (1, 6, 8):
        y1, s1 = chunk_s4d(a[:, :split], b[:, :split], log_lam, B, C, w, initial_state=init, output_final_state=True,
                           chunk_size=4)
        y2, s2 = chunk_s4d(a[:, split:], b[:, split:], log_lam, B, C, w, initial_state=s1, output_final_state=True,
                           chunk_size=4)
        assert max_err(torch.cat([y1, y2], 1), full) < 1e-10 and max_err(s2, s_full) < 1e-10, split


# documents of length 1, exactly L = 4, several L, starting mid-chunk (offsets 1, 5, 21, 25, 26) and on boundaries
LENGTHS = (1, 4, 3, 13, 4, 1, 6, 9)


@pytest.mark.parametrize("L,block", [(4, 32), (8, 32), (3, 32), (1, 2), (2, 2)],
                         ids=["L4", "L8", "L3", "L1-scan-block2", "L2-scan-block2"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero0", "state0"])
def test_packed_equals_separate_runs(L, block, with_state, monkeypatch):
    """Packed documents == each document run alone (naive_s4d with cu_seqlens runs them one by one): outputs, final
    states and gradients. block = 2: a 2-chunk scan block, so the chunk scan recurses over several levels with
    document boundaries inside and across its blocks."""
    monkeypatch.setattr(chunk_mod, "SCAN_BLOCK", block)
    H, R, D, M = 2, 3, 2, 5
    N, T = len(LENGTHS), sum(LENGTHS)
    cu = cu_seqlens_from_lengths(LENGTHS)
    log_lam, B, C, w = make_ssm_params(H, M, 21, with_w=True)
    a, b = make_inputs(1, T, H, R, D, 22)
    init = make_state(N, H, M, R + D, 23)
    g = torch.Generator().manual_seed(24)
    dy = torch.randn(1, T, H, R + D, dtype=F64, generator=g)
    dfin = torch.randn(N, H, M, R + D, dtype=C128, generator=g)
    leaves = (a, b, log_lam, B, C, w, init)
    ref = _run(naive_s4d, leaves, with_state, dy, dfin, cu_seqlens=cu)
    assert ref[1].shape == (N, H, M, R + D)
    _compare(ref, _run(chunk_s4d, leaves, with_state, dy, dfin, chunk_size=L, cu_seqlens=cu))


def test_deep_chunk_scan_without_offsets(monkeypatch):
    monkeypatch.setattr(chunk_mod, "SCAN_BLOCK", 2)
    H, R, D, M, T = 2, 2, 2, 4, 27
    log_lam, B, C, w = make_ssm_params(H, M, 41, with_w=True)
    a, b = make_inputs(2, T, H, R, D, 42)
    init = make_state(2, H, M, R + D, 43)
    y_n, s_n = naive_s4d(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True)
    for L in (1, 2, 5):  # 27, 14, 6 chunks: 5, 4 and 3 scan levels
        y, s = chunk_s4d(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True, chunk_size=L)
        assert max_err(y, y_n) < 1e-10 and max_err(s, s_n) < 1e-10, L


def test_float32_long_phases():
    """float32 at T = 4096 with slow, fast-rotating modes: the float64 λ tables (token and chunk level, phases up
    to ~4e6 rad) keep the float32 result within float32 rounding of the float64 FFT form (exact to 1e-10)."""
    Bsz, T, H, R, D, M = 1, 4096, 1, 2, 2, 8
    g = torch.Generator().manual_seed(51)
    re = -torch.empty(H, M, dtype=F64).uniform_(1e-4, 1e-3, generator=g)
    im = torch.empty(H, M, dtype=F64).uniform_(-1000.0, 1000.0, generator=g)
    lo = [torch.complex(re, im).to(C64), *(x.to(C64) for x in make_ssm_params(H, M, 51)[1:3])]
    w = torch.randn(H, M, generator=g)
    a, b = (x.float() for x in make_inputs(Bsz, T, H, R, D, 52))
    ref, s_ref = fft_s4d(a.double(), b.double(), *(x.to(C128) for x in lo), w.double(), output_final_state=True)
    y, s = chunk_s4d(a, b, *lo, w, output_final_state=True, chunk_size=64)
    assert y.dtype == torch.float32 and s.dtype == C64
    assert max_err(y.double(), ref) < 1e-4 * ref.abs().max().item()
    assert max_err(s.to(C128), s_ref) < 1e-4 * s_ref.abs().max().item()


def test_bf16_autocast_and_bf16_inputs():
    """Under bf16 autocast the intra-chunk Toeplitz matmul runs in bf16 (toeplitz.py's decision): outputs and
    gradients within bf16 rounding, visibly not float32; the state path runs in float32, so the final state keeps
    float32 accuracy. bf16 inputs: float32 compute, y cast back to bf16 (the tolerances of test_s4d_ops.py)."""
    Bsz, T, H, R, D, M = 2, 70, 2, 3, 4, 8
    log_lam, B, C, w = make_ssm_params(H, M, 91, with_w=True, im_max=100.0)
    lo = [x.to(C64) for x in (log_lam, B, C)]
    init = make_state(Bsz, H, M, R + D, 93).to(C64)
    a, b = (x.float().requires_grad_() for x in make_inputs(Bsz, T, H, R, D, 92))
    up = [x.to(C128) for x in (*lo, init)]
    ref, s_ref = naive_s4d(a.detach().double(), b.detach().double(), *up[:3], w.double(), initial_state=up[3],
                           output_final_state=True)
    scale, s_scale = ref.abs().max().item(), s_ref.abs().max().item()
    assert scale > 1e-1
    y32, s32 = chunk_s4d(a, b, *lo, w.float(), initial_state=init, output_final_state=True, chunk_size=16)
    assert max_err(y32.double(), ref) < 1e-5 * scale and max_err(s32.to(C128), s_ref) < 1e-5 * s_scale
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, s = chunk_s4d(a, b, *lo, w.float(), initial_state=init, output_final_state=True, chunk_size=16)
    assert y.dtype == torch.float32 and s.dtype == C64
    err = max_err(y.double(), ref) / scale
    assert 1e-5 < err < 2e-2
    assert max_err(s.to(C128), s_ref) < 1e-4 * s_scale
    (y * ref.float()).sum().backward()
    ga = a.grad.clone()
    a.grad = None
    (y32 * ref.float()).sum().backward()
    assert max_err(ga.double(), a.grad.double()) < 2e-2 * a.grad.abs().max().item()

    ab, bb = a.detach().to(torch.bfloat16), b.detach().to(torch.bfloat16)
    ref, s_ref = naive_s4d(ab.double(), bb.double(), *up[:3], w.double(), initial_state=up[3],
                           output_final_state=True)
    y, s = chunk_s4d(ab, bb, *lo, w.float(), initial_state=init, output_final_state=True, chunk_size=16)
    assert y.dtype == torch.bfloat16 and s.dtype == C64
    assert max_err(y.double(), ref) < 2e-2 * ref.abs().max().item()
    assert max_err(s.to(C128), s_ref) < 1e-4 * s_ref.abs().max().item()


def test_packed_call_reads_nothing_on_the_host():
    """The packed call, forward and backward, on the meta device (as tests/models/test_no_host_sync.py): any host
    read of the offsets (``.item()``, ``.tolist()``, ``nonzero``, a data-dependent shape) raises there."""
    H, R, D, M, T, N = 2, 3, 2, 4, 40, 5
    dev = "meta"
    a = torch.empty(1, T, H, R, device=dev, requires_grad=True)
    b = torch.empty(1, T, H, D, device=dev, requires_grad=True)
    params = [torch.empty(H, M, dtype=C64, device=dev), torch.empty(H, M, dtype=C64, device=dev),
              torch.empty(H, M, M, dtype=C64, device=dev), torch.empty(H, M, device=dev)]
    params = [p.requires_grad_() for p in params]
    init = torch.empty(N, H, M, R + D, dtype=C64, device=dev, requires_grad=True)
    cu = torch.empty(N + 1, dtype=torch.int32, device=dev)
    y, s = chunk_s4d(a, b, *params, initial_state=init, output_final_state=True, chunk_size=8, cu_seqlens=cu)
    assert y.shape == (1, T, H, R + D) and s.shape == (N, H, M, R + D) and y.device.type == "meta"
    (y.sum() + s.abs().sum()).backward()
    assert all(x.grad is not None for x in (a, b, *params, init))
    y, _ = s4d(a, b, *params, chunk_size=8, cu_seqlens=cu)  # "auto" with offsets runs the chunked form
    assert y.shape == (1, T, H, R + D)


@pytest.mark.slow  # ~3 s, most of it dynamo's first-use set-up; aot_eager keeps it off inductor's C++ build
def test_torch_compile_fullgraph_two_layouts_one_graph():
    """torch.compile(fullgraph=True) traces the packed call, forward and backward (aot_eager), and a second document
    layout of the same T and N runs the same graph: nothing depends on the offsets' values."""
    if not torch._dynamo.is_dynamo_supported():
        pytest.skip("torch.compile is not supported on this platform")
    from torch._dynamo.testing import CompileCounterWithBackend

    H, R, D, M = 2, 2, 3, 4
    lay1, lay2 = (1, 8, 3, 20, 4), (9, 9, 9, 8, 1)
    T, N = sum(lay1), len(lay1)
    assert sum(lay2) == T and len(lay2) == N
    log_lam, B, C, w = (x.to(C64) if x.is_complex() else x.float() for x in make_ssm_params(H, M, 81, with_w=True))
    a, b = (x.float() for x in make_inputs(1, T, H, R, D, 82))
    init = make_state(N, H, M, R + D, 83).to(C64)

    def fn(a, b, log_lam, B, C, w, init, cu):
        return chunk_s4d(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True, chunk_size=8,
                         cu_seqlens=cu)

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    for lay in (lay1, lay2):
        cu = cu_seqlens_from_lengths(lay)
        leaves = [x.clone().requires_grad_() for x in (a, b, log_lam, B, C, w, init)]
        y, s = compiled(*leaves, cu)
        y_n, s_n = naive_s4d(a.double(), b.double(), *(x.to(C128) if x.is_complex() else x.double()
                                                       for x in (log_lam, B, C, w)),
                             initial_state=init.to(C128), output_final_state=True, cu_seqlens=cu)
        assert max_err(y.detach().double(), y_n) < 1e-4 * y_n.abs().max().item()
        assert max_err(s.detach().to(C128), s_n) < 1e-4 * s_n.abs().max().item()
        grads = torch.autograd.grad(y.sum() + s.abs().sum(), leaves)
        assert all(torch.isfinite(torch.view_as_real(g) if g.is_complex() else g).all() for g in grads)
    assert counter.frame_count == 1


def test_dispatcher_runs_chunk():
    """backend="chunk" runs chunk_s4d with the given chunk size; "auto" runs it for packed documents; "naive",
    "fft" and "toeplitz" keep their per-document forms for packed documents."""
    H, R, D, M = 2, 2, 3, 4
    log_lam, B, C, w = make_ssm_params(H, M, 71, with_w=True)
    a, b = make_inputs(1, 17, H, R, D, 72)
    cu = cu_seqlens_from_lengths([5, 1, 11])
    y = s4d(a, b, log_lam, B, C, w, chunk_size=4, backend="chunk")[0]
    assert torch.equal(y, chunk_s4d(a, b, log_lam, B, C, w, chunk_size=4)[0])
    y_c = chunk_s4d(a, b, log_lam, B, C, w, chunk_size=4, cu_seqlens=cu)[0]
    assert torch.equal(s4d(a, b, log_lam, B, C, w, chunk_size=4, cu_seqlens=cu)[0], y_c)
    assert torch.equal(s4d(a, b, log_lam, B, C, w, chunk_size=4, backend="chunk", cu_seqlens=cu)[0], y_c)
    for backend in ("naive", "fft", "toeplitz"):
        y = s4d(a, b, log_lam, B, C, w, chunk_size=4, backend=backend, cu_seqlens=cu)[0]
        assert not torch.equal(y, y_c) and max_err(y, y_c) < 1e-10, backend


def _bad_cases():
    H, R, D, M, T = 3, 4, 2, 6, 9
    a, b = make_inputs(1, T, H, R, D, 0)
    log_lam, B, C, w = make_ssm_params(H, M, 0, with_w=True)
    good = dict(a=a, b=b, log_lam=log_lam, B=B, C=C, w=w)
    cu = cu_seqlens_from_lengths([4, 5])
    return [
        ("chunk_size", dict(good, chunk_size=0)),
        ("chunk_size", dict(good, chunk_size=-4)),
        ("chunk_size", dict(good, chunk_size=2.0)),
        ("chunk_size", dict(good, chunk_size=True)),
        ("a", dict(good, a=a[0])),
        ("w", dict(good, w=w[:, :5])),
        ("initial_state", dict(good, initial_state=make_state(1, H, M, R, 0))),
        ("initial_state", dict(good, initial_state=make_state(1, H, M, R + D, 0), cu_seqlens=cu)),
        ("initial_state", dict(good, initial_state=make_state(2, H, M, R, 0), cu_seqlens=cu)),
        ("cu_seqlens", dict(good, cu_seqlens=cu_seqlens_from_lengths([4, 4]))),
        ("cu_seqlens", dict(good, cu_seqlens=torch.tensor([0, 5, 3, 9]))),
        ("cu_seqlens", dict(good, cu_seqlens=cu.float())),
        ("cu_seqlens", dict(good, a=a.expand(2, -1, -1, -1), b=b.expand(2, -1, -1, -1), cu_seqlens=cu)),
    ]


@pytest.mark.parametrize("field,kwargs", _bad_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_arguments_raise_one_line(field, kwargs):
    kwargs = dict(kwargs)
    args = [kwargs.pop(n) for n in ("a", "b", "log_lam", "B", "C", "w")]
    with pytest.raises(ValueError, match=rf"^{field} ") as info:
        chunk_s4d(*args, **kwargs)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=rf"^{field} "):
        s4d(*args, backend="chunk", **kwargs)
