"""NatsLAttention against a slow per-token transcription of the spec semantics (natsl.md §1.3–1.6), plus routing
controls, state memory and the gradient paths of the router."""

import pytest
import torch
import torch.nn.functional as F

from hybrid_attention.layers import GatedDeltaNet, NatsLAttention
from hybrid_attention.layers.natsl.routing import RoutingRecorder, RoutingSpec

D, HL, DK, HS, C = 24, 2, 8, 4, 4
G, DKS, DVS = HS // HL, HL * DK // HS, 2 * HL * DK // HS


def _layer(**kw) -> NatsLAttention:
    torch.manual_seed(5)
    layer = NatsLAttention(D, HL, DK, expand_v=2, num_attn_heads=HS, chunk_size=C, **kw).double()
    with torch.no_grad():
        layer.score_proj.weight.normal_(0, 1.0)  # decisive, diverse routing
        layer.q_norm.weight.uniform_(0.5, 1.5)
        layer.gdn_scale.uniform_(0.5, 1.5)
        layer.dt_bias.uniform_(-2, 1)
    return layer


def _conv_silu(x, w):
    k = w.shape[-1]
    xp = torch.cat([x.new_zeros(k - 1, x.shape[1]), x])
    return F.silu(torch.stack([(xp[t : t + k].T * w[:, 0]).sum(-1) for t in range(x.shape[0])]))


