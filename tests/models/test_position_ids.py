"""position_ids are validated, not used (models/padding.check_position_ids): HF-style ones pass (forward, generate
with a left-padded mask, packed documents, decode steps of a padded cache) and leave every output unchanged; ones that
disagree with the mask / cache / cu_seqlens raise one line naming position_ids."""

from __future__ import annotations

import pytest
import torch

from hybrid_attention.models import HybridConfig, HybridForCausalLM

PAD_ID = 258


def _model() -> HybridForCausalLM:
    torch.manual_seed(0)
    cfg = HybridConfig.from_preset("tiny", layers=["softmax", "gdn"], num_hidden_layers=2)
    return HybridForCausalLM(cfg).double().eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 256, (2, 6))
    ids[1, :2] = PAD_ID
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    return ids, mask


def _hf_positions(mask: torch.Tensor) -> torch.Tensor:
    """What transformers builds from a mask (padding filled with 1)."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)


def _raises(fn) -> None:
    with pytest.raises(ValueError, match="^position_ids must") as err:
        fn()
    assert "\n" not in str(err.value)


@torch.no_grad()
def test_matching_position_ids_pass_and_change_nothing() -> None:
    model = _model()
    ids, mask = _batch()
    out = model(ids, attention_mask=mask, use_cache=True)
    same = model(ids, attention_mask=mask, position_ids=_hf_positions(mask))
    assert torch.equal(out.logits, same.logits)
    # a decode step: from the mask, and without it from the cache's per-row padding
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    ext = torch.cat([mask, torch.ones_like(nxt)], 1)
    step = model(nxt, cache=out.cache, attention_mask=ext, position_ids=torch.tensor([[6], [4]]))
    nomask = model(nxt, cache=out.cache, position_ids=torch.tensor([[6], [4]]))
    assert torch.equal(step.logits, nomask.logits)
    # generate(): transformers extends the given position_ids every step; each step is checked
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=PAD_ID)
    assert torch.equal(model.generate(ids, position_ids=_hf_positions(mask), **kw), model.generate(ids, **kw))
    # packed documents: positions restart at each document
    cu = torch.tensor([0, 2, 6])
    assert torch.equal(model(ids[:1], cu_seqlens=cu, position_ids=torch.tensor([[0, 1, 0, 1, 2, 3]])).logits,
                       model(ids[:1], cu_seqlens=cu).logits)


@torch.no_grad()
def test_position_ids_that_disagree_raise() -> None:
    model = _model()
    ids, mask = _batch()
    arange = torch.arange(6)[None].expand(2, 6)  # the padding counted as positions: the common mistake
    _raises(lambda: model(ids, attention_mask=mask, position_ids=arange))
    out = model(ids, attention_mask=mask, use_cache=True)
    nxt = torch.zeros(2, 1, dtype=torch.long)
    _raises(lambda: model(nxt, cache=out.cache, position_ids=torch.tensor([[6], [6]])))  # row 1 is at 4
    _raises(lambda: model(ids[:1], cu_seqlens=torch.tensor([0, 2, 6]), position_ids=arange[:1]))
    _raises(lambda: model(ids, position_ids=arange + 1))  # no mask, no cache: 0..T-1
    kw = dict(attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=PAD_ID)
    _raises(lambda: model.generate(ids, position_ids=arange, **kw))
    _raises(lambda: model(ids, position_ids=arange[:, :5]))  # shape: one per new token
