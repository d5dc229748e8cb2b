"""The suites whose GPU results were trained without TF32 pin ``tf32: false`` (hybrid_attention/device.py,
``set_tf32``): the default turned on later must not change what their cells (later seeds, resumed runs) train. A
suite with results has a ``results/<suite>_gpu`` directory."""

from pathlib import Path

import pytest

from hybrid_attention.evaluation.recall import RecallConfig
from hybrid_attention.experiments import load_suite
from hybrid_attention.training.config import TrainSection
from hybrid_attention.training.config_schema import from_dict

ROOT = Path(__file__).resolve().parents[2]
WITH_GPU_RESULTS = sorted(p.name[: -len("_gpu")] for p in (ROOT / "results").glob("*_gpu") if p.is_dir())


def test_the_defaults_turn_tf32_on():
    assert TrainSection().tf32 and RecallConfig().tf32


def test_every_suite_with_gpu_results_is_listed():
    assert "credible_prose" in WITH_GPU_RESULTS and "recall" in WITH_GPU_RESULTS, WITH_GPU_RESULTS


@pytest.mark.parametrize("name", WITH_GPU_RESULTS)
def test_suites_with_gpu_results_pin_tf32_off(name):
    suite = load_suite(ROOT / "configs" / "experiments" / f"{name}.yaml")
    checked = 0
    for cell in suite.cells:
        for seed in suite.cell_seeds(cell):
            if suite.uses_lm(cell):
                assert suite.run_config(cell, seed, Path("/tmp/unused")).train.tf32 is False, (cell.name, seed)
                checked += 1
            for task in suite.recall_configs(cell, seed).values():
                assert from_dict(RecallConfig, task).tf32 is False, (cell.name, seed)
                checked += 1
    assert checked, f"{name}: no cell checked"
