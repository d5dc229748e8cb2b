"""fla-style faces (integrations/fla.py) in a decoder written the way fla's models are == HybridForCausalLM (float64).

The decoder (embedding -> [norm -> attn face -> residual -> norm -> MLP -> residual] x N -> norm -> lm head, one
LayerCache passed through every layer) loads the weights of a HybridForCausalLM by renaming ``model.layers.{i}.mixer``
to ``layers.{i}.attn`` (strict load: the faces' parameters are the layers' own) and must give the same logits on a
prefill, on step-by-step decoding from its cache, and on a left-padded batch of two prompts of different lengths.
"""

from __future__ import annotations

import pydoc

import pytest
import torch
from torch import nn

from hybrid_attention.integrations import fla
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.models.padding import RowStates
from hybrid_attention.modules import RMSNorm, SwiGLU
from hybrid_attention.ops.gated_delta import gated_delta

MIXERS = ["interdomain", "s4d", "gdn", "natsl"]
PAD_ID = 258


def _face(name: str, cfg: HybridConfig, i: int) -> nn.Module:
    """The face of layer i, built with fla's keywords from the config (what HybridForCausalLM builds internally)."""
    common = dict(hidden_size=cfg.hidden_size, num_heads=cfg.num_heads, head_dim=cfg.head_dim, layer_idx=i,
                  mode="chunk", norm_eps=cfg.norm_eps, chunk_size=cfg.chunk_size, backend="reference")
    ssm = dict(state_size=cfg.state_size, rope_theta=cfg.rope_theta)
    if name == "interdomain":
        return fla.InterdomainAttention(**common, **ssm, readout=cfg.interdomain_readout)
    if name == "s4d":
        return fla.S4DMixer(**common, **ssm)
    if name == "gdn":
        return fla.GatedDeltaNet(**common)
    return fla.NatsLAttention(**common, num_attn_heads=cfg.mixer_options["natsl"]["num_attn_heads"],
                              rope_theta=cfg.rope_theta)


class FlaStyleBlock(nn.Module):
    def __init__(self, attn: nn.Module, cfg: HybridConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = attn
        self.mlp_norm = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h, attention_mask=None, past_key_values=None, use_cache=False, **kwargs):
        o, _, past_key_values = self.attn(self.attn_norm(h), attention_mask=attention_mask,
                                          past_key_values=past_key_values, use_cache=use_cache, **kwargs)
        h = h + o
        return h + self.mlp(self.mlp_norm(h)), past_key_values


class FlaStyleLM(nn.Module):
    def __init__(self, name: str, cfg: HybridConfig) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(FlaStyleBlock(_face(name, cfg, i), cfg) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False, **kwargs):
        if use_cache and past_key_values is None:
            past_key_values = fla.LayerCache()
        h = self.embeddings(input_ids)
        for layer in self.layers:
            h, past_key_values = layer(h, attention_mask, past_key_values, use_cache, **kwargs)
        return self.lm_head(self.norm(h)), past_key_values


