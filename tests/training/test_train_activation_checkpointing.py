"""``train.checkpointing``: each decoder block under torch.utils.checkpoint (non-reentrant) while training.

Same loss and gradients (float32, 1e-6) with and without it on a tiny model of every mixer; the plain forward in eval
mode / under no_grad; the option validates its type like every other key and reaches the Trainer's model."""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid_attention.config.run_config import load_config
from hybrid_attention.config.schema import ConfigError
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.models.mixers import MIXER_BUILDERS
from hybrid_attention.modules.activation_checkpointing import (
    checkpointed_blocks,
    disable_block_checkpointing,
    enable_block_checkpointing,
)


def _tiny(layers: list[str]) -> HybridForCausalLM:
    cfg = HybridConfig.from_preset("tiny", layers=layers, hidden_size=32, num_heads=2, head_dim=16, state_size=8,
                                   chunk_size=8)
    torch.manual_seed(0)
    return HybridForCausalLM(cfg).float().train()


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_same_loss_and_grads_with_checkpointing():
    layers = sorted(MIXER_BUILDERS)  # every mixer once
    plain = _tiny(layers)
    ckpt = enable_block_checkpointing(copy.deepcopy(plain))
    assert checkpointed_blocks(ckpt) == len(layers) and checkpointed_blocks(plain) == 0
    ids = torch.randint(0, plain.config.vocab_size, (2, 37))
    torch.manual_seed(1)
    l0, g0 = _loss_and_grads(plain, ids)
    torch.manual_seed(1)
    calls = []
    orig = torch.utils.checkpoint.checkpoint

    def spy(*a, **kw):
        calls.append(kw.get("use_reentrant"))
        return orig(*a, **kw)

    import hybrid_attention.modules.activation_checkpointing as mod

    mod.checkpoint = spy
    try:
        l1, g1 = _loss_and_grads(ckpt, ids)
    finally:
        mod.checkpoint = orig
    assert calls == [False] * len(layers)
    assert torch.allclose(l0, l1, rtol=1e-6, atol=1e-6), (l0.item(), l1.item())
    assert g0.keys() == g1.keys() and len(g0) == len(list(plain.parameters()))
    for n in g0:
        assert torch.allclose(g0[n], g1[n], rtol=1e-6, atol=1e-6), (n, (g0[n] - g1[n]).abs().max().item())
    # the state dict is untouched; eval / no_grad run the plain forward (no checkpoint)
    assert plain.state_dict().keys() == ckpt.state_dict().keys()
    ckpt.eval()
    mod.checkpoint = spy
    try:
        with torch.no_grad():
            out = ckpt(ids, use_cache=True)
    finally:
        mod.checkpoint = orig
    assert calls == [False] * len(layers) and out.cache is not None
    disable_block_checkpointing(ckpt)
    assert checkpointed_blocks(ckpt) == 0


def test_config_option_type_and_default():
    assert load_config(None, []).train.checkpointing is False
    assert load_config(None, ["train.checkpointing=true"]).train.checkpointing is True
    for bad in ("train.checkpointing=maybe", "train.checkpointing=1"):
        with pytest.raises(ConfigError, match=r"train.checkpointing = .* is not true/false") as info:
            load_config(None, [bad])
        assert "\n" not in str(info.value)


def test_trainer_enables_it(tmp_path):
    from training_helpers import tiny_config

    from hybrid_attention.training.distributed import init_distributed
    from hybrid_attention.training.trainer import Trainer

    cfg = tiny_config(tmp_path, "model.layers=gdn", "train.checkpointing=true", "train.steps=1",
                      "train.save_final=false")
    trainer = Trainer(cfg, init_distributed("cpu"), False, None, True)
    assert checkpointed_blocks(trainer.user_model) == trainer.user_model.config.num_hidden_layers
    loss = trainer.train_step()
    assert loss == loss  # finite step through the checkpointed blocks
