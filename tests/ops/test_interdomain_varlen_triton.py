"""Packed documents (``cu_seqlens``) through the Interdomain Triton kernels and the shared diagonal-SSM state scans.

Oracle: the float64 chunked PyTorch form run on each document alone (``chunk_interdomain(..., cu_seqlens=...)``, which
``tests/ops/test_varlen_ops.py`` checks against the token loop). The Triton side runs in float32 under the
interpreter (CPU) or compiled (GPU), on one packed row: outputs, per-document final states and every gradient (q, k,
v, log λ, B, C, initial_state) for each readout ("real" both as two passes and as one), the denominator channel,
both backward state paths (fused and unfused), the cross-sub-chunk path, NaN-poisoned buffers. Document lengths 1,
below, equal to and across the chunk length; T never a multiple of the chunk.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from triton_device import DEVICE as DEV

from hybrid_attention.ops.common.backend import resolve_backend
from hybrid_attention.ops.common.varlen import (
    chunk_layout,
    chunk_offsets,
    chunk_table,
    cu_seqlens_from_lengths,
    max_chunks,
)
from hybrid_attention.ops.interdomain import BACKENDS, chunk_interdomain, interdomain
from hybrid_attention.ops.interdomain.triton import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable")

if HAS_TRITON:
    from hybrid_attention.ops.interdomain.triton import triton_interdomain
    from hybrid_attention.ops.interdomain.triton.config import InterdomainConfig

F64, C128 = torch.float64, torch.complex128
TOL = 1e-4 if DEV == "cpu" else 5e-3  # relative L2, float32 kernels vs float64 (tf32 dots on a GPU)
H = 2
NAMES = ("q", "k", "v", "log_lam", "B", "C", "X0")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().cpu().to(b.dtype), b.detach().cpu()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def _problem(lengths, R, D, M, seed, *, denominator=False, with_state=True):
    """float64 / complex128 leaves (q, k, v [1, T, H, *], log_lam, B [H, M], C [H, M, M], X0 [N, H, M, NC] or
    None), the loss weights (do [1, T, H, D], dfin [N, H, M, NC]) and cu_seqlens."""
    g = torch.Generator().manual_seed(seed)
    T, N = sum(lengths), len(lengths)
    re = -torch.exp(torch.empty(H, M, dtype=F64).uniform_(math.log(1e-3), math.log(5.0), generator=g))
    re[:, 0], re[:, 1] = -5.0, -1e-3
    log_lam = torch.complex(re, torch.empty(H, M, dtype=F64).uniform_(-50, 50, generator=g))
    B = 0.3 * torch.randn(H, M, dtype=C128, generator=g)
    C = torch.randn(H, M, M, dtype=C128, generator=g) / math.sqrt(M)
    q, k = torch.randn(1, T, H, R, dtype=F64, generator=g), torch.randn(1, T, H, R, dtype=F64, generator=g)
    v = torch.randn(1, T, H, D, dtype=F64, generator=g)
    if denominator:  # a dominant slow mode and positive scores keep the denominator away from 0
        q, k = q.abs(), k.abs()
        log_lam[:, 0], B[:, 0], C[:, 0, 0] = -1e-3, 1.0, 3.0
    q = q / q.norm(dim=-1, keepdim=True)
    nc = R + D + (1 if denominator else 0)
    X0 = 0.3 * torch.randn(N, H, M, nc, dtype=C128, generator=g) if with_state else None
    do = torch.randn(1, T, H, D, dtype=F64, generator=g)
    dfin = torch.randn(N, H, M, nc, dtype=C128, generator=g)
    return [q, k, v, log_lam, B, C, X0], do, dfin, cu_seqlens_from_lengths(lengths)


def _run(fn, tensors, do, dfin, **kw):
    """(o, final, grads of every non-None leaf) of loss = <o, do> + Re <final, dfin>."""
    leaves = [t.clone().requires_grad_() if t is not None else None for t in tensors]
    o, fin = fn(*leaves[:6], initial_state=leaves[6], output_final_state=True, **kw)
    loss = (o.to(F64) * do.to(o.device)).sum() + (fin.conj() * dfin.to(fin.device, fin.dtype)).real.sum()
    live = [t for t in leaves if t is not None]
    return o, fin, dict(zip([n for n, t in zip(NAMES, leaves) if t is not None], torch.autograd.grad(loss, live)))


def _f32(tensors):
    return [None if t is None else t.to(DEV, torch.complex64 if t.is_complex() else torch.float32) for t in tensors]


CASES = [
    # lengths, R, D, M, chunk, readout, denominator, with_state, config
    pytest.param((1, 15, 16, 17, 3), 16, 16, 16, 16, "transpose", False, True, dict(poison=True), id="transpose"),
    pytest.param((32, 40, 20), 12, 20, 10, 32, "hermitian", False, False, dict(BC=16, fuse_dz=False, poison=True),
                 id="hermitian-cross-unfused"),
    pytest.param((5, 33, 2), 16, 16, 16, 16, "real", True, True, dict(poison=True), id="real-denominator"),
    # "real" as one kernel pass (REAL_C, from C itself): with the denominator; and across sub-chunks, split backward
    pytest.param((5, 33, 2), 16, 16, 16, 16, "real", True, True, dict(poison=True, real_one_pass=True),
                 id="real-one-pass-denominator"),
    pytest.param((32, 40, 20), 12, 20, 10, 32, "real", False, True,
                 dict(BC=16, bwd_split=True, poison=True, real_one_pass=True), id="real-one-pass-cross-split"),
    # the backward rescanning the states instead of reading the forward's
    pytest.param((1, 15, 16, 17, 3), 16, 16, 16, 16, "real", False, True, dict(poison=True, save_states=False),
                 id="real-rescanned"),
    # bf16 chunk states (kept, and rescanned in the backward) and bf16 chunk-kernel operands: LOWP_TOL
    pytest.param((1, 15, 16, 17, 3), 16, 16, 16, 16, "real", False, True, dict(poison=True, state_dtype="bf16"),
                 id="bf16-states"),
    pytest.param((32, 40, 20), 12, 20, 10, 32, "transpose", False, True,
                 dict(BC=16, poison=True, save_states=False, state_dtype="bf16", chunk_dots="bf16"),
                 id="bf16-states-dots-rescanned"),
]
LOWP_TOL = 1e-2  # bf16 states / operands: their rounding (tests/ops/test_interdomain_triton.py, BF16_TOL)


@pytest.mark.parametrize("lengths,R,D,M,chunk,readout,denominator,with_state,config", CASES)
def test_packed_triton_equals_per_document_reference(lengths, R, D, M, chunk, readout, denominator, with_state,
                                                     config):
    tensors, do, dfin, cu = _problem(lengths, R, D, M, seed=sum(lengths) + M, denominator=denominator,
                                     with_state=with_state)
    kw = dict(denominator=denominator, readout=readout)
    o_ref, f_ref, g_ref = _run(chunk_interdomain, tensors, do, dfin, chunk_size=8, cu_seqlens=cu, **kw)
    cfg = InterdomainConfig(**config)
    o, fin, grads = _run(triton_interdomain, _f32(tensors), do, dfin, chunk_size=chunk, config=cfg,
                         cu_seqlens=cu.to(DEV), **kw)
    assert o.shape == o_ref.shape and fin.shape == f_ref.shape == (len(lengths), H, M, R + D + denominator)
    assert set(grads) == set(g_ref) == {n for n, t in zip(NAMES, tensors) if t is not None}
    tol = (10 if denominator else 1) * TOL
    if cfg.state_dtype == "bf16" or cfg.chunk_dots == "bf16":
        tol = LOWP_TOL
    for name, (a, b) in {"o": (o, o_ref), "final": (fin, f_ref), **{f"d{n}": (grads[n], g_ref[n]) for n in grads}
                         }.items():
        assert torch.isfinite(a).all(), name
        assert _rel(a, b) < tol, (name, _rel(a, b))


def test_without_cu_seqlens_the_result_differs():
    """The check above can fail: the same packed row without cu_seqlens leaks the state across documents."""
    tensors, do, dfin, cu = _problem((1, 15, 16, 17, 3), 16, 16, 16, seed=7, with_state=False)
    o_ref, _ = chunk_interdomain(*tensors[:6], chunk_size=8, cu_seqlens=cu)
    o_vl, _ = triton_interdomain(*_f32(tensors)[:6], chunk_size=16, cu_seqlens=cu.to(DEV))
    o_dense, _ = triton_interdomain(*_f32(tensors)[:6], chunk_size=16)
    assert _rel(o_vl, o_ref) < TOL
    assert (o_dense.cpu().to(F64) - o_ref).abs().max().item() > 1e-3


def test_dispatch_picks_triton_for_packed_inputs():
    """"auto" picks the Triton kernels for Interdomain varlen calls; backend="triton" takes cu_seqlens."""
    assert resolve_backend("auto", "interdomain", True, BACKENDS, varlen=True, no_varlen=()) == "triton"
    assert resolve_backend("auto", "interdomain", True, BACKENDS, varlen=True) == "reference"  # ops still without
    tensors, _, _, cu = _problem((3, 20), 16, 16, 16, seed=3)
    ref, fr = chunk_interdomain(*tensors[:6], initial_state=tensors[6], output_final_state=True, cu_seqlens=cu)
    o, f = interdomain(*_f32(tensors)[:6], initial_state=_f32(tensors)[6], output_final_state=True, chunk_size=16,
                       backend="triton", cu_seqlens=cu.to(DEV))
    assert _rel(o, ref) < TOL and _rel(f, fr) < TOL


def test_chunk_table():
    """Rows = the static bound (reached by N - 1 one-token documents), each real row at its document's chunk, the
    extra rows past their document's end."""
    for lengths, L in [((1, 15, 16, 17, 3), 16), ((1, 1, 1, 30), 16), ((32, 32), 32), ((5,), 16)]:
        cu = cu_seqlens_from_lengths(lengths)
        T, N = sum(lengths), len(lengths)
        tab = chunk_table(cu, T, L)
        n_real = int(chunk_offsets(cu, L)[-1])
        assert tab.n_rows == max_chunks(T, N, L) >= n_real and tab.n_rows - n_real <= N - 1
        assert tab.cu.dtype == tab.offsets.dtype == tab.indices.dtype == torch.int32
        assert tab.offsets.tolist() == chunk_offsets(cu, L).tolist()
        doc, loc = tab.indices[:, 0].long(), tab.indices[:, 1].long()
        start = cu.long()[doc] + loc * L
        starts, lens = chunk_layout(cu, L)
        assert start[:n_real].tolist() == starts.tolist()
        assert (start[n_real:] >= cu.long()[doc[n_real:] + 1]).all()
    assert max_chunks(3 + 29, 4, 16) == int(chunk_offsets(cu_seqlens_from_lengths((1, 1, 1, 29)), 16)[-1])


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        (dict(cu_seqlens=torch.tensor([0, 5, 18], dtype=torch.int32)), r"^cu_seqlens must end at T = 20"),
        (dict(cu_seqlens=torch.tensor([0, 5, 5, 20])), r"^cu_seqlens must be strictly increasing"),
        (dict(cu_seqlens=torch.tensor([0.0, 20.0])), r"^cu_seqlens must have dtype int32 or int64"),
        (dict(cu_seqlens=torch.tensor([0, 20]), initial_state=torch.zeros(2, H, 16, 32, dtype=torch.complex64)),
         r"^initial_state must hold one state per sequence with cu_seqlens: \[N, ...\] with N = 1, got shape "),
        (dict(cu_seqlens=torch.tensor([0, 20]), initial_state=torch.zeros(1, H, 16, 31, dtype=torch.complex64)),
         r"^initial_state must be \[B, H, M, R \+ D\] = \(1, 2, 16, 32\)"),
    ],
)
def test_bad_arguments(kwargs, msg):
    tensors, _, _, _ = _problem((20,), 16, 16, 16, seed=1, with_state=False)
    # the states on the inputs' device (the message under test, not placement); the offsets on the host, where their
    # values are checked in full (device offsets are checked for dtype and shape only: ops/common/varlen.py)
    kwargs = {n: t if n == "cu_seqlens" else t.to(DEV) for n, t in kwargs.items()}
    with pytest.raises(ValueError, match=msg):
        triton_interdomain(*_f32(tensors)[:6], **kwargs)
    q = _f32(tensors)[0]
    with pytest.raises(ValueError, match=r"^cu_seqlens requires inputs of batch size 1"):
        triton_interdomain(*[q.expand(2, -1, -1, -1).contiguous()] * 2, torch.randn(2, 20, H, 16, device=DEV),
                           *_f32(tensors)[3:6], cu_seqlens=torch.tensor([0, 20], device=DEV))


