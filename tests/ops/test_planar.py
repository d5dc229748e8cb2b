"""Planar (real, imaginary) arithmetic of the compiled S4D / Interdomain paths vs the complex forms it replaced.

The helpers of ``ops/common/planar.py`` against torch's complex ops; ``S4DCore.planar()`` against the complex
discretisation (values and gradients); the S4D forms and the Interdomain reference / readout operator with ``Planar``
parameters against the same call with complex ones (float64: equal to ~1e-12).
"""

from __future__ import annotations

import math

import pytest
import torch

from hybrid_attention.modules import S4DCore
from hybrid_attention.ops.common.planar import Planar, as_complex, as_planar, cdiv, cexpm1, cmul
from hybrid_attention.ops.interdomain import chunk_interdomain
from hybrid_attention.ops.interdomain.readout import planar_readout_operator, readout_operators
from hybrid_attention.ops.interdomain.triton import HAS_TRITON
from hybrid_attention.ops.s4d import chunk_s4d, fft_s4d, naive_s4d, toeplitz_s4d

F64, C128 = torch.float64, torch.complex128


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def test_cmul_cdiv_match_complex():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 7, dtype=C128, generator=g), torch.randn(5, 7, dtype=C128, generator=g)
    assert _rel(as_complex(Planar(*cmul(x.real, x.imag, y.real, y.imag)), C128), x * y) < 1e-14
    assert _rel(as_complex(cdiv(as_planar(x, F64), as_planar(y, F64)), C128), x / y) < 1e-14


@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1.0, 5.0])
def test_cexpm1_matches_complex_at_small_and_large_arguments(scale):
    g = torch.Generator().manual_seed(1)
    z = scale * torch.complex(-torch.rand(64, dtype=F64, generator=g), torch.randn(64, dtype=F64, generator=g))
    want = torch.expm1(z)  # complex128 reference
    got = as_complex(cexpm1(as_planar(z, F64)), C128)
    assert ((got - want).abs() / want.abs()).max().item() < 1e-12  # relative per entry: no cancellation near 0


def _complex_discretisation(core: S4DCore):
    """The complex parameterisation S4DCore.forward() used before the planar one (the oracle)."""
    a = torch.complex(-torch.exp(core.A_log_re), core.A_im)
    log_lam = a * torch.exp(core.log_dt)[:, None]
    return log_lam, torch.expm1(log_lam) / a, torch.view_as_complex(core.C.contiguous())


def test_s4dcore_planar_matches_complex_values_and_gradients():
    torch.manual_seed(0)
    core = S4DCore(3, 16).double()
    with torch.no_grad():
        core.log_dt.uniform_(math.log(1e-3), math.log(1e-1))
    planar = core.planar()
    ref = _complex_discretisation(core)
    for p, r in zip(planar, ref, strict=True):
        assert isinstance(p, Planar) and p.dtype == F64
        assert _rel(as_complex(p, C128), r) < 1e-14
    for p, r in zip(core(), ref, strict=True):
        assert p.dtype == C128 and _rel(p, r) < 1e-14
    w = [torch.randn(t.shape, dtype=C128) for t in ref]
    loss_ref = sum((wi.conj() * r).real.sum() for wi, r in zip(w, ref, strict=True))
    g_ref = torch.autograd.grad(loss_ref, list(core.parameters()), allow_unused=True)
    loss = sum((wi.real * p.re + wi.imag * p.im).sum() for wi, p in zip(w, planar, strict=True))
    g = torch.autograd.grad(loss, list(core.parameters()), allow_unused=True)
    for name, a, b in zip([n for n, _ in core.named_parameters()], g, g_ref, strict=True):
        if b is None:
            assert a is None, name
            continue
        assert _rel(a, b) < 1e-12, name


def _s4d_problem(init: bool, Bsz: int = 2, T: int = 37, H: int = 2, R: int = 3, D: int = 4, M: int = 5):
    g = torch.Generator().manual_seed(2)
    core = S4DCore(H, M).double()
    log_lam, B, C = (p.detach() for p in core())
    a = torch.randn(Bsz, T, H, R, dtype=F64, generator=g)
    b = torch.randn(Bsz, T, H, D, dtype=F64, generator=g)
    w = torch.randn(H, M, dtype=F64, generator=g)
    x0 = torch.randn(Bsz, H, M, R + D, dtype=C128, generator=g) if init else None
    return a, b, (log_lam, B, C), w, x0


