"""The layer contract (layers/base.py) for every mixer: decode == prefill, pieces == whole, static steps == eager decode
== full forward, causality, batch rows independent, init_state == no state. float64 on CPU, so agreement is to
rounding."""

import pytest
import torch
from mixer_cases import HIDDEN, MIXER_CASES

T = 23  # not a multiple of any chunk size used


def _make(name):
    torch.manual_seed(1)
    layer = MIXER_CASES[name]().double().eval()
    # Make SSM decays diverse and not all slow, so the tests see state actually flowing across chunks.
    ssm = getattr(layer, "ssm", None)
    if ssm is not None:
        with torch.no_grad():
            ssm.log_dt.uniform_(-3.0, 0.0)
            ssm.B.normal_()
    return layer


def _x(b=2, t=T):
    return torch.randn(b, t, HIDDEN, dtype=torch.float64)


@pytest.mark.parametrize("name", sorted(MIXER_CASES))
def test_prefill_then_decode_matches_full(name):
    layer, x = _make(name), _x()
    full, _ = layer(x)
    y, st = layer(x[:, :9], layer.init_state(2, dtype=torch.float64))
    outs = [y]
    for t in range(9, T):
        y, st = layer(x[:, t : t + 1], st)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-10)


def _static_steps(layer, x, t0, static):
    """Static steps over x[:, t0:] (positions as 0-d device tensors, chunk ends from the host position)."""
    c = layer.step_chunk_size()
    return torch.cat([layer.step(x[:, t:t + 1], static, torch.tensor(t), c is not None and (t + 1) % c == 0)
                      for t in range(t0, x.shape[1])], 1)


@pytest.mark.parametrize("name", sorted(MIXER_CASES))
@pytest.mark.parametrize("t0", [9, 12])  # mid-chunk; chunk-aligned for the NAtS-L cases (C = 4)
def test_static_steps_match_eager_decode_and_full(name, t0):
    """Prefill t0 tokens, copy the state into static buffers (max_len = T), then one `step` per token: equal to the
    eager one-token decode and to the full forward pass."""
    layer, x = _make(name), _x()
    full, _ = layer(x)
    _, st = layer(x[:, :t0], layer.init_state(2, dtype=torch.float64))
    static = layer.init_static_state(2, T, device="cpu", dtype=torch.float64)
    layer.load_static_state(static, st)
    eager = []
    for t in range(t0, T):
        y, st = layer(x[:, t:t + 1], st)
        eager.append(y)
    with torch.no_grad():
        steps = _static_steps(layer, x, t0, static)
    torch.testing.assert_close(steps, torch.cat(eager, 1), rtol=0, atol=1e-10)
    torch.testing.assert_close(steps, full[:, t0:], rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(MIXER_CASES))
def test_static_steps_from_empty_state(name):
    """A fresh static state is the state of an empty prefix: steps from position 0 reproduce the full forward."""
    layer, x = _make(name), _x()
    full, _ = layer(x)
    with torch.no_grad():
        steps = _static_steps(layer, x, 0, layer.init_static_state(2, T, device="cpu", dtype=torch.float64))
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(MIXER_CASES))
@pytest.mark.parametrize("cuts", [(1,), (5, 6), (3, 10, 17), (22,)])
def test_pieces_match_full(name, cuts):
    layer, x = _make(name), _x()
    full, _ = layer(x)
    st, outs, prev = None, [], 0
    for c in (*cuts, T):
        y, st = layer(x[:, prev:c], st, output_state=True)
        outs.append(y)
        prev = c
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(MIXER_CASES))
def test_init_state_equals_no_state(name):
    layer, x = _make(name), _x()
    a, _ = layer(x)
    b, st = layer(x, layer.init_state(2, dtype=torch.float64))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert st is not None


@pytest.mark.parametrize("name", sorted(MIXER_CASES))
def test_causal(name):
    layer, x = _make(name), _x()
    y1, _ = layer(x)
    x2 = x.clone()
    x2[:, 11:] = torch.randn_like(x2[:, 11:])
    y2, _ = layer(x2)
    torch.testing.assert_close(y1[:, :11], y2[:, :11], rtol=0, atol=1e-12)
    assert (y1[:, 11:] - y2[:, 11:]).abs().max() > 1e-6  # the future does change the future


@pytest.mark.parametrize("name", sorted(MIXER_CASES))
def test_batch_rows_independent(name):
    layer, x = _make(name), _x(b=3)
    y, _ = layer(x)
    for i in range(3):
        yi, _ = layer(x[i : i + 1])
        # rtol: BLAS may sum a batch of 3 in another order than a batch of 1 (float64 rounding, 4e-14 relative on
        # the denominator case's outputs of size ~70 on some CPUs); a leak between rows would be far above this
        torch.testing.assert_close(yi, y[i : i + 1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(MIXER_CASES))
def test_float32_runs_and_is_close(name):
    layer = _make(name)
    x = _x()
    ref, _ = layer(x)
    y, _ = layer.float()(x.float())
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), ref, rtol=1e-3, atol=1e-4)
