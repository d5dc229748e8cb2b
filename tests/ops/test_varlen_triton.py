"""Packed documents (``cu_seqlens``) through the Triton kernels of ``gated_delta`` and ``chunk_attention`` (and
``natsl_mixed``, which composes them): the packed fp32 Triton run == each document run alone through the float64
reference form, for outputs, final states and the gradient of every input.

Runs on CPU under the Triton interpreter (``TRITON_INTERPRET=1``, fp32, tiny shapes) or on CUDA. Document lengths 1,
below, equal to and across the chunk size, T not a multiple of it; buffers NaN-poisoned (``config(poison=True)``),
so an element a kernel skips shows up. The controls show that the comparison can fail.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_gated_delta_triton import BF16_TOL
from triton_device import DEVICE

from hybrid_attention.ops.chunk_attention import chunk_attention, naive_chunk_attention
from hybrid_attention.ops.chunk_attention.triton import ChunkAttentionConfig, triton_chunk_attention
from hybrid_attention.ops.common import varlen
from hybrid_attention.ops.common.backend import resolve_backend
from hybrid_attention.ops.common.varlen import check_packed, chunk_table, cu_seqlens_from_lengths, max_chunks
from hybrid_attention.ops.gated_delta import chunk_gated_delta, gated_delta
from hybrid_attention.ops.gated_delta.triton import HAS_TRITON as TRITON_AVAILABLE
from hybrid_attention.ops.gated_delta.triton import GatedDeltaConfig, triton_gated_delta
from hybrid_attention.ops.natsl_mixed import natsl_mixed

pytestmark = [
    pytest.mark.skipif(not TRITON_AVAILABLE, reason="triton is not installed"),
    pytest.mark.triton,  # CUDA, or the CPU interpreter (triton_device.py)
]
TOL = 2e-5 if DEVICE == "cpu" else 5e-3  # interpreter: exact fp32 dots; GPU: tf32 dots (as test_gated_delta_triton)
C = 16
LENGTHS = (1, 5, 16, 37)  # 1, below, equal to, across the chunk size; T = 59 is not a multiple of C
F64 = torch.float64


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error norm (absolute when the reference norm is below 1, e.g. a gradient that is exactly 0)."""
    return ((a.double().cpu() - b.double()).norm() / max(b.double().norm().item(), 1.0)).item()


def n_chunks(lengths: tuple[int, ...], chunk: int = C) -> int:
    return sum(math.ceil(n / chunk) for n in lengths)


def _loss(o: torch.Tensor, S: torch.Tensor | None) -> torch.Tensor:
    """A fixed non-uniform weighting of every output (and final-state) element."""
    loss = (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype, device=o.device).view_as(o)).sum()
    if S is not None:
        loss = loss + (S * torch.linspace(1, -1, S.numel(), dtype=S.dtype, device=S.device).view_as(S)).sum()
    return loss


def _grads(loss: torch.Tensor, xs: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    leaves = [x for x in xs if x is not None]
    gs = iter(torch.autograd.grad(loss, leaves))
    return [next(gs) if x is not None else None for x in xs]


# ---------------------------------------------------------------------------------------------------------------------
# gated delta


def _gdn_inputs(lengths, commit_kind: str, with_s0: bool, seed: int, H: int = 2, K: int = 16, V: int = 32,
                chunk: int = C):
    gen = torch.Generator().manual_seed(seed)
    T, N, Nc = sum(lengths), len(lengths), n_chunks(lengths, chunk)
    q, k = torch.randn(1, T, H, K, generator=gen), torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, H, V, generator=gen)
    g = -0.6 * torch.rand(1, T, H, generator=gen)
    beta = torch.rand(1, T, H, generator=gen)
    commit = {"none": None, "random": torch.randint(0, 2, (1, Nc, H), generator=gen).float(),
              "relaxed": torch.rand(1, Nc, H, generator=gen)}[commit_kind]
    S0 = torch.randn(N, H, K, V, generator=gen) if with_s0 else None
    return [q, k, v, g, beta, commit, S0]


