"""Triton backend of the Interdomain core vs the float64 reference (chunk form), forward and every gradient.

Runs the kernels through the Triton interpreter on CPU (``triton_device.py`` sets TRITON_INTERPRET=1 when no GPU is
present), in float32 at tiny shapes; on a CUDA machine the same tests run compiled. Skipped when
triton does not import.
"""

from __future__ import annotations

import math

import pytest
import torch
from triton_device import DEVICE as DEV

from hybrid_attention.ops.interdomain import chunk_interdomain, interdomain
from hybrid_attention.ops.interdomain.triton import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable")

if HAS_TRITON:
    from hybrid_attention.ops.interdomain.triton import triton_interdomain
    from hybrid_attention.ops.interdomain.triton.config import InterdomainConfig
    from hybrid_attention.ops.interdomain.triton.decode import interdomain_decode_step

F64, C128 = torch.float64, torch.complex128
TOL = 1e-4  # relative L2 error, float32 kernels vs float64 reference (tf32 matmuls on a GPU: see GPU_TOL)
GPU_TOL = 5e-3  # the bar for bf16/tf32 GPU outputs; tf32 dots alone measured 2.2e-3 to 3.5e-3


def _tol() -> float:
    return GPU_TOL if DEV == "cuda" else TOL


def make_params(H, M, g, *, re_min=-5.0, im_max=50.0, dominant=False):
    log_re = torch.empty(H, M, dtype=F64).uniform_(math.log(1e-3), math.log(-re_min), generator=g)
    re = -torch.exp(log_re)
    im = torch.empty(H, M, dtype=F64).uniform_(-im_max, im_max, generator=g)
    if M >= 2:
        re[:, 0], re[:, 1] = re_min, -1e-3
    log_lam = torch.complex(re, im)
    B = 0.3 * torch.randn(H, M, dtype=C128, generator=g)
    C = torch.randn(H, M, M, dtype=C128, generator=g) / math.sqrt(M)
    if dominant:
        log_lam[:, 0], B[:, 0], C[:, 0, 0] = -1e-3, 1.0, 3.0
    return log_lam, B, C


def make_inputs(Bsz, T, H, R, D, g, *, positive=False):
    q = torch.randn(Bsz, T, H, R, dtype=F64, generator=g)
    k = torch.randn(Bsz, T, H, R, dtype=F64, generator=g)
    v = torch.randn(Bsz, T, H, D, dtype=F64, generator=g)
    if positive:
        q, k = q.abs(), k.abs()
    q = q / q.norm(dim=-1, keepdim=True).clamp(min=1e-6)
    return q, k, v


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a.detach().cpu().to(b.dtype)
    b = b.detach().cpu()
    if b.numel() == 0:
        return 0.0
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def run_both(Bsz, T, H, R, D, M, chunk, seed, *, with_state=True, with_final=True, denominator=False,
             readout="transpose", config=None, hooks=None, **pkw):
    """Returns {name: (triton value, float64 reference)} for o, the final state and all 7 gradients (the Triton side
    with launch configuration ``config``, an ``InterdomainConfig``; None = the registered op's defaults)."""
    g = torch.Generator().manual_seed(seed)
    log_lam, B, C = make_params(H, M, g, **pkw)
    q, k, v = make_inputs(Bsz, T, H, R, D, g, positive=denominator)
    n_ch = R + D + (1 if denominator else 0)
    X0 = torch.randn(Bsz, H, M, n_ch, dtype=C128, generator=g) if with_state else None
    do = torch.randn(Bsz, T, H, D, dtype=F64, generator=g)
    dfin = torch.randn(Bsz, H, M, n_ch, dtype=C128, generator=g)
    names = ["q", "k", "v", "log_lam", "B", "C"] + (["X0"] if with_state else [])
    base = [q, k, v, log_lam, B, C] + ([X0] if with_state else [])

    def run(fn, tensors):
        leaves = [t.clone().requires_grad_() for t in tensors]
        init = leaves[6] if with_state else None
        o, fin = fn(*leaves[:6], denominator=denominator, initial_state=init, output_final_state=with_final,
                    readout=readout)
        loss = (o.to(do.dtype) * do.to(o.device, o.dtype).to(do.dtype)).sum()
        if with_final:
            loss = loss + (fin.conj() * dfin.to(fin.device, fin.dtype)).real.sum()
        grads = torch.autograd.grad(loss, leaves)
        return o, fin, grads

    o_ref, fin_ref, g_ref = run(lambda *a, **kw: chunk_interdomain(*a, chunk_size=8, **kw), base)
    f32 = [t.to(DEV, torch.complex64 if t.is_complex() else torch.float32) for t in base]
    o, fin, gr = run(lambda *a, **kw: triton_interdomain(*a, chunk_size=chunk, config=config, hooks=hooks, **kw),
                     f32)
    out = {"o": (o, o_ref)}
    if with_final:
        out["final"] = (fin, fin_ref)
    for n, a, b in zip(names, gr, g_ref):
        out["d" + n] = (a, b)
    return out


