"""The causal short-convolution op (``ops/causal_conv``): the Triton kernels against the float64 definition (output,
final state, gradients of x, weight and the initial state), packed documents, NaN-poisoned buffers, the registered
op, the dispatcher's checks and ``ShortConvolution``'s backend switch.

The Triton tests run on the ``device`` fixture's device: CPU tensors through the interpreter here (float32, tiny
shapes, blocks of 16 so that T and C span several partial blocks), CUDA on a GPU machine (the same float32 tolerance:
the kernels have no matmul).
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from hybrid_attention.modules import ShortConvolution
from hybrid_attention.ops.causal_conv import causal_conv1d, naive_causal_conv1d
from hybrid_attention.ops.causal_conv.triton import DEFAULT_CONFIG, HAS_TRITON, CausalConvConfig
from hybrid_attention.ops.causal_conv.triton.config import BWD_FORMS, TILE_BC, TILE_BC_BWD

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable")

if HAS_TRITON:
    from hybrid_attention.ops.causal_conv.triton import ops as conv_ops
    from hybrid_attention.ops.causal_conv.triton import triton_causal_conv1d

F64 = torch.float64
SMALL = CausalConvConfig(BT=16, BC=16, BC_BWD=16, BC_STATE=16, poison=True)  # several partial blocks, NaN buffers
TOL = 2e-5  # relative L2 error of the float32 kernels against float64


def small(bwd_form: str = "reload") -> CausalConvConfig:
    """``SMALL`` with the backward kernel ``bwd_form`` (and the walking forward with the walking backward)."""
    return dataclasses.replace(SMALL, bwd_form=bwd_form, fwd_form="walk" if bwd_form == "walk" else "tile")


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error of a against the float64 reference (0 for two empty tensors)."""
    if ref.numel() == 0:
        return 0.0
    a, ref = a.detach().to("cpu", F64), ref.detach().to("cpu", F64)  # a reference computed on the GPU comes back
    return ((a - ref).norm() / ref.norm().clamp(min=1e-30)).item()


