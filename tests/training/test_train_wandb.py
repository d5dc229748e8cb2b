"""``train.wandb``: the tracked scalars in an offline Weights & Biases run in ``<out_dir>/wandb`` (read back from W&B's
own record file), the same run id after ``--resume``, a failed run marked failed, and one config error line when the
package is missing or the mode is not allowed."""

from __future__ import annotations

import builtins
import json
import struct
from pathlib import Path

import pytest
from training_helpers import tiny_config

from hybrid_attention.config.schema import ConfigError
from hybrid_attention.training.trainer import TrainingDiverged, train


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """W&B's own settings and caches under ``tmp_path``, no mode or key from the environment."""
    pytest.importorskip("wandb")
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    for var, name in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / name))


def _records(path: Path):
    """The protobuf records of a ``.wandb`` file: a 7-byte header, then 32 KiB blocks of chunks (crc32, length,
    type: 1 whole record, 2 first, 3 middle, 4 last part), the layout of a LevelDB log."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    pos, block, part = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += left
            continue
        part += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(part)
            part = b""
            yield record


def _runs(out: Path) -> list[dict]:
    """Every W&B run recorded in ``out/wandb`` (one per ``train`` call, oldest first): id, project, name, config, exit
    code and history {step: {tag: value}}. W&B's service writes the records file in the background; its teardown
    (what the end of the process does) flushes it."""
    import wandb

    wandb.teardown()
    runs = []
    for folder in sorted((out / "wandb").glob("offline-run-*")):
        run = {"history": {}, "exit_code": None}
        for r in _records(next(folder.glob("run-*.wandb"))):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                run.update(id=r.run.run_id, project=r.run.project, name=r.run.display_name,
                           config={i.key: json.loads(i.value_json) for i in r.run.config.update})
            elif kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                run["history"][items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
            elif kind == "exit":
                run["exit_code"] = r.exit.exit_code
        runs.append(run)
    return runs


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_an_offline_run_records_the_tracked_scalars(tmp_path, wandb_env):
    out = tmp_path / "run"
    train(tiny_config(out, "model.layers=[natsl, softmax]", "train.steps=4", "train.eval_every=2",
                      "train.wandb={project: tiny-tests, tags: [ci]}"), quiet=True)
    (run,) = _runs(out)
    assert run["id"] == (out / "wandb" / "run_id").read_text().strip()
    assert run["project"] == "tiny-tests" and run["name"] == "run" and run["exit_code"] == 0
    assert run["config"]["train"]["wandb"]["project"] == "tiny-tests"  # the resolved run config
    h = run["history"]
    assert sorted(h) == [1, 2, 3, 4]
    recs = _metrics(out)
    assert [h[r["step"]]["train/loss"] for r in recs if "loss" in r] == pytest.approx(
        [r["loss"] for r in recs if "loss" in r], rel=1e-6)
    assert [h[r["step"]]["val/ppl"] for r in recs if "val_ppl" in r] == pytest.approx(
        [r["val_ppl"] for r in recs if "val_ppl" in r], rel=1e-6)
    assert [s for s in h if "val/ppl" in h[s]] == [2, 4]
    assert all(0.0 <= h[s]["natsl/softmax_share/layer_0"] <= 1.0 for s in (2, 4))
    assert "natsl/softmax_share/layer_1" not in h[4]  # the softmax layer routes nothing


def test_resume_continues_the_same_wandb_run(tmp_path, wandb_env):
    out = tmp_path / "run"
    common = ("train.checkpoint_every=2", "train.wandb={project: tiny-tests}")
    train(tiny_config(out, "train.steps=2", *common), quiet=True)
    train(tiny_config(out, "train.steps=4", *common), resume=True, quiet=True)
    first, second = _runs(out)
    assert first["id"] == second["id"] == (out / "wandb" / "run_id").read_text().strip()
    assert sorted(first["history"]) == [1, 2] and sorted(second["history"]) == [3, 4]
    # a new run (not resumed) in another folder gets a new id
    train(tiny_config(tmp_path / "other", "train.steps=1", "train.wandb={project: tiny-tests}"), quiet=True)
    assert _runs(tmp_path / "other")[0]["id"] != first["id"]


def test_a_run_that_stops_on_an_error_is_marked_failed(tmp_path, wandb_env):
    out = tmp_path / "run"
    with pytest.raises(TrainingDiverged):
        train(tiny_config(out, "train.steps=20", "optim.lr=1e7", "train.max_nonfinite=1",
                          "train.wandb={project: tiny-tests}"), quiet=True)
    (run,) = _runs(out)
    assert run["exit_code"] == 1 and run["history"]


def test_mode_from_the_config_then_the_environment_then_offline(tmp_path, wandb_env, monkeypatch):
    from hybrid_attention.config.run_config import WandbSection
    from hybrid_attention.training.wandb_tracker import wandb_mode

    assert wandb_mode(WandbSection()) == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode(WandbSection()) == "disabled"
    assert wandb_mode(WandbSection(mode="offline")) == "offline"
    monkeypatch.setenv("WANDB_MODE", "cloud")
    with pytest.raises(ConfigError, match=r"WANDB_MODE = 'cloud' is not allowed; allowed values: offline, online"):
        wandb_mode(WandbSection())
    # disabled: the run trains and W&B records nothing
    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "run"
    train(tiny_config(out, "train.steps=1", "train.wandb={project: tiny-tests}"), quiet=True)
    assert _runs(out) == [] and (out / "final").is_dir()


def test_wandb_section_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'train.wandb.projekt'; allowed keys in 'train.wandb': project"):
        tiny_config(tmp_path / "run", "train.wandb={projekt: x}")
    with pytest.raises(ConfigError, match=r"train.wandb.mode = 'cloud' is not one of offline, online, disabled"):
        tiny_config(tmp_path / "run", "train.wandb={mode: cloud}")


def test_wandb_missing_is_one_config_error(tmp_path, monkeypatch):
    real = builtins.__import__

    def no_wandb(name, *a, **kw):
        if name == "wandb" or name.startswith("wandb."):
            raise ImportError("No module named 'wandb'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ConfigError, match=r"train.wandb is set but the wandb package is not installed: pip install"):
        tiny_config(tmp_path / "run", "train.wandb={project: x}")
    assert not (tmp_path / "run").exists()
    assert tiny_config(tmp_path / "run", "train.wandb=null").train.wandb is None


def test_a_w_and_b_run_that_cannot_start_refuses_the_run_with_nothing_written(tmp_path, wandb_env, monkeypatch):
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))  # no stored W&B key anywhere
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"train.wandb: W&B could not start a run in online mode: .*; "
                                          r"train.wandb.mode=offline needs no network or login"):
        train(tiny_config(out, "train.steps=1", "train.wandb={mode: online}"), quiet=True)
    assert not out.exists()
