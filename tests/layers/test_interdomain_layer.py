"""InterdomainAttention and its ablations against a slow, independent per-token implementation of spec §2.2.

The reference below re-derives every step from the paper's equations (manual causal convolution, RoPE as a complex
rotation, explicit complex S4D recurrence, explicit U/Γ readout) and only borrows the layer's *weights*.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from hybrid_attention.layers import InterdomainAttention, S4DBilinearMixer, S4DMixer, SoftmaxAttention

D_MODEL, H, DH, M, T = 16, 2, 8, 5, 13


def _conv(x, w):
    """Causal depthwise conv by explicit sums. x [T, C], w [C, 1, K]."""
    k = w.shape[-1]
    xp = torch.cat([x.new_zeros(k - 1, x.shape[1]), x])
    return torch.stack([(xp[t : t + k].T * w[:, 0]).sum(-1) for t in range(x.shape[0])])


def _rope(x, theta=10000.0):
    """RoPE as a complex rotation of the pairs (i, i + D/2). x [T, H, D]."""
    d = x.shape[-1]
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :])
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rot = torch.exp(1j * torch.arange(x.shape[0], dtype=torch.float64)[:, None] * freq)[:, None, :]
    z = z * rot
    return torch.cat([z.real, z.imag], -1)


def _rms(x, w, b, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w + b


def _xi(z):
    s = F.silu(z)
    return s / torch.sqrt((s * s).sum(-1, keepdim=True) + 1e-6)


def reference(layer: InterdomainAttention, x: torch.Tensor) -> torch.Tensor:
    """x [T, d] -> y [T, d], one sequence, token by token."""
    p = layer.proj
    rope = _rope if layer.rotary is not None else (lambda z: z)
    heads = lambda z: z.view(z.shape[0], H, DH)  # noqa: E731
    key_name, val_name = ("k", "v") if layer.dual_input else ("a", "b")
    key = heads(_conv(x @ p[key_name].weight.T, layer.convs[key_name].weight))
    key = rope(key)
    if layer.dual_input:
        key = _xi(key)
    gain = layer.ssm.B  # per-channel input gain [R + D]
    key = _rms(key, layer.key_norm.weight, layer.key_norm.bias) * gain[:DH]
    val = x @ p[val_name].weight.T
    if not layer.dual_input:
        val = _conv(val, layer.convs[val_name].weight)
    val = _rms(heads(val), layer.value_norm.weight, layer.value_norm.bias) * gain[DH:]
    if layer.query_readout:
        q = _xi(rope(heads(_conv(x @ p["q"].weight.T, layer.convs["q"].weight))))
    s = layer.ssm
    a = torch.complex(-torch.exp(s.A_log_re), s.A_im)
    dt = torch.exp(s.log_dt)[:, None]
    lam = torch.exp(dt * a)
    bbar = (lam - 1) / a  # ZOH of the unit per-mode input
    c = torch.complex(s.C[..., 0], s.C[..., 1])
    linear = layer.contraction == "linear"
    out = torch.zeros(T, H, 2 * DH if linear else DH, dtype=torch.float64)
    for h in range(H):
        X = torch.zeros(M, 2 * DH + 1, dtype=torch.complex128)
        for t in range(T):
            z = torch.cat([key[t, h], val[t, h], torch.ones(1, dtype=torch.float64)]).to(torch.complex128)
            X = lam[h][:, None] * X + bbar[h][:, None] * z[None, :]
            Y = c[h] @ X
            U, G, eta = Y[:, :DH], Y[:, DH : 2 * DH], Y[:, 2 * DH]
            if layer.query_readout:
                qt = q[t, h].to(torch.complex128)
                def read(g, qt=qt, qr=q[t, h], U=U):  # the three readouts, written out
                    if layer.readout == "transpose":
                        return (qt @ U.T @ g).real
                    if layer.readout == "hermitian":
                        return (qt @ U.conj().T @ g).real
                    return (qr @ U.real.T) @ g.real

                num = read(G)
                if layer.denominator:
                    num = num / read(eta)
                out[t, h] = num
            elif linear:  # y = Re(wᵀ C X) over the 2 d_h channels
                out[t, h] = (layer.contraction_w[h].to(torch.complex128) @ Y[:, : 2 * DH]).real
            else:
                out[t, h] = (U * G).sum(0).real
    o = out.reshape(T, -1)
    if layer.c_out is not None:
        o = o @ layer.c_out.weight.T
    if layer.g_proj is not None:
        o = torch.sigmoid(x @ layer.g_proj.weight.T) * o
    return o @ layer.o_proj.weight.T


FLAGS = [
    dict(),
    dict(rope=False),
    dict(denominator=True),
    dict(output_gate=True),
    dict(dual_input=False),
    dict(query_readout=False),
    dict(query_readout=False, contraction="bilinear"),
    dict(dual_input=False, query_readout=False, rope=False),
    dict(dual_input=False, query_readout=False, rope=False, contraction="bilinear"),
    dict(readout="hermitian"),
    dict(readout="real"),
    dict(readout="hermitian", denominator=True),
    dict(readout="real", dual_input=False, output_gate=True),
]


def _layer(**flags):
    torch.manual_seed(3)
    layer = InterdomainAttention(D_MODEL, H, DH, state_size=M, chunk_size=4, **flags).double()
    with torch.no_grad():
        layer.ssm.log_dt.uniform_(-3, 0)
        layer.ssm.B.normal_()
        if layer.contraction_w is not None:
            layer.contraction_w.normal_()
        layer.key_norm.bias.normal_()
        layer.value_norm.weight.normal_()
    return layer


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()) or "full")
def test_layer_matches_spec_reference(flags):
    layer = _layer(**flags)
    x = torch.randn(1, T, D_MODEL, dtype=torch.float64)
    y, _ = layer(x)
    torch.testing.assert_close(y[0], reference(layer, x[0]), rtol=1e-9, atol=1e-10)


def test_s4d_mixer_is_the_generic_no_query_cell():
    torch.manual_seed(3)
    s4d = S4DMixer(D_MODEL, H, DH, state_size=M).double()
    assert not s4d.query_readout and not s4d.dual_input and s4d.rotary is None and s4d.c_out is None
    assert s4d.contraction == "linear" and tuple(s4d.contraction_w.shape) == (H, M)
    assert s4d.o_proj.in_features == 2 * H * DH  # one output map R^{2d} -> R^d for C_out and W_O
    x = torch.randn(1, T, D_MODEL, dtype=torch.float64)
    torch.testing.assert_close(s4d(x)[0][0], reference(s4d, x[0]), rtol=1e-9, atol=1e-10)
    bil = S4DBilinearMixer(D_MODEL, H, DH, state_size=M).double()
    assert bil.contraction == "bilinear" and bil.c_out is not None and bil.contraction_w is None
    torch.testing.assert_close(bil(x)[0][0], reference(bil, x[0]), rtol=1e-9, atol=1e-10)
    with pytest.raises(ValueError, match="query_readout"):
        S4DMixer(D_MODEL, H, DH, query_readout=True)
    with pytest.raises(ValueError, match="contraction"):
        S4DMixer(D_MODEL, H, DH, contraction="bilinear")


def test_s4d_control_is_linear_in_its_ssm_input():
    """With the linear contraction the S4D core + readout is linear: a layer whose projections/norms are bypassed
    (inputs fed directly) obeys superposition; checked through the op the layer calls."""
    from hybrid_attention.ops.s4d import s4d

    torch.manual_seed(0)
    layer = S4DMixer(D_MODEL, H, DH, state_size=M).double()
    log_lam, bbar, c = layer.ssm()
    z1, z2 = (torch.randn(2, T, H, DH, dtype=torch.float64) for _ in range(2))
    w = layer.contraction_w
    f = lambda z: s4d(z[0][None], z[1][None], log_lam, bbar, c, w)[0]  # noqa: E731
    torch.testing.assert_close(f(2.0 * z1 - 3.0 * z2), 2.0 * f(z1) - 3.0 * f(z2), rtol=1e-12, atol=1e-12)


def test_bad_readout_or_contraction_is_one_clear_line():
    with pytest.raises(ValueError, match="readout must be one of transpose, hermitian, real, got 'x'"):
        InterdomainAttention(D_MODEL, H, DH, readout="x")
    with pytest.raises(ValueError, match="contraction must be one of linear, bilinear, got 'y'"):
        InterdomainAttention(D_MODEL, H, DH, query_readout=False, contraction="y")


@pytest.mark.parametrize("flag", ["rope", "denominator", "output_gate"])
def test_each_flag_changes_the_output(flag):
    """Same weights (the flag adds no parameter or the extra one is ignored), different computation."""
    x = torch.randn(1, T, D_MODEL, dtype=torch.float64)
    base = _layer()
    other = _layer(**{flag: not getattr(base, flag, base.rotary is not None if flag == "rope" else False)})
    other.load_state_dict(base.state_dict(), strict=False)
    assert (base(x)[0] - other(x)[0]).abs().max() > 1e-6


def test_denominator_needs_query():
    with pytest.raises(ValueError, match="denominator"):
        InterdomainAttention(D_MODEL, H, DH, query_readout=False, denominator=True)


def test_state_size_formulas():
    idl = InterdomainAttention(64, 4, 16, state_size=8)
    assert idl.state_size(1) == idl.state_size(10**6) == 2 * 4 * 8 * (16 + 16)
    assert S4DMixer(64, 4, 16, state_size=8).state_size(7) == idl.state_size(7)  # iso-state control
    sm = SoftmaxAttention(64, 4, 16)
    assert sm.state_size(0) == 0 and sm.state_size(100) == 100 * 2 * 4 * 16
    # the actual decode state holds exactly that many reals (complex = 2 reals), conv buffers aside
    st = idl.init_state(1)
    assert 2 * st.ssm.numel() == idl.state_size(1)


def test_s4d_inv_init_and_zoh():
    layer = InterdomainAttention(D_MODEL, H, DH, state_size=M).double()
    s = layer.ssm
    n = torch.arange(M, dtype=torch.float64)
    torch.testing.assert_close(s.A_im[0], (2 * M / math.pi) * (2 * M / (2 * n + 1) - 1))  # S4D-Inv, N = 2M
    assert (s.A_im >= 0).all()
    torch.testing.assert_close(s.B, torch.ones(2 * DH, dtype=torch.float64))  # per-channel gain, initialised to 1
    torch.testing.assert_close(-torch.exp(s.A_log_re), torch.full((H, M), -0.5, dtype=torch.float64))
    dt = torch.exp(s.log_dt)
    assert ((dt >= 1e-3) & (dt <= 1e-1)).all()
    log_lam, bbar, _ = s()
    a = s.A()
    torch.testing.assert_close(bbar, (torch.exp(log_lam) - 1) / a)  # ZOH of the unit per-mode input