def test_custom_op_opcheck_packed():
    """Schema, fake implementation (final state [N, ...]) and autograd registration with the chunk-table arguments."""
    from hybrid_attention.ops.interdomain.triton.ops import interdomain_fwd_op

    g = torch.Generator().manual_seed(4)
    M, R, D, lengths = 16, 16, 16, (2, 18, 1)
    T, N = sum(lengths), len(lengths)
    q, k, v = (torch.randn(1, T, H, n, generator=g).to(DEV).requires_grad_() for n in (R, R, D))
    ll = torch.stack([-torch.rand(H, M, generator=g), torch.randn(H, M, generator=g)], 1).to(DEV).requires_grad_()
    bb = torch.randn(H, 2, M, generator=g).to(DEV).requires_grad_()
    kk = (0.2 * torch.randn(H, 2, M, M, generator=g)).to(DEV).requires_grad_()
    init = torch.randn(N, H, 2, M, R + D, generator=g).to(DEV).requires_grad_()
    tab = chunk_table(cu_seqlens_from_lengths(lengths), T, 16, DEV)
    torch.library.opcheck(
        interdomain_fwd_op,
        (q, k, v, ll, bb, kk, init, tab.cu, tab.offsets, tab.indices, 16, False, True, "transpose"),
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )


@pytest.mark.parametrize("fuse_dz", [True, False])
def test_s4d_bilinear_packed_triton_equals_per_document_reference(fuse_dz):
    """The bilinear S4D op shares the scans: its readout kernels take the same chunk table (a, b, every gradient,
    initial / final states per document; one empty table row, NaN-poisoned buffers)."""
    from hybrid_attention.ops.s4d_bilinear import chunk_s4d_bilinear
    from hybrid_attention.ops.s4d_bilinear.triton import triton_s4d_bilinear
    from hybrid_attention.ops.s4d_bilinear.triton.config import S4DBilinearConfig

    lengths, R, M = (1, 15, 16, 17, 3), 16, 16
    tensors, _, _, cu = _problem(lengths, R, R, M, seed=11)
    a, _, b, log_lam, B, C, _ = tensors
    g = torch.Generator().manual_seed(12)
    X0 = 0.3 * torch.randn(len(lengths), H, M, 2 * R, dtype=C128, generator=g)
    do, dfin = torch.randn(a.shape, dtype=F64, generator=g), torch.randn(X0.shape, dtype=C128, generator=g)
    names = ("a", "b", "log_lam", "B", "C", "X0")

    def run(fn, ts, **kw):
        leaves = [t.clone().requires_grad_() for t in ts]
        o, fin = fn(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu, **kw)
        loss = (o.to(F64) * do.to(o.device)).sum() + (fin.conj() * dfin.to(fin.device, fin.dtype)).real.sum()
        return {"o": o, "final": fin, **{"d" + n: x for n, x in zip(names, torch.autograd.grad(loss, leaves))}}

    ref = run(chunk_s4d_bilinear, [a, b, log_lam, B, C, X0], chunk_size=8)
    cfg = S4DBilinearConfig(fuse_dz=fuse_dz, poison=True)
    out = run(triton_s4d_bilinear, _f32([a, b, log_lam, B, C, X0]), chunk_size=16, config=cfg)
    for name in ref:
        assert torch.isfinite(out[name]).all(), name
        assert _rel(out[name], ref[name]) < TOL, (name, _rel(out[name], ref[name]))