@pytest.mark.parametrize(
    "Bsz,T,H,R,D,M,chunk",
    [
        (1, 1, 2, 16, 16, 16, 16),
        (2, 7, 1, 16, 16, 16, 16),
        (1, 33, 2, 16, 16, 16, 16),
        (1, 33, 1, 16, 16, 16, 32),  # two sub-chunks: exercises the factorised cross-sub-chunk matmuls
        (2, 70, 2, 12, 20, 10, 32),  # non-power-of-two R, D, M; partial last chunk
    ],
)
def test_matches_float64_reference(Bsz, T, H, R, D, M, chunk):
    res = run_both(Bsz, T, H, R, D, M, chunk, seed=1000 + T * 7 + chunk)
    for name, (a, b) in res.items():
        assert a.shape == b.shape, name
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < _tol(), (name, rel(a, b))


@pytest.mark.parametrize("readout", ["hermitian", "real"])
@pytest.mark.parametrize(
    "Bsz,T,H,R,D,M,chunk,denominator",
    [
        (2, 7, 1, 16, 16, 16, 16, False),
        (1, 33, 1, 16, 16, 16, 32, False),  # two sub-chunks
        (1, 37, 2, 12, 20, 10, 16, True),  # odd T, non-power-of-two shapes, the denominator channel
    ],
)
def test_readouts_match_float64_reference(readout, Bsz, T, H, R, D, M, chunk, denominator):
    """The Hermitian (conjugated key-side vector in the kernels) and real readouts: o, final state, every gradient."""
    # a dominant slow mode keeps the denominator away from 0 (as in test_denominator), else the ratio is ill-posed;
    # that case checks the kernels' logic with ieee dots (see IEEE_IF_DOMINANT), the registered op's tf32 precision
    # is test_tf32_precision_at_training_shape's
    res = run_both(Bsz, T, H, R, D, M, chunk, seed=77 + T + chunk, denominator=denominator, readout=readout,
                   dominant=denominator, config=InterdomainConfig(**IEEE_IF_DOMINANT) if denominator else None)
    for name, (a, b) in res.items():
        assert a.shape == b.shape, name
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < _tol(), (readout, name, rel(a, b))


ONE_PASS = dict(real_one_pass=True)  # readout="real" as one kernel pass, r = Cᵀ Re(C p) from C (REAL_C)
# The tiny cases with a dominant slow mode (the denominator channel) are ill-conditioned under tf32 dots: on the H200
# the one-pass "real" gives dq 2.2e-2 and 7.8e-3 there (two-pass 3.2e-3 and 6.7e-3), and ieee dots 7e-6 for both
# (benchmarks/interdomain_real_precision.py). Those cases check the kernels' logic with ieee dots;
# tf32 precision is checked at the training shape (test_tf32_precision_at_training_shape). Under the interpreter the
# dots are ieee anyway (ScanConfig.prec).
IEEE_IF_DOMINANT = dict(dot_prec="ieee")


@pytest.mark.parametrize(
    "Bsz,T,H,R,D,M,chunk,denominator,cfg",
    [
        (2, 7, 1, 16, 16, 16, 16, False, {}),
        (1, 37, 2, 12, 20, 10, 16, True, IEEE_IF_DOMINANT),  # odd T, non-power-of-two shapes, the denominator
        (1, 45, 1, 16, 16, 16, 32, False, {"BC": 16, "poison": True}),  # two sub-chunks: block-grad accumulators
        (1, 40, 1, 12, 20, 10, 32, True, {"bwd_split": False, "poison": True, **IEEE_IF_DOMINANT}),  # one launch
    ],
)
def test_real_one_pass_matches_float64_reference(Bsz, T, H, R, D, M, chunk, denominator, cfg):
    """readout="real" in one pass (real_one_pass): o, final state and the gradients of q, k, v, log λ, B, C and the
    initial state vs the float64 reference; T never a multiple of the kernel chunk."""
    config = InterdomainConfig(**ONE_PASS, **cfg)
    res = run_both(Bsz, T, H, R, D, M, chunk, seed=55 + T + chunk, denominator=denominator, readout="real",
                   dominant=denominator, config=config)
    assert {"o", "final", "dX0", "dC"} <= set(res)
    for name, (a, b) in res.items():
        assert a.shape == b.shape, name
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < _tol(), (name, rel(a, b))


