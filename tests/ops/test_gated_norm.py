"""The gated RMSNorm op (``ops/gated_norm``): the Triton kernels against the float64 definition (output and the
gradients of x, gate and weight) at widths that are not powers of two and row counts that leave partial blocks, the
backward's partial weight sums over several row blocks per program, the registered op, the dispatcher's checks and the
GDN layer's ``norm_backend`` switch.

The Triton tests run on the ``device`` fixture's device: CPU tensors through the interpreter here (float32), CUDA on a
GPU machine (the same float32 tolerance: the kernels have no matmul).
"""

from __future__ import annotations

import pytest
import torch

from hybrid_attention.ops.gated_norm import gated_rms_norm, naive_gated_rms_norm
from hybrid_attention.ops.gated_norm.triton import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable")

if HAS_TRITON:
    from hybrid_attention.ops.gated_norm.triton import ops as norm_ops
    from hybrid_attention.ops.gated_norm.triton import triton_gated_rms_norm

F64 = torch.float64
TOL = 2e-6  # relative L2 error of the float32 kernels against float64


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.detach().to("cpu", F64), ref.detach().to("cpu", F64)
    return ((a - ref).norm() / ref.norm().clamp(min=1e-30)).item()


def make_case(shape: tuple[int, ...], seed: int):
    """Fresh float64 x, gate [*shape], a gain [D] near 1 and an output cotangent."""
    g = torch.Generator().manual_seed(seed)
    x, gate, dy = (torch.randn(shape, dtype=F64, generator=g) for _ in range(3))
    w = 1 + 0.2 * torch.randn(shape[-1], dtype=F64, generator=g)
    return x, gate, w, dy


def grads(fn, leaves, dy):
    y = fn(*leaves)
    return [y, *torch.autograd.grad(y, leaves, dy.to(y.device, y.dtype))]


@pytest.mark.parametrize("shape", [(2, 37, 3, 128), (5, 96), (1, 1, 1, 200), (3, 7, 2, 16)])
def test_triton_matches_float64_definition(shape, device):
    x, gate, w, dy = make_case(shape, seed=sum(shape))
    ref = grads(lambda *a: naive_gated_rms_norm(*a, 1e-6), [t.requires_grad_() for t in (x, gate, w)], dy)
    leaves = [t.detach().to(device, torch.float32).requires_grad_() for t in (x, gate, w)]
    got = grads(lambda *a: triton_gated_rms_norm(*a, 1e-6), leaves, dy)
    for name, a, b in zip(("y", "dx", "dgate", "dweight"), got, ref, strict=True):
        assert rel(a, b) < TOL, (name, rel(a, b))


def test_backward_programs_walk_several_row_blocks(device, monkeypatch):
    """With fewer backward programs than row blocks every program sums its blocks' dweight before the host sums the
    programs' rows: the same gradients as one block per program."""
    x, gate, w, dy = make_case((61, 48), seed=4)
    ref = grads(lambda *a: naive_gated_rms_norm(*a, 1e-5), [t.requires_grad_() for t in (x, gate, w)], dy)
    monkeypatch.setattr(norm_ops, "ELEMENTS", 256)  # 4 rows per block: 16 blocks
    monkeypatch.setattr(norm_ops, "BWD_PROGRAMS", 3)  # 6 blocks per program, the last program partly empty
    leaves = [t.detach().to(device, torch.float32).requires_grad_() for t in (x, gate, w)]
    got = grads(lambda *a: triton_gated_rms_norm(*a, 1e-5), leaves, dy)
    for name, a, b in zip(("y", "dx", "dgate", "dweight"), got, ref, strict=True):
        assert rel(a, b) < TOL, (name, rel(a, b))


