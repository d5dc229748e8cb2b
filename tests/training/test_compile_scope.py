"""``train.compile_scope`` (training/compile.py): "model" compiles the whole model, "blocks" each decoder block and the
loss; blocks of one mixer share one compiled graph, and the compiled step equals eager."""

import shutil

import pytest
import torch
from torch._dynamo.utils import counters
from training_helpers import tiny_config

from hybrid_attention.config.schema import ConfigError
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.training import trainer as trainer_mod
from hybrid_attention.training.compile import COMPILE_SCOPES, compile_model
from hybrid_attention.training.distributed import init_distributed


@pytest.mark.parametrize("scope", COMPILE_SCOPES)
def test_scope_reaches_the_trainer(tmp_path, monkeypatch, scope):
    compiled_modules, compiled_fns = [], []

    def fake_module_compile(self, *args, **kwargs):  # records the call; the model stays eager
        compiled_modules.append(type(self).__name__)

    def fake_compile(fn, **kwargs):
        compiled_fns.append(fn.__name__)
        return fn

    monkeypatch.setattr(torch.nn.Module, "compile", fake_module_compile)
    monkeypatch.setattr(torch, "compile", fake_compile)
    cfg = tiny_config(tmp_path, "train.device=cpu", "train.save_final=false", "train.compile=true",
                      f"train.compile_scope={scope}", "train.steps=1", "train.checkpoint_every=0")
    tr = trainer_mod.Trainer(cfg, init_distributed("cpu"), quiet=True)
    n_layers = len(tr.user_model.model.layers)
    if scope == "model":
        assert compiled_modules == ["HybridForCausalLM"] and compiled_fns == []
    else:
        assert compiled_modules == ["HybridBlock"] * n_layers and compiled_fns == ["compute_loss"]
    assert tr.train_step() > 0


def test_bad_scope_is_one_clear_line(tmp_path):
    with pytest.raises(ConfigError, match="compile_scope"):
        tiny_config(tmp_path, "train.compile_scope=layers")
    with pytest.raises(ValueError, match="compile scope must be one of model, blocks, got 'layers'"):
        compile_model(torch.nn.Linear(2, 2), "layers")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="inductor needs a C compiler")
def test_blocks_scope_compiles_one_graph_per_mixer_and_matches_eager():
    torch.manual_seed(0)
    layers = ["softmax", "gdn", "softmax", "gdn", "softmax", "gdn"]
    model = HybridForCausalLM(HybridConfig.from_preset("tiny", layers=layers)).train()
    ids = torch.randint(0, 259, (2, 32))

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss_e, g_e = step()
    torch._dynamo.reset()
    counters.clear()
    compile_model(model, "blocks")
    loss_c, g_c = step()
    # one graph per distinct block (softmax, gdn) and one for the loss: six layers, three graphs
    assert counters["stats"]["unique_graphs"] == 3
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    assert g_c.keys() == g_e.keys()
    for name in g_e:
        torch.testing.assert_close(g_c[name], g_e[name], rtol=1e-4, atol=1e-5, msg=name)
    torch._dynamo.reset()
