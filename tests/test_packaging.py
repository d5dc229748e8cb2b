"""What a wheel-only user gets: the example training configs as package data (``hybrid-attention train tiny_cpu``
works without a clone) and the license as an SPDX expression in the metadata."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hybrid_attention.config.examples import EXAMPLES_DIR, config_path, example_names
from hybrid_attention.config.run_config import load_config
from hybrid_attention.config.schema import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_train_takes_the_name_of_a_shipped_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ folder here
    assert example_names() == ["fineweb_edu", "small_gpu", "tiny_cpu", "two_gpu"]
    assert config_path("tiny_cpu") == config_path("tiny_cpu.yaml") == EXAMPLES_DIR / "tiny_cpu.yaml"
    cfg = load_config("tiny_cpu", ["train.steps=3"])
    assert (cfg.model.preset, cfg.train.out_dir, cfg.train.steps) == ("tiny", "runs/tiny_cpu", 3)
    (tmp_path / "tiny_cpu.yaml").write_text("train: {steps: 7}\n")  # a file of that name wins over the example
    assert load_config("tiny_cpu.yaml").train.steps == 7
    with pytest.raises(ConfigError, match=r"cannot read configs/tiny_cpu\.yaml: no such file, and not the name of a "
                                          r"shipped example config \(fineweb_edu, small_gpu, tiny_cpu, two_gpu;"):
        load_config("configs/tiny_cpu.yaml")


def test_the_clones_configs_are_the_shipped_examples():
    for name in example_names():
        assert (ROOT / "configs" / f"{name}.yaml").resolve() == EXAMPLES_DIR / f"{name}.yaml"


@pytest.mark.slow
def test_the_wheel_ships_the_examples_and_an_spdx_license(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "hybrid_attention", src / "hybrid_attention", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                           str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("hybrid_attention-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {f"hybrid_attention/config/examples/{n}.yaml" for n in example_names()} <= names
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
