"""Packed documents (``cu_seqlens``) through every mixer and the ShortConvolution: one packed call == each document
alone (float64, 1e-10), outputs and gradients (inputs and parameters)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from mixer_cases import HIDDEN, MIXER_CASES, _natsl
from torch import nn

from hybrid_attention.layers.natsl.routing import RoutingSpec
from hybrid_attention.modules import ShortConvolution
from hybrid_attention.ops.common.varlen import cu_seqlens_from_lengths

F64 = torch.float64
TOL = 1e-10
LENGTHS = (1, 3, 4, 9, 2)  # the cases' chunk sizes are 4 and 5: documents below, equal to and across one chunk

CASES: dict[str, Callable[[], nn.Module]] = {**MIXER_CASES, "natsl-counterfactual": _natsl(counterfactual_grad=True)}


def _separate(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    offs = cu_seqlens_from_lengths(LENGTHS).tolist()
    return torch.cat([fn(x[:, offs[i]:offs[i + 1]]) for i in range(len(LENGTHS))], 1)


def _check(module: nn.Module, packed: Callable, alone: Callable, x: torch.Tensor) -> None:
    """Outputs and gradients (w.r.t. x and every parameter) of the packed call and of the separate calls agree."""
    params = [p for p in module.parameters() if p.requires_grad]
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = packed(xa), _separate(alone, xb)
    assert ya.shape == yb.shape == x.shape[:2] + ya.shape[2:]
    assert (ya - yb).abs().max().item() < TOL
    w = torch.linspace(-1, 1, ya.numel(), dtype=F64).view_as(ya)
    ga = torch.autograd.grad((ya * w).sum(), [xa, *params], allow_unused=True)
    gb = torch.autograd.grad((yb * w).sum(), [xb, *params], allow_unused=True)
    for a, b in zip(ga, gb, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert (a - b).abs().max().item() < TOL


@pytest.mark.parametrize("name", list(CASES))
def test_mixer_packed_equals_separate(name: str) -> None:
    torch.manual_seed(0)
    layer = CASES[name]().double()
    x = torch.randn(1, sum(LENGTHS), HIDDEN, dtype=F64)
    cu = cu_seqlens_from_lengths(LENGTHS)
    _check(layer, lambda z: layer(z, cu_seqlens=cu)[0], lambda z: layer(z)[0], x)


@pytest.mark.parametrize("force", ["softmax", "gdn"])
def test_natsl_forced_routing_packed(force: str) -> None:
    """Every complete chunk softmax (earlier chunks must stay inside their document) or every chunk GDN."""
    torch.manual_seed(0)
    layer = CASES["natsl-rope"]().double()
    layer.routing = RoutingSpec(force)
    x = torch.randn(1, sum(LENGTHS), HIDDEN, dtype=F64)
    cu = cu_seqlens_from_lengths(LENGTHS)
    _check(layer, lambda z: layer(z, cu_seqlens=cu)[0], lambda z: layer(z)[0], x)


def test_packed_differs_without_cu_seqlens() -> None:
    """The check can fail: the same packed row without offsets leaks across documents."""
    torch.manual_seed(0)
    layer = CASES["gdn"]().double()
    x = torch.randn(1, sum(LENGTHS), HIDDEN, dtype=F64)
    assert (layer(x)[0] - _separate(lambda z: layer(z)[0], x)).abs().max().item() > 1e-3


@pytest.mark.parametrize("compiled_form", [False, True])
def test_short_conv_packed(compiled_form: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    conv = ShortConvolution(6, 4, "silu").double()
    x = torch.randn(1, sum(LENGTHS), 6, dtype=F64)
    cu = cu_seqlens_from_lengths(LENGTHS)
    if compiled_form:  # the shifted-product form of compiled training is the reference of the separate calls
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    _check(conv, lambda z: conv(z, cu_seqlens=cu)[0], lambda z: conv(z)[0], x)
    _, states = conv(x, output_final_state=True, cu_seqlens=cu)
    offs = cu.tolist()
    ref = torch.cat([conv(x[:, offs[i]:offs[i + 1]], output_final_state=True)[1] for i in range(len(LENGTHS))])
    assert states.shape == (len(LENGTHS), 6, 3) and (states - ref).abs().max().item() == 0.0


@pytest.mark.parametrize("name", [n for n, make in MIXER_CASES.items() if make().packed_states])
def test_packed_states_continue_each_document(name: str) -> None:
    """A packed call's state (output_state): row i continues document i (a left-padded prefill), 3 tokens a row."""
    torch.manual_seed(0)
    layer = CASES[name]().double()
    x = torch.randn(1, sum(LENGTHS), HIDDEN, dtype=F64)
    nxt = torch.randn(len(LENGTHS), 3, HIDDEN, dtype=F64)
    cu = cu_seqlens_from_lengths(LENGTHS)
    _, state = layer(x, output_state=True, cu_seqlens=cu)
    y = layer(nxt, state)[0]
    offs = cu.tolist()
    for i in range(len(LENGTHS)):
        _, alone = layer(x[:, offs[i]:offs[i + 1]], output_state=True)
        assert (y[i] - layer(nxt[i : i + 1], alone)[0][0]).abs().max().item() < TOL