def _pair(name: str) -> tuple[HybridForCausalLM, FlaStyleLM]:
    torch.manual_seed(0)
    options = {"natsl": {"num_attn_heads": 4}}
    options.setdefault(name, {})["backend"] = "reference"
    cfg = HybridConfig.from_preset("tiny", layers=[name, name], num_hidden_layers=2, chunk_size=4,
                                   mixer_options=options)
    ours = HybridForCausalLM(cfg).double().eval()
    theirs = FlaStyleLM(name, cfg).double().eval()
    weights = {k.removeprefix("model.").replace(".mixer.", ".attn."): v for k, v in ours.state_dict().items()}
    theirs.load_state_dict(weights, strict=True)  # 1:1: no missing, no unexpected key
    return ours, theirs


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", MIXERS)
def test_prefill_and_cached_decode_equal_our_model(name: str) -> None:
    ours, theirs = _pair(name)
    ids = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = ours(ids).logits
        logits, cache = theirs(ids)
        _close(logits, full)
        assert cache is None  # use_cache=False: no cache made
        logits, cache = theirs(ids[:, :6], use_cache=True)  # prefill ends mid-chunk (chunk_size 4)
        _close(logits, full[:, :6])
        for t in range(6, 11):
            step, cache = theirs(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            _close(step[:, 0], full[:, t])
    assert len(cache) == 2 and cache.get_seq_length(0) == cache.get_seq_length(1) == 11


@pytest.mark.parametrize("name", MIXERS)
def test_left_padded_prefill_and_decode_equal_our_model(name: str) -> None:
    ours, theirs = _pair(name)
    g = torch.Generator().manual_seed(2)
    lengths, t = (5, 9), 9
    ids = torch.full((2, t), PAD_ID)
    mask = torch.zeros(2, t, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, t - n :], mask[i, t - n :] = torch.randint(0, 256, (n,), generator=g), 1
    steps = torch.randint(0, 256, (2, 6), generator=g)
    with torch.no_grad():
        out = ours(ids, attention_mask=mask, use_cache=True)
        logits, cache = theirs(ids, attention_mask=mask, use_cache=True)
        valid = mask.bool()
        _close(logits[valid], out.logits[valid])
        fed = theirs(ids)[0][0, -1]  # the check can fail: padding fed as tokens changes the shorter row
        assert (fed - out.logits[0, -1]).abs().max() > 1e-3
        ours_cache = out.cache
        for s in range(steps.shape[1]):
            mask = torch.cat([mask, mask.new_ones(2, 1)], 1)
            tok = steps[:, s : s + 1]
            ref = ours(tok, attention_mask=mask, cache=ours_cache, use_cache=True)
            ours_cache = ref.cache
            step, cache = theirs(tok, attention_mask=mask, past_key_values=cache, use_cache=True)
            _close(step, ref.logits)
    assert cache.get_seq_length(1) == t + steps.shape[1]
    assert isinstance(cache[0], RowStates) == (name == "natsl")  # NAtS-L keeps one state per row


@pytest.mark.parametrize("name", MIXERS)
def test_packed_documents_and_gradients_equal_our_model(name: str) -> None:
    ours, theirs = _pair(name)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 256, (1, 14), generator=g)
    cu = torch.tensor([0, 5, 14], dtype=torch.int32)  # fla's varlen call: cu_seqlens through the layers' kwargs
    with torch.no_grad():
        _close(theirs(ids, cu_seqlens=cu)[0], ours(ids, cu_seqlens=cu).logits)
    ours.train(), theirs.train()
    ids = torch.randint(0, 256, (2, 10), generator=g)
    ours(ids, labels=ids).loss.backward()
    logits = theirs(ids)[0]
    shifted = logits[:, :-1].float().reshape(-1, logits.shape[-1])  # the loss in float32, as HybridForCausalLM's
    nn.functional.cross_entropy(shifted, ids[:, 1:].reshape(-1)).backward()
    grads = {k.removeprefix("model.").replace(".mixer.", ".attn."): p.grad for k, p in ours.named_parameters()}
    for k, p in theirs.named_parameters():
        torch.testing.assert_close(p.grad, grads[k], rtol=0, atol=1e-10, msg=k)


def _small_face(name: str, mode: str) -> nn.Module:
    torch.manual_seed(0)
    kw = dict(hidden_size=32, num_heads=2, chunk_size=4, layer_idx=0, mode=mode)
    if name == "interdomain":
        return fla.InterdomainAttention(**kw, state_size=4).double()
    if name == "s4d":
        return fla.S4DMixer(**kw, state_size=4).double()
    if name == "gdn":
        return fla.GatedDeltaNet(**kw, head_dim=8).double()
    return fla.NatsLAttention(**kw, head_dim=8, num_attn_heads=4).double()


@pytest.mark.parametrize("name", MIXERS)
def test_fused_recurrent_mode_equals_chunk_mode(name: str) -> None:
    chunk, recurrent = _small_face(name, "chunk"), _small_face(name, "fused_recurrent")
    recurrent.load_state_dict(chunk.state_dict())
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    mask = torch.tensor([[0] * 4 + [1] * 5, [1] * 9])
    step_mask = torch.cat([mask, mask.new_ones(2, 1)], 1)
    with torch.no_grad():
        for face in (chunk, recurrent):
            y, _, cache = face(x, attention_mask=mask, use_cache=True)
            face.outputs = (y, face(x[:, :1], attention_mask=step_mask, past_key_values=cache, use_cache=True)[0])
    assert (chunk.backend, recurrent.backend) == ("auto", "naive")
    for a, b in zip(chunk.outputs, recurrent.outputs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_faces_take_fla_keywords_and_map_mode_to_backend() -> None:
    gdn = fla.GatedDeltaNet(hidden_size=64, num_heads=2, head_dim=16, mode="fused_recurrent", layer_idx=3)
    assert (gdn.backend, gdn.layer_idx, gdn.o_norm.eps) == ("naive", 3, 1e-5)  # fla's norm_eps default
    assert fla.GatedDeltaNet(hidden_size=64, num_heads=2, head_dim=16).backend == "auto"
    assert fla.S4DMixer(hidden_size=64, num_heads=2, mode="fused_recurrent", backend="reference").backend == "reference"
    with pytest.raises(ValueError, match="mode must be one of 'chunk', 'fused_recurrent', got 'parallel'"):
        fla.InterdomainAttention(hidden_size=64, num_heads=2, mode="parallel")
    with pytest.raises(ValueError, match="num_v_heads must be None or num_heads"):
        fla.GatedDeltaNet(hidden_size=64, num_heads=2, head_dim=16, num_v_heads=4)
    with pytest.raises(ValueError, match="allow_neg_eigval must be False"):
        fla.GatedDeltaNet(hidden_size=64, num_heads=2, head_dim=16, allow_neg_eigval=True)


def test_call_contract_errors() -> None:
    attn = fla.InterdomainAttention(hidden_size=32, num_heads=2, state_size=4, chunk_size=4, backend="reference")
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match="layer_idx must be set"):
        attn(x, use_cache=True)
    attn.layer_idx = 0
    with pytest.raises(ValueError, match="past_key_values must be a LayerCache"):
        attn(x, past_key_values={})
    with pytest.raises(ValueError, match="attention_mask must be left padding"):
        attn(x, attention_mask=torch.tensor([[1, 0, 1, 1, 1], [1, 1, 1, 1, 1]]))
    o, none, cache = attn(x, attention_mask=torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]), use_cache=True)
    assert none is None and bool((o[0, :2] == 0).all()) and cache.get_seq_length(0) == 5
    with pytest.raises(ValueError, match="padding must precede the prefill"):
        attn(x[:, :1], attention_mask=torch.tensor([[0, 0, 1, 1, 1, 0], [1] * 6]), past_key_values=cache,
             use_cache=True)


