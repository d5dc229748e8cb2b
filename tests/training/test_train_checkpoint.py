"""Checkpoints: safetensors + JSON only, exact round trip, atomic directories, keep-last-N."""

import json

import pytest
import torch
from safetensors.torch import load_file

from hybrid_attention.checkpoints import integrity, step_checkpoints
from hybrid_attention.checkpoints.step_checkpoints import (
    checkpoint_dirs,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint,
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


class _Interrupt:
    """A stand-in that raises KeyboardInterrupt (Ctrl-C) on its ``at``-th call and otherwise calls ``fn``."""

    def __init__(self, fn, at: int):
        self.fn, self.at, self.calls = fn, at, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return self.fn(*args, **kwargs)


_SAVE_POINTS = [("gather", 1), ("save_file", 1), ("save_file", 3), ("write_manifest", 1), ("fsync_dir", 1),
                ("shutil.rmtree", 1), ("shutil.rmtree", 2), ("barrier", 1)]


@pytest.mark.parametrize("point,at", _SAVE_POINTS)
def test_ctrl_c_anywhere_in_a_save_leaves_no_hidden_folder(tmp_path, monkeypatch, point, at):
    """Ctrl-C at any call of a save (a collective, a file, the manifest, the rename's fsync, the rotation's delete)
    leaves no ``.tmp-`` or ``.old-`` folder, and every ``step-`` folder left is intact (the re-saved step 2 is the old
    or the new copy, never gone)."""
    m, opt = _model_and_opt(0)
    _train(m, opt, 1)
    for step in (1, 2):
        save_checkpoint(tmp_path, step, m, opt, {"data": step}, keep=2)
    hooks = {"gather": lambda obj: [obj], "barrier": lambda: None}
    if point in hooks:
        hooks[point] = _Interrupt(hooks[point], at)
    elif point == "shutil.rmtree":
        monkeypatch.setattr(integrity.shutil, "rmtree", _Interrupt(integrity.shutil.rmtree, at))
    else:
        module = step_checkpoints if point == "save_file" else integrity
        monkeypatch.setattr(module, point, _Interrupt(getattr(module, point), at))
    _train(m, opt, 1)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, m, opt, {"data": "again"}, keep=1, **hooks)
    monkeypatch.undo()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    names = [p.name for p in checkpoint_dirs(tmp_path)]
    assert "step-00000002" in names
    for p in checkpoint_dirs(tmp_path):
        assert read_checkpoint(p).verified


def test_rank_zero_writes_every_ranks_generator_state(tmp_path):
    """Only rank 0 touches the disk; it writes the generator states it gathered, and rank r resumes its own."""
    m, opt = _model_and_opt(0)
    torch.manual_seed(11)
    other = {"torch_cpu": torch.get_rng_state()}  # what rank 1 holds
    torch.manual_seed(12)
    assert save_checkpoint(tmp_path, 1, m, opt, {}, keep=1, rank=1, gather=lambda obj: None).name == "step-00000001"
    assert not tmp_path.exists() or not list(tmp_path.iterdir())
    path = save_checkpoint(tmp_path, 1, m, opt, {}, keep=1, gather=lambda obj: [obj, other])
    assert torch.equal(read_checkpoint(path, rank=1).rng["torch_cpu"], other["torch_cpu"])
    assert torch.equal(read_checkpoint(path, rank=0).rng["torch_cpu"], torch.get_rng_state())

