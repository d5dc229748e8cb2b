"""MQAR / synthetic passkey train-and-evaluate: one tiny sweep end to end."""

import json

from hybrid_attention.evaluation.recall import RecallConfig, recall_sweep, recall_table


def test_mqar_sweep_runs_and_reports(tmp_path):
    cfg = RecallConfig(mixers=["softmax", "s4d"], d_models=[32], lrs=[3e-3], vocab_size=64, seq_len=32,
                       num_kv_pairs=2, train_examples=64, test_examples=32, batch_size=16, epochs=1,
                       device="cpu", out_dir=str(tmp_path), model_options={"state_size": 8, "chunk_size": 8})
    rows = recall_sweep(cfg, log=lambda s: None)
    assert [r["mixer"] for r in rows] == ["softmax", "s4d"]
    assert all(0 <= r["accuracy"] <= 1 and r["state_size"] > 0 for r in rows)
    assert rows[0]["state_size"] > rows[1]["state_size"]  # KV cache vs a fixed SSM state at T=32
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2
    assert json.loads((tmp_path / "config.json").read_text())["task"] == "mqar"
    assert (tmp_path / "accuracy_vs_state.png").exists()
    assert "accuracy" in recall_table(rows)


def test_synthetic_passkey_task(tmp_path):
    cfg = RecallConfig(task="passkey", mixers=["softmax"], d_models=[32], vocab_size=32, seq_len=32,
                       train_examples=32, test_examples=16, batch_size=16, epochs=1, device="cpu",
                       out_dir=str(tmp_path))
    (row,) = recall_sweep(cfg, log=lambda s: None)
    assert row["task"] == "passkey" and 0 <= row["accuracy"] <= 1