@pytest.mark.skipif(DEV != "cuda", reason="tf32 dots exist on the GPU only (the interpreter computes ieee)")
@pytest.mark.parametrize("readout", ["transpose", "hermitian", "real"])
@pytest.mark.parametrize("denominator", [False, True])
def test_tf32_precision_at_training_shape(readout, denominator):
    """The registered op (DEFAULT_CONFIG: tf32 dots, one-pass "real") at the training head shape R = D = M = 64,
    T = 1000 (not a multiple of the chunk), with and without the dominant-mode denominator: o, the final state and
    every gradient within the GPU bar of the float64 reference, except the quotient of the denominator ablation with
    the hermitian / real readouts, which gets DENOM_TF32_TOL (see there)."""
    res = run_both(1, 1000, 2, 64, 64, 64, 32, seed=5, denominator=denominator, readout=readout,
                   dominant=denominator)
    errs = {name: rel(a, b) for name, (a, b) in res.items()}
    print(f"tf32 training shape, readout={readout} denominator={denominator}: "
          + " ".join(f"{n}={e:.2e}" for n, e in errs.items()))
    for name, (a, _b) in res.items():
        assert torch.isfinite(a).all(), name
    tol = DENOM_TF32_TOL if denominator and readout != "transpose" else GPU_TOL
    assert max(errs.values()) < tol, (readout, errs)


# The denominator ablation (``denominator=True``: o = read(U) / read(η), off by default, trained by no suite) with the
# hermitian / real readouts under tf32 dots, H200 (this test): o 8.7e-3 / 1.2e-2, dq 8.2e-3 / 2.3e-2,
# dX0 8.1e-3 / 2.3e-2 (transpose: o 8.5e-4, worst 2.1e-3; without the denominator every readout's worst field is
# 3.5e-3 / 3.5e-3 / 4.3e-3 for transpose / hermitian / real). The quotient amplifies the tf32 rounding of its
# numerator and denominator; ieee dots make the same kernels exact to 2e-5 (the tiny cases above). This bar holds
# the measured level with margin, so a further regression still fails.
DENOM_TF32_TOL = 4e-2


def test_real_one_pass_equals_two_pass():
    """The one-pass "real" and the two-pass average agree on the outputs and every gradient (float32 rounding), and
    the one pass launches each chunk kernel once (the two-pass form twice)."""
    from hybrid_attention.ops.common.triton.hooks import LaunchHooks

    class Count(LaunchHooks):
        def __init__(self):
            self.names = []

        def record(self, name, handle):
            self.names.append(name)

    out = {}
    for one in (True, False):
        hooks = Count()
        res = run_both(1, 37, 2, 12, 20, 10, 16, seed=8, readout="real",
                       config=InterdomainConfig(real_one_pass=one), hooks=hooks)
        out[one] = res
        assert hooks.names.count("chunk_fwd") == (1 if one else 2)
        parts = 2 if InterdomainConfig().bwd_split else 1  # the backward chunk kernel's launches per pass
        assert sum(n.startswith("chunk_bwd") for n in hooks.names) == (1 if one else 2) * parts
    for name in out[True]:
        assert rel(out[True][name][0], out[False][name][0]) < _tol(), name


@pytest.mark.parametrize("cfg", [{}, {"BC": 16, "bwd_split": False, "poison": True}])
def test_real_c_kernels_orientation(cfg):
    """REAL_C with a strongly non-symmetric C (random plus a large upper-triangular part, both planes) and random
    inputs: the op reading C itself equals the half-sum of the planar op with K₁ = Cᵀ C and the conjugated-p op with
    K₂ = Cᵀ conj(C), forward and every gradient, dC included. Each of C's two tiles is used in both orientations
    (x = Re p Re Cᵀ − Im p Im Cᵀ, r = x C; gx, dC, the key side); a tile loaded or a partial stored transposed shows
    here (checked by planting each such bug)."""
    from hybrid_attention.ops.common.triton.hooks import NO_HOOKS
    from hybrid_attention.ops.interdomain.readout import readout_operators
    from hybrid_attention.ops.interdomain.triton.ops import _EagerInterdomain

    g = torch.Generator().manual_seed(17)
    H, M, R, D, T = 2, 10, 12, 20, 45
    config = InterdomainConfig(**cfg)
    q, k, v = (torch.randn(1, T, H, n, generator=g).to(DEV) for n in (R, R, D))
    ll = torch.stack([-2 * torch.rand(H, M, generator=g), 5 * torch.randn(H, M, generator=g)], 1).to(DEV)
    bb = (0.3 * torch.randn(H, 2, M, generator=g)).to(DEV)
    tri = torch.triu(torch.ones(M, M), 1)
    C = torch.complex(torch.randn(H, M, M, generator=g) + 2 * tri, torch.randn(H, M, M, generator=g) - 2 * tri) / M
    assert rel(C, C.transpose(1, 2)) > 1.0  # far from symmetric: a transposed tile changes the result
    C = C.to(DEV)
    init = (0.3 * torch.randn(1, H, 2, M, R + D, generator=g)).to(DEV)
    do = torch.randn(1, T, H, D, generator=g).to(DEV)
    dfin = torch.randn(1, H, 2, M, R + D, generator=g).to(DEV)

    def op(leaves, kk, readout):
        q_, k_, v_, ll_, bb_, _, init_ = leaves
        args = (q_, k_, v_, ll_, bb_, kk, init_, None, None, None, 32, True, True, readout)
        return _EagerInterdomain.apply(config, NO_HOOKS, *args)[:2]  # (o, final); the kept tensors follow

    def planar(z):
        return torch.stack([z.real, z.imag], 1).contiguous()

    results = []
    for one in (True, False):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, ll, bb, C, init)]
        if one:
            o, fin = op(leaves, planar(leaves[5]), "real")
        else:
            k1, k2 = readout_operators(leaves[5], "real")  # the halves: ½ Cᵀ C, ½ Cᵀ conj(C)
            o1, f1 = op(leaves, planar(k1), "transpose")
            o2, _ = op(leaves, planar(k2), "hermitian")
            o, fin = o1 + o2, f1
        loss = (o * do).sum() + (fin * dfin).sum()
        results.append([o, fin, *torch.autograd.grad(loss, leaves)])
    names = ["o", "final", "dq", "dk", "dv", "dll", "dbb", "dC", "dinit"]
    for name, a, b in zip(names, *results):
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < _tol(), (name, rel(a, b))