def _gdn_separate(xs, lengths, decay_uncommitted: bool, chunk: int = C):
    """Each document alone through the float64 chunk reference, joined: (o [1, T, ...], S [N, ...])."""
    q, k, v, g, beta, commit, S0 = xs
    offs = cu_seqlens_from_lengths(lengths).tolist()
    os_, ss = [], []
    c0 = 0
    for i, n in enumerate(lengths):
        t = slice(offs[i], offs[i + 1])
        nc = math.ceil(n / chunk)
        o, S = chunk_gated_delta(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t],
                                 commit=commit[:, c0:c0 + nc] if commit is not None else None, chunk_size=chunk,
                                 initial_state=S0[i:i + 1] if S0 is not None else None, output_final_state=True,
                                 decay_uncommitted=decay_uncommitted)
        c0 += nc
        os_.append(o)
        ss.append(S)
    return torch.cat(os_, 1), torch.cat(ss, 0)


def _leaf(x: torch.Tensor | None, dtype: torch.dtype, dev: str) -> torch.Tensor | None:
    return x.detach().to(dev, dtype).clone().requires_grad_() if x is not None else None


GDN_NAMES = ["o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dcommit", "dS0"]


@pytest.mark.parametrize("commit_kind,decay_uncommitted,with_s0,chunk,local_dv", [
    ("none", True, False, C, "bwd_local"),
    ("random", True, True, C, "bwd_local"),
    ("relaxed", False, True, C, "bwd_local"),
    ("relaxed", True, True, 32, "bwd_local"),  # (1, 5, 16, 37) at C = 32: 1, below, below, across
    ("random", True, True, C, "state_bwd"),  # bf16 buffers: the state backward forms the local value gradient
])
def test_gated_delta_packed_matches_separate(commit_kind: str, decay_uncommitted: bool, with_s0: bool,
                                             chunk: int, local_dv: str) -> None:
    buffers, tol = ("bf16", BF16_TOL) if local_dv == "state_bwd" else ("auto", TOL)  # "auto": fp32 buffers here
    inputs = _gdn_inputs(LENGTHS, commit_kind, with_s0, seed=len(commit_kind) + 10 * with_s0, chunk=chunk)
    ref_xs = [_leaf(x, F64, "cpu") for x in inputs]
    o_ref, S_ref = _gdn_separate(ref_xs, LENGTHS, decay_uncommitted, chunk)
    g_ref = _grads(_loss(o_ref, S_ref), ref_xs)

    xs = [_leaf(x, torch.float32, DEVICE) for x in inputs]
    q, k, v, g, beta, commit, S0 = xs
    o, S = triton_gated_delta(q, k, v, g, beta, commit=commit, chunk_size=chunk, initial_state=S0,
                              output_final_state=True, decay_uncommitted=decay_uncommitted,
                              config=GatedDeltaConfig(poison=True, local_dv=local_dv, buffer_dtype=buffers),
                              cu_seqlens=cu_seqlens_from_lengths(LENGTHS))
    assert o.shape == o_ref.shape and S.shape == (len(LENGTHS), *S_ref.shape[1:])
    g_tri = _grads(_loss(o.double(), S.double()), xs)
    for name, a, b in zip(GDN_NAMES, [o, S, *g_tri], [o_ref, S_ref, *g_ref], strict=True):
        if b is None:
            assert a is None, name
            continue
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < tol, (name, rel(a, b))


def test_gated_delta_packed_forward_only_int64_offsets() -> None:
    """No-grad path, int64 offsets on the inputs' device, through the public op; the final states are per document."""
    inputs = _gdn_inputs((3, 17), "random", True, seed=3, V=16)
    q, k, v, g, beta, commit, S0 = (x.to(DEVICE) for x in inputs)
    cu = cu_seqlens_from_lengths((3, 17)).long().to(DEVICE)
    with torch.no_grad():
        o, S = gated_delta(q, k, v, g, beta, commit=commit, chunk_size=C, initial_state=S0, output_final_state=True,
                           backend="triton", cu_seqlens=cu)
    o_ref, S_ref = _gdn_separate([x.double().cpu() for x in inputs], (3, 17), True)
    assert rel(o, o_ref) < TOL and rel(S, S_ref) < TOL


