"""The suites with GPU results train every cell with the TF32 setting their results were trained with
(hybrid_attention/device.py, ``set_tf32``): a later change of the default must not change what their cells (later
seeds, resumed runs) train. A suite with results has a ``results/<suite>_gpu`` directory; a stored run config
(``cells/<cell>/seed<k>/config.yaml``) without a ``tf32`` key predates the option, when the trainer never set TF32."""

import json

import pytest
import yaml
from suite_runs import ROOT, WITH_GPU_RESULTS, lm_runs

from hybrid_attention.config.run_config import TrainSection
from hybrid_attention.config.schema import from_dict
from hybrid_attention.experiments import load_suite
from hybrid_attention.training.recall import RecallConfig


def test_the_defaults_turn_tf32_on():
    assert TrainSection().tf32 and RecallConfig().tf32


def test_every_suite_with_gpu_results_is_listed():
    assert "credible_prose" in WITH_GPU_RESULTS and "recall" in WITH_GPU_RESULTS, WITH_GPU_RESULTS


# Recall-only suites whose stored runs predate the "tf32" field of recall rows: the value their code trained with.
# credible_recall's stored rows trained with PyTorch's default, TF32 off.
RECALL_TF32_BEFORE_RECORDING = {"credible_recall": False}


def recorded_tf32(name: str) -> bool:
    """The TF32 setting of the stored runs of ``results/<name>_gpu`` (one value for all of them): the LM runs'
    ``config.yaml``, the recall rows' ``tf32`` (``recall_<task>.rows.json``), else ``RECALL_TF32_BEFORE_RECORDING``;
    False for runs from before either existed (when the trainer never set TF32)."""
    root = ROOT / "results" / f"{name}_gpu"
    values = {bool((yaml.safe_load(p.read_text()).get("train") or {}).get("tf32", False))
              for p in root.glob("cells/*/seed*/config.yaml")}
    values |= {row["tf32"] for p in root.glob("cells/*/seed*/recall_*.rows.json") for row in json.loads(p.read_text())
               if "tf32" in row}
    if not values and name in RECALL_TF32_BEFORE_RECORDING:
        values = {RECALL_TF32_BEFORE_RECORDING[name]}
    assert len(values) <= 1, f"{name}: stored runs disagree on tf32"
    return values.pop() if values else False


def test_recorded_tf32_reads_the_stored_configs():
    assert recorded_tf32("credible_cube") is True  # its stored configs record tf32 on
    assert recorded_tf32("credible_prose") is False  # its configs predate the key


@pytest.mark.parametrize("name", WITH_GPU_RESULTS)
def test_suites_with_gpu_results_pin_their_tf32(name):
    suite = load_suite(ROOT / "configs" / "experiments" / f"{name}.yaml")
    want = recorded_tf32(name)
    checked = 0
    for cell_name, seed, run in lm_runs(suite):
        assert run.train.tf32 is want, (cell_name, seed)
        checked += 1
    for cell in suite.cells:
        for seed in suite.cell_seeds(cell):
            for task in suite.recall_configs(cell, seed).values():
                assert from_dict(RecallConfig, task).tf32 is want, (cell.name, seed)
                checked += 1
    assert checked, f"{name}: no cell checked"


def test_pins_are_explicit():
    """Each suite with GPU results writes its tf32 in its YAML (not inherited from the default)."""
    for name in WITH_GPU_RESULTS:
        assert "tf32:" in (ROOT / "configs" / "experiments" / f"{name}.yaml").read_text(), name
