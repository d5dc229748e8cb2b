"""HybridForCausalLM with packed documents (cu_seqlens): logits, loss gradients == each document alone (float64)."""

from __future__ import annotations

import pytest
import torch

import hybrid_attention  # noqa: F401  (registers the Auto classes)
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.ops.common.varlen import cu_seqlens_from_lengths

LAYERS = ["gdn", "natsl", "softmax", "interdomain", "s4d", "s4d_bilinear"]
LENGTHS = (1, 7, 16, 21, 3)  # tiny chunk_size = 16: below, equal to and across a chunk


def _model() -> HybridForCausalLM:
    torch.manual_seed(0)
    cfg = HybridConfig.from_preset("tiny", layers=LAYERS, num_hidden_layers=len(LAYERS),
                                   mixer_options={"natsl": {"num_attn_heads": 4}})
    return HybridForCausalLM(cfg).double().train()


def test_packed_logits_and_gradients_equal_separate() -> None:
    model = _model()
    ids = torch.randint(0, 256, (1, sum(LENGTHS)))
    cu = cu_seqlens_from_lengths(LENGTHS)
    packed = model(ids, cu_seqlens=cu).logits
    w = torch.linspace(-1, 1, packed.numel(), dtype=torch.float64).view_as(packed)
    g_packed = torch.autograd.grad((packed * w).sum(), list(model.parameters()), allow_unused=True)
    offs = cu.tolist()
    alone = torch.cat([model(ids[:, offs[i]:offs[i + 1]]).logits for i in range(len(LENGTHS))], 1)
    g_alone = torch.autograd.grad((alone * w).sum(), list(model.parameters()), allow_unused=True)
    assert (packed - alone).abs().max().item() < 1e-10
    for a, b in zip(g_packed, g_alone, strict=True):
        assert (a is None) == (b is None) and (a is None or (a - b).abs().max().item() < 1e-10)


def test_packed_eval_cache_continues_each_document() -> None:
    """No cache by default; use_cache=True: row i of the cache continues document i; a cache given is refused."""
    model = _model().eval()
    ids = torch.randint(0, 256, (1, sum(LENGTHS)))
    nxt = torch.randint(0, 256, (len(LENGTHS), 2))
    cu = cu_seqlens_from_lengths(LENGTHS)
    assert model(ids, cu_seqlens=cu).cache is None
    cache = model(ids, cu_seqlens=cu, use_cache=True).cache
    assert cache.seen_tokens == max(LENGTHS)
    cont = model(nxt, cache=cache).logits
    offs = cu.tolist()
    for i in range(len(LENGTHS)):
        alone = model(torch.cat([ids[:, offs[i]:offs[i + 1]], nxt[i : i + 1]], 1)).logits[0, -2:]
        assert (cont[i] - alone).abs().max().item() < 1e-10
    with pytest.raises(ValueError, match="cu_seqlens runs packed documents from an empty state"):
        model(ids, cu_seqlens=cu, cache=cache)