# ----------------------------------------------------------------------------------------------------------------------
# The varlen launches compile for the GPU (no GPU needed): every kernel launched with IS_VARLEN in a bf16 forward +
# backward (Interdomain with the fused and the unfused state-carry gradient, and the bilinear S4D readout kernels) is
# recorded under the interpreter, then compiled ahead of time for sm_90 in a subprocess without the interpreter, with
# the signature inductor would give it (ints i64; no Python-float runtime argument is allowed at all).
# HYBRID_SKIP_AOT=1 skips the compile (about a minute of CPU).

from test_triton_scalar_args import AOT_SCRIPT  # noqa: E402 (the shared sm_90 compile subprocess)

GPU_CONSTEXPRS = {"USE_WHILE": False, "DOT_PREC": "tf32", "LP_DOT": True}  # interpreter-only values -> the GPU's
PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int32: "*i32",
       torch.int64: "*i64"}


def _record_varlen_launches(monkeypatch) -> list[dict]:
    import inspect

    from hybrid_attention.ops.common.triton import ssm_scan_kernels as scan_k
    from hybrid_attention.ops.interdomain.triton import kernels as chunk_k
    from hybrid_attention.ops.s4d_bilinear.triton import kernels as s4d_k
    from hybrid_attention.ops.s4d_bilinear.triton import triton_s4d_bilinear

    kernels = {id(obj): (mod.__name__, name) for mod in (scan_k, chunk_k, s4d_k) for name, obj in vars(mod).items()
               if hasattr(obj, "run") and hasattr(obj, "arg_names")}
    launches: list[dict] = []
    cls = type(chunk_k._chunk_fwd)
    orig_run = cls.run

    def spy(self, *args, **kwargs):
        if id(self) in kernels:
            bound = dict(zip(self.arg_names, args))
            bound.update({n: v for n, v in kwargs.items() if n in self.arg_names})
            params = inspect.signature(self.fn).parameters
            launches.append({"module": kernels[id(self)][0], "kernel": kernels[id(self)][1], "args": bound,
                             "constexpr": {n for n in bound if "constexpr" in str(params[n].annotation)},
                             "num_warps": kwargs.get("num_warps", 4), "num_stages": kwargs.get("num_stages", 1)})
        return orig_run(self, *args, **kwargs)

    monkeypatch.setattr(cls, "run", spy)
    lengths = (1, 20, 16)
    tensors, do, dfin, cu = _problem(lengths, 16, 16, 16, seed=5)
    low = [t.to(torch.bfloat16) if i < 3 else t for i, t in enumerate(_f32(tensors))]
    for cfg in (InterdomainConfig(), InterdomainConfig(fuse_dz=False)):
        _run(triton_interdomain, low, do, dfin, chunk_size=32, config=cfg, cu_seqlens=cu)
    a, b = low[0].detach().requires_grad_(), low[1].detach().requires_grad_()
    o, _ = triton_s4d_bilinear(a, b, *low[3:6], chunk_size=32, cu_seqlens=cu)
    o.float().sum().backward()
    monkeypatch.undo()
    return [r for r in launches if r["args"].get("IS_VARLEN")]


