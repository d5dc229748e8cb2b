"""Tests of the bilinear S4D core op (``s4d_bilinear``): naive (definition) vs chunk form, an independent pure-Python
kernel-view oracle, the link to the Interdomain readout, state carrying, gradients, low precision, overflow safety
and input validation."""

from __future__ import annotations

import cmath

import pytest
import torch
from ssm_cases import make_ssm_params, make_state, max_err

from hybrid_attention.ops.interdomain import naive_interdomain
from hybrid_attention.ops.s4d_bilinear import chunk_s4d_bilinear, naive_s4d_bilinear, s4d_bilinear

F64, C128 = torch.float64, torch.complex128


def make_params(H: int, M: int, seed: int, **kw):
    return make_ssm_params(H, M, seed, with_w=False, **kw)


def make_inputs(Bsz: int, T: int, H: int, R: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(Bsz, T, H, R, dtype=F64, generator=g), torch.randn(Bsz, T, H, R, dtype=F64, generator=g)


CASES = [(T, cs) for T in (1, 7, 63, 64, 65, 200) for cs in (16, 64)] + [(T, cs) for T in (1, 7) for cs in (1, 5)]


@pytest.mark.parametrize("with_state", [False, True], ids=["zero0", "state0"])
@pytest.mark.parametrize("T,chunk_size", CASES)
def test_naive_equals_chunk(T, chunk_size, with_state):
    Bsz, H, R, M = 2, 2, 3, 8
    seed = 1000 * T + chunk_size
    log_lam, B, C = make_params(H, M, seed)
    a, b = make_inputs(Bsz, T, H, R, seed + 1)
    init = make_state(Bsz, H, M, 2 * R, seed + 2) if with_state else None
    o_n, s_n = naive_s4d_bilinear(a, b, log_lam, B, C, initial_state=init, output_final_state=True)
    o_c, s_c = chunk_s4d_bilinear(
        a, b, log_lam, B, C, initial_state=init, output_final_state=True, chunk_size=chunk_size
    )
    assert o_n.shape == o_c.shape == (Bsz, T, H, R) and o_c.dtype == F64
    assert s_n.shape == s_c.shape == (Bsz, H, M, 2 * R) and s_c.dtype == C128
    assert o_n.abs().max() > 1e-2
    assert max_err(o_n, o_c) < 1e-9
    assert max_err(s_n, s_c) < 1e-9


@pytest.mark.parametrize("M,lift_cap", [(5, False), (40, False), (5, True)], ids=["few-modes", "many-modes", "no-cap"])
def test_reference_chunk_cap_on_cpu(M, lift_cap, monkeypatch):
    """On CPU tensors the reference runs chunks of reference_chunk(M) tokens at most (16 for M <= 32, else 32; its
    decay table has that length); with the cap lifted chunk_size is used as asked; all equal the token loop across
    chunk boundaries and a partial last chunk."""
    from hybrid_attention.ops.s4d_bilinear import chunk as chunk_mod

    if lift_cap:
        monkeypatch.setattr(chunk_mod, "reference_chunk", lambda M: 1000)
    seen = []
    real = chunk_mod.chunk_decays
    monkeypatch.setattr(chunk_mod, "chunk_decays", lambda ll, L: seen.append(L) or real(ll, L))
    Bsz, T, H, R = 1, 70, 1, 2
    log_lam, B, C = make_params(H, M, 5)
    a, b = make_inputs(Bsz, T, H, R, 6)
    init = make_state(Bsz, H, M, 2 * R, 7)
    o_n, s_n = naive_s4d_bilinear(a, b, log_lam, B, C, initial_state=init, output_final_state=True)
    o_c, s_c = chunk_s4d_bilinear(a, b, log_lam, B, C, initial_state=init, output_final_state=True, chunk_size=64)
    assert seen == [64 if lift_cap else (16 if M <= 32 else 32)]
    assert max_err(o_n, o_c) < 1e-9 and max_err(s_n, s_c) < 1e-9


def test_empty_sequence_and_no_state():
    log_lam, B, C = make_params(2, 4, 0)
    a, b = make_inputs(1, 0, 2, 3, 1)
    init = make_state(1, 2, 4, 6, 2)
    for fn in (naive_s4d_bilinear, chunk_s4d_bilinear):
        o, s = fn(a, b, log_lam, B, C, initial_state=init, output_final_state=True)
        assert o.shape == (1, 0, 2, 3) and torch.equal(s, init)
        assert fn(a, b, log_lam, B, C)[1] is None


def kernel_view_reference(a, b, log_lam, B, C, initial_state):
    """o_t[j] = Re Σ_m U_t[m, j] Γ_t[m, j] with U_t = Σ_{s<=t} κ(t-s) a_sᵀ + C(λ^{t+1} ⊙ X0^a), κ(τ) = C(λ^τ ⊙ B),
    likewise Γ_t from b; and X_T. Plain Python lists and cmath, no code shared with the ops."""
    Bsz, T, H, R = a.shape
    M = log_lam.shape[-1]
    out = [[[[0.0] * R for _ in range(H)] for _ in range(T)] for _ in range(Bsz)]
    final = [[[[0j] * 2 * R for _ in range(M)] for _ in range(H)] for _ in range(Bsz)]
    for h in range(H):
        ll = [complex(x) for x in log_lam[h].tolist()]
        Bh = [complex(x) for x in B[h].tolist()]
        Ch = [[complex(x) for x in row] for row in C[h].tolist()]
        pw = [[cmath.exp(ll[n] * tau) for n in range(M)] for tau in range(T + 1)]
        kappa = [[sum(Ch[m][n] * pw[tau][n] * Bh[n] for n in range(M)) for m in range(M)] for tau in range(T)]
        for bb in range(Bsz):
            X0 = [[0j] * 2 * R for _ in range(M)]
            if initial_state is not None:
                X0 = [[complex(x) for x in row] for row in initial_state[bb, h].tolist()]
            z = [a[bb, s, h].tolist() + b[bb, s, h].tolist() for s in range(T)]
            for t in range(T):
                Y = [
                    [
                        sum(kappa[t - s][m] * z[s][c] for s in range(t + 1))
                        + sum(Ch[m][n] * pw[t + 1][n] * X0[n][c] for n in range(M))
                        for c in range(2 * R)
                    ]
                    for m in range(M)
                ]
                out[bb][t][h] = [sum(Y[m][j] * Y[m][R + j] for m in range(M)).real for j in range(R)]
            for n in range(M):
                for c in range(2 * R):
                    final[bb][h][n][c] = pw[T][n] * X0[n][c] + sum(pw[T - 1 - s][n] * Bh[n] * z[s][c] for s in range(T))
    return torch.tensor(out, dtype=F64), torch.tensor(final, dtype=C128)


@pytest.mark.parametrize("with_state", [False, True], ids=["zero0", "state0"])
def test_matches_kernel_view(with_state):
    Bsz, T, H, R, M = 2, 6, 2, 2, 3
    log_lam, B, C = make_params(H, M, 7, im_max=3.0, re_min=-2.0)
    a, b = make_inputs(Bsz, T, H, R, 8)
    init = make_state(Bsz, H, M, 2 * R, 9) if with_state else None
    o_ref, s_ref = kernel_view_reference(a, b, log_lam, B, C, init)
    assert o_ref.abs().max() > 1e-2
    for fn, kw in ((naive_s4d_bilinear, {}), (chunk_s4d_bilinear, {"chunk_size": 4})):
        o, s = fn(a, b, log_lam, B, C, initial_state=init, output_final_state=True, **kw)
        assert max_err(o, o_ref) < 1e-10, fn.__name__
        assert max_err(s, s_ref) < 1e-10, fn.__name__


def test_is_interdomain_with_identity_query():
    """o[..., j] of s4d_bilinear equals channel j of Interdomain (plain-transpose readout: the bilinear product
    Re(diag(UᵀΓ)) has no conjugation) with k = a, v = b and the one-hot query e_j."""
    Bsz, T, H, R, M = 2, 30, 2, 3, 5
    log_lam, B, C = make_params(H, M, 17, im_max=50.0)
    a, b = make_inputs(Bsz, T, H, R, 18)
    o = chunk_s4d_bilinear(a, b, log_lam, B, C, chunk_size=8)[0]
    for j in range(R):
        e_j = torch.zeros_like(a)
        e_j[..., j] = 1.0
        assert max_err(o[..., j], naive_interdomain(e_j, a, b, log_lam, B, C, readout="transpose")[0][..., j]) < 1e-10


def test_split_equals_single_call():
    Bsz, T, H, R, M = 1, 20, 2, 3, 6
    log_lam, B, C = make_params(H, M, 11)
    a, b = make_inputs(Bsz, T, H, R, 12)
    init = make_state(Bsz, H, M, 2 * R, 13)
    for fn, kw in ((naive_s4d_bilinear, {}), (chunk_s4d_bilinear, {"chunk_size": 8})):
        full, s_full = fn(a, b, log_lam, B, C, initial_state=init, output_final_state=True, **kw)
        for split in range(T + 1):
            o1, s1 = fn(a[:, :split], b[:, :split], log_lam, B, C, initial_state=init, output_final_state=True, **kw)
            o2, s2 = fn(a[:, split:], b[:, split:], log_lam, B, C, initial_state=s1, output_final_state=True, **kw)
            assert max_err(torch.cat([o1, o2], dim=1), full) < 1e-9, (fn.__name__, split)
            assert max_err(s2, s_full) < 1e-9, (fn.__name__, split)


def test_gradcheck_chunk():
    Bsz, T, H, R, M = 1, 5, 1, 2, 3
    log_lam, B, C = make_params(H, M, 31, im_max=3.0, re_min=-2.0)
    a, b = make_inputs(Bsz, T, H, R, 32)
    init = make_state(Bsz, H, M, 2 * R, 33)
    inputs = tuple(x.clone().requires_grad_() for x in (a, b, log_lam, B, C, init))

    def fn(a, b, log_lam, B, C, init):
        return chunk_s4d_bilinear(a, b, log_lam, B, C, initial_state=init, output_final_state=True, chunk_size=2)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("backend", ["reference", "naive"])
def test_low_precision_inputs(dtype, tol, backend):
    Bsz, T, H, R, M = 2, 70, 2, 4, 8
    log_lam, B, C = (x.to(torch.complex64) for x in make_params(H, M, 51, im_max=100.0))
    a, b = (x.to(dtype) for x in make_inputs(Bsz, T, H, R, 52))
    init = make_state(Bsz, H, M, 2 * R, 53).to(torch.complex64)
    o, s = s4d_bilinear(
        a, b, log_lam, B, C, initial_state=init, output_final_state=True, chunk_size=32, backend=backend
    )
    assert o.dtype == dtype and s.dtype == torch.complex64
    up = [x.to(C128) for x in (log_lam, B, C, init)]
    ref, s_ref = naive_s4d_bilinear(a.double(), b.double(), *up[:3], initial_state=up[3], output_final_state=True)
    scale = ref.abs().max().item()
    assert scale > 1e-2
    assert max_err(o.double(), ref) < tol * scale
    assert max_err(s.to(C128), s_ref) < 1e-4 * s_ref.abs().max().item()


def test_fast_modes_do_not_overflow_float32():
    Bsz, T, H, R, M = 1, 130, 2, 3, 6
    log_lam, B, C = (x.to(torch.complex64) for x in make_params(H, M, 61, im_max=100.0, re_min=-30.0))
    a, b = (x.float() for x in make_inputs(Bsz, T, H, R, 62))
    o, s = chunk_s4d_bilinear(a, b, log_lam, B, C, output_final_state=True, chunk_size=64)
    assert torch.isfinite(o).all() and torch.isfinite(torch.view_as_real(s)).all()
    ref, _ = naive_s4d_bilinear(a.double(), b.double(), log_lam.to(C128), B.to(C128), C.to(C128))
    assert max_err(o.double(), ref) < 1e-4 * ref.abs().max().item()


def test_backends_dispatch():
    log_lam, B, C = make_params(2, 4, 71)
    a, b = make_inputs(1, 9, 2, 2, 72)
    assert torch.equal(
        s4d_bilinear(a, b, log_lam, B, C, backend="naive")[0], naive_s4d_bilinear(a, b, log_lam, B, C)[0]
    )
    o_chunk = chunk_s4d_bilinear(a, b, log_lam, B, C, chunk_size=4)[0]
    for backend in ("auto", "reference"):
        assert torch.equal(s4d_bilinear(a, b, log_lam, B, C, chunk_size=4, backend=backend)[0], o_chunk)
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'reference', 'naive', 'triton', got 'fft'"):
        s4d_bilinear(a, b, log_lam, B, C, backend="fft")


def _bad_cases():
    Bsz, T, H, R, M = 2, 5, 3, 4, 6
    a, b = make_inputs(Bsz, T, H, R, 0)
    log_lam, B, C = make_params(H, M, 0)
    good = dict(a=a, b=b, log_lam=log_lam, B=B, C=C)
    return [
        ("a", dict(good, a=a[0])),
        ("a", dict(good, a=a.to(C128))),
        ("b", dict(good, b=b[..., :3])),  # R != D
        ("b", dict(good, b=b[:, :4])),
        ("log_lam", dict(good, log_lam=log_lam[:, None])),
        ("B", dict(good, B=B[:2])),
        ("C", dict(good, C=C[:, :5])),
        ("initial_state", dict(good, initial_state=make_state(Bsz, H, M, R, 0))),
        ("chunk_size", dict(good, chunk_size=-1)),
    ]


@pytest.mark.parametrize("backend", ["auto", "naive"])
@pytest.mark.parametrize("field,kwargs", _bad_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_inputs_raise(field, kwargs, backend):
    kwargs = dict(kwargs)
    args = [kwargs.pop(n) for n in ("a", "b", "log_lam", "B", "C")]
    with pytest.raises(ValueError, match=rf"^{field} "):
        s4d_bilinear(*args, backend=backend, **kwargs)


def test_r_not_equal_d_raises_for_both_forms():
    log_lam, B, C = make_params(1, 4, 0)
    a, _ = make_inputs(1, 3, 1, 3, 0)
    b = torch.randn(1, 3, 1, 2, dtype=F64)
    for fn in (naive_s4d_bilinear, chunk_s4d_bilinear):
        with pytest.raises(ValueError, match=r"b must be \[B, T, H, D\] with D == R = 3"):
            fn(a, b, log_lam, B, C)
