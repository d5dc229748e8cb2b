"""The one-pass backward of the chunk-attention Triton kernels (``ChunkAttentionConfig(bwd_mode="one_pass")``):
one program per (key chunk, head) accumulates dk, dv and adds its dq share with fp32 atomics.

Against the float64 dense oracle (``naive_chunk_attention``) for the output and every gradient (dq, dk, dv, d
routing bias), with the tolerances of the existing Triton tests (``test_gated_delta_triton.py``'s chunk-attention
cases, ``test_varlen_triton.py``): T not a multiple of C, routed fractions 0 / 0.3 / 1, with and without routing
bias, group sizes 1 and 2, packed documents, dk/dv query steps below C, buffers NaN-poisoned. Runs on CPU under the
Triton interpreter (``TRITON_INTERPRET=1``, fp32) or on CUDA; the sm_90 compile with inductor's argument types is
checked under the interpreter (the AOT machinery of ``test_triton_scalar_args.py``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from triton_device import DEVICE, INTERPRET

from hybrid_attention.ops.chunk_attention import naive_chunk_attention
from hybrid_attention.ops.chunk_attention.triton import HAS_TRITON as TRITON_AVAILABLE
from hybrid_attention.ops.chunk_attention.triton import ChunkAttentionConfig
from hybrid_attention.ops.common.varlen import cu_seqlens_from_lengths

pytestmark = [
    pytest.mark.skipif(not TRITON_AVAILABLE, reason="triton is not installed"),
    pytest.mark.triton,  # CUDA, or the CPU interpreter (triton_device.py)
]
TOL = 2e-5 if DEVICE == "cpu" else 5e-3  # as the existing Triton tests: exact fp32 dots / tf32 dots on a GPU
NAMES = ["o", "dq", "dk", "dv", "d_routing_bias"]
ONE_PASS = ChunkAttentionConfig(bwd_mode="one_pass", poison=True)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error norm; absolute when the reference norm is below 1 (e.g. dq of a single token is exactly 0)."""
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / max(b.norm().item(), 1.0)).item()


def _run(xs: list[torch.Tensor | None], routing: torch.Tensor, do: torch.Tensor, C: int, G: int, backend: str,
         config: ChunkAttentionConfig = ONE_PASS, cu: torch.Tensor | None = None) -> list[torch.Tensor | None]:
    """Output and the gradients of q, k, v, routing bias of Σ o ⊙ do. xs: q, k ``[B, T, Hs, Dk]``, v ``[B, T, Hs,
    Dv]``, routing bias ``[B, N, Hs // G]`` or None; routing ``[B, N, Hs // G]``; do like the output."""
    from hybrid_attention.ops.chunk_attention.triton import triton_chunk_attention

    leaves = [x.detach().clone().requires_grad_() if x is not None else None for x in xs]
    if backend == "triton":
        o = triton_chunk_attention(*leaves[:3], routing, chunk_size=C, group_size=G, routing_bias=leaves[3],
                                   config=config, cu_seqlens=cu)
    else:
        o = naive_chunk_attention(*leaves[:3], routing, chunk_size=C, group_size=G, routing_bias=leaves[3],
                                  cu_seqlens=cu)
    req = [x for x in leaves if x is not None]
    grads = iter(torch.autograd.grad((o * do.to(o.dtype)).sum(), req))
    return [o] + [next(grads) if x is not None else None for x in leaves]


