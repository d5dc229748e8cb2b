"""``hybrid-attention compare``: runs side by side at the largest training-token count every run validated at, the
numbers read back from each run's own files, one plot set; one error line for a folder that is not a run and for runs
that share no token count, with nothing written."""

from __future__ import annotations

import json

import pytest

from hybrid_attention.cli import main
from hybrid_attention.config.run_config import load_config
from hybrid_attention.errors import DataError
from hybrid_attention.evaluation.info import state_size
from hybrid_attention.evaluation.loading import load_model
from hybrid_attention.experiments.compare import compare_runs
from hybrid_attention.training.metrics import read_metrics
from hybrid_attention.training.trainer import train

TINY = ["model.options={hidden_size: 32, num_heads: 2, head_dim: 16, state_size: 8, chunk_size: 8}",
        "data.max_bytes=400000", "data.val_fraction=0.2", "data.seq_len=32", "data.val_tokens=1024",
        "train.batch_size=4", "train.progress=false", "train.plots=false", "train.log_every=1", "train.device=cpu",
        "optim.warmup_steps=1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Four tiny runs: 128 tokens per step validated every 2 steps (6 and 4 steps), 256 tokens per step validated
    every step (2 steps), and one of 48-token rows (192 tokens per step) that shares no validation count."""
    root = tmp_path_factory.mktemp("compare")
    specs = {"interdomain": ["model.layers=interdomain", "train.steps=6", "train.eval_every=2"],
             "natsl": ["model.layers=natsl", "train.steps=4", "train.eval_every=2"],
             "softmax": ["model.layers=softmax", "train.steps=2", "train.eval_every=1", "train.batch_size=8"],
             "gdn_long_rows": ["model.layers=gdn", "train.steps=2", "train.eval_every=0", "data.seq_len=48"]}
    for name, extra in specs.items():
        train(load_config(None, [*TINY, *extra, f"train.out_dir={root / name}"]), quiet=True)
    return root


def _val(folder, step: int) -> dict:
    return [r for r in read_metrics(folder / "metrics.jsonl") if r.get("step") == step and "val_ppl" in r][-1]


def test_runs_compared_at_the_largest_shared_token_count(runs, tmp_path):
    folders = [runs / "interdomain", runs / "natsl", runs / "softmax"]
    res = compare_runs(folders, tmp_path / "out")
    assert res["tokens"] == 512  # validated at 256/512/768, 256/512 and 512/256 x 2 -> largest shared: 512
    rows = {r["run"]: r for r in res["rows"]}
    assert {name: r["steps"] for name, r in rows.items()} == {"interdomain": 4, "natsl": 4, "softmax": 2}
    for folder in folders:
        row, val = rows[folder.name], _val(folder, rows[folder.name]["steps"])
        assert (row["val_loss"], row["val_ppl"], row["val_bpb"]) == (val["val_loss"], val["val_ppl"], val["val_bpb"])
        model = load_model(folder, "cpu").model  # the trained model: the same parameters and state size
        assert row["params"] == model.num_parameters()
        assert row["state"] == state_size(model, 32)
        logged = [r for r in read_metrics(folder / "metrics.jsonl") if "tok_per_s" in r and r["tokens"] <= 512]
        assert row["loss"] == logged[-1]["loss"]
        rates = [r["tok_per_s"] for r in logged]
        assert min(rates) * (1 - 1e-9) <= row["tok_s"] <= max(rates) * (1 + 1e-9)  # the throughput of those steps
    assert rows["natsl"]["note"].startswith("NAtS-L layers counted with 50% of their chunks routed to softmax")
    assert "of the last validation batch's chunks" in rows["natsl"]["note"]
    assert f"natsl, state@32: {rows['natsl']['note']}" in res["table"]
    assert res["table"].splitlines()[0].split()[:3] == ["run", "layers", "params"]
    out = tmp_path / "out"
    assert (out / "table.txt").read_text() == res["table"] + "\n"
    assert json.loads((out / "compare.json").read_text())["rows"] == res["rows"]
    for name in ("compare_loss.png", "compare_val_ppl.png", "compare_tokens_per_s.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".*"))  # no partial files left

    # --tokens: another shared count
    again = compare_runs(folders[:2], tmp_path / "out256", tokens=256, plots=False)
    assert [r["steps"] for r in again["rows"]] == [2, 2]
    assert [r["val_ppl"] for r in again["rows"]] == [_val(f, 2)["val_ppl"] for f in folders[:2]]


def test_runs_that_share_no_token_count_are_one_error_naming_what_was_compared(runs, tmp_path):
    with pytest.raises(DataError, match=r"share no training-token count .* interdomain: 256, 512, 768 \(128 tokens "
                                        r"per step\); gdn_long_rows: 384 \(192 tokens per step\)"):
        compare_runs([runs / "interdomain", runs / "gdn_long_rows"], tmp_path / "out")
    with pytest.raises(DataError, match=r"--tokens 300: not a training-token count .* shared counts: 256, 512"):
        compare_runs([runs / "interdomain", runs / "natsl"], tmp_path / "out", tokens=300)
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_not_a_run_is_one_error(runs, tmp_path):
    (tmp_path / "empty").mkdir()
    for folder, what in ((tmp_path / "empty", r"is not a training run folder \(no config.yaml, metrics.jsonl, "
                                              r"tokenizer"),
                         (runs / "natsl" / "final", r"is not a training run folder \(no config.yaml, metrics.jsonl"),
                         (tmp_path / "missing", r"is not a folder")):
        with pytest.raises(DataError, match=what):
            compare_runs([runs / "interdomain", folder], tmp_path / "out")
    with pytest.raises(DataError, match="named twice"):
        compare_runs([runs / "natsl", runs / "natsl"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_command(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(runs / "interdomain"), str(runs / "softmax"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("2 runs at 512 training tokens (the largest count at which every run has a validation")
    assert (out / "table.txt").read_text() in printed
    assert main(["compare", str(runs / "interdomain"), str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: compare: ") and err.count("\n") == 1