def test_gated_delta_control_without_cu_seqlens_differs() -> None:
    """The comparison above can fail: the same packed row without cu_seqlens leaks the state across documents."""
    inputs = _gdn_inputs(LENGTHS, "none", False, seed=0, V=16)
    o_ref, _ = _gdn_separate([x.double() if x is not None else None for x in inputs], LENGTHS, True)
    q, k, v, g, beta, _, _ = (x.to(DEVICE) if x is not None else None for x in inputs)
    with torch.no_grad():
        o, _ = triton_gated_delta(q, k, v, g, beta, chunk_size=C)
    assert (o.double().cpu() - o_ref).abs().max().item() > 1e-3


# ---------------------------------------------------------------------------------------------------------------------
# chunk attention


def _attn_inputs(lengths, frac: float, seed: int, Hs: int = 4, G: int = 2, D: int = 16, chunk: int = C):
    gen = torch.Generator().manual_seed(seed)
    T, Nc = sum(lengths), n_chunks(lengths, chunk)
    q, k, v = (torch.randn(1, T, Hs, D, generator=gen) for _ in range(3))
    routing = torch.rand(1, Nc, Hs // G, generator=gen) < frac
    bias = 0.3 * torch.randn(1, Nc, Hs // G, generator=gen)
    return q, k, v, routing, bias


@pytest.mark.parametrize("lengths,frac,G,with_bias,dkv_qb,chunk", [
    (LENGTHS, 0.6, 2, True, 64, C),
    ((40, 19), 1.0, 2, True, 64, C),
    # dk/dv query steps of 16 < 32 rows (tl.dot's smallest tile on a GPU is 16): own chunk in two steps, the tiles
    # cross document ends
    ((21, 1, 35, 44), 0.7, 1, False, 16, 32),
])
def test_chunk_attention_packed_matches_separate(lengths: tuple[int, ...], frac: float, G: int, with_bias: bool,
                                                 dkv_qb: int, chunk: int) -> None:
    C = chunk  # noqa: N806 (the chunk size of this case)
    q, k, v, routing, bias = _attn_inputs(lengths, frac, seed=sum(lengths), Hs=2 * G, G=G, chunk=C)
    cu = cu_seqlens_from_lengths(lengths)
    ref = [_leaf(x, F64, "cpu") for x in (q, k, v, bias)]
    if not with_bias:
        ref[3] = None
    o_ref = naive_chunk_attention(*ref[:3], routing, chunk_size=C, group_size=G, routing_bias=ref[3], cu_seqlens=cu)
    g_ref = _grads(_loss(o_ref, None), ref)

    xs = [_leaf(x, torch.float32, DEVICE) for x in (q, k, v, bias)]
    if not with_bias:
        xs[3] = None
    o = triton_chunk_attention(*xs[:3], routing.to(DEVICE), chunk_size=C, group_size=G, routing_bias=xs[3],
                               config=ChunkAttentionConfig(dkv_qb=dkv_qb, poison=True), cu_seqlens=cu)
    g_tri = _grads(_loss(o.double(), None), xs)
    for name, a, b in zip(["o", "dq", "dk", "dv", "d_routing_bias"], [o, *g_tri], [o_ref, *g_ref], strict=True):
        if b is None:
            assert a is None, name
            continue
        assert torch.isfinite(a).all(), name
        assert rel(a, b) < TOL, (name, rel(a, b))


def test_chunk_attention_control_without_cu_seqlens_differs() -> None:
    """The comparison above can fail: with every chunk routed, the unpacked row attends across documents."""
    lengths = (40, 19)
    q, k, v, _, _ = _attn_inputs(lengths, 1.0, seed=1)
    cu = cu_seqlens_from_lengths(lengths)
    o_ref = naive_chunk_attention(q.double(), k.double(), v.double(), torch.ones(1, n_chunks(lengths), 2),
                                  chunk_size=C, group_size=2, cu_seqlens=cu)
    with torch.no_grad():
        o = triton_chunk_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE),
                                   torch.ones(1, math.ceil(sum(lengths) / C), 2, device=DEVICE), chunk_size=C,
                                   group_size=2)
    assert (o.double().cpu() - o_ref).abs().max().item() > 1e-3