def _rms(x, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def reference(layer: NatsLAttention, x: torch.Tensor, rollback_decay: bool = True):
    """x [T, D] -> (y [T, D], softmax type per complete chunk [N, Hl]), token by token."""
    t = x.shape[0]
    q = _conv_silu(x @ layer.q_proj.weight.T, layer.convs["q"].weight)
    k = _conv_silu(x @ layer.k_proj.weight.T, layer.convs["k"].weight)
    v = _conv_silu(x @ layer.v_proj.weight.T, layer.convs["v"].weight)
    beta = torch.sigmoid(x @ layer.b_proj.weight.T)
    g = -torch.exp(layer.A_log) * F.softplus(x @ layer.a_proj.weight.T + layer.dt_bias)
    z = x @ layer.g_proj.weight.T
    n_full = t // C
    is_sa = torch.zeros(n_full, HL, dtype=torch.bool)
    for n in range(n_full):
        logits = (x[n * C : (n + 1) * C].mean(0) @ layer.score_proj.weight.T).view(HL, 2)
        is_sa[n] = logits[:, 0] > logits[:, 1]
    # softmax branch
    o_sa = torch.zeros(t, HS, DVS, dtype=torch.float64)
    for i in range(HS):
        h = i // G
        qi = _rms(q[:, i * DKS : (i + 1) * DKS]) * layer.q_norm.weight
        ki = _rms(k[:, i * DKS : (i + 1) * DKS]) * layer.k_norm.weight
        vi = v[:, i * DVS : (i + 1) * DVS]
        for tq in range(t):
            cq = tq // C
            keys = [s for s in range(t) if (s // C == cq and s <= tq) or (s // C < cq and is_sa[s // C, h])]
            w = torch.softmax(torch.stack([qi[tq] @ ki[s] for s in keys]) / DKS**0.5, 0)
            o_sa[tq, i] = sum(w[j] * vi[s] for j, s in enumerate(keys))
    # GDN branch, §1.5 loop
    o_gdn = torch.zeros(t, HL, 2 * DK, dtype=torch.float64)
    for h in range(HL):
        S = torch.zeros(DK, 2 * DK, dtype=torch.float64)
        for n in range(-(-t // C)):
            S_start, gsum = S.clone(), 0.0
            for tt in range(n * C, min((n + 1) * C, t)):
                qn = F.normalize(q[tt, h * DK : (h + 1) * DK], dim=0, eps=0) * 1.0
                kn = k[tt, h * DK : (h + 1) * DK]
                qn = q[tt, h * DK : (h + 1) * DK] / torch.sqrt((q[tt, h * DK : (h + 1) * DK] ** 2).sum() + 1e-6)
                kn = kn / torch.sqrt((kn**2).sum() + 1e-6)
                S = torch.exp(g[tt, h]) * S
                u = beta[tt, h] * (v[tt, h * 2 * DK : (h + 1) * 2 * DK] - S.T @ kn)
                S = S + torch.outer(kn, u)
                o_gdn[tt, h] = S.T @ qn / DK**0.5
                gsum = gsum + g[tt, h]
            if n < n_full and is_sa[n, h]:
                S = (torch.exp(gsum) if rollback_decay else 1.0) * S_start
    # fusion
    og = o_gdn.reshape(t, HS, DVS)
    src = q if layer.weights_from == "q" else x
    w = torch.softmax((src @ layer.omega_proj.weight.T).view(t, HS, 2), -1)
    if layer.separate_norms:
        y = w[..., :1] * _rms(og) * layer.gdn_scale + w[..., 1:] * _rms(o_sa) * layer.attn_scale
    else:
        y = _rms(w[..., :1] * og + w[..., 1:] * o_sa) * layer.gdn_scale
    y = y * F.silu(z.view(t, HS, DVS))
    return y.reshape(t, -1) @ layer.o_proj.weight.T, is_sa


@pytest.mark.parametrize("t", [3, 12, 13, 19])
@pytest.mark.parametrize("kw", [{}, {"weights_from": "x", "separate_norms": False}, {"decay_uncommitted": False}],
                         ids=["default", "x-weights-one-norm", "no-rollback-decay"])
def test_matches_spec_reference(t, kw):
    layer = _layer(**kw)
    x = torch.randn(1, t, D, dtype=torch.float64)
    rec = RoutingRecorder()
    with rec.attach(layer):
        y, _ = layer(x)
    ref, is_sa = reference(layer, x[0], rollback_decay=kw.get("decay_uncommitted", True))
    torch.testing.assert_close(y[0], ref, rtol=1e-9, atol=1e-10)
    if t // C:
        assert torch.equal(rec.last()[0], is_sa)
    if t == 19:  # the reference test exercises both chunk types
        assert is_sa.any() and (~is_sa).any()


def test_forced_routing():
    layer = _layer()
    x = torch.randn(2, 17, D, dtype=torch.float64)
    rec = RoutingRecorder()
    layer.routing = RoutingSpec("gdn")
    with rec.attach(layer):
        y_gdn, _ = layer(x)
    assert rec.fraction().eq(0).all()
    layer.routing = RoutingSpec("softmax")
    with rec.attach(layer):
        y_sa, _ = layer(x)
    assert rec.fraction().eq(1).all()
    assert (y_gdn - y_sa).abs().max() > 1e-6
    with pytest.raises(ValueError, match="force_routing"):
        RoutingSpec("bogus")


def test_recorder_under_compile_does_not_recompile_per_call():
    # a recorder attached to a compiled layer records every call eagerly; traced, its list appends would become guards
    # on the list lengths and each call would recompile (an 8.5 s natsl prefill on the H200). aot_eager: CPU CI has no
    # inductor
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    layer = _layer().eval()
    fwd = torch.compile(layer, backend="aot_eager", dynamic=False)
    x = torch.randn(1, 4 * C, D, dtype=torch.float64)
    rec = RoutingRecorder()
    with rec.attach(layer), torch.no_grad():
        y0, _ = fwd(x)
        frames = counters["stats"]["unique_graphs"]
        for _ in range(3):
            y, _ = fwd(x)
    assert counters["stats"]["unique_graphs"] == frames
    assert len(rec.pass_fractions()) == 4  # every call recorded
    assert torch.equal(y, y0)
    torch.testing.assert_close(y0, layer(x)[0].detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 1.0])
def test_forced_fraction_is_exact_and_the_same_when_decoding(fraction):
    """force_routing = p: chunk n is softmax iff floor((n+1)p) > floor(np); prefill + token-by-token decode (which
    types each chunk on completion) reproduces the full pass, so the pattern follows the absolute chunk index."""
    layer = _layer(force_routing=fraction)
    n_chunks = 8
    x = torch.randn(2, n_chunks * C + 3, D, dtype=torch.float64)
    rec = RoutingRecorder()
    with rec.attach(layer):
        y_full, _ = layer(x)
    n = torch.arange(n_chunks, dtype=torch.float64)
    expected = torch.floor((n + 1) * fraction) > torch.floor(n * fraction)
    assert torch.equal(rec.last(), expected[None, :, None].expand(2, n_chunks, layer.num_heads))
    assert rec.fraction().eq(fraction).all()
    split = 2 * C + 5
    y0, st = layer(x[:, :split], layer.init_state(2, dtype=torch.float64))
    ys = [y0]
    for t in range(split, x.shape[1]):
        y_t, st = layer(x[:, t : t + 1], st)
        ys.append(y_t)
    torch.testing.assert_close(torch.cat(ys, 1), y_full, rtol=1e-9, atol=1e-10)
    assert int(st.n_kept.max()) == int(expected.sum())
    with pytest.raises(ValueError, match="force_routing"):
        RoutingSpec(1.5)


def test_all_gdn_softmax_branch_is_intra_chunk_and_gdn_branch_is_plain_gdn():
    """All-GDN routing: the softmax branch sees only its own chunk; all-softmax: the GDN state never commits."""
    from hybrid_attention.ops.chunk_attention import naive_chunk_attention
    from hybrid_attention.ops.gated_delta import naive_gated_delta

    layer = _layer()
    x = torch.randn(1, 14, D, dtype=torch.float64)
    captured = {}
    import hybrid_attention.layers.natsl.layer as natsl_mod

    orig_attn, orig_gdn = natsl_mod.chunk_attention, natsl_mod.gated_delta

    def spy_attn(qs, ks, vs, routing, **kw):
        captured["attn"] = (qs, ks, vs, routing)
        return orig_attn(qs, ks, vs, routing, **kw)

    def spy_gdn(*a, **kw):
        captured["gdn"] = (a, kw)
        return orig_gdn(*a, **kw)

    natsl_mod.chunk_attention, natsl_mod.gated_delta = spy_attn, spy_gdn
    try:
        layer.routing = RoutingSpec("gdn")
        layer(x)
        qs, ks, vs, routing = captured["attn"]
        assert not routing.bool().any()
        block_diag = naive_chunk_attention(qs, ks, vs, torch.zeros_like(routing), chunk_size=C, group_size=G)
        torch.testing.assert_close(orig_attn(qs, ks, vs, routing, chunk_size=C, group_size=G), block_diag)
        a, kw = captured["gdn"]
        plain, _ = naive_gated_delta(*a, chunk_size=C)
        torch.testing.assert_close(orig_gdn(*a, **kw)[0], plain)  # commit all ones = plain GDN
    finally:
        natsl_mod.chunk_attention, natsl_mod.gated_delta = orig_attn, orig_gdn


def test_state_memory_grows_only_with_softmax_chunks():
    x = torch.randn(1, 4 * C * 5 + 3, D, dtype=torch.float64)
    sizes = {}
    for mode in ("gdn", "softmax"):
        layer = _layer(force_routing=mode)
        _, st = layer(x, layer.init_state(1, dtype=torch.float64))
        sizes[mode] = st.num_reals()
        assert st.num_reals() == layer.state_size(x.shape[1], softmax_fraction=1.0 if mode == "softmax" else 0.0)
    kv_per_token = HS * (DKS + DVS)
    assert sizes["softmax"] - sizes["gdn"] == 20 * C * kv_per_token


def test_router_gets_gradient_only_through_selected_op_unless_counterfactual():
    x = torch.randn(2, 16, D, dtype=torch.float64)
    grads = {}
    for cf in (False, True):
        layer = _layer(counterfactual_grad=cf).train()
        y, _ = layer(x)
        y.pow(2).sum().backward()
        grads[cf] = layer.score_proj.weight.grad.clone()
        assert grads[cf].abs().sum() > 0
    assert not torch.allclose(grads[False], grads[True])
    # counterfactual mode leaves the forward unchanged
    a = _layer(counterfactual_grad=True).train()(x)[0]
    b = _layer().train()(x)[0]
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_router_gradient_matches_finite_differences_of_relaxed_mask(monkeypatch):
    """The straight-through gradient reaching the router probabilities p equals, for the selected op of each
    (chunk, head), the derivative of the loss w.r.t. that op's mask: the GDN commit value (finite differences of a
    relaxed commit 1 -> 1-ε) and, for softmax, the per-chunk logit bias (finite differences of ±δ)."""
    import hybrid_attention.layers.natsl.layer as natsl_mod

    layer = _layer().train()
    x = torch.randn(1, 13, D, dtype=torch.float64)
    w_out = torch.randn(1, 13, D, dtype=torch.float64)
    route = NatsLAttention._route
    hard0, _ = route(layer, x[:, :12].reshape(1, 3, C, D))
    override = {}

    def fake_route(self, x_chunks):  # p is a leaf we can read; "relax" edits the mask value the ops see
        hard = hard0.clone()
        for key, val in override.get("relax", {}).items():
            hard[key] = val
        p = hard.clone().requires_grad_(True)
        override["p"] = p
        return hard, p

    orig_attn = natsl_mod.chunk_attention

    def biased_attn(qs, ks, vs, routing, routing_bias=None, **kw):
        extra = torch.zeros_like(routing_bias)
        for key, val in override.get("bias", {}).items():
            extra[key] = val
        return orig_attn(qs, ks, vs, routing, routing_bias=routing_bias + extra, **kw)

    monkeypatch.setattr(NatsLAttention, "_route", fake_route)
    monkeypatch.setattr(natsl_mod, "chunk_attention", biased_attn)

    def loss():
        return (layer(x)[0] * w_out).sum()

    loss().backward()
    grad_p = override["p"].grad.clone()
    checked = {"gdn": 0, "softmax": 0}
    with torch.no_grad():
        for n in range(2):  # the last complete chunk has no later query: its gradient is 0 either way
            for h in range(HL):
                if hard0[0, n, h, 1] == 1:  # GDN-typed: derivative w.r.t. the commit value
                    eps = 1e-6
                    override["relax"] = {(0, n, h, 1): 1 - eps}
                    relaxed = loss()
                    override.pop("relax")
                    fd = (loss() - relaxed) / eps
                    torch.testing.assert_close(grad_p[0, n, h, 1], fd, rtol=1e-4, atol=1e-7)
                    assert grad_p[0, n, h, 0] == 0  # unselected op: no gradient
                    checked["gdn"] += 1
                else:  # softmax-typed: derivative w.r.t. the chunk's logit bias (Σ dS)
                    d = 1e-5
                    override["bias"] = {(0, n, h): d}
                    lp = loss()
                    override["bias"] = {(0, n, h): -d}
                    lm = loss()
                    override.pop("bias")
                    torch.testing.assert_close(grad_p[0, n, h, 0], (lp - lm) / (2 * d), rtol=1e-4, atol=1e-7)
                    assert grad_p[0, n, h, 1] == 0
                    checked["softmax"] += 1
    assert checked["gdn"] and checked["softmax"]


def test_decode_with_different_routings_per_row():
    layer = _layer().eval()
    x = torch.randn(3, 4 * C + 2, D, dtype=torch.float64)
    full, _ = layer(x)
    st = layer.init_state(3, dtype=torch.float64)
    outs = []
    rec = RoutingRecorder()
    with rec.attach(layer):
        for t in range(x.shape[1]):
            y, st = layer(x[:, t : t + 1], st)
            outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-10)
    types = rec.chunk_types()  # [B, N, Hn]
    assert not (types == types[:1]).all(), "rows should route differently in this test"


def test_bad_options():
    with pytest.raises(ValueError, match="weights_from"):
        NatsLAttention(D, HL, DK, num_attn_heads=HS, weights_from="k")
    with pytest.raises(ValueError, match="num_attn_heads"):
        NatsLAttention(D, HL, DK, num_attn_heads=3)
    with pytest.raises(ValueError, match="expand_v"):
        GatedDeltaNet(D, 2, 5, expand_v=0.3)


def test_gumbel_sampling_is_stochastic_in_training_and_argmax_in_eval():
    layer = _layer(sample="gumbel")
    with torch.no_grad():
        layer.score_proj.weight.mul_(0.01)  # near-uniform probabilities: Gumbel noise decides
    x = torch.randn(2, 8 * C, D, dtype=torch.float64)
    layer.train()
    routes = set()
    rec = RoutingRecorder()
    with rec.attach(layer):
        for _ in range(4):
            layer(x)
            routes.add(tuple(rec.last().flatten().tolist()))
        assert len(routes) > 1
        layer.eval()
        layer(x)
        r1 = rec.last().clone()
        layer(x)
        assert torch.equal(r1, rec.last())


def test_triton_backend_layer_matches_reference_with_gradients(monkeypatch, device):
    """backend="triton" runs both branches through natsl_mixed (Triton interpreter on the CPU): same output and
    gradients as the reference ops, T not a multiple of the chunk, both chunk types present. With CUDA (no interpreter)
    the Triton layer runs there (tf32 dots: looser tolerances); the reference stays on the CPU."""
    pytest.importorskip("triton")
    dev = device.type
    tol = dict(rtol=2e-4, atol=2e-5) if dev == "cpu" else dict(rtol=1e-2, atol=2e-3)
    gtol = dict(rtol=2e-3, atol=2e-4) if dev == "cpu" else dict(rtol=2e-2, atol=5e-3)
    c = 16  # the Triton kernels need chunk_size in {16, 32, 64, 128}
    torch.manual_seed(3)
    ref = NatsLAttention(D, HL, 16, expand_v=2, num_attn_heads=HS, chunk_size=c)
    tri = NatsLAttention(D, HL, 16, expand_v=2, num_attn_heads=HS, chunk_size=c, backend="triton")
    tri.load_state_dict(ref.state_dict())
    tri.to(dev)
    ref.routing = tri.routing = RoutingSpec(0.5)
    x = torch.randn(1, 3 * c + 5, D)
    import hybrid_attention.layers.natsl.layer as natsl_mod

    calls = []
    orig_mixed = natsl_mod.natsl_mixed
    monkeypatch.setattr(natsl_mod, "natsl_mixed", lambda *a, **kw: calls.append(1) or orig_mixed(*a, **kw))
    outs = []
    for layer, d in ((ref, "cpu"), (tri, dev)):
        xx = x.clone().to(d).requires_grad_()
        y, _ = layer(xx)
        y.pow(2).sum().backward()
        outs.append((y.detach().cpu(), xx.grad.cpu(),
                     {n: p.grad.cpu() for n, p in layer.named_parameters() if p.grad is not None}))
    assert len(calls) == 1  # the Triton layer went through the two-branch op, the reference layer did not
    torch.testing.assert_close(outs[1][0], outs[0][0], **tol)
    torch.testing.assert_close(outs[1][1], outs[0][1], **gtol)
    for name, g in outs[0][2].items():
        torch.testing.assert_close(outs[1][2][name], g, **gtol, msg=name)


def test_qk_norm_flag_bounds_or_frees_the_softmax_logits():
    """qk_norm=True (the default, the paper's `attn_qk_norm`): the softmax q / k are RMS-normalised per head, so
    scaling q does not change them; qk_norm=False passes them through, so the logits scale with q (a plain softmax
    layer's freedom). Both layers hold the same other parameters and give finite outputs and gradients."""
    torch.manual_seed(0)
    normed = NatsLAttention(D, HL, 16, expand_v=2, num_attn_heads=HS, chunk_size=8).double()
    free = NatsLAttention(D, HL, 16, expand_v=2, num_attn_heads=HS, chunk_size=8, qk_norm=False).double()
    assert {n for n, _ in normed.named_parameters()} - {n for n, _ in free.named_parameters()} == {
        "q_norm.weight", "k_norm.weight"}
    q = torch.randn(2, 11, HL * 16, dtype=torch.float64)
    k = torch.randn(2, 11, HL * 16, dtype=torch.float64)
    qs1, _ = normed._attn_qk(q, k, 0)
    qs3, _ = normed._attn_qk(3 * q, k, 0)
    torch.testing.assert_close(qs3, qs1, rtol=1e-5, atol=1e-5)  # up to the norm's eps (1e-6)
    fq1, fk1 = free._attn_qk(q, k, 0)
    fq3, _ = free._attn_qk(3 * q, k, 0)
    torch.testing.assert_close(fq3, 3 * fq1)
    torch.testing.assert_close(fk1, k.view_as(fk1))
    x = torch.randn(2, 19, D, dtype=torch.float64, requires_grad=True)
    y, _ = free(x)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()


def _output_moves(x: torch.Tensor, names: tuple[str, ...], **options) -> dict[str, bool | None]:
    """For a float64 NatsLAttention built with ``options`` (seed 0): whether adding random noise to each named
    parameter changes the layer's output on x (None: the layer has no such parameter)."""
    torch.manual_seed(0)
    layer = NatsLAttention(D, HL, DK, expand_v=2, num_attn_heads=HS, chunk_size=C, **options).double()
    y0, _ = layer(x)
    params = dict(layer.named_parameters())
    out = {}
    for name in names:
        if name not in params:
            out[name] = None
            continue
        p = params[name]
        delta = 0.5 * torch.randn_like(p)  # not a constant: a shift of every ω logit alike would cancel
        with torch.no_grad():
            p.add_(delta)
        out[name] = not torch.allclose(layer(x)[0], y0, rtol=0, atol=1e-12)
        with torch.no_grad():
            p.sub_(delta)
    return out


def test_fused_outputs_keeps_one_branch():
    """fused_outputs="softmax" (a diagnostic): the output does not depend on anything only the GDN branch reads (its
    decay and β parameters) or on the fusion weights ω, and does depend on the softmax branch's q / k norms; "gdn"
    the reverse; "both" (the default) depends on all of them. Bad values name the argument."""
    x = torch.randn(2, 19, D, dtype=torch.float64)
    names = ("A_log", "b_proj.weight", "omega_proj.weight", "q_norm.weight")

    assert _output_moves(x, names, fused_outputs="both") == {"A_log": True, "b_proj.weight": True,
                                                             "omega_proj.weight": True, "q_norm.weight": True}
    assert _output_moves(x, names, fused_outputs="softmax") == {"A_log": False, "b_proj.weight": False,
                                                                "omega_proj.weight": False, "q_norm.weight": True}
    assert _output_moves(x, names, fused_outputs="gdn") == {"A_log": True, "b_proj.weight": True,
                                                            "omega_proj.weight": False, "q_norm.weight": False}
    with pytest.raises(ValueError, match="fused_outputs must be one of 'both', 'softmax', 'gdn', got 'sa'"):
        NatsLAttention(D, HL, DK, num_attn_heads=HS, fused_outputs="sa")


def test_own_attn_qk_reads_the_softmax_branch_from_its_own_projections():
    """attn_qk="own" (a diagnostic): the softmax branch's q / k come from W_qs x, W_ks x, so with only that branch in
    the output (fused_outputs="softmax") the GDN branch's q / k projections no longer matter and the new ones do;
    "own_conv" reads them through its own convolutions "q_s" / "k_s" too; "shared" (the paper's layer) reads the GDN
    q / k. Bad values name the argument."""
    x = torch.randn(2, 19, D, dtype=torch.float64)
    names = ("q_proj.weight", "k_proj.weight", "attn_q_proj.weight", "attn_k_proj.weight", "convs.q_s.weight",
             "convs.k_s.weight")

    assert _output_moves(x, names, fused_outputs="softmax", attn_qk="shared") == {
        "q_proj.weight": True, "k_proj.weight": True, "attn_q_proj.weight": None, "attn_k_proj.weight": None,
        "convs.q_s.weight": None, "convs.k_s.weight": None}
    assert _output_moves(x, names, fused_outputs="softmax", attn_qk="own") == {
        "q_proj.weight": False, "k_proj.weight": False, "attn_q_proj.weight": True, "attn_k_proj.weight": True,
        "convs.q_s.weight": None, "convs.k_s.weight": None}
    assert _output_moves(x, names, fused_outputs="softmax", attn_qk="own_conv") == {
        "q_proj.weight": False, "k_proj.weight": False, "attn_q_proj.weight": True, "attn_k_proj.weight": True,
        "convs.q_s.weight": True, "convs.k_s.weight": True}
    with pytest.raises(ValueError, match="attn_qk must be one of 'shared', 'own', 'own_conv', got 'separate'"):
        NatsLAttention(D, HL, DK, num_attn_heads=HS, attn_qk="separate")


def test_own_conv_attn_qk_is_own_with_a_causal_short_convolution_and_silu():
    """attn_qk="own_conv" differs from "own" only by the softmax q / k's ShortConv + SiLU: with identity kernels
    (the last tap, the current token, 1; the earlier ones 0) it equals an "own" layer of the same weights whose
    W_qs x, W_ks x are SiLU-ed; with its own kernels it does not, and a token's softmax q / k see the K-1 tokens before
    it (the conv window) and no later one."""
    torch.manual_seed(1)
    x = torch.randn(2, 19, D, dtype=torch.float64)
    conv = _layer(attn_qk="own_conv")
    own = _layer(attn_qk="own")
    assert set(conv.state_dict()) - set(own.state_dict()) == {"convs.q_s.weight", "convs.k_s.weight"}
    own.load_state_dict(conv.state_dict(), strict=False)
    project = own._project

    def silu_own_qk(*args, **kwargs):  # "own" with SiLU(W_qs x), SiLU(W_ks x)
        z, *rest = project(*args, **kwargs)
        return {**z, "q_s": torch.nn.functional.silu(z["q_s"]), "k_s": torch.nn.functional.silu(z["k_s"])}, *rest

    own._project = silu_own_qk
    assert not torch.allclose(conv(x)[0], own(x)[0])
    # the causal window: perturbing token 7 moves the softmax q / k of tokens 7 .. 7 + K-1 only
    k = conv.convs["q_s"].kernel_size
    x2 = x.clone()
    x2[:, 7] += 1.0
    z, z2 = conv._project(x, None, False)[0], conv._project(x2, None, False)[0]
    for a, b in ((z[n], z2[n]) for n in ("q_s", "k_s")):
        moved = (a - b).abs().amax((0, 2)) > 0  # [T]
        assert moved.tolist() == [7 <= t < 7 + k for t in range(x.shape[1])]
    with torch.no_grad():
        for name in ("q_s", "k_s"):
            w = conv.convs[name].weight  # [channels, 1, K]
            w.zero_()
            w[:, 0, -1] = 1.0
    torch.testing.assert_close(conv(x)[0], own(x)[0], rtol=0, atol=1e-12)
    _, st_conv = conv(x[:, :9], output_state=True)  # continued too: identity kernels weigh no past input
    _, st_own = own(x[:, :9], output_state=True)
    torch.testing.assert_close(conv(x[:, 9:], st_conv)[0], own(x[:, 9:], st_own)[0], rtol=0, atol=1e-12)
