"""gated_delta: naive token loop vs chunk (WY) form, commit-mask semantics, gradients. CPU, float64."""

from __future__ import annotations

import math

import pytest
import torch

from hybrid_attention.ops.gated_delta import chunk_gated_delta, gated_delta, naive_gated_delta

F64 = torch.float64
TOL = 1e-9  # float64 agreement between forms; observed errors are ~1e-15


def make_inputs(B=2, T=37, H=2, K=6, V=5, seed=0, dtype=F64, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    k = torch.randn(B, T, H, K, generator=gen, dtype=dtype)
    v = torch.randn(B, T, H, V, generator=gen, dtype=dtype)
    g = -0.5 * torch.rand(B, T, H, generator=gen, dtype=dtype)  # log-decay in (-0.5, 0]
    beta = torch.rand(B, T, H, generator=gen, dtype=dtype)
    S0 = torch.randn(B, H, K, V, generator=gen, dtype=dtype)
    out = [q, k, v, g, beta, S0]
    if requires_grad:
        out = [x.requires_grad_() for x in out]
    return out


def make_commit(kind, B, N, H, seed=1):
    gen = torch.Generator().manual_seed(seed)
    if kind == "none":
        return None
    if kind == "ones":
        return torch.ones(B, N, H, dtype=F64)
    if kind == "zeros":
        return torch.zeros(B, N, H, dtype=F64)
    if kind == "random":
        return torch.randint(0, 2, (B, N, H), generator=gen).to(F64)
    if kind == "relaxed":
        return torch.rand(B, N, H, generator=gen, dtype=F64)
    raise AssertionError(kind)


def max_err(a, b):
    return (a - b).abs().max().item()


@pytest.mark.parametrize(
    "T,C",
    [
        (1, 4),
        (7, 4),
        (1, 16),
        (7, 16),
        (63, 16),
        (64, 16),
        (65, 16),
        (130, 16),
        (63, 64),
        (64, 64),
        (65, 64),
        (130, 64),
    ],
)
@pytest.mark.parametrize("decay_uncommitted", [True, False])
def test_naive_equals_chunk(T, C, decay_uncommitted):
    B, H = 2, 2
    q, k, v, g, beta, S0 = make_inputs(B=B, T=T, H=H, seed=T + C)
    N = math.ceil(T / C)
    for kind in ("none", "ones", "zeros", "random", "relaxed"):
        commit = make_commit(kind, B, N, H, seed=T)
        for init in (None, S0):
            kw = dict(
                commit=commit,
                chunk_size=C,
                initial_state=init,
                output_final_state=True,
                decay_uncommitted=decay_uncommitted,
            )
            o_ref, s_ref = naive_gated_delta(q, k, v, g, beta, **kw)
            o, s = chunk_gated_delta(q, k, v, g, beta, **kw)
            assert o.shape == (B, T, H, v.shape[-1]) and s.shape == S0.shape
            assert max_err(o, o_ref) < TOL, (kind, init is None)
            assert max_err(s, s_ref) < TOL, (kind, init is None)


def test_dispatch_backends_and_output_final_state_flag():
    q, k, v, g, beta, S0 = make_inputs(T=20)
    commit = make_commit("random", 2, 3, 2)
    o1, s1 = gated_delta(q, k, v, g, beta, commit=commit, chunk_size=8, backend="naive")
    o2, s2 = gated_delta(q, k, v, g, beta, commit=commit, chunk_size=8, backend="auto")
    o3, _ = gated_delta(q, k, v, g, beta, commit=commit, chunk_size=8, backend="reference")
    assert s1 is None and s2 is None
    assert max_err(o1, o2) < TOL and max_err(o2, o3) == 0.0
    with pytest.raises(ValueError, match="auto"):
        gated_delta(q, k, v, g, beta, backend="triton-nonexistent")


def plain_delta_rule(q, k, v, g, beta, S0, scale):
    """Independent recurrence: S_t = e^{g_t} (I - β_t k̂ k̂ᵀ) S_{t-1} + β_t k̂ vᵀ, per (b, h), matrices only."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    o = torch.zeros(B, T, H, V, dtype=F64)
    S_fin = torch.zeros(B, H, K, V, dtype=F64)
    eye = torch.eye(K, dtype=F64)
    for b in range(B):
        for h in range(H):
            S = S0[b, h].clone()
            for t in range(T):
                kh = k[b, t, h] / torch.sqrt((k[b, t, h] ** 2).sum() + 1e-6)
                qh = q[b, t, h] / torch.sqrt((q[b, t, h] ** 2).sum() + 1e-6)
                bt = beta[b, t, h]
                decay = math.exp(g[b, t, h].item())
                S = decay * (eye - bt * torch.outer(kh, kh)) @ S + bt * torch.outer(kh, v[b, t, h])
                o[b, t, h] = scale * (S.T @ qh)
            S_fin[b, h] = S
    return o, S_fin


@pytest.mark.parametrize("T,C", [(7, 4), (65, 16)])
def test_all_ones_equals_independent_delta_rule(T, C):
    q, k, v, g, beta, S0 = make_inputs(B=1, T=T, H=2, seed=3)
    o_ref, s_ref = plain_delta_rule(q, k, v, g, beta, S0, scale=q.shape[-1] ** -0.5)
    ones = make_commit("ones", 1, math.ceil(T / C), 2)
    for commit in (ones, None):
        for backend in ("naive", "auto"):
            o, s = gated_delta(
                q,
                k,
                v,
                g,
                beta,
                commit=commit,
                chunk_size=C,
                initial_state=S0,
                output_final_state=True,
                backend=backend,
            )
            assert max_err(o, o_ref) < TOL and max_err(s, s_ref) < TOL


@pytest.mark.parametrize("backend", ["naive", "auto"])
def test_all_zeros_keeps_only_decay(backend):
    B, T, H, C = 2, 45, 2, 16
    q, k, v, g, beta, S0 = make_inputs(B=B, T=T, H=H, seed=4)
    N = math.ceil(T / C)
    zeros = make_commit("zeros", B, N, H)
    S_start = S0
    for n in range(N):
        end = min((n + 1) * C, T)
        # state after chunk n: run the op on the prefix [0, end)
        _, s_after = gated_delta(
            q[:, :end],
            k[:, :end],
            v[:, :end],
            g[:, :end],
            beta[:, :end],
            commit=zeros[:, : n + 1],
            chunk_size=C,
            initial_state=S0,
            output_final_state=True,
            backend=backend,
        )
        gamma = g[:, n * C : end].sum(1).exp()[..., None, None]  # Γ_n [B, H, 1, 1]
        assert max_err(s_after, gamma * S_start) < TOL
        # the chunk's outputs are still the pseudo-updated ones: plain GDN of this chunk alone from S_start
        o_full, _ = gated_delta(
            q[:, :end],
            k[:, :end],
            v[:, :end],
            g[:, :end],
            beta[:, :end],
            commit=zeros[:, : n + 1],
            chunk_size=C,
            initial_state=S0,
            backend=backend,
        )
        sl = slice(n * C, end)
        o_chunk, _ = plain_delta_rule(
            q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], S_start, scale=q.shape[-1] ** -0.5
        )
        assert max_err(o_full[:, sl], o_chunk) < TOL
        S_start = gamma * S_start
    # without decay of uncommitted chunks, an all-zero mask restores the initial state exactly
    _, s_fin = gated_delta(
        q,
        k,
        v,
        g,
        beta,
        commit=zeros,
        chunk_size=C,
        initial_state=S0,
        output_final_state=True,
        decay_uncommitted=False,
        backend=backend,
    )
    assert max_err(s_fin, S0) < TOL


def test_commit_changes_only_later_outputs():
    B, T, H, C = 1, 48, 2, 16
    q, k, v, g, beta, S0 = make_inputs(B=B, T=T, H=H, seed=5)
    c1 = make_commit("ones", B, 3, H)
    c2 = c1.clone()
    c2[0, 1, 0] = 0.0  # chunk 1, head 0 not committed
    o1, _ = gated_delta(q, k, v, g, beta, commit=c1, chunk_size=C)
    o2, _ = gated_delta(q, k, v, g, beta, commit=c2, chunk_size=C)
    assert max_err(o1[:, :32], o2[:, :32]) == 0.0  # chunks 0 and 1: identical (intra-chunk always runs)
    assert max_err(o1[:, 32:, 1], o2[:, 32:, 1]) == 0.0  # other head untouched
    assert max_err(o1[:, 32:, 0], o2[:, 32:, 0]) > 1e-3  # later queries of head 0 see the dropped writes


@pytest.mark.parametrize("decay_uncommitted", [True, False])
def test_split_call_equals_one_call(decay_uncommitted):
    B, T, H, C = 2, 96, 2, 16
    q, k, v, g, beta, S0 = make_inputs(B=B, T=T, H=H, seed=6)
    commit = make_commit("random", B, T // C, H, seed=6)
    kw = dict(chunk_size=C, output_final_state=True, decay_uncommitted=decay_uncommitted)
    o, s = gated_delta(q, k, v, g, beta, commit=commit, initial_state=S0, **kw)
    cut = 48
    a = slice(0, cut)
    b = slice(cut, T)
    o1, s1 = gated_delta(
        q[:, a], k[:, a], v[:, a], g[:, a], beta[:, a], commit=commit[:, : cut // C], initial_state=S0, **kw
    )
    o2, s2 = gated_delta(
        q[:, b], k[:, b], v[:, b], g[:, b], beta[:, b], commit=commit[:, cut // C :], initial_state=s1, **kw
    )
    assert max_err(torch.cat([o1, o2], 1), o) < TOL and max_err(s2, s) < TOL


def loss_fn(o, s, seed=11):
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=gen, dtype=F64)
    ds = torch.randn(s.shape, generator=gen, dtype=F64)
    return (o * do).sum() + (s * ds).sum()


def test_commit_gradient_matches_finite_differences_and_state_formula():
    B, T, H, C = 1, 40, 2, 8
    q, k, v, g, beta, S0 = make_inputs(B=B, T=T, H=H, seed=7)
    N = T // C
    m = make_commit("relaxed", B, N, H, seed=7).requires_grad_()
    o, s = gated_delta(q, k, v, g, beta, commit=m, chunk_size=C, initial_state=S0, output_final_state=True)
    loss_fn(o, s).backward()
    dm = m.grad.clone()

    # (a) central finite differences of the relaxed mask
    eps = 1e-6
    fd = torch.zeros_like(dm)
    with torch.no_grad():
        for idx in [(0, n, h) for n in range(N) for h in range(H)]:
            vals = []
            for sign in (1, -1):
                mp = m.detach().clone()
                mp[idx] += sign * eps
                op, sp = gated_delta(
                    q, k, v, g, beta, commit=mp, chunk_size=C, initial_state=S0, output_final_state=True
                )
                vals.append(loss_fn(op, sp))
            fd[idx] = (vals[0] - vals[1]) / (2 * eps)
    assert max_err(dm, fd) < 1e-6 * max(1.0, fd.abs().max().item())

    # (b) d m_n = <dS_end(n), ΔS_n>, with dS_end(n) obtained by splitting the sequence after chunk n
    md = m.detach()
    for n in range(N):
        pre, cur, post = slice(0, n * C), slice(n * C, (n + 1) * C), slice((n + 1) * C, T)
        _, s_start = gated_delta(
            q[:, pre],
            k[:, pre],
            v[:, pre],
            g[:, pre],
            beta[:, pre],
            commit=md[:, :n],
            chunk_size=C,
            initial_state=S0,
            output_final_state=True,
        )
        _, s_full = gated_delta(
            q[:, cur],
            k[:, cur],
            v[:, cur],
            g[:, cur],
            beta[:, cur],
            chunk_size=C,
            initial_state=s_start,
            output_final_state=True,
        )  # chunk n fully committed
        gamma = g[:, cur].sum(1).exp()[..., None, None]
        delta = s_full - gamma * s_start  # ΔS_n
        s_end = (gamma * s_start + md[:, n][..., None, None] * delta).requires_grad_()
        o_post, s_post = gated_delta(
            q[:, post],
            k[:, post],
            v[:, post],
            g[:, post],
            beta[:, post],
            commit=md[:, n + 1 :],
            chunk_size=C,
            initial_state=s_end,
            output_final_state=True,
        )
        # the full-sequence loss restricted to what depends on S_end(n): outputs after chunk n and the final state
        gen_o = torch.Generator().manual_seed(11)
        do = torch.randn(o.shape, generator=gen_o, dtype=F64)
        ds = torch.randn(s.shape, generator=gen_o, dtype=F64)
        ((o_post * do[:, post]).sum() + (s_post * ds).sum()).backward()
        formula = (s_end.grad * delta).sum(dim=(-1, -2))  # [B, H]
        assert max_err(dm[:, n], formula) < 1e-9, n


@pytest.mark.parametrize("decay_uncommitted", [True, False])
def test_gradcheck_tiny(decay_uncommitted):
    B, T, H, K, V, C = 1, 5, 2, 3, 2, 2
    q, k, v, g, beta, S0 = make_inputs(B=B, T=T, H=H, K=K, V=V, seed=8, requires_grad=True)
    m = torch.rand(B, math.ceil(T / C), H, dtype=F64, generator=torch.Generator().manual_seed(8)).requires_grad_()

    def f(q, k, v, g, beta, m, S0):
        return chunk_gated_delta(
            q,
            k,
            v,
            g,
            beta,
            commit=m,
            chunk_size=C,
            initial_state=S0,
            output_final_state=True,
            decay_uncommitted=decay_uncommitted,
        )

    assert torch.autograd.gradcheck(f, (q, k, v, g, beta, m, S0), eps=1e-6, atol=1e-7)


def test_gradients_naive_equal_chunk():
    B, T, H, C = 2, 37, 2, 16
    ins_a = make_inputs(B=B, T=T, H=H, seed=9, requires_grad=True)
    ins_b = [x.detach().clone().requires_grad_() for x in ins_a]
    m_a = make_commit("relaxed", B, 3, H, seed=9).requires_grad_()
    m_b = m_a.detach().clone().requires_grad_()
    for fn, ins, m in ((naive_gated_delta, ins_a, m_a), (chunk_gated_delta, ins_b, m_b)):
        q, k, v, g, beta, S0 = ins
        o, s = fn(q, k, v, g, beta, commit=m, chunk_size=C, initial_state=S0, output_final_state=True)
        loss_fn(o, s).backward()
    for xa, xb in zip(ins_a + [m_a], ins_b + [m_b]):
        assert max_err(xa.grad, xb.grad) < TOL


def test_dtypes_and_no_l2norm():
    q, k, v, g, beta, S0 = make_inputs(T=20, dtype=torch.float32)
    o, s = gated_delta(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta, chunk_size=8, output_final_state=True)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    o64, s64 = gated_delta(*(x.double() for x in (q, k, v, g, beta)), chunk_size=8, output_final_state=True)
    assert o64.dtype == F64 and s64.dtype == F64
    # use_qk_l2norm=False with already-normalised-ish small keys: forms still agree
    args = [x.double() for x in (q, k, v, g, beta)]
    args[1] = args[1] * 0.2
    o1, _ = naive_gated_delta(*args, chunk_size=8, use_qk_l2norm=False, scale=0.3)
    o2, _ = chunk_gated_delta(*args, chunk_size=8, use_qk_l2norm=False, scale=0.3)
    assert max_err(o1, o2) < TOL


def test_shape_validation():
    q, k, v, g, beta, S0 = make_inputs(B=2, T=20, H=2)
    with pytest.raises(ValueError, match=r"commit must be \[B, N, H\]"):
        gated_delta(q, k, v, g, beta, commit=torch.ones(2, 2, 2, dtype=F64), chunk_size=8)  # N should be 3
    with pytest.raises(ValueError, match="beta"):
        gated_delta(q, k, v, g, beta[:, :, :1])
    with pytest.raises(ValueError, match="initial_state"):
        gated_delta(q, k, v, g, beta, initial_state=S0[:, :, :2])
    with pytest.raises(ValueError, match="chunk_size"):
        gated_delta(q, k, v, g, beta, chunk_size=0, backend="naive")


@pytest.mark.parametrize("backend", ["naive", "auto"])
def test_empty_call_returns_initial_state(backend):
    q, k, v, g, beta, S0 = make_inputs(T=0)
    o, s = gated_delta(
        q,
        k,
        v,
        g,
        beta,
        commit=torch.ones(2, 0, 2, dtype=F64),
        chunk_size=8,
        initial_state=S0,
        output_final_state=True,
        backend=backend,
    )
    assert o.shape == (2, 0, 2, 5) and torch.equal(s, S0)
