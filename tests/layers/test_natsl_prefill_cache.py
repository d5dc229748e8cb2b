"""The NAtS-L prefill's compacted cache without host reads: the fixed-size gather equals the decode path's
``nonzero`` scatter, forced routing knows its slot count on the host, and ``prefill_cache="full"`` (no sync) gives
the same outputs and an equivalent state as the default "trim" (one sync)."""

from __future__ import annotations

import pytest
import torch

from hybrid_attention.layers import NatsLAttention
from hybrid_attention.layers.natsl.routing import RoutingSpec

D, HL, DK, HS, C = 24, 2, 8, 4, 4


def _layer(**kw) -> NatsLAttention:
    torch.manual_seed(5)
    layer = NatsLAttention(D, HL, DK, expand_v=2, num_attn_heads=HS, chunk_size=C, **kw).double()
    with torch.no_grad():
        layer.score_proj.weight.normal_(0, 1.0)  # decisive, diverse routing
    return layer


@pytest.mark.parametrize("prior", [0, 3])
def test_gather_equals_the_scatter(prior):
    """_append_chunks with a host capacity (the gather) writes what the decode path's scatter writes, onto an empty
    or a non-empty cache; slots beyond the scatter's are empty (zero, invalid)."""
    layer = _layer()
    b, n, hn = 3, 7, HL
    g = torch.Generator().manual_seed(prior)
    k = torch.randn(b, n * C, HS, layer.attn_head_dim, generator=g, dtype=torch.float64)
    v = torch.randn(b, n * C, HS, layer.attn_head_v_dim, generator=g, dtype=torch.float64)
    sel = torch.rand(b, n, hn, generator=g) < 0.5
    sel[0, :, 0] = True  # a (row, head) keeping every chunk, and one keeping none
    sel[1, :, 1] = False

    def state():
        st = layer.init_state(b, dtype=torch.float64)
        if prior:
            first = torch.rand(b, prior, hn, generator=torch.Generator().manual_seed(9)) < 0.5
            layer._append_chunks(st, k[:, : prior * C], v[:, : prior * C], first)
        return st

    ref, got = state(), state()
    layer._append_chunks(ref, k, v, sel)
    bound = int(got.n_kept.max()) + n + 2  # any host bound >= the largest kept count
    layer._append_chunks(got, k, v, sel, capacity=bound)
    assert torch.equal(got.n_kept, ref.n_kept)
    assert got.valid.shape[-1] == bound
    m = ref.valid.shape[-1]
    assert torch.equal(got.valid[..., :m], ref.valid) and not got.valid[..., m:].any()
    for a, r in ((got.k_cache, ref.k_cache), (got.v_cache, ref.v_cache)):
        assert torch.equal(a[:, :, : m * C], r) and not a[:, :, m * C :].any()


@pytest.mark.parametrize("force", ["softmax", "gdn", 0.0, 0.25, 1 / 3, 0.5, 1.0])
def test_forced_count_is_the_device_count(force):
    spec = RoutingSpec(force)
    for n in (0, 1, 2, 7, 64, 1000):
        hard = torch.zeros(2, n, 3, 2, dtype=torch.float32)
        assert spec.apply(hard, 0)[..., 0].sum(1).eq(spec.forced_count(n)).all()  # every row and head, n = 0 too
    assert RoutingSpec(None).forced_count(5) is None


@pytest.mark.parametrize("force", [None, 0.5, "softmax", "gdn"])
@pytest.mark.parametrize("t", [3, 4, 17, 32])
def test_full_prefill_cache_equals_trim(force, t):
    """Same outputs bit for bit; the states differ only by empty slots; decoding on from either agrees to 1e-12."""
    trim, full = _layer(force_routing=force), _layer(force_routing=force, prefill_cache="full")
    x = torch.randn(2, t + 9, D, dtype=torch.float64)
    y_t, st_t = trim(x[:, :t], output_state=True)
    y_f, st_f = full(x[:, :t], output_state=True)
    assert torch.equal(y_t, y_f)
    assert torch.equal(st_t.n_kept, st_f.n_kept)
    m = st_t.valid.shape[-1]
    assert st_f.valid.shape[-1] == (m if force is not None else t // C)  # forced: the exact count, no padding
    assert torch.equal(st_f.valid[..., :m], st_t.valid) and not st_f.valid[..., m:].any()
    assert torch.equal(st_f.k_cache[:, :, : m * C], st_t.k_cache)
    z_t, _ = trim(x[:, t:], st_t)
    z_f, _ = full(x[:, t:], st_f)
    torch.testing.assert_close(z_f, z_t, rtol=0, atol=1e-12)


def test_full_prefill_state_loads_into_a_static_state():
    trim, full = _layer(), _layer(prefill_cache="full")
    x = torch.randn(2, 6 * C + 1, D, dtype=torch.float64)
    statics = []
    for layer in (trim, full):
        _, st = layer(x, output_state=True)
        static = layer.init_static_state(2, 8 * C, dtype=torch.float64, use_kernels=False,
                                         cache_chunks=int(st.n_kept.max()))
        layer.load_static_state(static, st)
        statics.append(static)
    for a, b in zip(statics[0].buffers(), statics[1].buffers(), strict=True):
        assert torch.equal(a, b)


def test_prefill_cache_is_validated():
    with pytest.raises(ValueError, match="prefill_cache"):
        _layer(prefill_cache="max")
