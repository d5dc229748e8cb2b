"""The fla-style faces inside fla's own model code: flash-linear-attention's ``GatedDeltaNetForCausalLM`` with every
block's ``attn`` replaced by a face (float64, CPU). With ``use_cache=True`` fla's model makes its own ``Cache`` and
passes it to every layer; a prefill and then token-by-token decoding from that cache must give the logits of one full
forward (of each row alone, after a left-padded prefill).

fla's ``GatedMLP`` runs a Triton SwiGLU kernel (no CPU path), so each block's MLP is swapped for the same gated MLP in
plain PyTorch with the same weights (``_PlainGatedMLP``); everything else (embedding, blocks, norms, the model's cache
handling, the LM head) is fla's code.
"""

from __future__ import annotations

import pytest
import torch
from fla import models as fla_models  # flash-linear-attention: in the `test` extra
from fla.models.utils import Cache
from torch import nn
from torch.nn import functional as F

from hybrid_attention.integrations import fla as faces

MIXERS = ["interdomain", "s4d", "gdn", "natsl"]
FACES = {"interdomain": faces.InterdomainAttention, "s4d": faces.S4DMixer, "gdn": faces.GatedDeltaNet,
         "natsl": faces.NatsLAttention}


class _PlainGatedMLP(nn.Module):
    """fla's ``GatedMLP`` (swish gate): down(silu(gate(x)) * up(x)), in plain PyTorch, taking its linear layers."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj

    def forward(self, x: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _fla_model(name: str) -> nn.Module:
    """fla's GatedDeltaNetForCausalLM (2 layers, width 64, 2 heads) with the ``name`` face as every block's attn,
    built from fla's config keywords alone (``hidden_size``, ``num_heads``, ``layer_idx``, ``mode``, ``norm_eps``)."""
    torch.manual_seed(0)
    config = fla_models.GatedDeltaNetConfig(hidden_size=64, num_heads=2, head_dim=16, num_hidden_layers=2,
                                            vocab_size=256, fuse_norm=False, fuse_swiglu=False,
                                            fuse_cross_entropy=False, use_cache=True)
    model = fla_models.GatedDeltaNetForCausalLM(config)
    for i, block in enumerate(model.model.layers):
        block.attn = FACES[name](hidden_size=config.hidden_size, num_heads=config.num_heads, layer_idx=i,
                                 mode=config.attn_mode, norm_eps=config.norm_eps, chunk_size=4, backend="reference")
        block.mlp = _PlainGatedMLP(block.mlp)
    return model.double().eval()


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", MIXERS)
def test_prefill_and_decode_in_flas_cache_equal_the_full_forward(name: str) -> None:
    model = _fla_model(name)
    ids = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        out = model(ids[:, :6], use_cache=True)  # the prefill ends mid-chunk (chunk_size 4)
        cache = out.past_key_values
        assert isinstance(cache, Cache)  # fla's model made its own cache and the faces filled it
        _close(out.logits, full[:, :6])
        for t in range(6, 11):
            out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            assert out.past_key_values is cache
            _close(out.logits[:, 0], full[:, t])
    assert len(cache) == 2 and cache.get_seq_length(0) == cache.get_seq_length(1) == 11
    assert type(cache[1]["recurrent_state"]).__name__.endswith("State")  # the layer's own state object


@pytest.mark.parametrize("name", ["interdomain", "natsl"])
def test_left_padded_prefill_and_decode_in_flas_cache_equal_each_row_alone(name: str) -> None:
    model = _fla_model(name)
    g = torch.Generator().manual_seed(2)
    rows = [torch.randint(0, 256, (n,), generator=g) for n in (5, 9)]
    steps = torch.randint(0, 256, (2, 4), generator=g)
    ids = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros(2, 9, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, 9 - len(r) :], mask[i, 9 - len(r) :] = r, 1
    with torch.no_grad():
        out = model(ids, attention_mask=mask, use_cache=True)
        logits, cache = [out.logits[:, -1]], out.past_key_values
        for s in range(steps.shape[1]):
            mask = torch.cat([mask, mask.new_ones(2, 1)], 1)
            out = model(steps[:, s : s + 1], attention_mask=mask, past_key_values=cache, use_cache=True)
            logits.append(out.logits[:, 0])
        for i, r in enumerate(rows):
            alone = model(torch.cat([r, steps[i]])[None], use_cache=False).logits[0, len(r) - 1 :]
            _close(torch.stack([lg[i] for lg in logits]), alone)


@pytest.mark.parametrize("name", MIXERS)
@pytest.mark.parametrize(("hidden_size", "num_heads"), [(256, 4), (64, 2)])
def test_every_face_builds_from_hidden_size_and_num_heads_alone(name: str, hidden_size: int, num_heads: int) -> None:
    face = FACES[name](hidden_size=hidden_size, num_heads=num_heads, layer_idx=0, backend="reference")
    x = torch.randn(1, 3, hidden_size)
    with torch.no_grad():
        o, _, cache = face(x, use_cache=True)
    assert o.shape == x.shape and torch.isfinite(o).all() and cache.get_seq_length(0) == 3
