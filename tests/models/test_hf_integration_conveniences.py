"""What HF and lm-eval users expect: ``gradient_checkpointing_enable()`` / ``disable()`` map to the block
checkpointing (same loss and gradients), loading needs ``import hybrid_attention`` (no remote code: config.json has
no ``auto_map``), and ``eval lm-eval`` saves its results JSON."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hybrid_attention.models import HybridConfig, HybridForCausalLM

REPO = Path(__file__).resolve().parents[2]


def _tiny() -> HybridForCausalLM:
    cfg = HybridConfig.from_preset("tiny", layers=["softmax", "s4d", "natsl"], hidden_size=32, num_heads=2,
                                   head_dim=16, state_size=8, chunk_size=8)
    torch.manual_seed(0)
    return HybridForCausalLM(cfg).float().train()


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradient_checkpointing_enable_maps_to_the_blocks(monkeypatch):
    plain = _tiny()
    ckpt = copy.deepcopy(plain)
    assert ckpt.supports_gradient_checkpointing and not ckpt.is_gradient_checkpointing
    ckpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert ckpt.is_gradient_checkpointing and ckpt.is_activation_checkpointing
    calls = []
    orig = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **kw: calls.append(1) or orig(*a, **kw))
    import hybrid_attention.modules.activation_checkpointing as ck

    monkeypatch.setattr(ck, "checkpoint", torch.utils.checkpoint.checkpoint)
    ids = torch.randint(0, plain.config.vocab_size, (2, 24))
    torch.manual_seed(1)
    l0, g0 = _loss_and_grads(plain, ids)
    torch.manual_seed(1)
    l1, g1 = _loss_and_grads(ckpt, ids)
    assert len(calls) == 3  # every block ran under torch.utils.checkpoint
    assert torch.allclose(l0, l1, atol=1e-6) and g0.keys() == g1.keys()
    assert all(torch.allclose(g0[k], g1[k], atol=1e-6, rtol=1e-5) for k in g0)
    ckpt.gradient_checkpointing_disable()
    assert not ckpt.is_gradient_checkpointing
    calls.clear()
    _loss_and_grads(ckpt, ids)
    assert calls == []
    with pytest.raises(ValueError, match="use_reentrant=True is not supported"):
        ckpt.gradient_checkpointing_enable({"use_reentrant": True})


def test_loading_needs_the_import_and_no_remote_code(tmp_path):
    model = _tiny()
    model.save_pretrained(tmp_path)
    assert "auto_map" not in json.loads((tmp_path / "config.json").read_text())
    code = ("import sys\nfrom transformers import AutoModelForCausalLM\n"
            "try:\n    AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
            "except ValueError as e:\n    print('refused:', 'hybrid_attention' in str(e))\n"
            "import hybrid_attention\nm = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
            "print('loaded:', type(m).__name__)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: True" in r.stdout and "loaded: HybridForCausalLM" in r.stdout


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None or importlib.util.find_spec("accelerate") is None,
                    reason="lm-eval[hf] not installed (pip install 'hybrid_attention[eval]')")
def test_eval_lm_eval_writes_its_results(tmp_path, capsys):
    from hybrid_attention.cli import main

    run = tmp_path / "run"
    tiny = ["model.options={hidden_size: 32, num_heads: 2, head_dim: 16, state_size: 8, chunk_size: 8}",
            "data.max_bytes=200000", "data.val_fraction=0.2", "data.seq_len=32", "data.val_tokens=1024",
            "train.batch_size=2", "train.steps=1", "train.progress=false", "train.eval_every=0",
            "train.checkpoint_every=0", "optim.warmup_steps=1", "model.layers=[softmax]", f"train.out_dir={run}"]
    assert main(["train", str(REPO / "configs" / "tiny_cpu.yaml"), *tiny]) == 0
    assert main(["eval", "lm-eval", "--checkpoint", str(run), "--limit", "4", "--batch-size", "4"]) == 0
    doc = json.loads((run / "lm_eval_hybrid_toy_mc.json").read_text())
    assert doc["tasks"] == ["hybrid_toy_mc"] and "acc,none" in doc["results"]["hybrid_toy_mc"]
    assert f"results: {run / 'lm_eval_hybrid_toy_mc.json'}" in capsys.readouterr().out
    out = tmp_path / "elsewhere"
    assert main(["eval", "lm-eval", "--checkpoint", str(run), "--limit", "4", "--out", str(out)]) == 0
    assert [p.name for p in out.iterdir()] == ["lm_eval_hybrid_toy_mc.json"]  # no temporary file left
