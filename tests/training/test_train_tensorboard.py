"""``train.tensorboard: true``: loss, validation ppl, lr, gradient norm, tokens/s and the NAtS-L softmax share per
layer as TensorBoard scalars in ``<out_dir>/tensorboard``; a clear config error without the package; the end-of-run
plots of lr, gradient norm and tokens/s. tensorboard is in the `test` extra, so these run wherever the suite does."""

from __future__ import annotations

import builtins

import pytest
from training_helpers import tiny_config

from hybrid_attention.config.schema import ConfigError
from hybrid_attention.training.trainer import train


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_scalars_of_a_natsl_run(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(out, "model.layers=[natsl, softmax]", "train.steps=4", "train.eval_every=2",
                      "train.tensorboard=true", "train.plots=true"), quiet=True)
    s = _scalars(out / "tensorboard")
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "val/loss", "val/ppl"):
        assert tag in s, sorted(s)
    assert [step for step, _ in s["train/loss"]] == [1, 2, 3, 4]  # log_every=1
    assert [step for step, _ in s["val/ppl"]] == [2, 4]
    share = s["natsl/softmax_share/layer_0"]
    assert [step for step, _ in share] == [2, 4] and all(0.0 <= v <= 1.0 for _, v in share)
    assert "natsl/softmax_share/layer_1" not in s  # the softmax layer routes nothing
    # the same numbers as metrics.jsonl
    import json

    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in recs if "lr" in r]
    assert [v for _, v in s["train/lr"]] == pytest.approx(lrs, rel=1e-6)
    for name in ("lr.png", "grad_norm.png", "tokens_per_s.png", "loss.png", "ppl.png"):
        assert (out / name).stat().st_size > 0


def test_tensorboard_off_writes_no_events(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(out, "train.steps=1"), quiet=True)
    assert not (out / "tensorboard").exists()


def test_tensorboard_missing_is_one_config_error(tmp_path, monkeypatch):
    real = builtins.__import__

    def no_tensorboard(name, *a, **kw):
        if name == "tensorboard" or name.startswith("tensorboard."):
            raise ImportError("No module named 'tensorboard'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(ConfigError, match=r"train.tensorboard = true needs the tensorboard package: pip install"):
        tiny_config(tmp_path / "run", "train.tensorboard=true")
    assert not (tmp_path / "run").exists()


def test_events_of_a_run_that_stops_on_an_error_are_flushed(tmp_path):
    import subprocess

    from training_helpers import REPO, cli_cmd, cli_env, tiny_overrides

    out = tmp_path / "run"
    args = tiny_overrides(out, "train.steps=50", "optim.lr=1e7", "train.max_nonfinite=1", "train.tensorboard=true")
    r = subprocess.run(cli_cmd("train", str(REPO / "configs" / "tiny_cpu.yaml"), *args), env=cli_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "error: stopping at step" in r.stderr, r.stderr[-2000:]
    steps = [step for step, _ in _scalars(out / "tensorboard")["train/loss"]]
    assert steps and steps == sorted(steps)
