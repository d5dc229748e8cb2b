"""chunk_attention: dense oracle vs memory-lean chunk loop vs independent loops, routing gradient. CPU, float64."""

from __future__ import annotations

import math
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F

from hybrid_attention.ops.chunk_attention import (
    FLEX_AVAILABLE,
    build_chunk_block_mask,
    chunk_attention,
    chunk_chunk_attention,
    flex_chunk_attention,
    naive_chunk_attention,
)

F64 = torch.float64
TOL = 1e-12


def make_inputs(B=2, T=37, Hs=4, Dk=6, Dv=5, seed=0, dtype=F64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hs, Dk, generator=gen, dtype=dtype)
    k = torch.randn(B, T, Hs, Dk, generator=gen, dtype=dtype)
    v = torch.randn(B, T, Hs, Dv, generator=gen, dtype=dtype)
    return q, k, v


def make_routing(B, N, Hn, seed=1, p=0.5):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(B, N, Hn, generator=gen) < p


def max_err(a, b):
    return (a - b).abs().max().item()


@pytest.mark.parametrize(
    "T,C",
    [(1, 4), (7, 4), (1, 16), (7, 16), (63, 16), (64, 16), (65, 16), (130, 16), (63, 64), (65, 64), (130, 64)],
)
@pytest.mark.parametrize("G", [1, 2])
def test_chunk_equals_naive(T, C, G):
    B, Hs = 2, 4
    q, k, v = make_inputs(B=B, T=T, Hs=Hs, seed=T + C + G)
    N = math.ceil(T / C)
    r = make_routing(B, N, Hs // G, seed=T)
    bias = torch.randn(B, N, Hs // G, dtype=F64, generator=torch.Generator().manual_seed(T))
    for rb in (None, bias):
        o_ref = naive_chunk_attention(q, k, v, r, chunk_size=C, group_size=G, routing_bias=rb)
        o = chunk_chunk_attention(q, k, v, r, chunk_size=C, group_size=G, routing_bias=rb)
        assert o.shape == (B, T, Hs, v.shape[-1])
        assert max_err(o, o_ref) < TOL


def per_query_loop(q, k, v, routing, C, G, scale, bias=None):
    """Independent definition: for every (b, i, t) list the visible keys and softmax over them with plain math."""
    B, T, Hs, _ = q.shape
    o = torch.zeros(B, T, Hs, v.shape[-1], dtype=F64)
    for b in range(B):
        for i in range(Hs):
            h = i // G
            for t in range(T):
                keys, extra = [], []
                for s in range(T):
                    if s // C == t // C and s <= t:
                        keys.append(s)
                        extra.append(0.0)
                    elif s // C < t // C and bool(routing[b, s // C, h]):
                        keys.append(s)
                        extra.append(0.0 if bias is None else float(bias[b, s // C, h]))
                logits = [scale * float(q[b, t, i] @ k[b, s, i]) + e for s, e in zip(keys, extra)]
                mx = max(logits)
                w = [math.exp(x - mx) for x in logits]
                z = sum(w)
                o[b, t, i] = sum((wi / z) * v[b, s, i] for wi, s in zip(w, keys))
    return o


@pytest.mark.parametrize("G", [1, 2])
def test_equals_independent_per_query_loop(G):
    B, T, Hs, C = 1, 23, 4, 5
    q, k, v = make_inputs(B=B, T=T, Hs=Hs, seed=2)
    N = math.ceil(T / C)
    r = make_routing(B, N, Hs // G, seed=2)
    bias = torch.randn(B, N, Hs // G, dtype=F64, generator=torch.Generator().manual_seed(3))
    for rb in (None, bias):
        o_ref = per_query_loop(q, k, v, r, C, G, q.shape[-1] ** -0.5, rb)
        for backend in ("naive", "reference"):
            o = chunk_attention(q, k, v, r, chunk_size=C, group_size=G, routing_bias=rb, backend=backend)
            assert max_err(o, o_ref) < TOL


def sdpa(q, k, v, causal=True):
    # [B, T, H, D] -> SDPA's [B, H, T, D]
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
    ).transpose(1, 2)


@pytest.mark.parametrize("T,C", [(50, 16), (64, 16), (7, 4)])
@pytest.mark.parametrize("backend", ["naive", "reference"])
def test_all_zero_routing_is_block_diagonal_causal(T, C, backend):
    B, Hs = 2, 4
    q, k, v = make_inputs(B=B, T=T, Hs=Hs, Dv=6, seed=4)
    N = math.ceil(T / C)
    zeros = torch.zeros(B, N, Hs // 2, dtype=torch.bool)
    o = chunk_attention(q, k, v, zeros, chunk_size=C, group_size=2, backend=backend)
    ref = torch.cat([sdpa(q[:, s : s + C], k[:, s : s + C], v[:, s : s + C]) for s in range(0, T, C)], dim=1)
    assert max_err(o, ref) < TOL


@pytest.mark.parametrize("T,C", [(50, 16), (130, 64), (7, 4)])
@pytest.mark.parametrize("backend", ["naive", "reference"])
def test_all_one_routing_is_plain_causal(T, C, backend):
    B, Hs = 2, 4
    q, k, v = make_inputs(B=B, T=T, Hs=Hs, Dv=6, seed=5)
    ones = torch.ones(B, math.ceil(T / C), Hs, dtype=F64)  # float routing, thresholded at 0.5
    o = chunk_attention(q, k, v, ones, chunk_size=C, backend=backend)
    assert max_err(o, sdpa(q, k, v)) < TOL


def test_group_size_mapping():
    B, T, Hs, G, C = 2, 40, 6, 2, 8
    q, k, v = make_inputs(B=B, T=T, Hs=Hs, seed=6)
    N = T // C
    r = make_routing(B, N, Hs // G, seed=6)
    o = chunk_attention(q, k, v, r, chunk_size=C, group_size=G)
    # decision head h governs softmax heads h*G .. h*G+G-1
    o_expanded = chunk_attention(q, k, v, r.repeat_interleave(G, dim=2), chunk_size=C, group_size=1)
    assert max_err(o, o_expanded) < TOL
    # flipping the routing of decision head 1 changes exactly softmax heads 2 and 3
    r2 = r.clone()
    r2[:, :, 1] = ~r2[:, :, 1]
    o2 = chunk_attention(q, k, v, r2, chunk_size=C, group_size=G)
    diff = (o2 - o).abs().amax(dim=(0, 1, 3))  # per softmax head
    assert diff[[0, 1, 4, 5]].max().item() < TOL  # (not bit-equal: the gather width changes the summation order)
    assert diff[2].item() > 1e-3 and diff[3].item() > 1e-3
    # the first chunk never depends on routing
    assert max_err(o2[:, :C], o[:, :C]) == 0.0


def test_float_routing_threshold():
    B, T, Hs, C = 1, 30, 2, 8
    q, k, v = make_inputs(B=B, T=T, Hs=Hs, seed=7)
    r = make_routing(B, 4, Hs, seed=7)
    # a straight-through one-hot is 1 or 0 only up to rounding
    soft = r.to(F64) + torch.where(r, -1e-16, 1e-16)
    assert max_err(chunk_attention(q, k, v, r, chunk_size=C), chunk_attention(q, k, v, soft, chunk_size=C)) == 0.0


def explicit_bias_grad(q, k, v, r, do, C, G, scale):
    """d bias[b, n, h] = Σ_{i in group h} Σ_{t: c(t) > n} Σ_{s in chunk n} P_ts (dO_t·v_s - dO_t·o_t)."""
    B, T, Hs, _ = q.shape
    N = math.ceil(T / C)
    pos = torch.arange(T)
    chunk = pos // C
    own = (chunk[:, None] == chunk[None, :]) & (pos[:, None] >= pos[None, :])
    earlier = chunk[None, :] < chunk[:, None]
    vis = r.repeat_interleave(G, 2)[:, chunk].permute(0, 2, 1)[:, :, None, :]
    mask = own | (earlier & vis)
    P = (scale * torch.einsum("bthd,bshd->bhts", q, k)).masked_fill(~mask, float("-inf")).softmax(-1)
    o = torch.einsum("bhts,bshd->bthd", P, v)
    dOv = torch.einsum("bthd,bshd->bhts", do, v)  # dO_t · v_s
    dOo = (do * o).sum(-1).transpose(1, 2)[..., None]  # dO_t · o_t, [B, Hs, T, 1]
    dS = P * (dOv - dOo) * earlier  # cross-chunk pairs only
    per_key = dS.sum(2)  # [B, Hs, T(key)]
    out = torch.zeros(B, N, Hs, dtype=F64)
    out.index_add_(1, chunk, per_key.transpose(1, 2))  # sum keys of each chunk -> [B, N, Hs]
    return out.reshape(B, N, Hs // G, G).sum(-1)


@pytest.mark.parametrize("backend", ["naive", "reference"])
def test_routing_bias_gradient(backend):
    B, T, Hs, G, C = 2, 29, 4, 2, 6
    q, k, v = make_inputs(B=B, T=T, Hs=Hs, seed=8)
    N = math.ceil(T / C)
    r = make_routing(B, N, Hs // G, seed=8, p=0.6)
    do = torch.randn(B, T, Hs, v.shape[-1], dtype=F64, generator=torch.Generator().manual_seed(9))
    bias = torch.zeros(B, N, Hs // G, dtype=F64, requires_grad=True)

    def loss(b):
        return (chunk_attention(q, k, v, r, chunk_size=C, group_size=G, routing_bias=b, backend=backend) * do).sum()

    loss(bias).backward()
    grad = bias.grad
    # finite differences
    eps = 1e-6
    fd = torch.zeros_like(grad)
    with torch.no_grad():
        for idx in torch.cartesian_prod(*(torch.arange(n) for n in grad.shape)).tolist():
            bp, bm = bias.detach().clone(), bias.detach().clone()
            bp[tuple(idx)] += eps
            bm[tuple(idx)] -= eps
            fd[tuple(idx)] = (loss(bp) - loss(bm)) / (2 * eps)
    assert max_err(grad, fd) < 1e-7
    # explicit FlashAttention dS formula
    formula = explicit_bias_grad(q, k, v, r, do, C, G, q.shape[-1] ** -0.5)
    assert max_err(grad, formula) < TOL
    # chunks not routed to softmax (and the last chunk, which has no later queries) get exactly zero
    assert grad[:, -1].abs().max().item() == 0.0
    assert grad[~r].abs().max().item() == 0.0
    assert grad[:, :-1][r[:, :-1]].abs().min().item() > 0  # routed chunks with later queries do get a signal


def test_gradcheck_q_k_v_bias():
    B, T, Hs, G, C = 1, 7, 2, 2, 3
    q, k, v = (x.requires_grad_() for x in make_inputs(B=B, T=T, Hs=Hs, Dk=3, Dv=2, seed=10))
    r = torch.tensor([[[1], [0], [1]]], dtype=torch.bool)
    bias = torch.randn(B, 3, 1, dtype=F64, requires_grad=True)

    def f(q, k, v, bias):
        return chunk_chunk_attention(q, k, v, r, chunk_size=C, group_size=G, routing_bias=bias)

    assert torch.autograd.gradcheck(f, (q, k, v, bias), eps=1e-6, atol=1e-8)


def test_shape_validation():
    q, k, v = make_inputs(B=2, T=20, Hs=4)
    with pytest.raises(ValueError, match=r"routing must be \[B, N, Hn\]"):
        chunk_attention(q, k, v, torch.ones(2, 3, 4, dtype=torch.bool), chunk_size=8, group_size=2)
    with pytest.raises(ValueError, match="group_size"):
        chunk_attention(q, k, v, torch.ones(2, 3, 1, dtype=torch.bool), chunk_size=8, group_size=3)
    with pytest.raises(ValueError, match="routing_bias"):
        chunk_attention(
            q, k, v, torch.ones(2, 3, 4, dtype=torch.bool), chunk_size=8, routing_bias=torch.zeros(2, 3, 2, dtype=F64)
        )
    with pytest.raises(ValueError, match="naive"):
        chunk_attention(q, k, v, torch.ones(2, 3, 4, dtype=torch.bool), chunk_size=8, backend="bogus")


# ---------------------------------------------------------------- FlexAttention (forward only on CPU)

needs_flex = pytest.mark.skipif(not FLEX_AVAILABLE, reason="torch.nn.attention.flex_attention unavailable")


@needs_flex
@pytest.mark.parametrize("T,C,G", [(64, 16, 2), (45, 8, 1), (130, 64, 3)])
def test_flex_block_lists_match_dense_mask(T, C, G):
    """Rebuild the token-level mask from the BlockMask's lists (full blocks = all visible, partial = causal inside)."""
    B, Hs = 2, 6
    N = math.ceil(T / C)
    r = make_routing(B, N, Hs // G, seed=T)
    bm = build_chunk_block_mask(r, T, C, G)
    for t in (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices):
        assert t.is_contiguous() and t.dtype == torch.int32  # compiled kernels index these as contiguous int32
    L = N * C
    rebuilt = torch.zeros(B, Hs, L, L, dtype=torch.bool)
    causal = torch.ones(C, C, dtype=torch.bool).tril()
    for b in range(B):
        for h in range(Hs):
            for qb in range(N):
                rows = slice(qb * C, (qb + 1) * C)
                for j in range(int(bm.full_kv_num_blocks[b, h, qb])):
                    kb = int(bm.full_kv_indices[b, h, qb, j])
                    rebuilt[b, h, rows, kb * C : (kb + 1) * C] = True
                for j in range(int(bm.kv_num_blocks[b, h, qb])):
                    kb = int(bm.kv_indices[b, h, qb, j])
                    assert kb == qb  # the only partial block is the diagonal
                    rebuilt[b, h, rows, kb * C : (kb + 1) * C] |= causal
    # the oracle's mask, via the naive op's definition
    pos = torch.arange(L)
    chunk = pos // C
    own = (chunk[:, None] == chunk[None, :]) & (pos[:, None] >= pos[None, :])
    earlier = chunk[None, :] < chunk[:, None]
    vis = r.repeat_interleave(G, 2)[:, chunk].permute(0, 2, 1)[:, :, None, :]
    assert torch.equal(rebuilt, own | (earlier & vis))


@needs_flex
@pytest.mark.parametrize("T,C,G", [(64, 16, 2), (45, 8, 1)])
def test_flex_eager_forward_matches_naive(T, C, G):
    B, Hs = 2, 4
    q, k, v = make_inputs(B=B, T=T, Hs=Hs, seed=11)
    N = math.ceil(T / C)
    r = make_routing(B, N, Hs // G, seed=11)
    bias = torch.randn(B, N, Hs // G, dtype=F64, generator=torch.Generator().manual_seed(11))
    for rb in (None, bias):
        ref = naive_chunk_attention(q, k, v, r, chunk_size=C, group_size=G, routing_bias=rb)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
            try:
                o = flex_chunk_attention(q, k, v, r, chunk_size=C, group_size=G, routing_bias=rb, compiled=False)
            except (NotImplementedError, RuntimeError) as e:  # pragma: no cover - torch-build dependent
                pytest.skip(f"eager flex_attention does not run here: {e}")
        assert max_err(o, ref) < 1e-12


@needs_flex
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="inductor needs a C compiler")
def test_flex_compiled_forward_uses_block_lists():
    """Compiled CPU flex walks the block lists (eager flex only evaluates mask_mod); ~10-20 s of compilation.

    This test caught non-contiguous index tensors, which the compiled CPU kernel misread (wrong rows).
    """
    B, T, Hs, G, C = 1, 60, 4, 2, 16
    q, k, v = make_inputs(B=B, T=T, Hs=Hs, Dk=8, Dv=8, seed=12, dtype=torch.float32)
    N = math.ceil(T / C)
    r = make_routing(B, N, Hs // G, seed=12)
    bias = torch.randn(B, N, Hs // G, generator=torch.Generator().manual_seed(12))
    ref = naive_chunk_attention(
        q.double(), k.double(), v.double(), r, chunk_size=C, group_size=G, routing_bias=bias.double()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            o = flex_chunk_attention(q, k, v, r, chunk_size=C, group_size=G, routing_bias=bias, compiled=True)
        except Exception as e:  # pragma: no cover - toolchain dependent
            pytest.skip(f"torch.compile(flex_attention) unavailable on this CPU: {type(e).__name__}: {e}")
    assert max_err(o.double(), ref) < 1e-5


@pytest.mark.parametrize("qb", [8, 24])
def test_dkv_query_step_below_a_dot_tile_is_refused(qb: int) -> None:
    """A dk/dv query step below 16 rows compiles in the interpreter but not for a GPU (tl.dot's smallest tile): one
    line naming the field, at construction."""
    from hybrid_attention.ops.chunk_attention.triton.config import ChunkAttentionConfig

    with pytest.raises(ValueError, match=rf"^dkv_qb must be a power of two >= 16 .*got {qb}$"):
        ChunkAttentionConfig(dkv_qb=qb)
    assert ChunkAttentionConfig(dkv_qb=16).dkv_qb == 16