# ---------------------------------------------------------------------------------------------------------------------
# natsl_mixed, dispatch, errors


def test_natsl_mixed_triton_packed_matches_reference() -> None:
    lengths = (5, 20)
    gq, gk, gv, g, beta, commit, S0 = _gdn_inputs(lengths, "random", True, seed=5, V=16)
    qa, ka, va, routing, bias = _attn_inputs(lengths, 0.6, seed=6)
    cu = cu_seqlens_from_lengths(lengths)
    outs = []
    for backend, dt, dev in (("triton", torch.float32, DEVICE), ("reference", F64, "cpu")):
        args = [x.to(dev, dt) for x in (gq, gk, gv, g, beta, commit, qa, ka, va)]
        with torch.no_grad():
            outs.append(natsl_mixed(*args, routing.to(dev), routing_bias=bias.to(dev, dt), chunk_size=C,
                                    group_size=2, initial_state=S0.to(dev, dt), output_final_state=True,
                                    backend=backend, cu_seqlens=cu))
    for name, a, b in zip(["o_gdn", "final_state", "o_attn"], *outs, strict=True):
        assert rel(a, b) < TOL, (name, rel(a, b))


def test_dispatch_takes_triton_for_packed_inputs() -> None:
    # "auto" follows `supported` when the op's Triton kernels take cu_seqlens; ops that still refuse keep falling back
    assert resolve_backend("auto", "op", True, varlen=True, no_varlen=()) == "triton"
    assert resolve_backend("auto", "op", True, varlen=True, no_varlen=("flex",)) == "triton"
    assert resolve_backend("auto", "op", False, varlen=True, no_varlen=()) == "reference"
    assert resolve_backend("auto", "op", True, varlen=True) == "reference"
    assert resolve_backend("triton", "op", True, varlen=True, no_varlen=()) == "triton"
    with pytest.raises(NotImplementedError, match="flex backend of chunk_attention"):
        q, k, v, routing, bias = _attn_inputs((3, 17), 0.5, seed=0)
        chunk_attention(q, k, v, routing, chunk_size=C, group_size=2, backend="flex",
                        cu_seqlens=cu_seqlens_from_lengths((3, 17)))


def test_packed_chunk_table() -> None:
    """The one table of every varlen kernel: real rows [0, Nc) are the global chunks in document order, then spare
    rows pointing past the last document's end (no tokens)."""
    tab = chunk_table(cu_seqlens_from_lengths((1, 16, 37, 9)), 63, C)
    assert tab.cu.dtype == tab.offsets.dtype == tab.indices.dtype == torch.int32
    assert tab.n_docs == 4 and tab.n_rows == max_chunks(63, 4, C) == 7  # Nc = 6: one spare row
    assert tab.offsets.tolist() == [0, 1, 2, 5, 6]
    assert tab.indices.tolist() == [[0, 0], [1, 0], [2, 0], [2, 1], [2, 2], [3, 0], [3, 1]]
    # (first token, end token) of each row as the kernels' table_row reads it: the last row is empty (t0 >= t1)
    cu = tab.cu.long()
    t0 = cu[tab.indices[:, 0].long()] + C * tab.indices[:, 1].long()
    t1 = torch.minimum(t0 + C, cu[tab.indices[:, 0].long() + 1])
    assert t0.tolist() == [0, 1, 17, 33, 49, 54, 70] and t1.tolist() == [1, 17, 33, 49, 54, 63, 63]


