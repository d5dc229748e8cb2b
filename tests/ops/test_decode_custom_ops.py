"""The Triton decode kernels a static decode step calls are registered custom ops (schema with the mutated state, fake
kernel), so that `torch.compile` traces a step around them: `torch.library.opcheck` of each (the Triton interpreter
without a GPU). Their numerics are tested in test_gated_delta_triton, test_interdomain_triton and tests/serving."""

from __future__ import annotations

import pytest
import torch
from triton_device import DEVICE as DEV

from hybrid_attention.ops.common.triton import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")


def test_decode_attention_op():
    from hybrid_attention.ops.decode_attention import decode_attention

    b, h, L, d, dv = 2, 3, 40, 16, 24
    q, k, v = torch.randn(b, h, d), torch.randn(b, h, L, d), torch.randn(b, h, L, dv)
    len1, start2, len2 = torch.tensor([[3, 5, 1], [0, 7, 2]]), torch.full((1, 1), 30), torch.full((1, 1), 4)
    args = tuple(t.to(DEV) for t in (q, k, v, len1, start2, len2))
    torch.library.opcheck(decode_attention, (*args, 0.25, 3, 16))


def test_gated_delta_step_op():
    from hybrid_attention.ops.gated_delta.triton.decode import gated_delta_step_op

    b, h, d, dv = 2, 3, 16, 24
    args = (torch.randn(b, h, d), torch.randn(b, h, d), torch.randn(b, h, dv), -torch.rand(b, h), torch.rand(b, h),
            torch.randn(b, h, d, dv))
    torch.library.opcheck(gated_delta_step_op, tuple(t.to(DEV) for t in args))


@pytest.mark.parametrize("denominator", [False, True])
def test_interdomain_decode_op(denominator):
    from hybrid_attention.ops.interdomain.triton.decode import decode_params, interdomain_decode_op

    b, h, m, r, d = 2, 2, 16, 16, 16
    log_lam = torch.complex(-torch.rand(h, m), torch.randn(h, m))
    lam, bb, kk, readout = decode_params(log_lam, 0.3 * torch.randn(h, m, dtype=torch.complex64),
                                         torch.randn(h, m, m, dtype=torch.complex64) / m**0.5, "real")
    state = torch.view_as_real(0.1 * torch.randn(b, h, m, r + d + int(denominator), dtype=torch.complex64))
    q, k, v = torch.randn(b, h, r), torch.randn(b, h, r), torch.randn(b, h, d)
    args = tuple(t.to(DEV) for t in (q, k, v, lam, bb, kk, state))
    torch.library.opcheck(interdomain_decode_op, (*args, denominator, readout))
