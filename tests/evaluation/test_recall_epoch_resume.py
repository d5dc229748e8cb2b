"""A recall model cut after an epoch resumes from that epoch's checkpoint (``recall_resume``) and ends exactly as the
uncut run: same loss, accuracy and epochs, on fresh examples per epoch, with a NAtS-L layer's Gumbel routing noise
(the global RNG) included; a checkpoint of another model is ignored, a damaged one is not used."""

import pytest
import torch

from hybrid_attention.training import recall
from hybrid_attention.training.recall import RecallConfig


class Cut(Exception):
    pass


def _cfg() -> RecallConfig:
    return RecallConfig(vocab_size=64, seq_len=32, num_kv_pairs=3, train_examples=48, test_examples=16, batch_size=16,
                        epochs=3, fresh_data=True, early_stop=2.0, device="cpu", model_options={"chunk_size": 8})


def _cut_after(epoch: int):
    def log(msg: str) -> None:
        if f"epoch {epoch}:" in msg:
            raise Cut
    return log


@pytest.mark.parametrize("mixer", ["softmax", "natsl"])
def test_a_cut_model_resumes_to_the_uncut_result(tmp_path, mixer):
    cfg, cpu = _cfg(), torch.device("cpu")
    uncut = recall.train_and_eval(cfg, mixer, 16, 3e-3, cpu)
    with pytest.raises(Cut):
        recall.train_and_eval(cfg, mixer, 16, 3e-3, cpu, log=_cut_after(2), resume_dir=tmp_path)
    lines = []
    resumed = recall.train_and_eval(cfg, mixer, 16, 3e-3, cpu, log=lines.append, resume_dir=tmp_path)
    assert any("resumed after epoch 2" in m for m in lines), lines
    assert sum("epoch 3:" in m for m in lines) == 1 and not any("epoch 1:" in m for m in lines)
    for key in ("loss", "accuracy", "epochs", "history"):  # history: the cut run's epochs came from the checkpoint
        assert resumed[key] == uncut[key], key
    assert [h["epoch"] for h in uncut["history"]] == [1, 2, 3]
    assert uncut["history"][-1]["accuracy"] == uncut["accuracy"] and uncut["history"][-1]["loss"] == uncut["loss"]
    assert resumed["seconds"] > 0


def test_a_model_cut_inside_its_length_curriculum_resumes_to_the_uncut_result(tmp_path):
    # cut after the last short epoch: the resumed run trains epoch 3 at the full length, as the uncut one did
    cfg, cpu = _cfg(), torch.device("cpu")
    cfg.short_seq_len, cfg.short_epochs = 24, 2
    uncut = recall.train_and_eval(cfg, "softmax", 16, 3e-3, cpu)
    with pytest.raises(Cut):
        recall.train_and_eval(cfg, "softmax", 16, 3e-3, cpu, log=_cut_after(2), resume_dir=tmp_path)
    resumed = recall.train_and_eval(cfg, "softmax", 16, 3e-3, cpu, resume_dir=tmp_path)
    assert (resumed["loss"], resumed["accuracy"], resumed["epochs"]) == (uncut["loss"], uncut["accuracy"], 3)
    assert [h["seq_len"] for h in resumed["history"]] == [24, 24, 32] and resumed["history"] == uncut["history"]
    plain = recall.train_and_eval(_cfg(), "softmax", 16, 3e-3, cpu)  # and the curriculum changed the run
    assert plain["loss"] != uncut["loss"]


def test_a_checkpoint_from_before_a_new_none_field_still_resumes(tmp_path, monkeypatch):
    # a checkpoint that stores every config field, None ones included, but not a field added later with a None
    # default (short_num_kv_pairs): the fingerprint leaves None values out on both sides, so it resumes
    from hybrid_attention.training import recall_resume

    cfg, cpu = _cfg(), torch.device("cpu")
    real = recall_resume.fingerprint

    def old_style(*args):
        fp = real(*args)
        config = {**fp["config"], "short_seq_len": None}
        return {**fp, "config": config}

    monkeypatch.setattr(recall, "fingerprint", old_style)
    with pytest.raises(Cut):
        recall.train_and_eval(cfg, "softmax", 16, 3e-3, cpu, log=_cut_after(2), resume_dir=tmp_path)
    monkeypatch.setattr(recall, "fingerprint", real)
    lines = []
    recall.train_and_eval(cfg, "softmax", 16, 3e-3, cpu, log=lines.append, resume_dir=tmp_path)
    assert any("resumed after epoch 2" in m for m in lines), lines
    assert "short_num_kv_pairs" not in real(cfg, "softmax", 16, 3e-3)["config"]
    cfg2 = _cfg()
    cfg2.short_seq_len, cfg2.short_epochs, cfg2.short_num_kv_pairs = 24, 2, 2
    assert real(cfg2, "softmax", 16, 3e-3)["config"]["short_num_kv_pairs"] == 2  # a set value counts


def test_another_models_checkpoint_is_ignored_and_a_damaged_one_not_used(tmp_path):
    cfg, cpu = _cfg(), torch.device("cpu")
    with pytest.raises(Cut):
        recall.train_and_eval(cfg, "softmax", 16, 3e-3, cpu, log=_cut_after(1), resume_dir=tmp_path)
    lines = []
    other = recall.train_and_eval(cfg, "softmax", 16, 1e-3, cpu, log=lines.append, resume_dir=tmp_path)
    assert any("another config or model" in m for m in lines) and not any("resumed" in m for m in lines)
    fresh = recall.train_and_eval(cfg, "softmax", 16, 1e-3, cpu)
    assert (other["loss"], other["accuracy"]) == (fresh["loss"], fresh["accuracy"])
    # the lr-1e-3 run wrote its own epoch-3 checkpoint; damage it: the next start is a fresh one
    (step,) = sorted(tmp_path.glob("step-*"))
    data = bytearray((step / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (step / "model.safetensors").write_bytes(bytes(data))
    lines = []
    recall.train_and_eval(cfg, "softmax", 16, 1e-3, cpu, log=lines.append, resume_dir=tmp_path)
    assert any("damaged" in m for m in lines) and not any("resumed" in m for m in lines)


def test_a_model_cut_after_its_last_epoch_reports_without_training(tmp_path):
    # cut between the last epoch's checkpoint and its row: the next start trains nothing and reports the same row
    # (T 64, seed 0: a routing whose softmax fraction differs from the one a state size assumes without a record)
    cfg, cpu = _cfg(), torch.device("cpu")
    cfg.vocab_size, cfg.seq_len = 128, 64
    uncut = recall.train_and_eval(cfg, "natsl", 16, 3e-3, cpu)
    assert uncut["state_size"] != recall.build_recall_model(cfg, "natsl", 16).state_size(cfg.seq_len, {})
    with pytest.raises(Cut):
        recall.train_and_eval(cfg, "natsl", 16, 3e-3, cpu, log=_cut_after(3), resume_dir=tmp_path)
    lines = []
    resumed = recall.train_and_eval(cfg, "natsl", 16, 3e-3, cpu, log=lines.append, resume_dir=tmp_path)
    assert not any(": loss" in m for m in lines)  # no epoch trained
    for key in ("loss", "accuracy", "epochs", "state_size"):
        assert resumed[key] == uncut[key], key