@pytest.mark.parametrize("form", [fft_s4d, toeplitz_s4d, chunk_s4d, naive_s4d])
@pytest.mark.parametrize("init", [False, True])
def test_s4d_forms_take_planar_parameters(form, init):
    a, b, params, w, x0 = _s4d_problem(init)
    planar = [as_planar(p, F64) for p in params]
    kw = dict(initial_state=x0, output_final_state=True)
    y_c, f_c = form(a, b, *params, w, **kw)
    y_p, f_p = form(a, b, *planar, w, **kw)
    assert y_p.dtype == y_c.dtype and f_p.dtype == f_c.dtype == C128
    assert _rel(y_p, y_c) < 1e-12 and _rel(f_p, f_c) < 1e-12


def test_chunk_s4d_packed_takes_planar_parameters():
    a, b, params, w, _ = _s4d_problem(False, Bsz=1, T=40)
    cu = torch.tensor([0, 7, 23, 40])
    planar = [as_planar(p, F64) for p in params]
    y_c, f_c = chunk_s4d(a, b, *params, w, output_final_state=True, chunk_size=8, cu_seqlens=cu)
    y_p, f_p = chunk_s4d(a, b, *planar, w, output_final_state=True, chunk_size=8, cu_seqlens=cu)
    assert _rel(y_p, y_c) < 1e-12 and _rel(f_p, f_c) < 1e-12


@pytest.mark.parametrize("readout", ["transpose", "hermitian"])
def test_planar_readout_operator_matches_complex(readout):
    C = torch.randn(3, 6, 6, dtype=C128, generator=torch.Generator().manual_seed(3))
    k1, k2 = readout_operators(C, readout)
    want = k1 if k1 is not None else k2
    assert _rel(as_complex(planar_readout_operator(as_planar(C, F64), readout), C128), want) < 1e-14