def test_registered_op_follows_the_default_real_one_pass(monkeypatch):
    """Without a config (the registered torch.library ops, the training path), readout="real" takes the number of
    passes from DEFAULT_CONFIG.real_one_pass: one call of the op with readout "real" (kk = C) when set, two calls
    ("transpose", "hermitian") when not; forward and backward through the registered ops match the float64
    reference either way."""
    import dataclasses

    from hybrid_attention.ops.interdomain.triton import ops

    calls = []
    real_op = ops.interdomain_fwd_op

    def spy(*args):
        calls.append(args[13])  # the readout
        return real_op(*args)

    monkeypatch.setattr(ops, "interdomain_fwd_op", spy)
    for one in (False, True):
        monkeypatch.setattr(ops, "DEFAULT_CONFIG", dataclasses.replace(ops.DEFAULT_CONFIG, real_one_pass=one))
        calls.clear()
        res = run_both(1, 20, 1, 12, 20, 10, 16, seed=3, readout="real")
        assert calls == (["real"] if one else ["transpose", "hermitian"]), calls
        for name, (a, b) in res.items():
            assert rel(a, b) < _tol(), (one, name, rel(a, b))


def test_every_output_element_is_written():
    """All kernel-written buffers start as NaN (poison); any element a kernel skips would surface as NaN."""
    res = run_both(2, 37, 1, 12, 16, 10, 32, seed=99, config=InterdomainConfig(poison=True))
    for name, (a, b) in res.items():
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < _tol(), (name, rel(a, b))


@pytest.mark.parametrize(
    "cfg,chunk",
    [
        ({"BC": 32, "max_chunk": 32, "bwd_split": False}, 32),  # one block per chunk, one backward launch
        ({"BC": 16, "max_chunk": 64, "bwd_split": False}, 64),  # four sub-chunks: factorised cross-sub-chunk matmuls
        ({"BC": 32, "max_chunk": 32, "bwd_split": True, "warps_chunk_fwd": 8}, 32),  # the AOT report's choice
        ({"BC": 32, "max_chunk": 64, "bwd_split": True}, 64),  # backward as two launches (value / key side)
        ({"BC": 16, "max_chunk": 32, "bwd_split": True}, 32),
        ({"BC": 16, "max_chunk": 32, "bwd_split": True, "fuse_dz": True}, 32),  # split chunk kernel + fused scan
    ],
)
def test_kernel_configurations(cfg, chunk):
    res = run_both(1, 70, 1, 16, 16, 16, chunk, seed=31 + chunk + cfg["BC"], config=InterdomainConfig(**cfg))
    for name, (a, b) in res.items():
        assert rel(a, b) < _tol(), (name, rel(a, b))


@pytest.mark.parametrize("readout", ["transpose", "hermitian", "real"])
@pytest.mark.parametrize("cfg", [dict(save_states=False), dict(save_states=False, bwd_split=False, BC=16)])
def test_backward_rescanning_the_states(cfg, readout):
    """The backward that rescans the chunk states (save_states=False) instead of reading the forward's: o, the final
    state and every gradient vs the float64 reference; T never a multiple of the chunk; NaN-poisoned buffers."""
    config = InterdomainConfig(**cfg, poison=True)
    res = run_both(2, 45, 2, 12, 20, 10, 32, seed=len(cfg) + len(readout), readout=readout, config=config)
    for name, (a, b) in res.items():
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < _tol(), (name, rel(a, b))


def test_the_forward_keeps_states_only_for_a_gradient(monkeypatch):
    """The registered op is asked to keep its chunk states (per DEFAULT_CONFIG.save_states) only when a gradient is
    needed: never under no_grad (inference stores nothing extra)."""
    import dataclasses

    from hybrid_attention.ops.interdomain.triton import ops

    calls = []
    real_op = ops.interdomain_fwd_op

    def spy(*args):
        calls.append(args[14])
        return real_op(*args)

    monkeypatch.setattr(ops, "interdomain_fwd_op", spy)
    for save in (True, False):
        monkeypatch.setattr(ops, "DEFAULT_CONFIG", dataclasses.replace(ops.DEFAULT_CONFIG, save_states=save))
        g = torch.Generator().manual_seed(2)
        log_lam, B, C = (t.to(DEV, torch.complex64) for t in make_params(1, 10, g))
        q, k, v = (t.to(DEV, torch.float32) for t in make_inputs(1, 20, 1, 12, 12, g))
        with torch.no_grad():
            triton_interdomain(q, k, v, log_lam, B, C, chunk_size=16)
        triton_interdomain(q, k, v.requires_grad_(), log_lam, B, C, chunk_size=16)[0].sum().backward()
    assert calls == [False, True, False, False]


