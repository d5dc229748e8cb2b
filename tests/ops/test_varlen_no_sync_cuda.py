"""CUDA only: a packed forward + backward of every Triton op that takes ``cu_seqlens`` makes no host sync when the
offsets live on the GPU (``torch.cuda.set_sync_debug_mode("error")`` raises on any synchronising call), and equals
the same call with the offsets on the CPU (the path the other varlen tests check against float64). Skipped without a
GPU: on the CPU the interpreter reads everything on the host (the meta-device tests cover the host side there)."""

from __future__ import annotations

import pytest
import torch
from ssm_cases import make_ssm_params

from hybrid_attention.ops.chunk_attention import chunk_attention
from hybrid_attention.ops.common.varlen import cu_seqlens_from_lengths
from hybrid_attention.ops.gated_delta import gated_delta
from hybrid_attention.ops.interdomain import interdomain

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (sync debug mode)")
LENGTHS = (1, 70, 64, 200, 9)  # 1, across, equal to, several chunks of 64, below
C = 64


def _run(fn, leaves, cu, sync_free: bool):
    xs = [x.detach().clone().requires_grad_() for x in leaves]
    if sync_free:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        out = fn(*xs, cu)
        loss = sum((o.float() * torch.linspace(-1, 1, o.numel(), device=o.device).view_as(o)).sum() for o in out)
        grads = torch.autograd.grad(loss, xs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [o.detach() for o in out], grads


def _check(fn, leaves):
    cu_host = cu_seqlens_from_lengths(LENGTHS)
    ref_out, ref_grads = _run(fn, leaves, cu_host, sync_free=False)
    out, grads = _run(fn, leaves, cu_host.cuda(), sync_free=True)
    for a, b in zip([*out, *grads], [*ref_out, *ref_grads], strict=True):
        assert torch.isfinite(a).all()
        assert (a.float() - b.float()).norm() <= 1e-3 * max(b.float().norm().item(), 1.0)  # atomics may reorder sums


def test_gated_delta_packed_is_sync_free():
    T, H, K, V = sum(LENGTHS), 2, 64, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(1, T, H, K, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(1, T, H, V, device="cuda", generator=g, dtype=torch.bfloat16)
    gate = -0.5 * torch.rand(1, T, H, device="cuda", generator=g)
    beta = torch.rand(1, T, H, device="cuda", generator=g)

    def fn(q, k, v, gate, beta, cu):
        return gated_delta(q, k, v, gate, beta, chunk_size=C, backend="triton", cu_seqlens=cu)[:1]

    _check(fn, [q, k, v, gate, beta])


def test_chunk_attention_packed_is_sync_free():
    T, Hs, G, D = sum(LENGTHS), 4, 2, 64
    nc = sum(-(-n // C) for n in LENGTHS)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(1, T, Hs, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    routing = torch.rand(1, nc, Hs // G, device="cuda", generator=g) < 0.5

    def fn(q, k, v, cu):
        return (chunk_attention(q, k, v, routing, chunk_size=C, group_size=G, backend="triton", cu_seqlens=cu),)

    _check(fn, [q, k, v])


def test_interdomain_packed_is_sync_free():
    T, H, R, D, M = sum(LENGTHS), 2, 64, 64, 64
    log_lam, B, Cm = (p.to("cuda", torch.complex64) for p in make_ssm_params(H, M, seed=2))
    g = torch.Generator(device="cuda").manual_seed(2)
    q, k = (torch.randn(1, T, H, R, device="cuda", generator=g) for _ in range(2))
    v = torch.randn(1, T, H, D, device="cuda", generator=g)

    def fn(q, k, v, cu):
        return interdomain(q, k, v, log_lam, B, Cm, chunk_size=C, backend="triton", cu_seqlens=cu)[:1]

    _check(fn, [q, k, v])