def _inputs(B: int, T: int, Hs: int, G: int, N: int, frac: float, bias: bool, seed: int, Dk: int = 16,
            Dv: int = 32):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, Hs, Dk, generator=gen), torch.randn(B, T, Hs, Dk, generator=gen)
    v = torch.randn(B, T, Hs, Dv, generator=gen)
    routing = torch.rand(B, N, Hs // G, generator=gen) < frac
    rb = 0.3 * torch.randn(B, N, Hs // G, generator=gen) if bias else None  # nonzero: a forward effect too
    do = torch.randn(B, T, Hs, Dv, generator=gen)
    return [q, k, v, rb], routing, do


def _check(tri: list, ref: list) -> None:
    for name, a, b in zip(NAMES, tri, ref, strict=True):
        if b is None:
            assert a is None, name
            continue
        assert a.shape == b.shape and torch.isfinite(a).all(), name
        assert rel(a, b) < TOL, (name, rel(a, b))


@pytest.mark.parametrize("frac", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("G", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_one_pass_matches_dense(frac: float, G: int, bias: bool) -> None:
    """B = 2, T = 45 (chunks 16, 16, 13), Dk = 24 (a padded head dim, scale not a power of two)."""
    B, T, Hs, C = 2, 45, 2 * G, 16
    xs, routing, do = _inputs(B, T, Hs, G, math.ceil(T / C), frac, bias, seed=int(100 * frac) + 7 * G + bias, Dk=24)
    ref = _run([x.double() if x is not None else None for x in xs], routing, do, C, G, "naive")
    dev = [x.to(DEVICE) if x is not None else None for x in xs]
    _check(_run(dev, routing.to(DEVICE), do.to(DEVICE), C, G, "triton"), ref)


@pytest.mark.parametrize("T,C,qb,frac", [(100, 32, 16, 0.6), (70, 64, 32, 0.5), (1, 16, 64, 1.0)])
def test_one_pass_query_steps_and_chunk_sizes(T: int, C: int, qb: int, frac: float) -> None:
    """Query steps below C (the own chunk in C / QB static steps, later tiles crossing T), C = 64, a single token."""
    xs, routing, do = _inputs(1, T, 4, 2, math.ceil(T / C), frac, True, seed=T + C)
    ref = _run([x.double() for x in xs], routing, do, C, 2, "naive")
    cfg = ChunkAttentionConfig(bwd_mode="one_pass", onepass_qb=qb, poison=True)
    _check(_run([x.to(DEVICE) for x in xs], routing.to(DEVICE), do.to(DEVICE), C, 2, "triton", cfg), ref)


@pytest.mark.parametrize("lengths,frac,G,bias,qb,C", [
    ((1, 5, 16, 37), 0.6, 2, True, 64, 16),  # 1, below, equal to, across the chunk size; T = 59
    ((40, 19), 1.0, 2, True, 64, 16),
    ((30, 29), 0.0, 1, True, 64, 16),
    ((21, 1, 35, 44), 0.7, 1, False, 16, 32),  # query steps of 16 rows crossing document ends
])
def test_one_pass_packed_matches_dense(lengths: tuple[int, ...], frac: float, G: int, bias: bool, qb: int,
                                       C: int) -> None:
    """Packed documents (``cu_seqlens``): the oracle runs each document alone (the spare chunk-table rows add
    nothing)."""
    N = sum(math.ceil(n / C) for n in lengths)
    xs, routing, do = _inputs(1, sum(lengths), 2 * G, G, N, frac, bias, seed=sum(lengths) + qb)
    cu = cu_seqlens_from_lengths(lengths)
    ref = _run([x.double() if x is not None else None for x in xs], routing, do, C, G, "naive", cu=cu)
    cfg = ChunkAttentionConfig(bwd_mode="one_pass", onepass_qb=qb, poison=True)
    dev = [x.to(DEVICE) if x is not None else None for x in xs]
    _check(_run(dev, routing.to(DEVICE), do.to(DEVICE), C, G, "triton", cfg, cu=cu.to(DEVICE)), ref)


def test_one_pass_equals_two_pass_and_launches_one_kernel(monkeypatch) -> None:
    """Both modes give the same gradients (fp32: to rounding, atomics reorder the dq sum); one_pass launches
    ``_bwd_kernel`` and neither two-pass kernel, two_pass (the default) the reverse."""
    from hybrid_attention.ops.chunk_attention.triton import function as F

    launched: list[str] = []

    def spy(name: str):
        kernel = getattr(F, name)

        class _Spy:
            def __getitem__(self, grid):
                launched.append(name)
                return kernel[grid]

        return _Spy()

    for name in ("_dq_kernel", "_dkv_kernel", "_bwd_kernel"):
        monkeypatch.setattr(F, name, spy(name))
    xs, routing, do = _inputs(2, 50, 4, 2, 4, 0.5, True, seed=3)
    xs, routing, do = [x.to(DEVICE) for x in xs], routing.to(DEVICE), do.to(DEVICE)
    two = _run(xs, routing, do, 16, 2, "triton", ChunkAttentionConfig())
    assert launched == ["_dq_kernel", "_dkv_kernel"]
    launched.clear()
    one = _run(xs, routing, do, 16, 2, "triton")
    assert launched == ["_bwd_kernel"]
    for name, a, b in zip(NAMES, one, two, strict=True):
        assert rel(a, b) < TOL, name


def test_one_pass_bf16_returns_input_dtypes() -> None:
    """bf16 q, k, v: dq is cast from the fp32 atomic buffer; every gradient in its input's dtype, near the oracle."""
    xs, routing, do = _inputs(1, 40, 2, 1, 3, 0.5, True, seed=11)
    ref = _run([x.double() for x in xs], routing, do, 16, 1, "naive")
    dev = [x.to(DEVICE, torch.bfloat16) for x in xs[:3]] + [xs[3].to(DEVICE)]
    tri = _run(dev, routing.to(DEVICE), do.to(DEVICE), 16, 1, "triton")
    for name, a, b in zip(NAMES, tri, ref, strict=True):
        assert a.dtype == (torch.float32 if name == "d_routing_bias" else torch.bfloat16), name
        assert rel(a, b) < 3e-2, (name, rel(a, b))  # bf16 inputs, output and gradients


@pytest.mark.parametrize("kw,msg", [
    (dict(bwd_mode="onepass"), r"^bwd_mode must be one of 'two_pass', 'one_pass', got 'onepass'$"),
    (dict(onepass_qb=8), r"^onepass_qb must be a power of two >= 16 .*got 8$"),
])
def test_bad_config_one_line_error(kw: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        ChunkAttentionConfig(**kw)
    assert ChunkAttentionConfig().bwd_mode == "two_pass"  # the default is unchanged


@pytest.mark.skipif(not INTERPRET, reason="records launches under TRITON_INTERPRET=1 (the CPU interpreter)")
def test_one_pass_compiles_for_sm90_with_inductor_types(monkeypatch) -> None:
    """``_bwd_kernel`` (dense and packed) compiles for sm_90 with i64 ints and fp64 floats, as inductor would type
    its launch (the check ``test_triton_scalar_args.py`` makes for the default kernels), and takes no Python-float
    runtime argument."""
    if os.environ.get("HYBRID_SKIP_AOT"):
        pytest.skip("HYBRID_SKIP_AOT")
    sys.path.insert(0, os.path.dirname(__file__))
    from test_triton_scalar_args import AOT_SCRIPT, _aot_spec, _record_launches

    launches = _record_launches(monkeypatch)
    xs, routing, do = _inputs(1, 32, 2, 2, 2, 1.0, True, seed=5)
    _run(xs, routing, do, 16, 2, "triton")
    xs, routing, do = _inputs(1, 32, 2, 2, 3, 1.0, True, seed=6)
    _run(xs, routing, do, 16, 2, "triton", cu=torch.tensor([0, 5, 32], dtype=torch.int32))
    monkeypatch.undo()
    launches = [r for r in launches if r["kernel"] == "_bwd_kernel"]
    assert len(launches) == 2
    floats = [n for r in launches for n, v in r["args"].items() if n not in r["constexpr"] and isinstance(v, float)]
    assert not floats
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, "-c", AOT_SCRIPT], input=json.dumps(_aot_spec(launches)),
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