def test_no_state_no_final():
    res = run_both(1, 40, 1, 16, 16, 16, 32, seed=7, with_state=False, with_final=False)
    assert set(res) == {"o", "dq", "dk", "dv", "dlog_lam", "dB", "dC"}
    for name, (a, b) in res.items():
        assert rel(a, b) < _tol(), (name, rel(a, b))


def test_fast_and_oscillating_modes_stay_finite():
    """Re log λ down to -80 (λ^{-s} would overflow float32 after one token) and |Im log λ| up to 1000."""
    res = run_both(1, 40, 1, 16, 16, 16, 32, seed=11, re_min=-80.0, im_max=1000.0)
    for name, (a, b) in res.items():
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < 10 * _tol(), (name, rel(a, b))


def test_denominator():
    res = run_both(1, 20, 1, 16, 16, 16, 16, seed=5, denominator=True, dominant=True)
    for name, (a, b) in res.items():
        assert rel(a, b) < 10 * _tol(), (name, rel(a, b))


def test_chunk_size_invariance_and_dispatch():
    g = torch.Generator().manual_seed(3)
    log_lam, B, C = make_params(2, 16, g)
    q, k, v = make_inputs(1, 37, 2, 16, 16, g)
    args = [t.to(DEV, torch.complex64 if t.is_complex() else torch.float32) for t in (q, k, v, log_lam, B, C)]
    o16, f16 = triton_interdomain(*args, chunk_size=16, output_final_state=True)
    o32, f32 = interdomain(*args, chunk_size=32, output_final_state=True, backend="triton")
    o_odd = triton_interdomain(*args, chunk_size=20)[0]  # not a power of two: the kernels use 64
    assert rel(o16, o32) < _tol() and rel(f16, f32) < _tol() and rel(o_odd, o32) < _tol()
    with pytest.raises(ValueError, match="float64"):
        interdomain(q, k, v, log_lam, B, C, backend="triton")
    auto = interdomain(q, k, v, log_lam, B, C, backend="auto")[0]  # float64: auto keeps the reference
    assert torch.equal(auto, chunk_interdomain(q, k, v, log_lam, B, C)[0])


def test_low_precision_activations():
    """fp16 activations: output in fp16, state math in float32 (bf16 runs on the GPU benchmark)."""
    g = torch.Generator().manual_seed(9)
    log_lam, B, C = make_params(1, 16, g)
    q, k, v = make_inputs(1, 24, 1, 16, 16, g)
    q16, k16, v16 = (t.to(DEV, torch.float16) for t in (q, k, v))
    o, fin = triton_interdomain(q16, k16, v16, log_lam.to(DEV), B.to(DEV), C.to(DEV), output_final_state=True)
    o_ref, fin_ref = chunk_interdomain(
        q16.double().cpu(), k16.double().cpu(), v16.double().cpu(), log_lam, B, C, output_final_state=True
    )
    assert o.dtype == torch.float16 and fin.dtype == torch.complex64
    # fp16 rounding of the inputs/outputs ~1e-3; on a GPU the tf32 dots add their own (see GPU_TOL)
    assert rel(o.float(), o_ref) < max(2e-3, _tol()) and rel(fin, fin_ref) < (1e-4 if DEV == "cpu" else _tol())


def test_empty_sequence():
    g = torch.Generator().manual_seed(2)
    log_lam, B, C = make_params(1, 16, g)
    X0 = torch.randn(1, 1, 16, 32, dtype=torch.complex64, generator=g).to(DEV)
    q = torch.zeros(1, 0, 1, 16, device=DEV)
    o, fin = triton_interdomain(
        q, q, q, log_lam.to(DEV), B.to(DEV), C.to(DEV), initial_state=X0, output_final_state=True
    )
    assert o.shape == (1, 0, 1, 16) and torch.equal(fin, X0)


