"""A suite's ``cpu`` / ``long_cpu`` profile resolves to the suite the former ``X_cpu.yaml`` twin gave."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hybrid_attention.experiments.suite import load_suite

SUITES = Path(__file__).resolve().parents[2] / "configs" / "experiments"
TWINS = sorted(p.name for p in SUITES.glob("*_cpu.yaml"))


def _pair(twin: str) -> tuple[str, str]:
    profile = "long_cpu" if twin.endswith("_long_cpu.yaml") else "cpu"
    return twin[: -len(f"_{profile}.yaml")] + ".yaml", profile


@pytest.mark.parametrize("twin", TWINS)
def test_profile_equals_twin(twin):
    base, profile = _pair(twin)
    got = dataclasses.asdict(load_suite(SUITES / base, profile=profile))
    want = dataclasses.asdict(load_suite(SUITES / twin))
    assert got == want
