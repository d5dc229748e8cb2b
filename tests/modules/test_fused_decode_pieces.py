"""The decode-time fusions (modules/fused_linear.py, modules/conv.short_conv_step, SwiGLU.forward_fused) equal the
modules they replace, in float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hybrid_attention.modules import ShortConvolution, SwiGLU, concat_linear_weights, short_conv_step

F64 = torch.float64


def test_concat_linear_weights_equals_each_linear():
    torch.manual_seed(0)
    lins = [nn.Linear(16, n, bias=False).double() for n in (8, 3, 5)]
    w, sizes = concat_linear_weights(lins)
    x = torch.randn(4, 16, dtype=F64)
    for part, lin in zip(torch.nn.functional.linear(x, w).split(sizes, -1), lins):
        torch.testing.assert_close(part, lin(x), rtol=0, atol=1e-12)
    assert sizes == [8, 3, 5] and not w.requires_grad
    with pytest.raises(ValueError, match="bias-free nn.Linear layers with one input size"):
        concat_linear_weights([nn.Linear(16, 4), nn.Linear(8, 4, bias=False)])
    with pytest.raises(ValueError, match="non-empty"):
        concat_linear_weights([])


@pytest.mark.parametrize("activation", [None, "silu"])
def test_short_conv_step_equals_short_convolution(activation):
    """Token by token over concatenated channels == two ShortConvolutions run on their halves; states advance."""
    torch.manual_seed(1)
    convs = [ShortConvolution(c, 4, activation).double() for c in (6, 10)]
    x = torch.randn(2, 7, 16, dtype=F64)
    refs = [conv(xs)[0] for conv, xs in zip(convs, x.split([6, 10], -1))]
    state = torch.zeros(2, 16, 3, dtype=F64)
    weight = torch.cat([c.weight[:, 0, :] for c in convs]).detach()
    ys = torch.stack([short_conv_step(x[:, t], state, weight, activation) for t in range(7)], 1)
    torch.testing.assert_close(ys, torch.cat(refs, -1), rtol=0, atol=1e-12)
    torch.testing.assert_close(state, x[:, -3:].transpose(1, 2), rtol=0, atol=0)
    assert (ys - torch.cat(refs[::-1], -1)).abs().max() > 1e-3  # the check can fail: channels in the wrong order


def test_swiglu_forward_fused():
    torch.manual_seed(2)
    mlp = SwiGLU(12, 20).double()
    x = torch.randn(3, 1, 12, dtype=F64)
    torch.testing.assert_close(mlp.forward_fused(x, mlp.decode_weights()), mlp(x), rtol=0, atol=1e-12)


def test_fuse_inputs_equals_the_modules_and_shares_its_conv_state():
    """FusedInputs == each Linear (+ its ShortConvolution, states carried) token by token; the returned views write
    into the fused conv state; convs that do not follow the linears are refused."""
    from hybrid_attention.modules import fuse_inputs

    torch.manual_seed(3)
    lins = [nn.Linear(8, n, bias=False).double() for n in (6, 4, 3)]
    convs = [ShortConvolution(n, 4, "silu").double() for n in (6, 4)]
    states = [torch.randn(2, n, 3, dtype=F64) for n in (6, 4)]
    fused, views = fuse_inputs(lins, convs, states, "cpu", F64)
    x = torch.randn(2, 5, 8, dtype=F64)
    refs = [conv(lin(x), st)[0] for lin, conv, st in zip(lins, convs, states)] + [lins[2](x)]
    steps = [fused(x[:, t]) for t in range(5)]
    for i, ref in enumerate(refs):
        torch.testing.assert_close(torch.stack([s[i] for s in steps], 1), ref, rtol=0, atol=1e-12)
    views[1].zero_()
    assert fused.conv_state[:, 6:].abs().max() == 0 and fused.conv_state[:, :6].abs().max() > 0
    with pytest.raises(ValueError, match="convs must follow the first linears"):
        fuse_inputs(lins, convs[::-1], states[::-1], "cpu", F64)
