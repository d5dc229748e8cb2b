"""Left-padded batches (attention_mask): forward, prefill and greedy generate() == each prompt alone (float64)."""

from __future__ import annotations

import pytest
import torch

import hybrid_attention  # noqa: F401  (registers the Auto classes)
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.models.padding import RowStates

MIXERS = ["softmax", "interdomain", "s4d", "s4d_bilinear", "gdn", "natsl"]
HYBRID = ["gdn", "natsl", "softmax", "interdomain"]
LENGTHS = (5, 9, 13)  # chunk_size 4: the prompts end at different chunk phases, decoding crosses chunk ends
PAD_ID = 258


def _model(layers: list[str]) -> HybridForCausalLM:
    torch.manual_seed(0)
    cfg = HybridConfig.from_preset("tiny", layers=layers, num_hidden_layers=len(layers), chunk_size=4,
                                   mixer_options={"natsl": {"num_attn_heads": 4}})
    return HybridForCausalLM(cfg).double().eval()


def _batch() -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Prompts [1, L_i] and their left-padded batch: ids [B, T] (PAD_ID at padding), mask [B, T]."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (1, n), generator=g) for n in LENGTHS]
    t = max(LENGTHS)
    ids = torch.full((len(LENGTHS), t), PAD_ID)
    mask = torch.zeros(len(LENGTHS), t, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, t - p.shape[1]:], mask[i, t - p.shape[1]:] = p[0], 1
    return prompts, ids, mask


def _generate(model: HybridForCausalLM, ids: torch.Tensor, mask: torch.Tensor):
    return model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=PAD_ID,
                          output_logits=True, return_dict_in_generate=True)


@pytest.mark.parametrize("layers", [[m] for m in MIXERS] + [HYBRID], ids=lambda v: "+".join(v))
def test_padded_generate_equals_each_prompt_alone(layers: list[str]) -> None:
    model = _model(layers)
    prompts, ids, mask = _batch()
    with torch.no_grad():
        batched = _generate(model, ids, mask)
        logits = torch.stack(batched.logits, 1)  # [B, 8, vocab]
        for i, p in enumerate(prompts):
            alone = _generate(model, p, torch.ones_like(p))
            assert torch.equal(batched.sequences[i, ids.shape[1]:], alone.sequences[0, p.shape[1]:])
            torch.testing.assert_close(logits[i], torch.stack(alone.logits, 1)[0], rtol=0, atol=1e-8)


def test_padded_forward_and_prefill_equal_rows_alone() -> None:
    model = _model(HYBRID)
    prompts, ids, mask = _batch()
    with torch.no_grad():
        out = model(ids, attention_mask=mask, use_cache=True, output_hidden_states=True)
        last, cache = model.prefill(ids, attention_mask=mask)
        for i, p in enumerate(prompts):
            alone = model(p).logits[0]
            torch.testing.assert_close(out.logits[i, ids.shape[1] - p.shape[1]:], alone, rtol=0, atol=1e-10)
            torch.testing.assert_close(last[i], alone[-1], rtol=0, atol=1e-10)
            assert bool((out.logits[i, : ids.shape[1] - p.shape[1]] == 0).all())
        fed = model(ids).logits[0, -1]  # the check can fail: padding fed as tokens changes the shortest row
        assert (fed - model(prompts[0]).logits[0, -1]).abs().max().item() > 1e-3
    assert cache.seen_tokens == ids.shape[1] and len(out.hidden_states) == len(HYBRID) + 1
    kinds = {blk.mixer_type: isinstance(st, RowStates) for blk, st in zip(model.model.layers, cache.states,
                                                                            strict=True)}
    assert kinds == {"gdn": False, "natsl": True, "softmax": False, "interdomain": False}


def test_all_ones_mask_is_the_unpadded_path() -> None:
    model = _model(HYBRID)
    ids = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        a = model(ids, attention_mask=torch.ones_like(ids)).logits
        b = model(ids).logits
    assert torch.equal(a, b)


@pytest.mark.parametrize("row", [[1, 0, 1, 1], [0, 1, 1, 0], [0, 0, 0, 0]])
def test_mask_that_is_not_left_padding_raises(row: list[int]) -> None:
    model = _model(["gdn"])
    ids = torch.randint(0, 256, (2, 4))
    mask = torch.tensor([[1, 1, 1, 1], row])
    with pytest.raises(ValueError, match="^attention_mask must be left padding") as err:
        model(ids, attention_mask=mask)
    assert "\n" not in str(err.value)
