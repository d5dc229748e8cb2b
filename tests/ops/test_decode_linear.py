"""ops/decode_linear: the fused decode GEMVs (`norm_linear` with the RMSNorm prologue and the SwiGLU epilogue,
`linear_residual`) against their PyTorch definitions (naive.py) at odd shapes (K, N not multiples of the blocks;
B in {1, 3, 8}), float64 (the kernels then accumulate in float64: a tight oracle), float32 and bfloat16 (against the
float64 definition of the same inputs, with the plain bf16 step's own error as the yardstick); `opcheck` of the
registered ops; the dispatcher's errors. Without a GPU the Triton interpreter runs the kernels."""

from __future__ import annotations

import pytest
import torch
from triton_device import DEVICE as DEV

from hybrid_attention.ops.common.triton import HAS_TRITON
from hybrid_attention.ops.decode_linear import (
    add_norm_linear,
    add_norm_linear_reference,
    linear_residual,
    linear_residual_reference,
    norm_linear,
    norm_linear_reference,
)

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
K, N = 83, 2 * 45  # neither a multiple of any block size
ULPS = 4 if DEV == "cpu" else 2  # bf16 slack, in ulps of the largest result (see test_norm_linear)


def _inputs(b: int, dtype: torch.dtype, k: int = K, n: int = N):
    g = torch.Generator().manual_seed(b)
    x = 3 * torch.randn(b, k, generator=g, dtype=torch.float64)
    nw = 0.5 + torch.rand(k, generator=g, dtype=torch.float64)
    w = torch.randn(n, k, generator=g, dtype=torch.float64) / k**0.5
    r = torch.randn(b, n, generator=g, dtype=torch.float64)
    return [t.to(DEV, dtype) for t in (x, nw, w, r)]


def _exact(fn, *args):
    """The definition evaluated in float64 from the same (rounded) inputs."""
    return fn(*[a.double() if isinstance(a, torch.Tensor) else a for a in args])


