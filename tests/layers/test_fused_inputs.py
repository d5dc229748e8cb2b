"""The training / prefill fusion of the input projections and short convolutions (``project_inputs``,
modules/fused_linear.py) in the GDN, NAtS-L and softmax layers: one product of x and one convolution per call, and in
float64 the same outputs, states and gradients as the projections and convolutions run one by one."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import hybrid_attention.layers.gated_deltanet as gdn_module
import hybrid_attention.layers.natsl.layer as natsl_module
import hybrid_attention.layers.softmax as softmax_module
from hybrid_attention.layers import GatedDeltaNet, NatsLAttention, SoftmaxAttention
from hybrid_attention.modules import ShortConvolution, project_inputs

F64 = torch.float64
HIDDEN = 32
LAYER_MODULES = (gdn_module, natsl_module, softmax_module)


def _natsl(**kw) -> nn.Module:
    return NatsLAttention(HIDDEN, num_heads=2, head_dim=8, expand_v=2, num_attn_heads=4, chunk_size=4, **kw)


# name -> (factory, the layer's state_dict keys: the checkpoint layout the fusion must not change)
GDN_KEYS = {"A_log", "a_proj.weight", "b_proj.weight", "convs.k.weight", "convs.q.weight", "convs.v.weight", "dt_bias",
            "g_proj.weight", "k_proj.weight", "o_norm.weight", "o_proj.weight", "q_proj.weight", "v_proj.weight"}
NATSL_KEYS = {"A_log", "a_proj.weight", "attn_scale", "b_proj.weight", "convs.k.weight", "convs.q.weight",
              "convs.v.weight", "dt_bias", "g_proj.weight", "gdn_scale", "k_norm.weight", "k_proj.weight",
              "o_proj.weight", "omega_proj.weight", "q_norm.weight", "q_proj.weight", "score_proj.weight",
              "v_proj.weight"}
OWN_QK = {"attn_q_proj.weight", "attn_k_proj.weight"}
CASES = {
    "gdn": (lambda: GatedDeltaNet(HIDDEN, num_heads=2, head_dim=8, expand_v=2, chunk_size=4), GDN_KEYS),
    "gdn-no-gate": (lambda: GatedDeltaNet(HIDDEN, num_heads=2, head_dim=8, expand_v=2, chunk_size=4, use_gate=False),
                    GDN_KEYS - {"g_proj.weight"}),
    "natsl": (_natsl, NATSL_KEYS),
    "natsl-own-x-weights": (lambda: _natsl(attn_qk="own", weights_from="x"), NATSL_KEYS | OWN_QK),
    "natsl-own-conv": (lambda: _natsl(attn_qk="own_conv"), NATSL_KEYS | OWN_QK | {"convs.q_s.weight",
                                                                                  "convs.k_s.weight"}),
    "softmax": (lambda: SoftmaxAttention(HIDDEN, num_heads=2, head_dim=16),
                {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}),
}
# (GEMMs that read x, depthwise convolutions) of one eager forward: one each (softmax: no convolution)
EXPECTED_LAUNCHES = {name: (1, 0 if name == "softmax" else 1) for name in CASES}


def separate_inputs(x, linears, convs=None, state=None, output_final_state=False, *, cu_seqlens=None):
    """The unfused form of ``project_inputs``: each Linear, then its own ShortConvolution with its own state."""
    convs = convs or {}
    out, new_state = {}, {}
    for name, lin in linears.items():
        out[name] = lin(x)
        if name in convs:
            out[name], s = convs[name](out[name], state.get(name) if state else None, output_final_state,
                                       cu_seqlens=cu_seqlens)
            if output_final_state:
                new_state[name] = s
    return out, new_state


def _tensors(obj) -> list[torch.Tensor]:
    """Every tensor of a layer state (dataclass, dict, tensor) in a fixed order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for k in sorted(obj) for t in _tensors(obj[k])]
    if dataclasses.is_dataclass(obj):
        return [t for f in dataclasses.fields(obj) for t in _tensors(getattr(obj, f.name))]
    return []