def test_layer_cache_semantics() -> None:
    cache = fla.LayerCache()
    assert len(cache) == 0 and cache.get_seq_length(0) == 0
    cache.update("state-2", layer_idx=2, offset=7)
    assert len(cache) == 3 and cache[2] == "state-2" and cache.get_seq_length(2) == 7 and cache.get_seq_length(0) == 0
    with pytest.raises(KeyError, match="layer_idx 0"):
        cache[0]
    cache.update("state-2b", layer_idx=2, offset=1)
    assert cache[2] == "state-2b" and cache.get_seq_length(2) == 8 and list(cache) == [None, None, "state-2b"]


def test_help_lists_constructor_arguments() -> None:
    for face in (fla.InterdomainAttention, fla.S4DMixer, fla.GatedDeltaNet, fla.NatsLAttention):
        text = pydoc.render_doc(face)
        for arg in ("hidden_size", "num_heads", "layer_idx", "mode", "norm_eps", "chunk_size=", "backend="):
            assert arg in text, (face.__name__, arg)
    assert "state_size=64" in fla.InterdomainAttention.__doc__ and "num_attn_heads" in fla.NatsLAttention.__doc__


@pytest.mark.parametrize("qk_norm", [False, True])
def test_fla_op_aliases_map_onto_gated_delta(qk_norm: bool) -> None:
    g = torch.Generator().manual_seed(3)
    b, t, h, k, v = 2, 10, 2, 8, 16
    q, kk = torch.randn(b, t, h, k, generator=g, dtype=torch.float64), torch.randn(b, t, h, k, generator=g,
                                                                                   dtype=torch.float64)
    vv = torch.randn(b, t, h, v, generator=g, dtype=torch.float64)
    decay = -torch.rand(b, t, h, generator=g, dtype=torch.float64)
    beta = torch.rand(b, t, h, generator=g, dtype=torch.float64)
    h0 = torch.randn(b, h, k, v, generator=g, dtype=torch.float64)
    if not qk_norm:  # fla's ops take normalised q, k from the caller by default
        q, kk = (z / z.norm(dim=-1, keepdim=True) for z in (q, kk))
    o, s = fla.chunk_gated_delta_rule(q, kk, vv, decay, beta, initial_state=h0, output_final_state=True,
                                      use_qk_l2norm_in_kernel=qk_norm, chunk_size=4, backend="reference")
    o_ref, s_ref = gated_delta(q, kk, vv, decay, beta, initial_state=h0, output_final_state=True, chunk_size=4,
                               use_qk_l2norm=qk_norm, backend="reference")
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref)
    o_rec, s_rec = fla.fused_recurrent_gated_delta_rule(q, kk, vv, decay, beta, initial_state=h0,
                                                        output_final_state=True, use_qk_l2norm_in_kernel=qk_norm)
    torch.testing.assert_close(o_rec, o, rtol=0, atol=1e-10)
    torch.testing.assert_close(s_rec, s, rtol=0, atol=1e-10)
    # the default differs from gated_delta's: without normalised inputs the two disagree
    raw = fla.chunk_gated_delta_rule(q * 3, kk, vv, decay, beta, chunk_size=4, backend="reference")[0]
    assert (raw - gated_delta(q * 3, kk, vv, decay, beta, chunk_size=4, backend="reference")[0]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="head_first=True is not supported"):
        fla.chunk_gated_delta_rule(q, kk, vv, decay, beta, head_first=True)
