"""Building blocks: ShortConvolution state carry, RoPE relative-position property, norms, SwiGLU sizes."""

import pytest
import torch

from hybrid_attention.modules import HeadRMSNorm, RMSNorm, RotaryEmbedding, ShortConvolution, swiglu_hidden_size


@pytest.mark.parametrize("activation", [None, "silu"])
def test_short_conv_pieces_equal_whole(activation):
    conv = ShortConvolution(6, 4, activation).double()
    x = torch.randn(2, 11, 6, dtype=torch.float64)
    full, _ = conv(x)
    st, outs = None, []
    for a, b in [(0, 1), (1, 2), (2, 7), (7, 11)]:
        y, st = conv(x[:, a:b], st, output_final_state=True)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), full)
    # causal and exactly depthwise with kernel 4: y_t = sum_j w[c, j] x_{t-3+j}
    xp = torch.cat([x.new_zeros(2, 3, 6), x], 1)
    manual = sum(conv.weight[:, 0, j] * xp[:, j : j + 11] for j in range(4))
    if activation == "silu":
        manual = torch.nn.functional.silu(manual)
    torch.testing.assert_close(full, manual)


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("with_state", [False, True])
def test_short_conv_compiled_form_equals_conv1d(activation, with_state):
    """Under torch.compile the convolution is written as K shifted products (fused by inductor); outputs, final state
    and every gradient equal the eager F.conv1d form (float64)."""
    torch.manual_seed(1)
    conv = ShortConvolution(5, 4, activation).double()
    x = torch.randn(2, 9, 5, dtype=torch.float64, requires_grad=True)
    st = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True) if with_state else None
    compiled = torch.compile(conv, backend="eager", fullgraph=True)
    results = []
    for fn in (conv, compiled):
        y, new = fn(x, st, output_final_state=True)
        (y * torch.linspace(-1, 1, 5, dtype=torch.float64)).sum().add_((new**2).sum()).backward()
        grads = [t.grad.clone() for t in (x, conv.weight) + ((st,) if with_state else ())]
        for t in (x, conv.weight) + ((st,) if with_state else ()):
            t.grad = None
        results.append((y.detach(), new.detach(), grads))
    (y0, s0, g0), (y1, s1, g1) = results
    torch.testing.assert_close(y1, y0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s1, s0, rtol=0, atol=0)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_short_conv_rejects_bad_args():
    with pytest.raises(ValueError, match="activation"):
        ShortConvolution(4, 4, "relu")
    with pytest.raises(ValueError, match="channels"):
        ShortConvolution(4)(torch.randn(1, 3, 5))


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(8)
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)
    s1 = (rope(q, 10) * rope(k, 3)).sum()
    s2 = (rope(q, 107) * rope(k, 100)).sum()
    torch.testing.assert_close(s1, s2)
    x = torch.randn(2, 9, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(rope(x, 0)[:, 4:], rope(x[:, 4:], 4))  # offsets compose
    torch.testing.assert_close(rope(x).norm(dim=-1), x.norm(dim=-1))  # a rotation


def test_norms():
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64)
    n = HeadRMSNorm(3, 4, bias=True).double()
    with torch.no_grad():
        n.bias.normal_()
    y = n(x)
    manual = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) + n.bias
    torch.testing.assert_close(y, manual)
    r = RMSNorm(4).bfloat16()
    assert r(torch.randn(3, 4, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_swiglu_sizes_match_the_paper():
    assert [swiglu_hidden_size(d) for d in (768, 1024, 1536, 2048)] == [2048, 2816, 4096, 5504]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_rope_table_rows_equal_the_angle_math(dtype):
    """`at_table` (static decode steps: a row of the precomputed table) gives exactly what `at` computes, for one
    position, positions [T] and per-row positions [B, T]; one shared table per (dim, theta, length, device, dtype)."""
    rope = RotaryEmbedding(16, theta=500.0)
    table = rope.table(300, "cpu", dtype)
    assert table.shape == (300, 2, 16) and table.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert rope.table(300, "cpu", dtype) is table and rope.table(301, "cpu", dtype) is not table
    g = torch.Generator().manual_seed(0)
    for x, pos in [(torch.randn(3, 1, 2, 16, generator=g), torch.tensor(299)),
                   (torch.randn(2, 5, 2, 16, generator=g), torch.tensor([0, 7, 64, 65, 250])),
                   (torch.randn(3, 1, 2, 16, generator=g), torch.tensor([[3], [0], [298]]))]:
        x = x.to(dtype)
        torch.testing.assert_close(rope.at_table(x, table, pos), rope.at(x, pos), rtol=0, atol=0)
    assert not torch.equal(rope.at_table(x, table, pos), x)  # it rotates


def test_short_conv_fla_backend_dispatch(monkeypatch):
    """backend="fla": the stateless training call (dense or packed) goes to fla's ``causal_conv1d`` with the [D, K]
    weight and the activation; a call with a state or a final state runs the library's own form (the same values as
    "reference"); without fla installed the stateless call raises one line naming the package."""
    from hybrid_attention.modules import conv as conv_mod
    from hybrid_attention.ops.causal_conv import naive_causal_conv1d

    calls = []

    def fake_fla(x, weight, activation=None, cu_seqlens=None):
        calls.append((tuple(weight.shape), activation, cu_seqlens))
        return naive_causal_conv1d(x, weight, activation=activation, cu_seqlens=cu_seqlens)

    monkeypatch.setattr(conv_mod, "_fla_causal_conv1d", lambda: fake_fla)
    ref = ShortConvolution(6, 4, "silu").double()
    fla = ShortConvolution(6, 4, "silu", backend="fla").double()
    fla.load_state_dict(ref.state_dict())
    x = torch.randn(1, 11, 6, dtype=torch.float64)
    torch.testing.assert_close(fla(x)[0], ref(x)[0])
    cu = torch.tensor([0, 4, 11])
    torch.testing.assert_close(fla(x, cu_seqlens=cu)[0], ref(x, cu_seqlens=cu)[0])
    assert calls == [((6, 4), "silu", None), ((6, 4), "silu", cu)]
    state = torch.randn(1, 6, 3, dtype=torch.float64)
    for args in ((x, state), (x, None, True)):
        got, want = fla(*args), ref(*args)
        torch.testing.assert_close(got[0], want[0])
        if want[1] is not None:
            torch.testing.assert_close(got[1], want[1])
    assert len(calls) == 2
    monkeypatch.undo()
    monkeypatch.setitem(__import__("sys").modules, "fla.modules.causal_conv1d", None)
    with pytest.raises(RuntimeError, match="backend 'fla' needs flash-linear-attention"):
        fla(x)
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'reference', 'triton', 'fla'"):
        ShortConvolution(4, 4, backend="flash")
