"""Checkpoints: safetensors + JSON only, exact round trip, atomic directories, keep-last-N."""

import json

import torch
from safetensors.torch import load_file

from hybrid_attention.checkpoints.step_checkpoints import (
    checkpoint_dirs,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)


def _model_and_opt(seed: int):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.LayerNorm(6), torch.nn.Linear(6, 3))
    opt = torch.optim.AdamW([{"params": [m[0].weight, m[2].weight], "name": "decay"},
                             {"params": [m[0].bias, m[1].weight, m[1].bias, m[2].bias], "weight_decay": 0.0}], lr=1e-2)
    return m, opt


def _train(m, opt, n):
    for _ in range(n):
        m(torch.randn(4, 6)).square().mean().backward()
        opt.step()
        opt.zero_grad()


def test_round_trip_is_exact_and_pickle_free(tmp_path):
    m, opt = _model_and_opt(0)
    _train(m, opt, 3)
    path = save_checkpoint(tmp_path, 3, m, opt, {"data": {"epoch": 0, "batch": 3}}, keep=2)
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json", "model.safetensors", "optimizer.safetensors", "rng-rank0.safetensors", "trainer_state.json"]
    json.loads((path / "trainer_state.json").read_text())  # plain JSON
    load_file(str(path / "optimizer.safetensors"))
    ref_next = torch.rand(3)  # the RNG stream right after saving
    _train(m, opt, 2)
    ref = {k: v.clone() for k, v in m.state_dict().items()}

    m2, opt2 = _model_and_opt(1)
    doc = load_checkpoint(path, m2, opt2)
    assert doc["step"] == 3 and doc["data"] == {"epoch": 0, "batch": 3}
    assert torch.equal(torch.rand(3), ref_next)
    _train(m2, opt2, 2)
    assert all(torch.equal(ref[k], v) for k, v in m2.state_dict().items())
    assert opt2.param_groups[0]["name"] == "decay"


def test_keep_last_n_and_ignore_partial(tmp_path):
    m, opt = _model_and_opt(0)
    _train(m, opt, 1)
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, m, opt, {}, keep=2)
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["step-00000003", "step-00000004"]
    (tmp_path / ".tmp-step-00000005").mkdir()  # what a kill during a save leaves behind
    (tmp_path / ".tmp-step-00000005" / "model.safetensors").write_bytes(b"partial")
    assert latest_checkpoint(tmp_path).name == "step-00000004"
    save_checkpoint(tmp_path, 6, m, opt, {}, keep=2)
    assert not (tmp_path / ".tmp-step-00000005").exists()