def test_bf16_inputs(device):
    """bf16 x and gate with a float32 gain: y and dx, dgate in bf16 within bf16 rounding of float64, dweight float32."""
    x, gate, w, dy = make_case((4, 33, 2, 64), seed=8)
    ref = grads(lambda *a: naive_gated_rms_norm(*a, 1e-6), [t.requires_grad_() for t in (x, gate, w)], dy)
    xb, gb = (t.detach().to(device, torch.bfloat16).requires_grad_() for t in (x, gate))
    wf = w.detach().to(device, torch.float32).requires_grad_()
    got = grads(lambda *a: gated_rms_norm(*a, 1e-6, backend="triton"), [xb, gb, wf], dy)
    assert got[0].dtype == got[1].dtype == got[2].dtype == torch.bfloat16 and got[3].dtype == torch.float32
    for name, a, b in zip(("y", "dx", "dgate", "dweight"), got, ref, strict=True):
        assert rel(a, b) < 1e-2, (name, rel(a, b))


def test_custom_op_opcheck(device):
    """Schema, fake (meta) implementation and autograd registration of the registered forward op."""
    x, gate, w, _ = make_case((9, 24), seed=2)
    args = tuple(t.float().to(device).requires_grad_() for t in (x, gate, w)) + (1e-6,)
    torch.library.opcheck(norm_ops.gated_rms_norm_fwd_op, args,
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_dispatch_and_input_errors():
    """"auto" runs the reference on CPU tensors; one clear line per bad argument; the Triton form refuses float64."""
    x, gate, w, _ = make_case((2, 8, 12), seed=1)
    assert torch.equal(gated_rms_norm(x, gate, w), naive_gated_rms_norm(x, gate, w, 1e-6))
    with pytest.raises(ValueError, match="gated_rms_norm: backend must be one of 'auto', 'reference', 'triton'"):
        gated_rms_norm(x, gate, w, backend="cuda")
    with pytest.raises(ValueError, match=r"gate must have x's shape \(2, 8, 12\)"):
        gated_rms_norm(x, gate[:1], w)
    with pytest.raises(ValueError, match=r"weight must be \[12\]"):
        gated_rms_norm(x, gate, w[:5])
    with pytest.raises(ValueError, match="float64"):
        triton_gated_rms_norm(x, gate, w)


def test_auto_takes_triton_outside_compile_only(monkeypatch):
    """"auto" picks the Triton op for supported CUDA inputs in eager code and the reference inside ``torch.compile``
    (inductor fuses it and recomputes y for the next layer's backward); never for CPU inputs."""
    import types

    from hybrid_attention.ops import gated_norm

    monkeypatch.setattr(gated_norm.triton_backend, "supported", lambda x, w: True)
    cuda_like, w = types.SimpleNamespace(is_cuda=True), torch.ones(4)
    assert gated_norm.auto_takes_triton(cuda_like, w)
    assert not gated_norm.auto_takes_triton(torch.ones(2, 4), w)
    seen = []

    @torch.compile(backend="eager", fullgraph=True)
    def traced(x):
        seen.append(gated_norm.auto_takes_triton(cuda_like, w))
        return x + 1

    traced(torch.ones(2))
    assert seen == [False]


def test_gdn_layer_norm_backend(device):
    """``GatedDeltaNet(norm_backend="triton")`` equals the reference layer with the same weights (output and every
    parameter's gradient, float32), and an unknown name is refused with the allowed values."""
    from hybrid_attention.layers.gated_deltanet import GatedDeltaNet

    torch.manual_seed(0)
    ref = GatedDeltaNet(32, num_heads=2, head_dim=16, backend="reference").to(device)
    fused = GatedDeltaNet(32, num_heads=2, head_dim=16, backend="reference", norm_backend="triton").to(device)
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(2, 19, 32, device=device)
    ys = [m(x)[0] for m in (ref, fused)]
    for y in ys:
        y.pow(2).sum().backward()
    assert rel(ys[1], ys[0]) < 1e-5
    for (name, p), q in zip(ref.named_parameters(), fused.parameters(), strict=True):
        assert rel(q.grad, p.grad) < 1e-4, name
    with pytest.raises(ValueError, match="norm_backend must be one of 'auto', 'reference', 'triton'"):
        GatedDeltaNet(32, num_heads=2, head_dim=16, norm_backend="fused")