@pytest.mark.parametrize("readout", ["transpose", "hermitian", "real"])
def test_decode_step_matches_reference(readout):
    """One-token decode steps (state update + readout) continue a prefilled state exactly like the sequence op, for
    every readout (the fused step and the training kernels share the readout operators)."""
    g = torch.Generator().manual_seed(21)
    H, R, D, M = 2, 16, 16, 16
    log_lam, B, C = make_params(H, M, g)
    q, k, v = make_inputs(2, 12, H, R, D, g)
    o_ref, fin_ref = chunk_interdomain(q, k, v, log_lam, B, C, output_final_state=True, readout=readout)
    to32 = [t.to(DEV, torch.complex64 if t.is_complex() else torch.float32) for t in (q, k, v, log_lam, B, C)]
    q32, k32, v32, ll32, B32, C32 = to32
    _, state = triton_interdomain(q32[:, :5], k32[:, :5], v32[:, :5], ll32, B32, C32, output_final_state=True,
                                  readout=readout)
    outs = []
    for t in range(5, 12):
        o_t, state = interdomain_decode_step(q32[:, t], k32[:, t], v32[:, t], ll32, B32, C32, state, readout=readout)
        outs.append(o_t)
    assert rel(torch.stack(outs, dim=1), o_ref[:, 5:]) < _tol()
    assert rel(state, fin_ref) < _tol()