def _assert_matches(out: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor | None) -> None:
    """out (kernel) against ref (the plain path, same dtype): float64 to 1e-12, float32 to 2e-5; bf16 (``exact``: the
    definition in float64 from the same inputs): the kernel's error within the plain path's own plus ULPS bf16 ulps
    of the result."""
    if exact is not None:
        scale = exact.abs().max().item()
        err_k = (out.double() - exact).abs().max().item()
        err_r = (ref.double() - exact).abs().max().item()
        assert err_k <= err_r + ULPS * 2**-7 * scale, (err_k, err_r, scale)
    else:
        tol = 1e-12 if out.dtype == torch.float64 else 2e-5
        assert torch.allclose(out, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("b", [1, 3, 8])
@pytest.mark.parametrize("act", [None, "swiglu"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_norm_linear(b, act, dtype):
    x, nw, w, _ = _inputs(b, dtype)
    out = norm_linear(x, nw, w, 1e-5, act, backend="triton")
    assert out.shape == (b, N // 2 if act else N) and out.dtype == dtype
    ref = norm_linear_reference(x, nw, w, 1e-5, act)
    if dtype == torch.bfloat16:
        # both round at the same points (normed x, gain product, gate, up, silu); the kernel's error against the
        # float64 definition is the plain bf16 path's own plus a few bf16 ulps of the result: the interpreter's
        # fp32 -> bf16 casts truncate (round toward zero, also with fp_downcast_rounding="rtne": probed on triton's
        # interpreter), where the GPU rounds to nearest like PyTorch
        _assert_matches(out, ref, _exact(norm_linear_reference, x, nw, w, 1e-5, act))
    else:
        _assert_matches(out, ref, None)


@pytest.mark.parametrize("b", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_add_norm_linear(b, dtype):
    """The residual add folded into the prologue: h = x + residual (written once, by program 0) and the SwiGLU GEMV
    of its norm. Several column programs (block_n=16), so h must not depend on which program wrote it."""
    x, nw, w, _ = _inputs(b, dtype)
    res = torch.randn_like(x)
    h, out = add_norm_linear(x, res, nw, w, 1e-5, "swiglu", backend="triton", block_n=16)
    h_ref, ref = add_norm_linear_reference(x, res, nw, w, 1e-5, "swiglu")
    assert h.shape == x.shape and out.shape == (b, N // 2)
    if dtype == torch.bfloat16:  # the interpreter's truncating casts (see test_norm_linear): a bf16 ulp of h
        assert torch.allclose(h.double(), h_ref.double(), atol=0, rtol=2**-7)
        _assert_matches(out, ref, _exact(norm_linear_reference, h_ref, nw, w, 1e-5, "swiglu"))
    else:
        _assert_matches(h, h_ref, None)
        _assert_matches(out, ref, None)


@pytest.mark.parametrize("b", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_linear_residual(b, dtype):
    x, _, w, r = _inputs(b, dtype)
    out = linear_residual(x, w, r, backend="triton")
    assert out.shape == (b, N) and out.dtype == dtype
    ref = linear_residual_reference(x, w, r)
    if dtype == torch.bfloat16:
        _assert_matches(out, ref, _exact(linear_residual_reference, x, w, r))
    else:
        _assert_matches(out, ref, None)


def test_block_sizes_and_strided_rows():
    """An explicit column block (several programs, a ragged last one) and x rows with a stride (a view of [B, 1, K]
    inputs, as a decode step's hidden state reshaped) give the same result."""
    x, nw, w, r = _inputs(3, torch.float64, k=130, n=2 * 70)
    wide = torch.zeros(3, 2, 130, dtype=x.dtype, device=x.device)
    wide[:, 0] = x
    xs = wide[:, 0]
    assert not xs.is_contiguous()
    for bn in (16, 32, 128):
        assert torch.allclose(norm_linear(xs, nw, w, 1e-6, "swiglu", backend="triton", block_n=bn),
                              norm_linear_reference(x, nw, w, 1e-6, "swiglu"), atol=1e-12, rtol=0)
        assert torch.allclose(linear_residual(xs, w, r, backend="triton", block_n=bn),
                              linear_residual_reference(x, w, r), atol=1e-12, rtol=0)


def test_custom_ops():
    """The registered ops (schema, fake kernels) pass `torch.library.opcheck`."""
    from hybrid_attention.ops.decode_linear.triton.kernel import add_norm_linear as anl_op
    from hybrid_attention.ops.decode_linear.triton.kernel import linear_residual as lr_op
    from hybrid_attention.ops.decode_linear.triton.kernel import norm_linear as nl_op

    x, nw, w, r = _inputs(3, torch.float32)
    torch.library.opcheck(nl_op, (x, nw, w, 1e-5, "swiglu", None))
    torch.library.opcheck(nl_op, (x, nw, w, 1e-5, None, 16))
    torch.library.opcheck(lr_op, (x, w, r, None))
    torch.library.opcheck(anl_op, (x, torch.randn_like(x), nw, w, 1e-5, "swiglu", 16))


def test_dispatch_and_errors():
    """"auto" picks the reference on CPU tensors; bad shapes, activations and batch sizes are refused in one line."""
    x, nw, w, r = _inputs(3, torch.float32)
    if DEV == "cpu":
        assert torch.equal(norm_linear(x, nw, w, 1e-5), norm_linear_reference(x, nw, w, 1e-5))
    with pytest.raises(ValueError, match="act must be None or 'swiglu'"):
        norm_linear(x, nw, w, 1e-5, "gelu")
    with pytest.raises(ValueError, match="even N"):
        norm_linear(x, nw, w[:-1], 1e-5, "swiglu")
    with pytest.raises(ValueError, match="norm_weight must be"):
        norm_linear(x, nw[:-1], w, 1e-5)
    with pytest.raises(ValueError, match="x must be"):
        linear_residual(x[:, :-1], w, r)
    with pytest.raises(ValueError, match="residual must be"):
        linear_residual(x, w, r[:, :-1])
    with pytest.raises(ValueError, match="residual must be x's shape"):
        add_norm_linear(x, x[:, :-1], nw, w, 1e-5)
    with pytest.raises(ValueError, match="B <= 8"):
        linear_residual(torch.randn(9, K, device=DEV), w, torch.randn(9, N, device=DEV), backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        norm_linear(x, nw, w, 1e-5, backend="cuda")