def test_host_side_reads_no_offsets_on_a_device(monkeypatch) -> None:
    """With device offsets the GDN / attention host side (``check_packed`` + ``chunk_table``) reads no value on the
    host: run on the meta device (no data at all: any .tolist() / .item() / int() of it raises) and with those
    reads patched to fail; every shape is static. CPU offsets are the control: they are read (checked in full)."""
    T, N = 59, 4
    cu = torch.empty(N + 1, dtype=torch.int32, device="meta")
    q = torch.empty(1, T, 2, 16, device="meta")
    commit = torch.empty(1, 6, 2, device="meta")
    reads = []
    for name in ("tolist", "item", "__int__", "__index__", "__bool__", "cpu", "numpy"):
        orig = getattr(torch.Tensor, name)

        def spy(self, *a, _orig=orig, _name=name, **kw):
            reads.append((_name, self.device.type))
            return _orig(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, spy)
    assert check_packed(cu, q, C, {"commit": commit}, torch.empty(N, 2, 16, 16, device="meta")) == N
    tab = chunk_table(cu, T, C)
    assert tab.indices.shape == (max_chunks(T, N, C), 2) and tab.offsets.shape == tab.cu.shape == (N + 1,)
    assert tab.indices.device.type == "meta" and not reads, reads
    # the bounds check of a per-chunk input stands in for the exact one
    with pytest.raises(ValueError, match=r"^commit must be \[1, Nc, \.\.\.\] with Nc in \[4, 7\]"):
        check_packed(cu, q, C, {"commit": torch.empty(1, 8, 2, device="meta")})
    # ... and it is what the Triton entry points run on device offsets (they fail before any launch here)
    g = torch.empty(1, T, 2, device="meta")
    with pytest.raises(ValueError, match=r"^commit must be \[1, Nc, \.\.\.\] with Nc in \[4, 7\]"):
        triton_gated_delta(q, q, q, g, g, commit=torch.empty(1, 3, 2, device="meta"), chunk_size=C, cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"^routing must be \[1, Nc, \.\.\.\] with Nc in \[4, 7\]"):
        triton_chunk_attention(q, q, q, torch.empty(1, 8, 1, device="meta"), chunk_size=C, group_size=2,
                               cu_seqlens=cu)
    assert not reads, reads
    check_packed(cu_seqlens_from_lengths(LENGTHS), q, C, {"commit": commit})  # control: CPU offsets are read
    assert ("tolist", "cpu") in reads


def test_triton_forms_build_the_one_table(monkeypatch) -> None:
    """The GDN and attention Triton forms (and natsl_mixed through them) pass the caller's offsets to the one
    builder as given (no host copy first) and launch their grids over its NT rows."""
    built = []
    orig = varlen.chunk_table

    def spy(cu_seqlens, total_len, chunk_size, device=None):
        built.append(cu_seqlens)
        return orig(cu_seqlens, total_len, chunk_size, device)

    import hybrid_attention.ops.chunk_attention.triton.function as ca_fn
    import hybrid_attention.ops.gated_delta.triton.function as gdn_fn

    monkeypatch.setattr(gdn_fn, "chunk_table", spy)
    monkeypatch.setattr(ca_fn, "chunk_table", spy)
    lengths = (9, 9, 9, 9)  # Nc = 4, NT = max_chunks(36, 4, 16) = 6: two spare rows
    gq, gk, gv, g, beta, commit, S0 = (x.to(DEVICE) for x in _gdn_inputs(lengths, "random", True, seed=2, V=16))
    qa, ka, va, routing, bias = (x.to(DEVICE) for x in _attn_inputs(lengths, 0.6, seed=2))
    cu = cu_seqlens_from_lengths(lengths).to(DEVICE)
    with torch.no_grad():
        natsl_mixed(gq, gk, gv, g, beta, commit, qa, ka, va, routing, routing_bias=bias, chunk_size=C, group_size=2,
                    initial_state=S0, output_final_state=True, backend="triton", cu_seqlens=cu)
    assert len(built) == 2 and all(b is cu for b in built)