def make_case(B: int, T: int, C: int, K: int, n_seq: int, with_init: bool, seed: int):
    """Fresh float64 leaves x [B, T, C], weight [C, K], initial state [n_seq, C, K-1] (or None)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, dtype=F64, generator=g)
    w = torch.randn(C, K, dtype=F64, generator=g) / K**0.5
    init = torch.randn(n_seq, C, K - 1, dtype=F64, generator=g) if with_init else None
    return x, w, init


def run_both(x, w, init, activation, device, cu=None, config=SMALL):
    """(triton results, float64 reference results), each (y, final, dx, dw, dinit): forward with the final state,
    backward of a random linear function of y and the final state (so the final-state gradient is exercised)."""
    g = torch.Generator().manual_seed(99)
    dy = torch.randn(x.shape, dtype=F64, generator=g)
    n_seq = x.shape[0] if cu is None else len(cu) - 1
    dfin = torch.randn(n_seq, x.shape[2], w.shape[1] - 1, dtype=F64, generator=g)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)

    def one(fn, dtype, dev):
        leaves = [t.to(dev, dtype).requires_grad_() if t is not None else None for t in (x, w, init)]
        y, fin = fn(leaves[0], leaves[1], activation=activation, initial_state=leaves[2], output_final_state=True,
                    cu_seqlens=None if cu_t is None else cu_t.to(dev))
        loss = (y * dy.to(dev, dtype)).sum() + (fin * dfin.to(dev, dtype)).sum()
        grads = torch.autograd.grad(loss, [t for t in leaves if t is not None])
        return y, fin, *grads

    tri = one(lambda *a, **k: triton_causal_conv1d(*a, config=config, **k), torch.float32, device)
    ref = one(naive_causal_conv1d, F64, "cpu")
    return tri, ref


def assert_close(tri, ref, tol: float = TOL) -> None:
    names = ("y", "final", "dx", "dweight", "dinit")
    for name, a, b in zip(names, tri, ref, strict=False):
        assert torch.isfinite(a).all(), f"{name}: non-finite (an unwritten element of a NaN-poisoned buffer?)"
        assert rel(a, b) < tol, f"{name}: relative error {rel(a, b):.2e}"


@pytest.mark.parametrize(
    "K, activation, with_init, bwd_form",
    [(4, act, with_init, form) for form in BWD_FORMS for act in ("silu", None) for with_init in (True, False)]
    + [(3, "silu", True, "reload"), (2, "silu", False, "reload"), (2, None, True, "reload")],
)
def test_triton_matches_float64_definition(K, activation, with_init, bwd_form, device):
    """T = 37, C = 24: three token blocks and two channel blocks of 16, the last ones partial; both backward forms at
    K = 4 (other widths run "reload" whatever the form)."""
    x, w, init = make_case(2, 37, 24, K, 2, with_init, seed=K)
    tri, ref = run_both(x, w, init, activation, device, config=small(bwd_form))
    assert_close(tri, ref)


@pytest.mark.parametrize("bwd_form", BWD_FORMS)
@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("with_init", [False, True])
def test_packed_documents(with_init, activation, bwd_form, device):
    """Documents of 1 (< K-1), 3 (= K-1), 17 and 19 tokens packed in one row: each starts from its own history (zeros
    or its initial state), the final states are per document, the blocks cross document boundaries."""
    cu = [0, 1, 4, 21, 40]
    x, w, init = make_case(1, 40, 20, 4, len(cu) - 1, with_init, seed=7)
    tri, ref = run_both(x, w, init, activation, device, cu=cu, config=small(bwd_form))
    assert_close(tri, ref)


def _record_launches(monkeypatch) -> list[str]:
    """The names of the kernels launched from here on, in order; the launches record and do not run."""
    import triton.runtime.jit as jit

    launched: list[str] = []

    def getitem(self, grid):
        launched.append(self.fn.__name__)
        return lambda *args, **kwargs: None

    monkeypatch.setattr(jit.KernelInterface, "__getitem__", getitem)
    return launched


@pytest.mark.parametrize("bwd_form, K, kernel", [("reload", 4, "_conv_bwd_kernel"),
                                                 ("shifted", 4, "_conv_bwd_shifted_kernel"),
                                                 ("shifted", 3, "_conv_bwd_kernel"),
                                                 ("walk", 4, "_conv_bwd_walk_kernel"),
                                                 ("walk", 3, "_conv_bwd_kernel")])
def test_bwd_form_picks_the_kernel(bwd_form, K, kernel, monkeypatch):
    """``CausalConvConfig.bwd_form`` decides the backward tile kernel ("shifted" only at K = 4); a value outside
    ``BWD_FORMS`` is one line naming the field and the allowed values. The launches are recorded, not run (meta
    tensors)."""
    launched = _record_launches(monkeypatch)
    x = torch.empty(1, 8, 16, device="meta")
    conv_ops._bwd_impl(x, torch.empty(16, K, device="meta"), None, None, None, None, [torch.empty_like(x)], None, True,
                       cfg=small(bwd_form))
    assert launched == [kernel]
    with pytest.raises(ValueError, match="CausalConvConfig.bwd_form must be one of 'reload', 'shifted', 'walk', "
                                         "got 'fast'"):
        CausalConvConfig(bwd_form="fast")


@pytest.mark.parametrize("fwd_form, K, kernel", [("tile", 4, "_conv_fwd_kernel"), ("walk", 4, "_conv_fwd_walk_kernel"),
                                                 ("walk", 3, "_conv_fwd_kernel")])
def test_fwd_form_picks_the_kernel(fwd_form, K, kernel, monkeypatch):
    """``CausalConvConfig.fwd_form`` decides the forward kernel ("walk" only at K = 4); a bad value is one line naming
    the field and the allowed values."""
    launched = _record_launches(monkeypatch)
    x = torch.empty(1, 8, 16, device="meta")
    conv_ops._fwd_impl(x, torch.empty(16, K, device="meta"), None, None, None, None, True, False, [16],
                       cfg=dataclasses.replace(SMALL, fwd_form=fwd_form))
    assert launched == [kernel]
    with pytest.raises(ValueError, match="CausalConvConfig.fwd_form must be one of 'tile', 'walk', got 'fast'"):
        CausalConvConfig(fwd_form="fast")


def test_for_width_falls_back_to_the_tile_forms():
    """Kernel widths other than 4 run the tile forms, a walking form's channel blocks capped at the tile forms'
    spill-free sizes; BT (the packed chunk table's chunk) stays; K = 4 keeps the settings."""
    cfg = CausalConvConfig(BT=64, BC=256, BC_BWD=256, fwd_form="walk", bwd_form="walk")
    assert cfg.for_width(4) is cfg
    low = cfg.for_width(3)
    assert (low.fwd_form, low.bwd_form, low.BT, low.BC, low.BC_BWD) == ("tile", "reload", 64, TILE_BC, TILE_BC_BWD)
    tile = CausalConvConfig(BC=128, BC_BWD=64, fwd_form="tile", bwd_form="shifted").for_width(2)
    assert (tile.bwd_form, tile.BC, tile.BC_BWD) == ("reload", 128, 64)  # blocks chosen for the tile forms stay


@pytest.mark.parametrize("bwd_form", BWD_FORMS)
@pytest.mark.parametrize("packed", [False, True])
def test_column_slice_read_in_place(bwd_form, packed, device):
    """x as columns 5 .. 5 + C of a wider tensor (a fused projection's output): the kernels read it in place (no
    copy) and the output, final state and every gradient, the wide tensor's included (zero outside the slice), match
    the float64 definition on the slice."""
    cu = [0, 3, 21, 40] if packed else None
    B, T, C, K = (1, 40, 20, 4) if packed else (2, 37, 24, 4)
    x, w, init = make_case(B, T, C, K, 3 if packed else B, True, seed=11)
    wide = torch.randn(B, T, C + 13, dtype=F64, generator=torch.Generator().manual_seed(3))
    wide[..., 5:5 + C] = x
    g = torch.Generator().manual_seed(99)
    dy = torch.randn(x.shape, dtype=F64, generator=g)
    dfin = torch.randn(init.shape, dtype=F64, generator=g)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    assert conv_ops._rows_apart(wide.to(device)[..., 5:5 + C]).stride(1) == C + 13

    def one(fn, dtype, dev):
        leaves = [t.to(dev, dtype).requires_grad_() for t in (wide, w, init)]
        y, fin = fn(leaves[0][..., 5:5 + C], leaves[1], activation="silu", initial_state=leaves[2],
                    output_final_state=True, cu_seqlens=None if cu_t is None else cu_t.to(dev))
        loss = (y * dy.to(dev, dtype)).sum() + (fin * dfin.to(dev, dtype)).sum()
        return y, fin, *torch.autograd.grad(loss, leaves)

    tri = one(lambda *a, **k: triton_causal_conv1d(*a, config=small(bwd_form), **k), torch.float32, device)
    ref = one(naive_causal_conv1d, F64, "cpu")
    assert_close(tri, ref)
    outside = torch.cat([tri[2][..., :5], tri[2][..., 5 + C:]], -1)
    assert outside.abs().max() == 0


@pytest.mark.parametrize("bwd_form", BWD_FORMS)
@pytest.mark.parametrize("packed", [False, True])
def test_split_outputs(bwd_form, packed, device, monkeypatch):
    """``split_sizes``: y as parts of their own, each contiguous, read from a column slice of a wider tensor. The
    parts, the final state and every gradient match the float64 definition, with one part left out of the loss (its
    gradient arrives as zeros). The walking forms launch once per part in each direction and write no full-width y."""
    cu = [0, 3, 21, 40] if packed else None
    B, T, C, K = (1, 40, 20, 4) if packed else (2, 37, 24, 4)
    sizes = (4, 9, 7) if packed else (5, 11, 8)
    x, w, init = make_case(B, T, C, K, 3 if packed else B, True, seed=13)
    wide = torch.randn(B, T, C + 6, dtype=F64, generator=torch.Generator().manual_seed(4))
    wide[..., 2:2 + C] = x
    g = torch.Generator().manual_seed(98)
    dy = torch.randn(x.shape, dtype=F64, generator=g)
    dy[..., sizes[0]:sizes[0] + sizes[1]] = 0  # the second part is not in the loss
    dfin = torch.randn(init.shape, dtype=F64, generator=g)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)

    def one(dtype, dev, split):
        leaves = [t.to(dev, dtype).requires_grad_() for t in (wide, w, init)]
        kw = dict(activation="silu", initial_state=leaves[2], output_final_state=True,
                  cu_seqlens=None if cu_t is None else cu_t.to(dev))
        if split:
            parts, fin = triton_causal_conv1d(leaves[0][..., 2:2 + C], leaves[1], split_sizes=sizes,
                                              config=small(bwd_form), **kw)
            assert [tuple(p.shape) for p in parts] == [(B, T, n) for n in sizes]
            assert all(p.is_contiguous() for p in parts)
            dys = dy.to(dev, dtype).split(sizes, -1)
            loss = sum((p * d).sum() for i, (p, d) in enumerate(zip(parts, dys)) if i != 1)
            y = torch.cat(parts, -1)
        else:
            y, fin = naive_causal_conv1d(leaves[0][..., 2:2 + C], leaves[1], **kw)
            loss = (y * dy.to(dev, dtype)).sum()
        loss = loss + (fin * dfin.to(dev, dtype)).sum()
        return y, fin, *torch.autograd.grad(loss, leaves)

    launched = []
    if bwd_form == "walk":
        import triton.runtime.jit as jit

        getitem = jit.KernelInterface.__getitem__
        monkeypatch.setattr(jit.KernelInterface, "__getitem__",
                            lambda self, grid: launched.append(self.fn.__name__) or getitem(self, grid))
    tri = one(torch.float32, device, True)
    assert_close(tri, one(F64, "cpu", False))
    if bwd_form == "walk":
        assert launched.count("_conv_fwd_walk_kernel") == launched.count("_conv_bwd_walk_kernel") == len(sizes)