@pytest.mark.parametrize("save", [False, True])
@pytest.mark.parametrize("readout", ["transpose", "real"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_custom_op_opcheck(readout, save, dtype):
    """Schema, fake (meta) implementation and autograd registration of the registered forward op (kk planar K, or
    the planar C of the one-pass "real" readout); bf16 activations: the kept chunk states are bf16 (the default
    ``state_dtype="auto"``), in the fake implementation too."""
    from hybrid_attention.ops.interdomain.triton.ops import interdomain_fwd_op

    g = torch.Generator().manual_seed(4)
    H, M, R, D = 1, 16, 16, 16
    q, k, v = (torch.randn(1, 9, H, n, generator=g).to(DEV, dtype).requires_grad_() for n in (R, R, D))
    ll = torch.stack([-torch.rand(H, M, generator=g), torch.randn(H, M, generator=g)], 1).to(DEV).requires_grad_()
    bb = torch.randn(H, 2, M, generator=g).to(DEV).requires_grad_()
    kk = (0.2 * torch.randn(H, 2, M, M, generator=g)).to(DEV).requires_grad_()
    init = torch.randn(1, H, 2, M, R + D, generator=g).to(DEV).requires_grad_()
    args = (q, k, v, ll, bb, kk, init, None, None, None, 16, False, True, readout, save)
    torch.library.opcheck(interdomain_fwd_op, args,
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    states = interdomain_fwd_op(*args)[2]
    assert states.dtype == (dtype if save else torch.float32) and (states.numel() > 0) == save


FUSED_DZ = dict(fuse_dz=True)  # the backward with the fused reverse scan + state-carry gradient (_state_bwd_dz)


@pytest.mark.parametrize("denominator", [False, True])
@pytest.mark.parametrize("T", [1, 17, 40, 100])
def test_fused_state_carry_gradient(T, denominator):
    """fuse_dz=True vs the float64 reference: T = 1 (only the peeled partial chunk), 17 / 40 / 100 (partial last chunk
    of 16 after 1 / 2 / 6 full ones), initial state and final-state gradient, every gradient."""
    res = run_both(1, T, 2, 16, 16, 16, 16, seed=400 + T + denominator, denominator=denominator, dominant=denominator,
                   config=InterdomainConfig(**FUSED_DZ))
    assert {"dq", "dk", "dv", "dlog_lam", "dB", "dC", "dX0"} <= set(res)
    for name, (a, b) in res.items():
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < (10 if denominator else 1) * _tol(), (name, rel(a, b))


def test_fused_state_carry_gradient_odd_shapes_poisoned():
    """Non-power-of-two R, D, M (masked modes and channels, two channel blocks), B = 2, no initial state, chunk 32
    with a partial last chunk; every kernel-written buffer starts as NaN."""
    cfg = InterdomainConfig(**FUSED_DZ, poison=True, BCH_FZ=16)
    res = run_both(2, 45, 2, 12, 20, 10, 32, seed=77, with_state=False, config=cfg)
    for name, (a, b) in res.items():
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < _tol(), (name, rel(a, b))
    res = run_both(1, 45, 1, 12, 20, 10, 32, seed=78, with_final=False, config=cfg)  # dX0, no final-state gradient
    for name, (a, b) in res.items():
        assert rel(a, b) < _tol(), (name, rel(a, b))


def test_power_table_is_the_rounded_float64_power():
    """The host power table equals exp(n log λ) evaluated in complex128 and rounded to float32, also for phases
    n·Im log λ ~ 3e4 where a float32 product would be off by ~1e-3 rad."""
    from hybrid_attention.ops.common.triton.ssm_scan import planar, power_table

    g = torch.Generator().manual_seed(12)
    log_lam = torch.complex(
        -5 * torch.rand(3, 10, generator=g, dtype=F64), 1000 * torch.randn(3, 10, generator=g, dtype=F64)
    )
    ll = planar(log_lam, 1)
    assert ll.dtype == torch.float32 and ll.shape == (3, 2, 10) and ll.is_contiguous()
    P = power_table(ll, 32)
    lam64 = torch.complex(ll[:, 0].double(), ll[:, 1].double())
    ref = torch.exp(torch.arange(33, dtype=F64)[None, :, None] * lam64[:, None, :]).to(torch.complex64)
    assert P.shape == (3, 2, 33, 10) and P.is_contiguous()
    assert torch.equal(P[:, 0], ref.real) and torch.equal(P[:, 1], ref.imag)


@pytest.mark.parametrize("readout", ["transpose", "real"])
def test_registered_op_traces_under_compile(monkeypatch, readout):
    """torch.compile(fullgraph=True) traces the registered op (its schema carries the readout name; "real" with the
    one-pass form switched on) and its forward and backward equal eager's exactly."""
    import dataclasses

    import torch._dynamo

    from hybrid_attention.ops.interdomain.triton import ops as id_ops

    monkeypatch.setattr(id_ops, "DEFAULT_CONFIG", dataclasses.replace(id_ops.DEFAULT_CONFIG, real_one_pass=True))
    g = torch.Generator().manual_seed(11)
    H, M, R, D, T = 2, 16, 16, 16, 21
    q, k, v = (torch.randn(1, T, H, n, generator=g).to(DEV) for n in (R, R, D))
    log_lam = torch.complex(-0.5 * torch.rand(H, M, generator=g), torch.randn(H, M, generator=g)).to(DEV)
    B = torch.complex(torch.randn(H, M, generator=g), torch.randn(H, M, generator=g)).to(DEV)
    C = (0.3 * torch.complex(torch.randn(H, M, M, generator=g), torch.randn(H, M, M, generator=g))).to(DEV)

    def f(q, k, v, C):
        return id_ops.triton_interdomain(q, k, v, log_lam, B, C, chunk_size=16, readout=readout)[0]

    results = []
    torch._dynamo.reset()
    for fn in (f, torch.compile(f, backend="aot_eager", fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, C)]
        o = fn(*leaves)
        results.append((o, torch.autograd.grad(o.square().sum(), leaves)))
    torch._dynamo.reset()
    (o_e, g_e), (o_c, g_c) = results
    assert torch.equal(o_c, o_e)
    for a, b in zip(g_c, g_e):
        assert torch.equal(a, b)


def test_real_dot_prec_is_validated_and_launches():
    """``real_dot_prec`` (the precision of the one-pass "real" products through C) is checked at construction, and a
    tf32x3 launch runs the same kernels (the interpreter computes every dot in ieee: equal results there)."""
    with pytest.raises(ValueError, match="real_dot_prec must be one of tf32, tf32x3, ieee"):
        InterdomainConfig(real_dot_prec="fp16")
    res = {p: run_both(1, 37, 2, 12, 20, 10, 16, seed=3, readout="real", config=InterdomainConfig(real_dot_prec=p))
           for p in ("tf32", "tf32x3")}
    for name, (a, b) in res["tf32x3"].items():
        assert rel(a, b) < _tol(), name
        if DEV == "cpu":
            assert torch.equal(a, res["tf32"][name][0]), name


BF16_TOL = 1e-2  # the GPU gradient bar (outputs: GPU_TOL); bf16 operands put every field near 4e-3


@pytest.mark.parametrize("readout", ["transpose", "hermitian", "real"])
def test_bf16_chunk_dots(readout):
    """``chunk_dots="bf16"`` rounds every chunk-kernel operand to bf16 (float32 accumulation): o and every gradient stay
    within BF16_TOL of float64, and on the CPU (exact float32 dots otherwise) the rounding is visible: the error is far
    above the float32 run's. The denominator ablation runs float32 operands whatever the config: its results equal the
    float32 config's. The field is validated at construction."""
    with pytest.raises(ValueError, match="chunk_dots must be one of fp32, bf16, auto"):
        InterdomainConfig(chunk_dots="fp16")
    auto = InterdomainConfig(chunk_dots="auto")  # bf16 operands for bf16 activations only
    for act in (torch.float32, torch.bfloat16, torch.float16):
        want = InterdomainConfig(chunk_dots="bf16" if act == torch.bfloat16 else "fp32")
        assert (auto.chunk_prec(act), auto.real_prec(act)) == (want.chunk_prec(act), want.real_prec(act)), act
    res = {cd: run_both(1, 70, 2, 16, 16, 16, 32, seed=3, readout=readout, config=InterdomainConfig(chunk_dots=cd))
           for cd in ("fp32", "bf16")}
    for name, (a, b) in res["bf16"].items():
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < BF16_TOL, (name, rel(a, b))
    if DEV == "cpu":
        assert rel(*res["bf16"]["o"]) > 10 * rel(*res["fp32"]["o"])
    den = {cd: run_both(1, 37, 1, 8, 8, 8, 16, seed=4, readout=readout, denominator=True, dominant=True,
                        config=InterdomainConfig(chunk_dots=cd)) for cd in ("fp32", "bf16")}
    for name, (a, _b) in den["bf16"].items():
        assert torch.equal(a, den["fp32"][name][0]), name


def test_bf16_denominator_stays_on_the_registered_op(monkeypatch):
    """bf16 activations with the denominator: the default config's call runs the registered op (what torch.compile
    sees, not the eager path of a non-default config) with float32 chunk operands, so its output and gradients equal
    those of an explicit ``chunk_dots="fp32"`` config."""
    from hybrid_attention.ops.interdomain.triton import ops as id_ops

    g = torch.Generator().manual_seed(6)
    log_lam, B, C = make_params(1, 8, g)
    q, k, v = (t.to(DEV, torch.bfloat16) for t in make_inputs(1, 21, 1, 8, 8, g, positive=True))
    params = [t.to(DEV) for t in (log_lam, B, C)]

    def run(config):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = triton_interdomain(*leaves, *params, denominator=True, chunk_size=16, config=config)[0]
        return (o, *torch.autograd.grad(o.float().square().sum(), leaves))

    want = run(InterdomainConfig(chunk_dots="fp32"))

    def eager_refused(*args):
        raise AssertionError("the default config's denominator call left the registered op")

    monkeypatch.setattr(id_ops._EagerInterdomain, "apply", eager_refused)
    for a, b in zip(run(None), want):
        assert torch.equal(a, b)


@pytest.mark.skipif(DEV != "cuda", reason="bf16 tensor cores exist on the GPU only (the interpreter emulates them)")
@pytest.mark.parametrize("readout", ["transpose", "hermitian", "real"])
def test_bf16_chunk_dots_at_training_shape(readout):
    """bf16 chunk-kernel operands at the training head shape R = D = M = 64, T = 1000 (not a multiple of the chunk):
    o and the final state within the GPU output bar GPU_TOL, every gradient within BF16_TOL."""
    res = run_both(1, 1000, 2, 64, 64, 64, 32, seed=5, readout=readout, config=InterdomainConfig(chunk_dots="bf16"))
    errs = {name: rel(a, b) for name, (a, b) in res.items()}
    print(f"bf16 chunk dots, training shape, readout={readout}: " + " ".join(f"{n}={e:.2e}" for n, e in errs.items()))
    assert errs["o"] < GPU_TOL and errs["final"] < GPU_TOL, errs
    assert max(errs.values()) < BF16_TOL, errs


@pytest.mark.parametrize("cfg", [dict(state_dtype="bf16"), dict(state_dtype="bf16", chunk_dots="bf16"),
                                 dict(state_dtype="bf16", save_states=False, poison=True)])
def test_bf16_chunk_states(cfg):
    """bf16 chunk-state buffers (``ScanConfig.state_dtype``), alone, with bf16 chunk dots, and recomputed in the
    backward (NaN-poisoned buffers): o, the final state and every gradient of the "real" readout within BF16_TOL of
    float64, and on the CPU the states' rounding is visible (the error is far above the float32 run's)."""
    res = run_both(2, 70, 2, 16, 16, 16, 32, seed=3, readout="real", config=InterdomainConfig(**cfg))
    for name, (a, b) in res.items():
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < BF16_TOL, (name, rel(a, b))
    if DEV == "cpu":
        assert rel(*res["o"]) > 1e-3


@pytest.mark.parametrize("cfg", [dict(buffer_dtype="bf16"), dict(buffer_dtype="bf16", poison=True, state_dtype="bf16",
                                                                 chunk_dots="bf16")])
def test_bf16_backward_buffers(cfg):
    """bf16 per-chunk backward buffers (``InterdomainConfig.buffer_dtype``: the chunk-local state adjoints and the dC
    partials), alone and with bf16 states and operands on NaN-poisoned buffers: every gradient of the "real" readout
    within BF16_TOL of float64, the forward untouched (bit-equal to the float32-buffer run), and on the CPU the
    rounding is visible in the gradients the buffers feed (k, v, B, log λ, C, X0). The field is validated."""
    with pytest.raises(ValueError, match="buffer_dtype must be one of fp32, bf16, auto"):
        InterdomainConfig(buffer_dtype="fp16")
    with pytest.raises(ValueError, match="needs fuse_dz=True"):
        InterdomainConfig(buffer_dtype="bf16", fuse_dz=False)
    auto = InterdomainConfig(buffer_dtype="auto")
    assert [auto.buffers(a) for a in (torch.float32, torch.bfloat16, torch.float16)] == [
        torch.float32, torch.bfloat16, torch.float32]
    base = {k: v for k, v in cfg.items() if k != "buffer_dtype"}
    res = {b: run_both(2, 70, 2, 16, 16, 16, 32, seed=3, readout="real", config=InterdomainConfig(buffer_dtype=b,
                                                                                                   **base))
           for b in ("fp32", "bf16")}
    for name, (a, b) in res["bf16"].items():
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < BF16_TOL, (name, rel(a, b))
    assert torch.equal(res["bf16"]["o"][0], res["fp32"]["o"][0])
    if DEV == "cpu":
        for name in ("dk", "dv", "dB", "dlog_lam", "dC", "dX0"):
            assert rel(*res["bf16"][name]) > 1e-4 and not torch.equal(res["bf16"][name][0], res["fp32"][name][0]), name