@pytest.mark.skipif(DEV != "cpu", reason="records launches under the interpreter")
def test_varlen_launches_compile_for_sm90(monkeypatch):
    import json
    import subprocess
    import sys

    launches = _record_varlen_launches(monkeypatch)
    names = {r["kernel"] for r in launches}
    assert names == {"_state_fwd", "_chunk_fwd", "_chunk_bwd", "_state_bwd_dz", "_state_bwd", "_chunk_dz",
                     "_readout_fwd", "_readout_bwd"}, names
    specs, seen = [], set()
    for rec in launches:
        sig, cx = {}, {}
        for name, val in rec["args"].items():
            if name in rec["constexpr"]:
                sig[name], cx[name] = "constexpr", GPU_CONSTEXPRS.get(name, val)
            elif isinstance(val, torch.Tensor):
                sig[name] = PTR[val.dtype]
            elif isinstance(val, int) and not isinstance(val, bool):
                sig[name] = "i64"
            else:
                raise AssertionError(f"{rec['kernel']}: runtime argument {name}={val!r} is not a tensor or an int")
        key = (rec["kernel"], json.dumps(cx, sort_keys=True))
        if key not in seen:
            seen.add(key)
            specs.append({"module": rec["module"], "kernel": rec["kernel"], "signature": sig, "constexprs": cx,
                          "num_warps": rec["num_warps"], "num_stages": rec["num_stages"]})
    if os.environ.get("HYBRID_SKIP_AOT"):
        return
    pytest.importorskip("triton.backends.compiler")
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, "-c", AOT_SCRIPT], input=json.dumps(specs), capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failed, "sm_90 compile of the varlen kernels failed:\n" + "\n".join(failed)