def test_packed_equals_documents_run_alone(device):
    """The packed call equals each document run as its own sequence (the reference's per-document form itself is
    checked against the K shifted products here too)."""
    cu = [0, 5, 6, 30]
    x, w, _ = make_case(1, 30, 16, 3, 3, False, seed=11)
    xd, wd = x.to(device, torch.float32), w.to(device, torch.float32)
    y, fin = triton_causal_conv1d(xd, wd, activation="silu", output_final_state=True,
                                  cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=device), config=SMALL)
    for n in range(len(cu) - 1):
        a, b = cu[n], cu[n + 1]
        y_n, fin_n = triton_causal_conv1d(xd[:, a:b], wd, activation="silu", output_final_state=True, config=SMALL)
        assert torch.equal(y[:, a:b], y_n)
        assert torch.equal(fin[n : n + 1], fin_n)
        pre = sum(torch.nn.functional.pad(x[:, a:b], (0, 0, 2 - j, 0))[:, : b - a] * w[:, j] for j in range(3))
        assert rel(y_n, torch.nn.functional.silu(pre)) < TOL


@pytest.mark.parametrize("T", [0, 2, 9])
def test_final_state_is_the_last_inputs(T, device):
    """The final state is an exact copy (x's dtype) of the last K-1 inputs, reaching into the initial state when
    T < K-1 (all of it for T = 0), with and without an activation."""
    K = 5
    x, w, init = make_case(2, T, 16, K, 2, True, seed=T)
    xd, wd, hd = (t.to(device, torch.float32) for t in (x, w, init))
    for activation in (None, "silu"):
        _, fin = triton_causal_conv1d(xd, wd, activation=activation, initial_state=hd, output_final_state=True,
                                      config=SMALL)
        assert torch.equal(fin, torch.cat([hd, xd.mT], dim=-1)[..., -(K - 1):])
        _, fin0 = triton_causal_conv1d(xd, wd, activation=activation, output_final_state=True, config=SMALL)
        assert torch.equal(fin0, torch.cat([torch.zeros_like(hd), xd.mT], dim=-1)[..., -(K - 1):])


