"""Tests of the Interdomain Attention core op: naive (definition) vs chunk form, an independent pure-Python kernel-view
oracle, state carrying, gradients, low precision, overflow safety and input validation. CPU, float64 unless stated."""

from __future__ import annotations

import cmath
import math

import pytest
import torch

from hybrid_attention.ops.interdomain import READOUTS, chunk_interdomain, interdomain, naive_interdomain
from hybrid_attention.ops.interdomain import chunk as chunk_mod
from hybrid_attention.ops.interdomain.naive import DEN_EPS

F64, C128 = torch.float64, torch.complex128


def make_params(H: int, M: int, seed: int, *, im_max: float = 1000.0, re_min: float = -5.0, dominant: bool = False):
    """log_lam [H, M] with Re log-uniform in [re_min, -1e-3] (both extremes forced in) and Im uniform in ±im_max (both
    extremes forced in); complex Gaussian B [H, M] (scale 0.3) and C [H, M, M] (E|C_ij|² = 1/M).

    ``dominant``: mode 0 becomes a slow real mode (log λ = -1e-3, B = 1) read strongly through C[:, 0, 0] = 3. With
    non-negative features this keeps the ideal-readout denominator far from 0 (it is otherwise indefinite for a
    complex basis), so that comparisons of num/den test the ops and not the conditioning of a near-zero division.
    """
    g = torch.Generator().manual_seed(seed)
    log_re = torch.empty(H, M, dtype=F64).uniform_(math.log(1e-3), math.log(-re_min), generator=g)
    re = -torch.exp(log_re)
    im = torch.empty(H, M, dtype=F64).uniform_(-im_max, im_max, generator=g)
    if M >= 4:
        re[:, 0], re[:, 1] = re_min, -1e-3
        im[:, 2], im[:, 3] = im_max, -im_max
    log_lam = torch.complex(re, im)
    B = 0.3 * torch.randn(H, M, dtype=C128, generator=g)
    C = torch.randn(H, M, M, dtype=C128, generator=g) / math.sqrt(M)
    if dominant:
        log_lam[:, 0], B[:, 0], C[:, 0, 0] = -1e-3, 1.0, 3.0
    return log_lam, B, C