def _fresh(obj):
    """A copy of a layer state whose floating tensors are new leaves that require gradients (None stays None)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().clone()
        return t.requires_grad_() if t.is_floating_point() or t.is_complex() else t
    if isinstance(obj, dict):
        return {k: _fresh(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **{f.name: _fresh(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    return obj


def _weighted(t: torch.Tensor) -> torch.Tensor:
    """A fixed, non-uniform weighting of t's entries summed (so that every entry's gradient is checked)."""
    r = torch.view_as_real(t) if t.is_complex() else t
    return (r * torch.cos(torch.arange(r.numel(), dtype=F64)).view(r.shape)).sum()


def _run(layer: nn.Module, x: torch.Tensor, state=None, **kw):
    """Forward, a loss over y and every floating output state tensor, backward -> (y, state, gradients by name)."""
    y, st = layer(x, state, **kw)
    loss = _weighted(y) + sum(_weighted(t) for t in _tensors(st) if t.is_floating_point() or t.is_complex())
    inputs = [x, *(t for t in _tensors(state) if t.requires_grad)]
    params = dict(layer.named_parameters())
    grads = torch.autograd.grad(loss, [*params.values(), *inputs], allow_unused=True)
    return y, st, dict(zip([*params, *(f"input{i}" for i in range(len(inputs)))], grads))


def _assert_same(fused, separate) -> None:
    (y, st, grads), (y_ref, st_ref, grads_ref) = fused, separate
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-12)
    assert type(st) is type(st_ref)
    got, ref = _tensors(st), _tensors(st_ref)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    if hasattr(st, "conv"):
        assert list(st.conv) == list(st_ref.conv)
    assert getattr(st, "offset", None) == getattr(st_ref, "offset", None)
    assert grads.keys() == grads_ref.keys()
    for name in grads:
        if grads_ref[name] is None:
            assert grads[name] is None, name
        else:
            torch.testing.assert_close(grads[name], grads_ref[name], rtol=0, atol=1e-12, msg=name)
    assert any(g is not None and g.abs().max() > 0 for g in grads.values())


def _both(monkeypatch, layer, x, state=None, **kw):
    """The layer run as it is (fused) and with every layer module's ``project_inputs`` replaced by the unfused form;
    an incoming state is cloned per run (``_fresh``)."""

    fused = _run(layer, x, _fresh(state), **kw)
    with monkeypatch.context() as m:
        for module in LAYER_MODULES:
            m.setattr(module, "project_inputs", separate_inputs)
        separate = _run(layer, x, _fresh(state), **kw)
    return fused, separate


@pytest.mark.parametrize("name", list(CASES))
def test_fused_inputs_equal_the_separate_projections(name, monkeypatch):
    """Dense from an empty state, then continued from a state (whose tensors' gradients are checked too): outputs,
    every state tensor (the conv states by branch name) and every parameter gradient agree."""
    factory, _ = CASES[name]
    layer = factory().double()
    x = torch.randn(2, 11, HIDDEN, dtype=F64, requires_grad=True)
    _assert_same(*_both(monkeypatch, layer, x, output_state=True))
    with torch.no_grad():
        _, prefix = layer(torch.randn(2, 6, HIDDEN, dtype=F64), output_state=True)
    if hasattr(prefix, "conv"):
        assert sorted(prefix.conv) == sorted(layer.convs)
        assert all(prefix.conv[n].shape == (2, c.channels, c.kernel_size - 1) for n, c in layer.convs.items())
    _assert_same(*_both(monkeypatch, layer, x, prefix, output_state=True))


@pytest.mark.parametrize("name", list(CASES))
def test_fused_inputs_equal_the_separate_projections_packed(name, monkeypatch):
    """Packed documents (cu_seqlens): the same outputs and gradients, and the per-document final conv states
    [N, channels, K-1] where the layer returns packed states."""
    factory, _ = CASES[name]
    layer = factory().double()
    x = torch.randn(1, 17, HIDDEN, dtype=F64, requires_grad=True)
    cu = torch.tensor([0, 2, 9, 17])
    keep = layer.packed_states
    fused, separate = _both(monkeypatch, layer, x, cu_seqlens=cu, output_state=keep)
    _assert_same(fused, separate)
    if keep and hasattr(fused[1], "conv"):
        assert all(fused[1].conv[n].shape == (3, c.channels, c.kernel_size - 1) for n, c in layer.convs.items())


class _Launches(TorchDispatchMode):
    """Counts the matrix products that read x's storage and the convolutions of the code it runs."""

    def __init__(self, x: torch.Tensor) -> None:
        super().__init__()
        self.ptr, self.gemms, self.convs = x.untyped_storage().data_ptr(), 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default):
            self.gemms += any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == self.ptr
                              for a in args)
        self.convs += func is torch.ops.aten.convolution.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", list(CASES))
def test_one_product_of_x_and_one_convolution_per_forward(name, monkeypatch):
    """The eager forward runs one GEMM on x for all the input projections and one convolution for all the convolved
    branches (the unfused form: one each); the parameters and the state_dict keep their per-projection layout."""
    factory, keys = CASES[name]
    layer = factory().double()
    assert set(layer.state_dict()) == keys
    x = torch.randn(2, 9, HIDDEN, dtype=F64)
    with _Launches(x) as launches:
        layer(x)
    assert (launches.gemms, launches.convs) == EXPECTED_LAUNCHES[name]
    for module in LAYER_MODULES:
        monkeypatch.setattr(module, "project_inputs", separate_inputs)
    with _Launches(x) as unfused:
        layer(x)
    assert unfused.gemms >= 2 and unfused.convs == len(getattr(layer, "convs", ()))