def test_planar_readout_operator_ignores_autocast():
    C = as_planar(torch.randn(2, 8, 8, dtype=torch.complex64), torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        k = planar_readout_operator(C, "transpose")
    assert k.dtype == torch.float32


@pytest.mark.parametrize("readout", ["transpose", "hermitian", "real"])
def test_chunk_interdomain_takes_planar_parameters(readout):
    g = torch.Generator().manual_seed(4)
    Bsz, T, H, R, D, M = 2, 21, 2, 3, 4, 5
    log_lam, B, C = (p.detach() for p in S4DCore(H, M).double()())
    q, k = torch.randn(Bsz, T, H, R, dtype=F64, generator=g), torch.randn(Bsz, T, H, R, dtype=F64, generator=g)
    v = torch.randn(Bsz, T, H, D, dtype=F64, generator=g)
    kw = dict(readout=readout, chunk_size=8, output_final_state=True)
    o_c, f_c = chunk_interdomain(q, k, v, log_lam, B, C, **kw)
    o_p, f_p = chunk_interdomain(q, k, v, *(as_planar(p, F64) for p in (log_lam, B, C)), **kw)
    assert _rel(o_p, o_c) < 1e-12 and _rel(f_p, f_c) < 1e-12


def test_planar_with_mismatched_parts_is_refused():
    a, b, params, w, _ = _s4d_problem(False)
    bad = Planar(params[0].real, params[0].imag[:, :-1])
    with pytest.raises(ValueError, match="log_lam as Planar"):
        fft_s4d(a, b, bad, *params[1:], w)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable")
@pytest.mark.parametrize("readout", ["transpose", "real"])
def test_triton_interdomain_planar_matches_complex_with_gradients(readout, device):
    """The glue of the Triton op with Planar parameters (stacked planes, the real readout operator) gives the output
    and the S4DCore parameter gradients of the complex glue (float32 kernels: equal to float32 rounding)."""
    from hybrid_attention.ops.interdomain.triton import triton_interdomain

    dev = device
    g = torch.Generator().manual_seed(5)
    Bsz, T, H, R, D, M = 1, 32, 2, 16, 16, 16
    core = S4DCore(H, M).to(dev)
    q = torch.randn(Bsz, T, H, R, generator=g).to(dev)
    q = q / q.norm(dim=-1, keepdim=True)
    k, v = torch.randn(Bsz, T, H, R, generator=g).to(dev), torch.randn(Bsz, T, H, D, generator=g).to(dev)
    do = torch.randn(Bsz, T, H, D, generator=g).to(dev)
    results = []
    for params in (core, core.planar):
        o, _ = triton_interdomain(q, k, v, *params(), readout=readout, chunk_size=16)
        grads = torch.autograd.grad((o * do).sum(), list(core.parameters()), allow_unused=True)
        results.append((o.detach(), grads))
    (o_c, g_c), (o_p, g_p) = results
    assert _rel(o_p, o_c) < 1e-5
    for name, a, b in zip([n for n, _ in core.named_parameters()], g_p, g_c, strict=True):
        if b is None:
            assert a is None, name
            continue
        assert _rel(a, b) < 1e-4, name


def _complex_impulse_table(log_lam, B, C, BT):
    """The bilinear op's table by its definition in complex128: Kern[h, m, d] = Σ_n C[h, m, n] B[h, n] λ[h, n]^d."""
    d = torch.arange(BT, dtype=F64)
    lam_pow = torch.exp(log_lam.to(C128)[:, None, :] * d[None, :, None])
    return torch.einsum("hmn,hn,hdn->hmd", C.to(C128), B.to(C128), lam_pow)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable")
def test_bilinear_impulse_table_is_planar_and_matches_complex():
    from hybrid_attention.ops.s4d_bilinear.triton.ops import impulse_table

    log_lam, B, C = (p.detach() for p in S4DCore(3, 6).double()())
    want = _complex_impulse_table(log_lam, B, C, 32)
    for args in ((log_lam, B, C), tuple(as_planar(p, F64) for p in (log_lam, B, C))):
        got = impulse_table(*args, 32)
        assert isinstance(got, Planar) and got.dtype == torch.float32
        assert _rel(as_complex(got, C128), want) < 1e-6  # rounded once to float32


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable")
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_s4d_bilinear_takes_planar_parameters(backend, device):
    """The bilinear core with ``Planar`` parameters (the layers pass ``S4DCore.planar()``) equals the complex call:
    output, final state and the S4DCore parameter gradients, odd T, with an initial state."""
    from hybrid_attention.ops.s4d_bilinear import s4d_bilinear

    dev = device if backend == "triton" else "cpu"
    dt = F64 if backend == "reference" else torch.float32
    g = torch.Generator().manual_seed(6)
    H, M, R = 2, 16, 16
    core = S4DCore(H, M).to(dev, dt)
    a = torch.randn(1, 37, H, R, generator=g, dtype=dt).to(dev)
    b = torch.randn(1, 37, H, R, generator=g, dtype=dt).to(dev)
    cdt = C128 if dt == F64 else torch.complex64
    x0 = torch.randn(1, H, M, 2 * R, generator=g, dtype=C128).to(dev, cdt)
    kw = dict(backend=backend, chunk_size=16, output_final_state=True, initial_state=x0)

    def run(params):
        o, f = s4d_bilinear(a, b, *params, **kw)
        loss = o.square().sum() + f.abs().square().sum()
        return o.detach(), f.detach(), torch.autograd.grad(loss, list(core.parameters()), allow_unused=True)

    o_c, f_c, g_c = run(core())
    o_p, f_p, g_p = run(core.planar())
    tol = 1e-12 if dt == F64 else 1e-5
    assert _rel(o_p, o_c) < tol and _rel(f_p, f_c) < tol
    for name, x, y in zip([n for n, _ in core.named_parameters()], g_p, g_c, strict=True):
        assert (x is None) == (y is None), name
        if y is not None:
            assert _rel(x, y) < (1e-10 if dt == F64 else 1e-4), name