def make_inputs(Bsz: int, T: int, H: int, R: int, D: int, seed: int, *, positive: bool = False):
    """q unit-norm per head (like ξ(q) = SiLU/ℓ2), k and v standard normal; non-negative q, k if ``positive``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(Bsz, T, H, R, dtype=F64, generator=g)
    k = torch.randn(Bsz, T, H, R, dtype=F64, generator=g)
    v = torch.randn(Bsz, T, H, D, dtype=F64, generator=g)
    if positive:
        q, k = q.abs(), k.abs()
    q = q / q.norm(dim=-1, keepdim=True)
    return q, k, v


def make_state(Bsz: int, H: int, M: int, n_ch: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(Bsz, H, M, n_ch, dtype=C128, generator=g)


def denominator_values(q, k, log_lam, B, C, initial_state=None):
    """Re(q_tᵀ U_tᵀ η_t) [B, T, H], obtained from the op without denominator and a value that is the constant 1
    (then Γ_t = η_t)."""
    ones = torch.ones_like(q[..., :1])
    R = q.shape[-1]
    init = None if initial_state is None else torch.cat([initial_state[..., :R], initial_state[..., -1:]], dim=-1)
    return naive_interdomain(q, k, ones, log_lam, B, C, initial_state=init)[0][..., 0]


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


# ----------------------------------------------------------------------------------------------------------------------
# naive == chunk

CASES = [(T, cs) for T in (1, 7, 63, 64, 65, 200) for cs in (16, 64)] + [(T, cs) for T in (1, 7) for cs in (1, 5)]


@pytest.mark.parametrize("denominator", [False, True], ids=["noden", "den"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero0", "state0"])
@pytest.mark.parametrize("T,chunk_size", CASES)
def test_naive_equals_chunk(T, chunk_size, with_state, denominator):
    Bsz, H, R, D, M = 2, 2, 4, 3, 8
    seed = 1000 * T + chunk_size
    log_lam, B, C = make_params(H, M, seed, dominant=denominator)
    q, k, v = make_inputs(Bsz, T, H, R, D, seed + 1, positive=denominator)
    n_ch = R + D + (1 if denominator else 0)
    init = 0.3 * make_state(Bsz, H, M, n_ch, seed + 2) if with_state else None
    if denominator:  # precondition of the data: den well away from 0, so num/den is well conditioned
        den = denominator_values(q, k, log_lam, B, C, init)
        assert den.abs().min().item() > 0.1

    o_n, s_n = naive_interdomain(
        q, k, v, log_lam, B, C, denominator=denominator, initial_state=init, output_final_state=True
    )
    o_c, s_c = chunk_interdomain(
        q,
        k,
        v,
        log_lam,
        B,
        C,
        denominator=denominator,
        initial_state=init,
        output_final_state=True,
        chunk_size=chunk_size,
    )
    assert o_n.shape == o_c.shape == (Bsz, T, H, D) and o_c.dtype == F64
    assert s_n.shape == s_c.shape == (Bsz, H, M, n_ch) and s_c.dtype == C128
    assert o_n.abs().max() > 1e-2  # not trivially zero
    assert max_err(o_n, o_c) < 1e-9
    assert max_err(s_n, s_c) < 1e-9


def test_no_final_state_unless_asked():
    log_lam, B, C = make_params(1, 4, 0)
    q, k, v = make_inputs(1, 5, 1, 2, 2, 1)
    for fn in (naive_interdomain, chunk_interdomain):
        assert fn(q, k, v, log_lam, B, C)[1] is None


def test_empty_sequence_passes_state_through():
    log_lam, B, C = make_params(2, 4, 0)
    q, k, v = make_inputs(1, 0, 2, 3, 2, 1)
    init = make_state(1, 2, 4, 5, 2)
    for fn in (naive_interdomain, chunk_interdomain):
        o, s = fn(q, k, v, log_lam, B, C, initial_state=init, output_final_state=True)
        assert o.shape == (1, 0, 2, 2) and torch.equal(s, init)


# ----------------------------------------------------------------------------------------------------------------------
# independent oracle: the convolution-kernel view, in plain Python complex arithmetic


def kernel_view_reference(q, k, v, log_lam, B, C, initial_state, denominator):
    """o and X_T from κ(τ) = C (λ^τ ⊙ B): U_t = Σ_{s<=t} κ(t-s) k_sᵀ + C (λ^{t+1} ⊙ X0^k), likewise Γ_t, η_t;
    o_t = Re(q_tᵀ U_tᵀ Γ_t) [/ safe(Re(q_tᵀ U_tᵀ η_t))]. Shares no code with the ops (lists and cmath only)."""
    Bsz, T, H, R = q.shape
    D, M = v.shape[-1], log_lam.shape[-1]
    n_ch = R + D + (1 if denominator else 0)
    out = [[[[0.0] * D for _ in range(H)] for _ in range(T)] for _ in range(Bsz)]
    final = [[[[0j] * n_ch for _ in range(M)] for _ in range(H)] for _ in range(Bsz)]
    for h in range(H):
        ll = [complex(x) for x in log_lam[h].tolist()]
        Bh = [complex(x) for x in B[h].tolist()]
        Ch = [[complex(x) for x in row] for row in C[h].tolist()]
        pw = [[cmath.exp(ll[n] * tau) for n in range(M)] for tau in range(T + 1)]  # λ^τ
        kappa = [[sum(Ch[m][n] * pw[tau][n] * Bh[n] for n in range(M)) for m in range(M)] for tau in range(T)]
        for b in range(Bsz):
            X0 = [[0j] * n_ch for _ in range(M)]
            if initial_state is not None:
                X0 = [[complex(x) for x in row] for row in initial_state[b, h].tolist()]
            z = [k[b, s, h].tolist() + v[b, s, h].tolist() + ([1.0] if denominator else []) for s in range(T)]
            for t in range(T):
                Y = [
                    [
                        sum(kappa[t - s][m] * z[s][c] for s in range(t + 1))
                        + sum(Ch[m][n] * pw[t + 1][n] * X0[n][c] for n in range(M))
                        for c in range(n_ch)
                    ]
                    for m in range(M)
                ]  # Y_t = [U_t | Γ_t | η_t]
                qt = q[b, t, h].tolist()
                a = [sum(qt[r] * Y[m][r] for r in range(R)) for m in range(M)]  # q_tᵀ U_tᵀ, no conjugation
                num = [sum(a[m] * Y[m][R + d] for m in range(M)).real for d in range(D)]
                if denominator:
                    den = sum(a[m] * Y[m][R + D] for m in range(M)).real
                    den = max(den, DEN_EPS) if den >= 0 else min(den, -DEN_EPS)
                    num = [x / den for x in num]
                out[b][t][h] = num
            for n in range(M):
                for c in range(n_ch):
                    final[b][h][n][c] = pw[T][n] * X0[n][c] + sum(pw[T - 1 - s][n] * Bh[n] * z[s][c] for s in range(T))
    return torch.tensor(out, dtype=F64), torch.tensor(final, dtype=C128)


@pytest.mark.parametrize("denominator", [False, True], ids=["noden", "den"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero0", "state0"])
def test_matches_kernel_view(with_state, denominator):
    Bsz, T, H, R, D, M = 2, 6, 2, 2, 3, 3
    log_lam, B, C = make_params(H, M, 7, im_max=3.0, re_min=-2.0, dominant=denominator)
    q, k, v = make_inputs(Bsz, T, H, R, D, 8, positive=denominator)
    init = make_state(Bsz, H, M, R + D + int(denominator), 9) if with_state else None
    o_ref, s_ref = kernel_view_reference(q, k, v, log_lam, B, C, init, denominator)
    assert o_ref.abs().max() > 1e-2
    for fn, kw in ((naive_interdomain, {}), (chunk_interdomain, {"chunk_size": 4})):
        # the kernel view above is the plain-transpose readout (no conjugation): name it, whatever the default is
        o, s = fn(q, k, v, log_lam, B, C, denominator=denominator, initial_state=init, output_final_state=True,
                  readout="transpose", **kw)
        assert max_err(o, o_ref) < 1e-10, fn.__name__
        assert max_err(s, s_ref) < 1e-10, fn.__name__


def test_readout_is_bilinear_not_hermitian():
    """One token, M = 1, readout "transpose": o = Re(q·k · (C B)² · v) (plain square), not |C B|² q·k v (Hermitian)."""
    log_lam = torch.tensor([[-0.5 + 0.3j]], dtype=C128)
    B = torch.tensor([[1.0 + 1.0j]], dtype=C128)
    C = torch.tensor([[[1.0 + 0.0j]]], dtype=C128)
    q = torch.tensor([[[[1.0]]]], dtype=F64)
    k = torch.tensor([[[[2.0]]]], dtype=F64)
    v = torch.tensor([[[[3.0]]]], dtype=F64)
    for fn in (naive_interdomain, chunk_interdomain):
        o, _ = fn(q, k, v, log_lam, B, C, readout="transpose")
        # U = C B k = 2(1+i), Γ = C B v = 3(1+i): Re(U Γ) = 6 Re((1+i)²) = 0 (Hermitian would give 12)
        assert abs(o.item()) < 1e-12


# ----------------------------------------------------------------------------------------------------------------------
# state carrying


@pytest.mark.parametrize("denominator", [False, True], ids=["noden", "den"])
def test_split_equals_single_call(denominator):
    Bsz, T, H, R, D, M = 1, 20, 2, 3, 2, 6
    log_lam, B, C = make_params(H, M, 11, dominant=denominator)
    q, k, v = make_inputs(Bsz, T, H, R, D, 12, positive=denominator)
    init = 0.3 * make_state(Bsz, H, M, R + D + int(denominator), 13)
    for fn, kw in ((naive_interdomain, {}), (chunk_interdomain, {"chunk_size": 8})):
        full, s_full = fn(
            q, k, v, log_lam, B, C, denominator=denominator, initial_state=init, output_final_state=True, **kw
        )
        for split in range(T + 1):
            o1, s1 = fn(
                q[:, :split],
                k[:, :split],
                v[:, :split],
                log_lam,
                B,
                C,
                denominator=denominator,
                initial_state=init,
                output_final_state=True,
                **kw,
            )
            o2, s2 = fn(
                q[:, split:],
                k[:, split:],
                v[:, split:],
                log_lam,
                B,
                C,
                denominator=denominator,
                initial_state=s1,
                output_final_state=True,
                **kw,
            )
            assert max_err(torch.cat([o1, o2], dim=1), full) < 1e-9, (fn.__name__, split)
            assert max_err(s2, s_full) < 1e-9, (fn.__name__, split)


def test_decode_steps_equal_prefill():
    """Prefill with the chunk form, then one token at a time with the naive form (the decode step)."""
    Bsz, T, H, R, D, M = 2, 40, 2, 4, 4, 8
    log_lam, B, C = make_params(H, M, 21, im_max=50.0)
    q, k, v = make_inputs(Bsz, T, H, R, D, 22)
    full, _ = chunk_interdomain(q, k, v, log_lam, B, C, chunk_size=16)
    o, state = chunk_interdomain(q[:, :25], k[:, :25], v[:, :25], log_lam, B, C, output_final_state=True, chunk_size=16)
    outs = [o]
    for t in range(25, T):
        o_t, state = naive_interdomain(
            q[:, t : t + 1],
            k[:, t : t + 1],
            v[:, t : t + 1],
            log_lam,
            B,
            C,
            initial_state=state,
            output_final_state=True,
        )
        outs.append(o_t)
    assert max_err(torch.cat(outs, dim=1), full) < 1e-10


# ----------------------------------------------------------------------------------------------------------------------
# gradients


@pytest.mark.parametrize("denominator", [False, True], ids=["noden", "den"])
def test_gradcheck_chunk(denominator):
    Bsz, T, H, R, D, M = 1, 5, 1, 2, 2, 3
    log_lam, B, C = make_params(H, M, 31, im_max=3.0, re_min=-2.0, dominant=denominator)
    q, k, v = make_inputs(Bsz, T, H, R, D, 32, positive=denominator)
    init = 0.3 * make_state(Bsz, H, M, R + D + int(denominator), 33)
    if denominator:
        assert denominator_values(q, k, log_lam, B, C, init).abs().min().item() > 0.1
    inputs = tuple(x.clone().requires_grad_() for x in (q, k, v, log_lam, B, C, init))

    def fn(q, k, v, log_lam, B, C, init):
        return chunk_interdomain(
            q, k, v, log_lam, B, C, denominator=denominator, initial_state=init, output_final_state=True, chunk_size=2
        )

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


def test_gradients_naive_equal_chunk():
    Bsz, T, H, R, D, M = 2, 19, 2, 3, 2, 5
    log_lam, B, C = make_params(H, M, 41, im_max=100.0)
    q, k, v = make_inputs(Bsz, T, H, R, D, 42)
    grads = []
    for fn, kw in ((naive_interdomain, {}), (chunk_interdomain, {"chunk_size": 8})):
        xs = [x.clone().requires_grad_() for x in (q, k, v, log_lam, B, C)]
        o, s = fn(*xs, output_final_state=True, **kw)
        (o.square().sum() + s.abs().square().sum()).backward()
        grads.append([x.grad for x in xs])
    for g_n, g_c in zip(*grads):
        assert max_err(g_n, g_c) < 1e-8 * max(1.0, g_n.abs().max().item())


def _all_gradients(fn, tensors, weights, **kw):
    """Gradients of every input (q, k, v, log λ, B, C, initial state) of Σ w_o·o + Σ w_s·(Re, Im) final state."""
    xs = [x.clone().requires_grad_() for x in tensors]
    o, s = fn(*xs[:6], initial_state=xs[6], output_final_state=True, **kw)
    w_o, w_s = weights
    (o.double() * w_o).sum().add((torch.view_as_real(s).double() * w_s).sum()).backward()
    return [x.grad for x in xs]


@pytest.mark.parametrize("readout", READOUTS)
@pytest.mark.parametrize("denominator", [False, True], ids=["noden", "den"])
def test_every_gradient_naive_equals_chunk(readout, denominator):
    """The chunk form's closed-form backward (``chunk_function.ChunkCore``) against autograd through the token loop:
    every gradient, each readout, with and without the denominator, five chunks with a partial last one, an initial
    state and the final state in the loss."""
    Bsz, T, H, R, D, M = 2, 37, 2, 3, 2, 5
    log_lam, B, C = make_params(H, M, 91, im_max=100.0, dominant=denominator)
    q, k, v = make_inputs(Bsz, T, H, R, D, 92, positive=denominator)
    n_ch = R + D + int(denominator)
    init = 0.3 * make_state(Bsz, H, M, n_ch, 93)
    if denominator:
        assert denominator_values(q, k, log_lam, B, C, init).abs().min().item() > 0.1
    g = torch.Generator().manual_seed(94)
    weights = (torch.randn(Bsz, T, H, D, dtype=F64, generator=g),
               torch.randn(Bsz, H, M, n_ch, 2, dtype=F64, generator=g))
    tensors = (q, k, v, log_lam, B, C, init)
    kw = dict(denominator=denominator, readout=readout)
    want = _all_gradients(naive_interdomain, tensors, weights, **kw)
    got = _all_gradients(chunk_interdomain, tensors, weights, chunk_size=8, **kw)
    for name, g_n, g_c in zip(("q", "k", "v", "log_lam", "B", "C", "initial_state"), want, got):
        assert g_c.dtype == g_n.dtype and g_n.abs().max() > 1e-3, name
        assert max_err(g_n, g_c) < 1e-9 * max(1.0, g_n.abs().max().item()), name


def test_float32_gradients_near_float64():
    """The chunk form in float32 (complex64 parameters and state): every gradient within 1e-4 of the float64 one,
    relative to its largest entry."""
    Bsz, T, H, R, D, M = 2, 50, 2, 4, 4, 6
    log_lam, B, C = make_params(H, M, 95, im_max=100.0)
    q, k, v = make_inputs(Bsz, T, H, R, D, 96)
    init = 0.3 * make_state(Bsz, H, M, R + D, 97)
    g = torch.Generator().manual_seed(98)
    weights = (torch.randn(Bsz, T, H, D, dtype=F64, generator=g),
               torch.randn(Bsz, H, M, R + D, 2, dtype=F64, generator=g))
    tensors = (q, k, v, log_lam, B, C, init)
    want = _all_gradients(chunk_interdomain, tensors, weights, chunk_size=16)
    low = [x.float() if x.is_floating_point() else x.to(torch.complex64) for x in tensors]
    got = _all_gradients(chunk_interdomain, low, weights, chunk_size=16)
    for g_n, g_c in zip(want, got):
        assert g_c.dtype in (torch.float32, torch.complex64)
        assert max_err(g_n, g_c.to(g_n.dtype)) < 1e-4 * g_n.abs().max().item()


def test_chunk_form_under_bf16_autocast():
    """Under CPU bf16 autocast (a training run with train.precision=bf16 on a CPU) the chunk form computes in float32
    inside, forward and backward: o in the inputs' dtype, every gradient equal to the run without autocast."""
    Bsz, T, H, R, D, M = 2, 37, 2, 4, 4, 6
    log_lam, B, C = make_params(H, M, 91)
    q, k, v = (x.float() for x in make_inputs(Bsz, T, H, R, D, 92))
    init = (0.3 * make_state(Bsz, H, M, R + D, 93)).to(torch.complex64)
    params = [x.to(torch.complex64) for x in (log_lam, B, C)]
    results = []
    for autocast in (False, True):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, *params, init)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            o, fin = chunk_interdomain(*leaves[:6], initial_state=leaves[6], output_final_state=True, chunk_size=16,
                                       readout="real")
            loss = o.square().sum() + fin.abs().square().sum()
        assert o.dtype == torch.float32
        results.append([o.detach(), *torch.autograd.grad(loss, leaves)])
    for plain, cast in zip(*results):
        assert torch.allclose(plain, cast, rtol=1e-5, atol=1e-6)