def test_project_inputs_order_errors_and_gradients():
    """Outputs come back in the order of `linears` (convolved or not), each weight gets its own gradient, and convs
    that cannot run as one convolution, or name no projection, are refused."""
    lins = {n: nn.Linear(8, w, bias=False).double() for n, w in (("a", 3), ("q", 6), ("k", 4))}
    convs = {n: ShortConvolution(lins[n].out_features, 3, "silu").double() for n in ("q", "k")}
    x = torch.randn(2, 5, 8, dtype=F64)
    out, st = project_inputs(x, lins, convs, None, True)
    ref, st_ref = separate_inputs(x, lins, convs, None, True)
    assert list(out) == list(lins) and list(st) == ["q", "k"]
    for n in lins:
        torch.testing.assert_close(out[n], ref[n], rtol=0, atol=1e-12)
    for n in st:
        torch.testing.assert_close(st[n], st_ref[n], rtol=0, atol=1e-12)
    sum(_weighted(t) for t in out.values()).backward()
    assert all(m.weight.grad is not None for m in [*lins.values(), *convs.values()])
    with pytest.raises(ValueError, match="one activation and one kernel size"):
        project_inputs(x, lins, {**convs, "k": ShortConvolution(4, 4, "silu").double()})
    with pytest.raises(ValueError, match="one backend"):
        project_inputs(x, lins, {**convs, "k": ShortConvolution(4, 3, "silu", backend="auto").double()})
    with pytest.raises(ValueError, match="must name projections"):
        project_inputs(x, lins, {"z": convs["q"]})


def test_product_width_padded_to_a_multiple(monkeypatch):
    """The one product runs at a width padded to ``width_multiple`` (zero weight rows; by default
    ``PRODUCT_WIDTH_MULTIPLE`` for CUDA inputs and none on the CPU), and its outputs and weight gradients equal the
    projections run one by one."""
    import hybrid_attention.modules.fused_linear as fused_linear

    lins = {n: nn.Linear(8, w, bias=False).double() for n, w in (("q", 40), ("a", 3), ("b", 3))}
    convs = {"q": ShortConvolution(40, 3, "silu").double()}
    x = torch.randn(2, 5, 8, dtype=F64)
    widths, linear = [], fused_linear.F.linear
    monkeypatch.setattr(fused_linear.F, "linear", lambda x, w: widths.append(w.shape[0]) or linear(x, w))
    project_inputs(x, lins, convs)
    out, _ = project_inputs(x, lins, convs, width_multiple=fused_linear.PRODUCT_WIDTH_MULTIPLE)
    monkeypatch.undo()
    assert widths == [46, 64] and [t.shape[-1] for t in out.values()] == [40, 3, 3]
    ref, _ = separate_inputs(x, lins, convs, None, False)
    loss = sum(_weighted(t) for t in out.values())
    grads = torch.autograd.grad(loss, [m.weight for m in lins.values()])
    grads_ref = torch.autograd.grad(sum(_weighted(t) for t in ref.values()), [m.weight for m in lins.values()])
    for n, a, b, ga, gb in zip(lins, out.values(), ref.values(), grads, grads_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=n)
        torch.testing.assert_close(ga, gb, rtol=0, atol=1e-12, msg=n)


@pytest.mark.triton
def test_project_inputs_triton_conv_backend(device):
    """The fused convolution on the Triton kernels (the convolved columns are a strided block of the product) equals
    the separate ShortConvolutions on them, with an incoming state and packed documents."""
    lins = {n: nn.Linear(8, w, bias=False).to(device) for n, w in (("q", 6), ("k", 4), ("b", 2))}
    convs = {n: ShortConvolution(lins[n].out_features, 4, "silu", "triton").to(device) for n in ("q", "k")}
    x = torch.randn(2, 7, 8, device=device)
    state = {n: torch.randn(2, c.channels, 3, device=device) for n, c in convs.items()}
    for kw in ({"state": state}, {}):
        got, ref = project_inputs(x, lins, convs, **kw, output_final_state=True), separate_inputs(
            x, lins, convs, **kw, output_final_state=True)
        for a, b in zip(_tensors(got), _tensors(ref)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    cu = torch.tensor([0, 3, 7], device=device)
    got = project_inputs(x[:1], lins, convs, None, True, cu_seqlens=cu)
    ref = separate_inputs(x[:1], lins, convs, None, True, cu_seqlens=cu)
    for a, b in zip(_tensors(got), _tensors(ref)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