def test_pieces_with_carried_state_equal_one_call(device):
    """Two calls with the state carried give the one-call output (the prefill / chunked-prefill contract)."""
    x, w, _ = make_case(2, 30, 16, 4, 2, False, seed=3)
    xd, wd = x.to(device, torch.float32), w.to(device, torch.float32)
    y, fin = triton_causal_conv1d(xd, wd, activation="silu", output_final_state=True, config=SMALL)
    y1, s1 = triton_causal_conv1d(xd[:, :13], wd, activation="silu", output_final_state=True, config=SMALL)
    y2, s2 = triton_causal_conv1d(xd[:, 13:], wd, activation="silu", initial_state=s1, output_final_state=True,
                                  config=SMALL)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=1e-6, atol=1e-6)
    assert torch.equal(s2, fin)


def test_registered_op_default_config(device):
    """The registered custom op (``DEFAULT_CONFIG``, the path of ``torch.compile``) in bf16: output within bf16
    rounding of the float64 definition, gradients of every input, the weight gradient in the weight's dtype."""
    x, w, init = make_case(2, 37, 24, 4, 2, True, seed=5)
    xb = x.to(device, torch.bfloat16).requires_grad_()
    wf = w.to(device, torch.float32).requires_grad_()
    hb = init.to(device, torch.bfloat16).requires_grad_()
    y, fin = causal_conv1d(xb, wf, activation="silu", initial_state=hb, output_final_state=True, backend="triton")
    assert y.dtype == fin.dtype == torch.bfloat16
    y.float().pow(2).sum().backward()
    assert wf.grad.dtype == torch.float32 and xb.grad.dtype == hb.grad.dtype == torch.bfloat16
    leaves = [t.detach().double().requires_grad_() for t in (xb, wf, hb)]
    y_ref, _ = naive_causal_conv1d(*leaves[:2], activation="silu", initial_state=leaves[2])
    y_ref.pow(2).sum().backward()
    assert rel(y, y_ref) < 1e-2
    for leaf, ref in zip((xb, wf, hb), leaves, strict=True):
        assert rel(leaf.grad, ref.grad) < 1e-2