def test_spare_rows_read_and_write_nothing() -> None:
    """Documents of 9 tokens at C = 16: 4 real chunk rows and 2 spare ones. The spare rows' programs return at once:
    the packed fp32 run equals the float64 per-document reference, and every output and gradient, poisoned buffers
    included, is finite and matched (a spare row that wrote into a real document, or a row skipped, would fail)."""
    lengths = (9, 9, 9, 9)
    assert max_chunks(36, 4, C) - n_chunks(lengths) == 2
    inputs = _gdn_inputs(lengths, "relaxed", True, seed=7, V=16)
    ref_xs = [_leaf(x, F64, "cpu") for x in inputs]
    o_ref, S_ref = _gdn_separate(ref_xs, lengths, False)
    g_ref = _grads(_loss(o_ref, S_ref), ref_xs)
    xs = [_leaf(x, torch.float32, DEVICE) for x in inputs]
    q, k, v, g, beta, commit, S0 = xs
    o, S = triton_gated_delta(q, k, v, g, beta, commit=commit, chunk_size=C, initial_state=S0,
                              output_final_state=True, decay_uncommitted=False, config=GatedDeltaConfig(poison=True),
                              cu_seqlens=cu_seqlens_from_lengths(lengths))
    g_tri = _grads(_loss(o.double(), S.double()), xs)
    for name, a, b in zip(GDN_NAMES, [o, S, *g_tri], [o_ref, S_ref, *g_ref], strict=True):
        assert a.shape == b.shape and torch.isfinite(a).all(), name
        assert rel(a, b) < TOL, (name, rel(a, b))

    qa, ka, va, routing, bias = _attn_inputs(lengths, 1.0, seed=8)
    cu = cu_seqlens_from_lengths(lengths)
    ref = [_leaf(x, F64, "cpu") for x in (qa, ka, va, bias)]
    o_ref = naive_chunk_attention(*ref[:3], routing, chunk_size=C, group_size=2, routing_bias=ref[3], cu_seqlens=cu)
    g_ref = _grads(_loss(o_ref, None), ref)
    xs = [_leaf(x, torch.float32, DEVICE) for x in (qa, ka, va, bias)]
    o = triton_chunk_attention(*xs[:3], routing.to(DEVICE), chunk_size=C, group_size=2, routing_bias=xs[3],
                               config=ChunkAttentionConfig(poison=True), cu_seqlens=cu)
    g_tri = _grads(_loss(o.double(), None), xs)
    for name, a, b in zip(["o", "dq", "dk", "dv", "d_routing_bias"], [o, *g_tri], [o_ref, *g_ref], strict=True):
        assert a.shape == b.shape and torch.isfinite(a).all(), name
        assert rel(a, b) < TOL, (name, rel(a, b))


def test_per_chunk_inputs_padded_to_max_chunks() -> None:
    """Per-chunk inputs of max_chunks(T, N, C) rows (the NAtS-L layer's sync-free packed routing) with junk past Nc:
    the same outputs and gradients of the real inputs and rows as with the exact Nc rows (spare rows never read)."""
    lengths = (9, 9, 9, 9)  # Nc = 4, max_chunks = 6
    nc, rows = n_chunks(lengths), max_chunks(36, 4, C)
    cu = cu_seqlens_from_lengths(lengths).to(DEVICE)
    junk = lambda x, val: torch.cat([x, torch.full_like(x[:, :1], val).expand(1, rows - nc, *x.shape[2:])], 1)  # noqa: E731
    inputs = _gdn_inputs(lengths, "relaxed", False, seed=3, V=16)
    results = []
    for pad in (False, True):
        xs = [_leaf(x, torch.float32, DEVICE) for x in inputs]
        q, k, v, g, beta, commit, _ = xs
        m = junk(commit, 0.5) if pad else commit
        o, S = triton_gated_delta(q, k, v, g, beta, commit=m, chunk_size=C, output_final_state=True, cu_seqlens=cu)
        results.append([o, S, *_grads(_loss(o, S), xs[:6])])
    for name, a, b in zip(GDN_NAMES, *results, strict=False):
        assert torch.equal(a, b), name
    qa, ka, va, routing, bias = _attn_inputs(lengths, 0.6, seed=4)
    results = []
    for pad in (False, True):
        xs = [_leaf(x, torch.float32, DEVICE) for x in (qa, ka, va, bias)]
        r, b = (junk(routing, True), junk(xs[3], 1.0)) if pad else (routing, xs[3])
        o = triton_chunk_attention(*xs[:3], r.to(DEVICE), chunk_size=C, group_size=2, routing_bias=b, cu_seqlens=cu)
        results.append([o, *_grads(_loss(o, None), xs)])
    for name, a, b in zip(["o", "dq", "dk", "dv", "d_routing_bias"], *results, strict=True):
        assert torch.equal(a, b), name