def test_planar_readout_matrix_is_the_readout():
    """r^ = P p^ (interleaved real and imaginary parts) equals r = K₁ p + K₂ conj(p) of ``readout_operators``."""
    from hybrid_attention.ops.common.planar import as_planar
    from hybrid_attention.ops.interdomain.chunk import planar_readout_matrix
    from hybrid_attention.ops.interdomain.chunk_function import interleave
    from hybrid_attention.ops.interdomain.readout import readout_operators

    g = torch.Generator().manual_seed(99)
    H, M = 2, 5
    C = torch.randn(H, M, M, dtype=C128, generator=g)
    p = torch.randn(H, 7, M, dtype=C128, generator=g)
    for readout in READOUTS:
        k1, k2 = readout_operators(C, readout)
        want = sum(torch.einsum("hmn,htn->htm", K, x) for K, x in ((k1, p), (k2, p.conj())) if K is not None)
        got = interleave(p) @ planar_readout_matrix(as_planar(C, F64), readout).transpose(-1, -2)
        torch.testing.assert_close(got, interleave(want), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------------
# precision and overflow safety


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("backend", ["reference", "naive"])
def test_low_precision_inputs(dtype, tol, backend):
    Bsz, T, H, R, D, M = 2, 70, 2, 4, 4, 8
    log_lam, B, C = make_params(H, M, 51, im_max=100.0)
    q, k, v = (x.to(dtype) for x in make_inputs(Bsz, T, H, R, D, 52))
    init = 0.3 * make_state(Bsz, H, M, R + D, 53)
    o, s = interdomain(
        q,
        k,
        v,
        log_lam.to(torch.complex64),
        B.to(torch.complex64),
        C.to(torch.complex64),
        initial_state=init.to(torch.complex64),
        output_final_state=True,
        chunk_size=32,
        backend=backend,
    )
    assert o.dtype == dtype and s.dtype == torch.complex64
    # float64 result on the same (rounded) inputs and parameters
    log_lam, B, C, init = (x.to(torch.complex64).to(C128) for x in (log_lam, B, C, init))
    ref, s_ref = naive_interdomain(
        q.double(), k.double(), v.double(), log_lam, B, C, initial_state=init, output_final_state=True
    )
    scale = ref.abs().max().item()
    assert scale > 1e-2
    assert max_err(o.double(), ref) < tol * scale
    assert max_err(s.to(C128), s_ref) < 1e-4 * s_ref.abs().max().item()


def test_fast_modes_do_not_overflow_float32(monkeypatch):
    """Re(log λ) = -30: a λ^t · λ^{-s} factorisation would need e^{30·63} (inf even in float64); ours stays finite.
    (The CPU chunk cap is lifted so that the 64-token chunks are really used.)"""
    monkeypatch.setattr(chunk_mod, "REFERENCE_CHUNK", 1000)
    Bsz, T, H, R, D, M = 1, 130, 2, 3, 3, 6
    log_lam, B, C = make_params(H, M, 61, im_max=100.0, re_min=-30.0)
    q, k, v = make_inputs(Bsz, T, H, R, D, 62)
    cast = (q.float(), k.float(), v.float(), log_lam.to(torch.complex64), B.to(torch.complex64), C.to(torch.complex64))
    o, s = chunk_interdomain(*cast, denominator=False, output_final_state=True, chunk_size=64)
    assert torch.isfinite(o).all() and torch.isfinite(torch.view_as_real(s)).all()
    ref, _ = naive_interdomain(*(x.to(F64) if x.is_floating_point() else x.to(C128) for x in cast))
    assert max_err(o.double(), ref) < 1e-4 * ref.abs().max().item()
    # the gradient is finite too (no inf * 0 in the masked part of the decay table)
    xs = [x.clone().requires_grad_() for x in cast]
    chunk_interdomain(*xs, chunk_size=64)[0].sum().backward()
    assert all(torch.isfinite(torch.view_as_real(x.grad) if x.is_complex() else x.grad).all() for x in xs)


def test_safe_denominator_sign_and_floor():
    from hybrid_attention.ops.interdomain.naive import safe_divide

    num = torch.ones(4, dtype=F64)
    den = torch.tensor([0.0, 1e-9, -1e-9, -2.0], dtype=F64)
    assert torch.equal(safe_divide(num, den), torch.tensor([1 / DEN_EPS, 1 / DEN_EPS, -1 / DEN_EPS, -0.5], dtype=F64))


# ----------------------------------------------------------------------------------------------------------------------
# dispatch and validation


def test_backends_dispatch():
    log_lam, B, C = make_params(2, 4, 71)
    q, k, v = make_inputs(1, 9, 2, 2, 3, 72)
    o_naive = naive_interdomain(q, k, v, log_lam, B, C, denominator=True)[0]
    o_chunk = chunk_interdomain(q, k, v, log_lam, B, C, denominator=True, chunk_size=4)[0]
    assert torch.equal(interdomain(q, k, v, log_lam, B, C, denominator=True, backend="naive")[0], o_naive)
    for backend in ("auto", "reference"):
        out = interdomain(q, k, v, log_lam, B, C, denominator=True, chunk_size=4, backend=backend)[0]
        assert torch.equal(out, o_chunk)
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'reference', 'naive', 'triton', got 'fft'"):
        interdomain(q, k, v, log_lam, B, C, backend="fft")


def _bad_cases():
    Bsz, T, H, R, D, M = 2, 5, 3, 4, 2, 6
    q, k, v = make_inputs(Bsz, T, H, R, D, 0)
    log_lam, B, C = make_params(H, M, 0)
    good = dict(q=q, k=k, v=v, log_lam=log_lam, B=B, C=C)
    return [
        ("q", dict(good, q=q.to(C128))),
        ("k", dict(good, q=q[..., :3])),
        ("q", dict(good, q=q[0])),
        ("k", dict(good, k=k[:, :4])),
        ("k", dict(good, k=k.to(C128))),
        ("v", dict(good, v=v[:, :, :2])),
        ("v", dict(good, v=v[0])),
        ("log_lam", dict(good, log_lam=log_lam[:2])),
        ("log_lam", dict(good, log_lam=log_lam[0])),
        ("B", dict(good, B=B[:, :5])),
        ("C", dict(good, C=C[:, :, :5])),
        ("initial_state", dict(good, initial_state=make_state(Bsz, H, M, R + D + 1, 0))),
        ("initial_state", dict(good, initial_state=make_state(Bsz, H, M + 1, R + D, 0))),
        ("chunk_size", dict(good, chunk_size=0)),
    ]


@pytest.mark.parametrize("backend", ["auto", "naive"])
@pytest.mark.parametrize("field,kwargs", _bad_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_inputs_raise(field, kwargs, backend):
    kwargs = dict(kwargs)
    args = [kwargs.pop(n) for n in ("q", "k", "v", "log_lam", "B", "C")]
    with pytest.raises(ValueError, match=rf"^{field} "):
        interdomain(*args, backend=backend, **kwargs)


def test_denominator_state_needs_extra_channel():
    q, k, v = make_inputs(1, 3, 1, 2, 2, 0)
    log_lam, B, C = make_params(1, 4, 0)
    with pytest.raises(ValueError, match=r"initial_state must be \[B, H, M, R \+ D \+ 1"):
        chunk_interdomain(q, k, v, log_lam, B, C, denominator=True, initial_state=make_state(1, 1, 4, 4, 0))


@pytest.mark.parametrize("cap", [None, 1000], ids=["cpu-cap", "no-cap"])
def test_reference_chunk_cap_on_cpu(cap, monkeypatch):
    """On CPU tensors the reference runs chunks of at most REFERENCE_CHUNK tokens (its decay table has that length);
    with the cap lifted, chunk_size is used as asked; both equal the token loop across chunk boundaries."""
    if cap is not None:
        monkeypatch.setattr(chunk_mod, "REFERENCE_CHUNK", cap)
    seen = []
    real = chunk_mod._decay_tables
    monkeypatch.setattr(chunk_mod, "_decay_tables", lambda ll, b, L: seen.append(L) or real(ll, b, L))
    Bsz, T, H, R, D, M = 1, 130, 1, 2, 3, 5
    log_lam, B, C = make_params(H, M, 71)
    q, k, v = make_inputs(Bsz, T, H, R, D, 72)
    o_c, s_c = chunk_interdomain(q, k, v, log_lam, B, C, output_final_state=True, chunk_size=64)
    o_n, s_n = naive_interdomain(q, k, v, log_lam, B, C, output_final_state=True)
    assert seen == [min(64, chunk_mod.REFERENCE_CHUNK)]
    assert max_err(o_n, o_c) < 1e-9 and max_err(s_n, s_c) < 1e-9


def test_parameters_on_another_device_are_refused_by_name():
    log_lam, B, C = make_params(1, 4, 81)
    q, k, v = make_inputs(1, 5, 1, 2, 3, 82)
    for name, args in (("log_lam", (log_lam.to("meta"), B, C)), ("C", (log_lam, B, C.to("meta")))):
        with pytest.raises(ValueError, match=f"{name} must be on the same device as k"):
            chunk_interdomain(q, k, v, *args)