@pytest.mark.parametrize("K, sizes", [(3, [16]), (4, [5, 11])])
def test_custom_op_opcheck(K, sizes, device):
    """Schema, fake (meta) implementation and autograd registration of the registered forward op: one output, and at
    K = 4 (the walking kernels) two parts."""
    x, w, init = make_case(1, 9, 16, K, 1, True, seed=2)
    args = (x.float().to(device).requires_grad_(), w.float().to(device).requires_grad_(),
            init.float().to(device).requires_grad_(), None, None, None, True, True, sizes)
    torch.library.opcheck(conv_ops.causal_conv1d_fwd_op, args,
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_dispatch_and_input_errors():
    """"auto" runs the reference on CPU tensors; one clear line per bad argument; the Triton form refuses float64
    and widths above its maximum."""
    x, w, init = make_case(2, 8, 4, 3, 2, True, seed=1)
    y_auto, _ = causal_conv1d(x, w, activation="silu")
    y_ref, _ = naive_causal_conv1d(x, w, activation="silu")
    assert torch.equal(y_auto, y_ref)
    with pytest.raises(ValueError, match="causal_conv1d: backend must be one of 'auto', 'reference', 'triton'"):
        causal_conv1d(x, w, backend="cuda")
    with pytest.raises(ValueError, match="activation must be one of None, 'silu'"):
        causal_conv1d(x, w, activation="gelu")
    with pytest.raises(ValueError, match=r"weight must be \[C, K\] with C = 4"):
        causal_conv1d(x, w[:3])
    with pytest.raises(ValueError, match=r"initial_state must be \[N, C, K-1\] = \(2, 4, 2\)"):
        causal_conv1d(x, w, initial_state=init[..., :1])
    with pytest.raises(ValueError, match="cu_seqlens requires inputs of batch size 1"):
        causal_conv1d(x, w, cu_seqlens=torch.tensor([0, 8], dtype=torch.int32))
    with pytest.raises(ValueError, match="float64"):
        triton_causal_conv1d(x, w)
    with pytest.raises(ValueError, match="K <= 8"):
        triton_causal_conv1d(x.float(), torch.randn(4, 9))
    parts, _ = causal_conv1d(x, w, activation="silu", split_sizes=[1, 3])  # the reference: views of y
    assert [tuple(p.shape) for p in parts] == [(2, 8, 1), (2, 8, 3)] and torch.equal(torch.cat(parts, -1), y_ref)
    for bad in ([1, 2], [0, 4], [4.0]):
        with pytest.raises(ValueError, match=r"split_sizes must be positive widths summing to C = 4, got"):
            causal_conv1d(x, w, split_sizes=bad)


def test_short_convolution_triton_backend(device):
    """``ShortConvolution(backend="triton")`` equals the default reference path (same weights): output, new state
    and gradients, with a carried state and with packed documents; "reference" is the default."""
    assert ShortConvolution(8, 4, "silu").backend == "reference"
    with pytest.raises(ValueError, match="ShortConvolution: backend must be one of"):
        ShortConvolution(8, 4, backend="fast")
    torch.manual_seed(0)
    ref = ShortConvolution(24, 4, "silu").to(device)
    tri = ShortConvolution(24, 4, "silu", backend="triton").to(device)
    tri.load_state_dict(ref.state_dict())
    x = torch.randn(2, 21, 24, device=device)
    state = torch.randn(2, 24, 3, device=device)
    cu = torch.tensor([0, 2, 21], dtype=torch.int32, device=device)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # the reference's fp32 conv1d on a GPU
        for args, kw in (((x, state, True), {}), ((x[:1], None, True), {"cu_seqlens": cu})):
            outs = []
            for conv in (ref, tri):
                xi = args[0].clone().requires_grad_()
                y, s = conv(xi, *args[1:], **kw)
                (y.pow(2).sum() + s.sum()).backward()
                outs.append((y, s, xi.grad, conv.weight.grad.clone()))
                conv.weight.grad = None
            for a, b in zip(*outs, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_layer_conv_backend_option(device):
    """``GatedDeltaNet(conv_backend="triton")`` (what ``mixer_options.gdn.conv_backend`` sets) runs its q, k, v
    convolutions on the op and equals the default layer with the same weights, output and input gradient."""
    from hybrid_attention.layers import GatedDeltaNet

    torch.manual_seed(0)
    layers = [GatedDeltaNet(32, num_heads=2, head_dim=16, chunk_size=16, backend="reference", conv_backend=b).to(device)
              for b in ("reference", "triton")]
    layers[1].load_state_dict(layers[0].state_dict())
    assert all(c.backend == "triton" for c in layers[1].convs.values())
    x = torch.randn(2, 19, 32, device=device)
    outs = []
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for layer in layers:
            xi = x.clone().requires_grad_()
            y, _ = layer(xi)
            y.pow(2).sum().backward()
            outs.append((y, xi.grad))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the CPU smoke test of the GPU benchmark")
def test_benchmark_dry_run(tmp_path):
    """``benchmarks/causal_conv.py --dryrun`` at tiny shapes on the CPU (interpreter): the correctness check passes
    and every timing row is written."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1", OUT=str(tmp_path))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.causal_conv", "--dryrun"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "causal_conv_gpu.json").read_text())
    assert res["errors"] == [], res["errors"]
    assert res["correctness"] and all(r["pass"] for r in res["correctness"])
    others = {f"triton {f}" for f in BWD_FORMS if f != DEFAULT_CONFIG.bwd_form}  # the forms not the default
    assert {r["form"] for r in res["timings"]} == {"triton", "triton compiled", "reference eager",
                                                   "reference compiled"} | others