def test_bad_packed_inputs_one_line_errors() -> None:
    q, k, v, g, beta, commit, S0 = _gdn_inputs(LENGTHS, "random", True, seed=0, V=16)
    cu = cu_seqlens_from_lengths(LENGTHS)
    qa, ka, va, routing, bias = _attn_inputs(LENGTHS, 0.5, seed=0)
    cases = [
        (lambda: triton_gated_delta(q, k, v, g, beta, chunk_size=C, cu_seqlens=cu[:-1]),
         r"^cu_seqlens must end at T = 59"),
        (lambda: triton_gated_delta(q, k, v, g, beta, chunk_size=C, cu_seqlens=cu.float()),
         r"^cu_seqlens must have dtype int32 or int64"),
        (lambda: triton_gated_delta(q, k, v, g, beta, chunk_size=C, cu_seqlens=torch.tensor([0, 5, 5, 59])),
         r"^cu_seqlens must be strictly increasing"),
        (lambda: triton_gated_delta(q, k, v, g, beta, commit=commit[:, :-1], chunk_size=C, cu_seqlens=cu),
         r"^commit must be \[1, Nc, \.\.\.\] with Nc = 6"),
        (lambda: triton_gated_delta(q, k, v, g, beta, commit=commit[..., :1], chunk_size=C, cu_seqlens=cu),
         r"^commit must be \[1, Nc, H\] = \(1, 6, 2\)"),
        (lambda: triton_gated_delta(q, k, v, g, beta, initial_state=S0[:2], chunk_size=C, cu_seqlens=cu),
         r"^initial_state must hold one state per sequence"),
        (lambda: triton_gated_delta(q, k, v, g, beta, initial_state=S0[..., :8], chunk_size=C, cu_seqlens=cu),
         r"^initial_state must be \[N, H, K, V\]"),
        (lambda: triton_gated_delta(q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1),
                                    g.expand(2, -1, -1), beta.expand(2, -1, -1), chunk_size=C, cu_seqlens=cu),
         r"^cu_seqlens requires inputs of batch size 1"),
        (lambda: triton_chunk_attention(qa, ka, va, routing[:, :-1], chunk_size=C, group_size=2, cu_seqlens=cu),
         r"^routing must be \[1, Nc, \.\.\.\] with Nc = 6"),
        (lambda: triton_chunk_attention(qa, ka, va, routing[..., :1], chunk_size=C, group_size=2, cu_seqlens=cu),
         r"^routing must be \[B, N, Hn\] = \(1, 6, 2\) with N = Σ ceil"),
        (lambda: triton_chunk_attention(qa, ka, va, routing, routing_bias=bias[:, :2], chunk_size=C, group_size=2,
                                        cu_seqlens=cu),
         r"^routing_bias must be \[1, Nc, \.\.\.\] with Nc = 6"),
    ]
    for fn, msg in cases:
        with pytest.raises(ValueError, match=msg) as info:
            fn()
        assert "\n" not in str(info.value), msg
