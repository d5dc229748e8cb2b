"""torch.compile of a whole model (reference ops, CPU inductor) runs and matches eager."""

import shutil

import pytest
import torch

from hybrid_attention.models import HybridConfig, HybridForCausalLM


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="inductor needs a C compiler")
def test_compiled_model_matches_eager():
    torch.manual_seed(0)
    model = HybridForCausalLM(HybridConfig.from_preset("tiny", layers=["interdomain", "softmax"])).eval()
    ids = torch.randint(0, 259, (1, 40))
    ref = model(ids, use_cache=False).logits
    out = torch.compile(model)(ids, use_cache=False).logits
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="inductor needs a C compiler")
@pytest.mark.parametrize("mixer", ["interdomain", "s4d", "s4d_bilinear"])
def test_compiled_training_gradients_match_eager(mixer):
    """Training under torch.compile (CPU inductor, reference ops): the loss and every parameter gradient of a 2-layer
    model equal eager's, the SSM parameters included (inductor once returned wrong gradients for log Δ / A of the
    bilinear S4D reference: ops/s4d_bilinear/chunk.py)."""
    torch.manual_seed(0)
    model = HybridForCausalLM(HybridConfig.from_preset("tiny", layers=[mixer, mixer])).train()
    ids = torch.randint(0, 259, (2, 32))

    def grads(fn):
        model.zero_grad(set_to_none=True)
        loss = fn(ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss_e, g_e = grads(model)
    torch._dynamo.reset()  # static shapes: a recompile with automatic dynamic shapes hits an inductor error (CPU)
    loss_c, g_c = grads(torch.compile(model, dynamic=False))
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    assert g_c.keys() == g_e.keys()
    for name, g in g_e.items():
        err = ((g_c[name] - g).norm() / g.norm().clamp(min=1e-12)).item()
        assert err < 1e-3, (name, err)


@pytest.mark.parametrize("backend", ["toeplitz", "fft"])
def test_s4d_autocast_step_traces_without_a_graph_break(monkeypatch, backend):
    """The s4d convolution forms ask no untraceable autocast question inside a compiled step. torch 2.11's Dynamo
    cannot trace ``torch.amp.is_autocast_available`` (a C builtin): it broke the compiled s4d step in both forms,
    the resumed frames hit the recompile limit and ran eagerly on the H200. Stand-in here (torch 2.13 traces the
    builtin): the query breaks the graph whenever it is called while tracing."""

    def untraceable(device_type: str) -> bool:
        torch._dynamo.graph_break()
        return True

    monkeypatch.setattr(torch.amp, "is_autocast_available", untraceable)
    torch._dynamo.reset()
    model = HybridForCausalLM(HybridConfig.from_preset("tiny", layers=["s4d", "s4d"], num_hidden_layers=2,
                                                       mixer_options={"s4d": {"backend": backend}})).train()
    ids = torch.randint(0, 259, (2, 32))

    def loss(ids):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(ids, labels=ids).loss

    explained = torch._dynamo.explain(loss)(ids)
    assert explained.graph_break_count == 0, [str(r.reason)[:120] for r in explained.break_reasons]
