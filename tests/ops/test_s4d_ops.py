"""Tests of the S4D-only control op (linear readout y = Re(wᵀ C X)): naive token loop (definition) vs the FFT
convolution, an independent ZOH/Vandermonde direct convolution, linearity, state carrying, every gradient, long
sequences, low precision, torch.compile and input validation. float64 on CPU, small shapes."""

from __future__ import annotations

import math
import unittest.mock

import pytest
import torch
from ssm_cases import make_ssm_params, make_state, max_err

from hybrid_attention.ops.s4d import BACKENDS, fft_s4d, naive_s4d, s4d, toeplitz_s4d

F64, C128 = torch.float64, torch.complex128


def make_params(H: int, M: int, seed: int, **kw):
    return make_ssm_params(H, M, seed, with_w=True, **kw)


def make_inputs(Bsz: int, T: int, H: int, R: int, D: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(Bsz, T, H, R, dtype=F64, generator=g), torch.randn(Bsz, T, H, D, dtype=F64, generator=g)


FNS = [naive_s4d, fft_s4d, toeplitz_s4d]


@pytest.mark.parametrize("fn", FNS, ids=lambda f: f.__name__)
def test_linear_in_the_input(fn):
    Bsz, T, H, R, D, M = 2, 29, 2, 3, 2, 6
    log_lam, B, C, w = make_params(H, M, 1)
    a1, b1 = make_inputs(Bsz, T, H, R, D, 2)
    a2, b2 = make_inputs(Bsz, T, H, R, D, 3)
    al, be = 0.7, -1.9
    y1, s1 = fn(a1, b1, log_lam, B, C, w, output_final_state=True)
    y2, s2 = fn(a2, b2, log_lam, B, C, w, output_final_state=True)
    y, s = fn(al * a1 + be * a2, al * b1 + be * b2, log_lam, B, C, w, output_final_state=True)
    assert y.abs().max() > 1e-1
    assert max_err(y, al * y1 + be * y2) < 1e-12 * max(1.0, y.abs().max().item())
    assert max_err(s, al * s1 + be * s2) < 1e-12 * max(1.0, s.abs().max().item())


def zoh(A: torch.Tensor, Bc: torch.Tensor, dt: torch.Tensor):
    """ZOH discretisation of dX/dt = A X + Bc u: (log λ, B̄) = (dt A, (exp(dt A) - 1) / A · Bc)."""
    log_lam = dt[:, None] * A
    return log_lam, (torch.exp(log_lam) - 1) / A * Bc


@pytest.mark.parametrize("with_state", [False, True], ids=["zero0", "state0"])
def test_equals_direct_convolution_with_zoh_kernel(with_state):
    """y_t[c] = Σ_{s<=t} K(t-s) z_s[c] + Re(Σ_m c̃_m λ_m^{t+1} X0[m, c]), K(l) = Re(Σ_m c̃_m B̄_m λ_m^l), c̃ = Cᵀw,
    with the kernel and the sums written out here (complex exp, explicit double loop)."""
    Bsz, T, H, R, D, M = 2, 37, 2, 2, 3, 5
    g = torch.Generator().manual_seed(5)
    A = torch.complex(-torch.rand(H, M, dtype=F64, generator=g) - 0.05, 20 * torch.randn(H, M, dtype=F64, generator=g))
    Bc = torch.randn(H, M, dtype=C128, generator=g)
    dt = torch.tensor([0.01, 0.1], dtype=F64)
    log_lam, Bbar = zoh(A, Bc, dt)
    C = torch.randn(H, M, M, dtype=C128, generator=g) / math.sqrt(M)
    w = torch.randn(H, M, dtype=F64, generator=g)
    a, b = make_inputs(Bsz, T, H, R, D, 6)
    X0 = make_state(Bsz, H, M, R + D, 7) if with_state else None

    z = torch.cat([a, b], dim=-1)
    ref = torch.zeros(Bsz, T, H, R + D, dtype=F64)
    for h in range(H):
        ct = C[h].transpose(0, 1) @ w[h].to(C128)  # c̃ = Cᵀw
        lam = torch.exp(log_lam[h])
        K = [(ct * Bbar[h] * lam**l).sum().real for l in range(T)]
        for t in range(T):
            ref[:, t, h] = sum(K[t - s] * z[:, s, h] for s in range(t + 1))
            if X0 is not None:
                ref[:, t, h] += torch.einsum("m,bmc->bc", ct * lam ** (t + 1), X0[:, h]).real
    assert ref.abs().max() > 1e-1
    for name in ("naive", "fft", "toeplitz"):
        y, _ = s4d(a, b, log_lam, Bbar, C, w, initial_state=X0, backend=name)
        assert max_err(y, ref) < 1e-10, name


@pytest.mark.parametrize("fast", [fft_s4d, toeplitz_s4d], ids=lambda f: f.__name__)
def test_fast_forms_equal_naive_values_and_gradients(fast):
    Bsz, T, H, R, D, M = 2, 37, 2, 3, 5, 6
    log_lam, B, C, w = make_params(H, M, 11)
    a, b = make_inputs(Bsz, T, H, R, D, 12)
    init = make_state(Bsz, H, M, R + D, 13)
    g = torch.Generator().manual_seed(14)
    dy = torch.randn(Bsz, T, H, R + D, dtype=F64, generator=g)
    dfin = torch.randn(Bsz, H, M, R + D, dtype=C128, generator=g)
    outs = {}
    for fn in (naive_s4d, fast):
        leaves = [x.clone().requires_grad_() for x in (a, b, log_lam, B, C, w, init)]
        y, fin = fn(*leaves[:6], initial_state=leaves[6], output_final_state=True)
        loss = (y * dy).sum() + (fin.conj() * dfin).real.sum()
        outs[fn.__name__] = (y.detach(), fin.detach(), torch.autograd.grad(loss, leaves))
    (y_n, f_n, g_n), (y_f, f_f, g_f) = outs["naive_s4d"], outs[fast.__name__]
    assert y_f.shape == (Bsz, T, H, R + D) and y_f.dtype == F64
    assert f_f.shape == (Bsz, H, M, R + D) and f_f.dtype == C128
    assert y_n.abs().max() > 1e-1
    assert max_err(y_f, y_n) < 1e-10 and max_err(f_f, f_n) < 1e-10
    for name, gn, gf in zip(("a", "b", "log_lam", "B", "C", "w", "initial_state"), g_n, g_f):
        assert gf.dtype == gn.dtype, name
        assert max_err(gf, gn) < 1e-9 * max(1.0, gn.abs().max().item()), name


def test_gradcheck_fft():
    Bsz, T, H, R, D, M = 1, 5, 1, 1, 2, 3
    log_lam, B, C, w = make_params(H, M, 21, im_max=3.0, re_min=-2.0)
    a, b = make_inputs(Bsz, T, H, R, D, 22)
    init = make_state(Bsz, H, M, R + D, 23)
    inputs = tuple(x.clone().requires_grad_() for x in (a, b, log_lam, B, C, w, init))

    def fn(a, b, log_lam, B, C, w, init):
        return fft_s4d(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("fn", FNS, ids=lambda f: f.__name__)
def test_pieces_equal_single_call(fn):
    """T tokens at once == T1 then T - T1 with the carried state == T one-token calls."""
    Bsz, T, H, R, D, M = 1, 23, 2, 2, 3, 6
    log_lam, B, C, w = make_params(H, M, 31, im_max=100.0)
    a, b = make_inputs(Bsz, T, H, R, D, 32)
    init = make_state(Bsz, H, M, R + D, 33)
    full, s_full = fn(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True)
    for split in (0, 1, 9, T):
        y1, s1 = fn(a[:, :split], b[:, :split], log_lam, B, C, w, initial_state=init, output_final_state=True)
        y2, s2 = fn(a[:, split:], b[:, split:], log_lam, B, C, w, initial_state=s1, output_final_state=True)
        assert max_err(torch.cat([y1, y2], dim=1), full) < 1e-10, split
        assert max_err(s2, s_full) < 1e-10, split
    state, steps = init, []
    for t in range(T):
        y_t, state = fn(
            a[:, t : t + 1], b[:, t : t + 1], log_lam, B, C, w, initial_state=state, output_final_state=True
        )
        steps.append(y_t)
    assert max_err(torch.cat(steps, dim=1), full) < 1e-10 and max_err(state, s_full) < 1e-10


def test_empty_and_single_token():
    H, M, R, D = 2, 4, 3, 2
    log_lam, B, C, w = make_params(H, M, 0)
    init = make_state(1, H, M, R + D, 2)
    for T in (0, 1):
        a, b = make_inputs(1, T, H, R, D, 1)
        for fn in FNS:
            y, s = fn(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True)
            assert y.shape == (1, T, H, R + D)
            if T == 0:
                assert torch.equal(s, init)
                s0 = fn(a, b, log_lam, B, C, w, output_final_state=True)[1]
                assert s0.shape == init.shape and not s0.abs().any()
            assert fn(a, b, log_lam, B, C, w)[1] is None
        y_n, s_n = naive_s4d(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True)
        y_f, s_f = fft_s4d(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True)
        assert max_err(y_f, y_n) < 1e-12 and max_err(s_f, s_n) < 1e-12


def test_long_sequence_fft_matches_naive():
    """T = 3001 with modes that barely decay and phases l·Im(log λ) up to ~3e6 rad: relative error ~1e-9 or better."""
    Bsz, T, H, R, D, M = 1, 3001, 1, 1, 1, 8
    log_lam, B, C, w = make_params(H, M, 41, im_max=1000.0, re_min=-1.0)
    a, b = make_inputs(Bsz, T, H, R, D, 42)
    init = make_state(Bsz, H, M, R + D, 43)
    y_n, s_n = naive_s4d(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True)
    y_f, s_f = fft_s4d(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True)
    assert y_n[:, -100:].abs().max() > 1e-1  # the slow modes still contribute at the end
    assert max_err(y_f, y_n) < 1e-9 * y_n.abs().max().item()
    assert max_err(s_f, s_n) < 1e-9 * s_n.abs().max().item()


def test_float32_inputs_keep_long_phases():
    """float32 inputs at T = 4096 with slowly decaying, fast-rotating modes: the float64 Vandermonde table keeps the
    phases l·Im(log λ) (up to ~4e6 rad) exact and only the float32 convolution rounds; a float32 table would be off
    by ~0.1-1 rad in the late taps (measured: 2e-2 of the output scale, 200x this tolerance)."""
    Bsz, T, H, R, D, M = 1, 4096, 1, 2, 2, 8
    g = torch.Generator().manual_seed(51)
    re = -torch.empty(H, M, dtype=F64).uniform_(1e-4, 1e-3, generator=g)
    im = torch.empty(H, M, dtype=F64).uniform_(-1000.0, 1000.0, generator=g)
    lo = [torch.complex(re, im).to(torch.complex64), *(x.to(torch.complex64) for x in make_params(H, M, 51)[1:3])]
    w = torch.randn(H, M, generator=g)
    a, b = (x.float() for x in make_inputs(Bsz, T, H, R, D, 52))
    # float64 reference on the same float32-rounded inputs and parameters
    ref, _ = naive_s4d(a.double(), b.double(), *(x.to(C128) for x in lo), w.double())
    y, s = s4d(a, b, *lo, w, output_final_state=True)
    assert y.dtype == torch.float32 and s.dtype == torch.complex64
    assert max_err(y.double(), ref) < 1e-4 * ref.abs().max().item()


@pytest.mark.parametrize("backend", ["auto", "naive"])
def test_bf16_inputs(backend):
    Bsz, T, H, R, D, M = 2, 45, 2, 4, 3, 8
    log_lam, B, C, w = make_params(H, M, 61, im_max=100.0)
    lo = [x.to(torch.complex64) for x in (log_lam, B, C)]
    a, b = (x.to(torch.bfloat16) for x in make_inputs(Bsz, T, H, R, D, 62))
    init = make_state(Bsz, H, M, R + D, 63).to(torch.complex64)
    y, s = s4d(a, b, *lo, w.float(), initial_state=init, output_final_state=True, backend=backend)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.complex64
    up = [x.to(C128) for x in (*lo, init)]
    ref, s_ref = naive_s4d(a.double(), b.double(), *up[:3], w.float().double(), initial_state=up[3],
                           output_final_state=True)  # fmt: skip
    scale = ref.abs().max().item()
    assert scale > 1e-1
    assert max_err(y.double(), ref) < 2e-2 * scale  # bf16 output rounding (2^-8 relative) dominates
    assert max_err(s.to(C128), s_ref) < 1e-4 * s_ref.abs().max().item()


def test_backends_dispatch():
    log_lam, B, C, w = make_params(2, 4, 71)
    a, b = make_inputs(1, 9, 2, 2, 3, 72)
    assert BACKENDS == ("auto", "reference", "naive", "triton", "fft", "toeplitz", "chunk")
    assert torch.equal(s4d(a, b, log_lam, B, C, w, backend="toeplitz")[0], toeplitz_s4d(a, b, log_lam, B, C, w)[0])
    assert torch.equal(s4d(a, b, log_lam, B, C, w, backend="naive")[0], naive_s4d(a, b, log_lam, B, C, w)[0])
    y_fft = fft_s4d(a, b, log_lam, B, C, w)[0]
    for backend in ("auto", "reference", "triton", "fft"):
        assert torch.equal(s4d(a, b, log_lam, B, C, w, chunk_size=4, backend=backend)[0], y_fft), backend
    msg = "backend must be one of 'auto', 'reference', 'naive', 'triton', 'fft', 'toeplitz', 'chunk', got 'cuda'"
    with pytest.raises(ValueError, match=msg):
        s4d(a, b, log_lam, B, C, w, backend="cuda")


def test_auto_backend_choice():
    """"auto": the Toeplitz matmul on CUDA up to AUTO_TOEPLITZ_MAX_T tokens (not float64); above it the chunked form
    while torch.compile traces, the FFT in eager mode; the FFT on the CPU. CUDA inputs are stood in for by objects
    with the three attributes the choice reads."""
    from types import SimpleNamespace

    from hybrid_attention.ops.s4d import AUTO_TOEPLITZ_MAX_T, auto_backend

    def on_cuda(T, dtype):
        return SimpleNamespace(device=torch.device("cuda"), dtype=dtype, shape=(1, T, 1, 1))

    t = AUTO_TOEPLITZ_MAX_T
    assert auto_backend(torch.zeros(1, 8, 1, 1)) == "fft"  # CPU
    assert auto_backend(on_cuda(t, torch.bfloat16)) == "toeplitz"
    assert auto_backend(on_cuda(t, torch.float32)) == "toeplitz"
    assert auto_backend(on_cuda(t + 1, torch.bfloat16)) == "fft"
    with unittest.mock.patch("torch.compiler.is_compiling", return_value=True):
        assert auto_backend(on_cuda(t + 1, torch.bfloat16)) == "chunk"
        assert auto_backend(on_cuda(t, torch.bfloat16)) == "toeplitz"
        assert auto_backend(torch.zeros(1, t + 1, 1, 1)) == "fft"  # CPU
    assert auto_backend(on_cuda(64, torch.float64)) == "fft"
    cu = torch.zeros(3, dtype=torch.int32)  # packed documents: the chunked form, whatever the device and length
    assert auto_backend(torch.zeros(1, 8, 1, 1), cu) == "chunk"
    assert auto_backend(on_cuda(t, torch.bfloat16), cu) == "chunk"


def test_toeplitz_under_bf16_autocast():
    """Under bf16 autocast the Toeplitz matmuls run in bf16 (a decided precision, like a Linear layer): outputs and
    gradients within bf16 rounding of the float64 definition; outside autocast they run in float32."""
    Bsz, T, H, R, D, M = 2, 70, 2, 3, 4, 8
    log_lam, B, C, w = make_params(H, M, 91, im_max=100.0)
    lo = [x.to(torch.complex64) for x in (log_lam, B, C)]
    a, b = (x.float().requires_grad_() for x in make_inputs(Bsz, T, H, R, D, 92))
    ref, _ = naive_s4d(a.detach().double(), b.detach().double(), *(x.to(C128) for x in lo), w.double())
    scale = ref.abs().max().item()
    assert scale > 1e-1
    y32, _ = toeplitz_s4d(a, b, *lo, w.float())
    assert max_err(y32.double(), ref) < 1e-5 * scale
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = toeplitz_s4d(a, b, *lo, w.float())
    err = max_err(y.double(), ref) / scale
    assert 1e-5 < err < 2e-2  # bf16 operands: visibly not float32, within bf16 rounding
    (y * ref.float()).sum().backward()
    ga = a.grad.clone()
    a.grad = None
    (y32 * ref.float()).sum().backward()
    assert max_err(ga.double(), a.grad.double()) < 2e-2 * a.grad.abs().max().item()


def test_toeplitz_saves_its_matmul_operand_in_the_autocast_dtype():
    """Under bf16 autocast the convolution keeps z for its backward as the bf16 matmul operand, not the float32
    input (half the activation bytes; the backward used z.to(bf16) anyway, so the gradients are the same)."""
    from hybrid_attention.ops.s4d.toeplitz import toeplitz_convolve

    z = torch.randn(2, 40, 3, 5, requires_grad=True)
    K = torch.randn(3, 40, requires_grad=True)
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        y = toeplitz_convolve(z, K)
    assert y.dtype == torch.float32
    assert ((2, 40, 3, 5), torch.bfloat16) in saved and ((2, 40, 3, 5), torch.float32) not in saved
    y.sum().backward()
    assert z.grad.dtype == torch.float32 and torch.isfinite(z.grad).all() and torch.isfinite(K.grad).all()


@pytest.mark.parametrize("fast", [fft_s4d, toeplitz_s4d], ids=lambda f: f.__name__)
def test_states_under_bf16_autocast(fast):
    """Initial and final states under bf16 autocast (a prefill in the training precision): the state terms run in
    float32 (torch.complex refused the bf16 einsums autocast made of them)."""
    Bsz, T, H, R, D, M = 1, 33, 2, 2, 3, 6
    log_lam, B, C, w = make_params(H, M, 95)
    lo = [x.to(torch.complex64) for x in (log_lam, B, C)]
    a, b = (x.float() for x in make_inputs(Bsz, T, H, R, D, 96))
    init = make_state(Bsz, H, M, R + D, 97).to(torch.complex64)
    _, s_ref = naive_s4d(a.double(), b.double(), *(x.to(C128) for x in lo), w.double(), initial_state=init.to(C128),
                         output_final_state=True)  # fmt: skip
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, s = fast(a, b, *lo, w.float(), initial_state=init, output_final_state=True)
    assert s.dtype == torch.complex64 and torch.isfinite(y).all()
    assert max_err(s.to(C128), s_ref) < 1e-4 * s_ref.abs().max().item()


def _bad_cases():
    Bsz, T, H, R, D, M = 2, 5, 3, 4, 2, 6
    a, b = make_inputs(Bsz, T, H, R, D, 0)
    log_lam, B, C, w = make_params(H, M, 0)
    good = dict(a=a, b=b, log_lam=log_lam, B=B, C=C, w=w)
    return [
        ("a", dict(good, a=a[0])),
        ("b", dict(good, b=b[:, :4])),
        ("log_lam", dict(good, log_lam=log_lam[:, None])),
        ("B", dict(good, B=B[:2])),
        ("C", dict(good, C=C[:, :5])),
        ("w", dict(good, w=w[:, :5])),
        ("w", dict(good, w=w[None])),
        ("w", dict(good, w=w.to(C128))),
        ("initial_state", dict(good, initial_state=make_state(Bsz, H, M, R, 0))),
        ("chunk_size", dict(good, chunk_size=0)),
    ]


@pytest.mark.parametrize("backend", ["auto", "naive"])
@pytest.mark.parametrize("field,kwargs", _bad_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_inputs_raise(field, kwargs, backend):
    kwargs = dict(kwargs)
    args = [kwargs.pop(n) for n in ("a", "b", "log_lam", "B", "C", "w")]
    with pytest.raises(ValueError, match=rf"^{field} "):
        s4d(*args, backend=backend, **kwargs)


def test_bad_w_message():
    log_lam, B, C, w = make_params(3, 6, 0)
    a, b = make_inputs(1, 4, 3, 2, 2, 1)
    with pytest.raises(ValueError, match=r"^w must be a real floating-point \[H, M\] = \(3, 6\) tensor on cpu, got "
                                         r"shape \(3, 5\)"):  # fmt: skip
        fft_s4d(a, b, log_lam, B, C, w[:, :5])


@pytest.mark.slow  # ~2 s, most of it dynamo's first-use set-up; aot_eager keeps it off inductor's C++ build
@pytest.mark.parametrize("fast", [fft_s4d, toeplitz_s4d], ids=lambda f: f.__name__)
def test_torch_compile_smoke(fast):
    """fft_s4d / toeplitz_s4d under torch.compile on CPU, forward and backward. The aot_eager backend traces through
    dynamo and AOTAutograd (graph breaks allowed) without inductor's C++ build, (minutes on a 2-core CI machine);
    inductor itself also runs (complex ops fall back to eager) but is not exercised here."""
    if not torch._dynamo.is_dynamo_supported():
        pytest.skip("torch.compile is not supported on this platform")
    Bsz, T, H, R, D, M = 1, 11, 2, 2, 3, 4
    log_lam, B, C, w = (x.to(torch.complex64) if x.is_complex() else x.float() for x in make_params(H, M, 81))
    a, b = (x.float() for x in make_inputs(Bsz, T, H, R, D, 82))
    init = make_state(Bsz, H, M, R + D, 83).to(torch.complex64)

    def fn(a, b, log_lam, B, C, w, init):
        return fast(a, b, log_lam, B, C, w, initial_state=init, output_final_state=True)

    torch._dynamo.reset()
    leaves = [x.clone().requires_grad_() for x in (a, b, log_lam, B, C, w, init)]
    y, s = torch.compile(fn, backend="aot_eager")(*leaves)
    y_e, s_e = fn(a, b, log_lam, B, C, w, init)
    assert max_err(y.detach(), y_e) < 1e-5 and max_err(s.detach(), s_e) < 1e-5
    grads = torch.autograd.grad(y.sum() + s.abs().sum(), leaves)
    assert all(torch.isfinite(torch.view_as_real(g) if g.is_complex() else g).all() for g in grads)


def _dense_causal_conv(z: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """y[b, t, h, c] = Σ_{s<=t} K[h, t-s] z[b, s, h, c], as a plain double loop over (t, s)."""
    T = z.shape[1]
    y = torch.zeros_like(z)
    for t in range(T):
        for s in range(t + 1):
            y[:, t] += K[:, t - s][None, :, None] * z[:, s]
    return y


@pytest.mark.parametrize("T", [1, 17, 64, 100])
@pytest.mark.parametrize("block", [1, 16, 33, 64, 1000])
def test_toeplitz_blocks_equal_the_dense_convolution(T, block):
    """The blocked Toeplitz convolution (zero blocks above the diagonal skipped; T not a multiple of the block, one
    block, one row per block) gives the output and both gradients of the causal convolution, float64."""
    from hybrid_attention.ops.s4d.toeplitz import toeplitz_convolve

    g = torch.Generator().manual_seed(T * 131 + block)
    z = torch.randn(2, T, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    K = torch.randn(3, T, dtype=torch.float64, generator=g, requires_grad=True)
    dy = torch.randn(2, T, 3, 4, dtype=torch.float64, generator=g)
    y = toeplitz_convolve(z, K, block)
    dz, dK = torch.autograd.grad(y, (z, K), dy)
    y_ref = _dense_causal_conv(z, K)
    dz_ref, dK_ref = torch.autograd.grad(y_ref, (z, K), dy)
    for got, want in ((y, y_ref), (dz, dz_ref), (dK, dK_ref)):
        assert torch.allclose(got, want, rtol=0, atol=1e-12 * want.abs().max().item() + 1e-14)


def test_toeplitz_block_must_be_positive():
    from hybrid_attention.ops.s4d.toeplitz import toeplitz_convolve

    with pytest.raises(ValueError, match="block must be a positive number of rows, got 0"):
        toeplitz_convolve(torch.zeros(1, 4, 1, 1), torch.zeros(1, 4), 0)


def test_toeplitz_default_block_is_dense_then_blocked():
    """The default block: one dense matmul up to DENSE_MAX_T tokens, TOEPLITZ_BLOCK rows above; the default call equals
    the dense convolution at a length that runs blocks (float64, output and both gradients)."""
    from hybrid_attention.ops.s4d.toeplitz import DENSE_MAX_T, TOEPLITZ_BLOCK, default_block, toeplitz_convolve

    assert default_block(1) == 1 and default_block(DENSE_MAX_T) == DENSE_MAX_T
    assert default_block(DENSE_MAX_T + 1) == TOEPLITZ_BLOCK < DENSE_MAX_T
    T = DENSE_MAX_T + 37  # blocks, the last one partial
    g = torch.Generator().manual_seed(5)
    z = torch.randn(1, T, 1, 2, dtype=torch.float64, generator=g, requires_grad=True)
    K = torch.randn(1, T, dtype=torch.float64, generator=g, requires_grad=True)
    dy = torch.randn(1, T, 1, 2, dtype=torch.float64, generator=g)
    y = toeplitz_convolve(z, K)
    dz, dK = torch.autograd.grad(y, (z, K), dy)
    y_ref = toeplitz_convolve(z, K, T)  # one dense block, equal to the double loop (the test above)
    dz_ref, dK_ref = torch.autograd.grad(y_ref, (z, K), dy)
    for got, want in ((y, y_ref), (dz, dz_ref), (dK, dK_ref)):
        assert torch.allclose(got, want, rtol=0, atol=1e-12 * want.abs().max().item() + 1e-14)