def test_layer_refuses_state_with_cu_seqlens() -> None:
    layer = CASES["gdn"]().double()
    x = torch.randn(1, sum(LENGTHS), HIDDEN, dtype=F64)
    with pytest.raises(ValueError, match="^GatedDeltaNet: cu_seqlens runs packed documents from an empty state"):
        layer(x, layer.init_state(1, dtype=F64), cu_seqlens=cu_seqlens_from_lengths(LENGTHS))
    with pytest.raises(ValueError, match="^NatsLAttention: cu_seqlens runs packed documents from an empty state"):
        CASES["natsl"]().double()(x, output_state=True, cu_seqlens=cu_seqlens_from_lengths(LENGTHS))
    with pytest.raises(ValueError, match="^cu_seqlens must end at T = 19"):
        layer(x, cu_seqlens=cu_seqlens_from_lengths([3, 4]))
    with pytest.raises(ValueError, match="^state must be None with cu_seqlens"):
        ShortConvolution(4, 4)(x[..., :4], torch.zeros(1, 4, 3, dtype=F64), cu_seqlens=cu_seqlens_from_lengths([19]))


def test_natsl_packed_recorder_keeps_the_real_chunks() -> None:
    """The packed pass types a static bound of chunk rows (T // C, the complete chunks first); an attached recorder
    keeps the real ones: the same types as the documents' separate passes, in document order."""
    from hybrid_attention.layers.natsl.routing import RoutingRecorder

    torch.manual_seed(0)
    layer = CASES["natsl"]().double()
    lengths = (4, 9, 1, 8, 5, 12, 3)  # 1 + 2 + 0 + 2 + 1 + 3 + 0 = 9 complete chunks of 4 < T // C = 10 rows
    x = torch.randn(1, sum(lengths), HIDDEN, dtype=F64)
    offs = cu_seqlens_from_lengths(lengths).tolist()
    rec = RoutingRecorder()
    with rec.attach(layer):
        layer(x, cu_seqlens=cu_seqlens_from_lengths(lengths))
        packed = rec.last()
        alone = []
        for a, b in zip(offs[:-1], offs[1:], strict=True):
            layer(x[:, a:b])
            alone.append(rec.last())
    assert sum(lengths) // 4 == 10 and packed.shape == (1, 9, 2)
    assert torch.equal(packed, torch.cat(alone, 1))


def test_natsl_packed_triton_matches_separate(device: torch.device) -> None:
    """backend="triton" (the interpreter on the CPU, fp32; compiled on a GPU, tf32 dots: the looser tolerances of
    test_natsl_layer's Triton test): the packed call passes per-chunk inputs of the sync-free row count
    max_chunks(T, N, C) to the Triton kernels; outputs and gradients equal the documents run alone through the
    reference ops on the CPU."""
    pytest.importorskip("triton")
    from hybrid_attention.layers import NatsLAttention

    on_cpu = device.type == "cpu"
    tol = dict(rtol=2e-4, atol=2e-5) if on_cpu else dict(rtol=1e-2, atol=2e-3)
    gtol = dict(rtol=2e-3, atol=2e-4) if on_cpu else dict(rtol=2e-2, atol=5e-3)
    torch.manual_seed(3)
    kw = dict(num_heads=2, head_dim=16, expand_v=2, num_attn_heads=4, chunk_size=16)
    ref = NatsLAttention(HIDDEN, **kw)
    tri = NatsLAttention(HIDDEN, backend="triton", **kw)
    tri.load_state_dict(ref.state_dict())
    tri.to(device)
    lengths = (5, 16, 37, 1, 20)  # 4 complete chunks, Nc = 7 chunk rows, max_chunks(79, 5, 16) = 9
    cu = cu_seqlens_from_lengths(lengths)
    x = torch.randn(1, sum(lengths), HIDDEN)
    xa, xb = x.clone().to(device).requires_grad_(), x.clone().requires_grad_()
    ya = tri(xa, cu_seqlens=cu.to(device))[0]
    offs = cu.tolist()
    yb = torch.cat([ref(xb[:, a:b])[0] for a, b in zip(offs[:-1], offs[1:], strict=True)], 1)
    torch.testing.assert_close(ya.cpu(), yb, **tol)
    w = torch.linspace(-1, 1, ya.numel()).view_as(yb)
    ga = torch.autograd.grad((ya * w.to(device)).sum(), [xa, *tri.parameters()])
    gb = torch.autograd.grad((yb * w).sum(), [xb, *ref.parameters()])
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a.cpu(), b, **gtol)
