"""The suites whose Interdomain results were produced with the "transpose" readout pin it: a later change of
DEFAULT_READOUT must not change what their cells (and resumed runs) train."""

from pathlib import Path

import pytest

from hybrid_attention.config.run_config import model_config
from hybrid_attention.config.schema import from_dict
from hybrid_attention.experiments import load_suite
from hybrid_attention.layers.interdomain import InterdomainAttention
from hybrid_attention.ops.interdomain import readout as readout_mod
from hybrid_attention.training.recall import RecallConfig, build_recall_model

SUITES = Path(__file__).resolve().parents[2] / "configs" / "experiments"
PINNED = ["credible_prose", "credible_prose_cpu", "interdomain_cube", "interdomain_cube_cpu",
          "interdomain_cube_long_cpu", "interdomain_length", "interdomain_length_cpu", "interdomain_length_long_cpu",
          "interdomain_vs_s4d", "interdomain_vs_s4d_cpu", "interdomain_readout_ab", "interdomain_readout_ab_cpu",
          "recall", "recall_cpu"]


@pytest.mark.parametrize("name", PINNED)
def test_pinned_suites_keep_transpose_under_a_switched_default(monkeypatch, name):
    monkeypatch.setattr(readout_mod, "DEFAULT_READOUT", "hermitian")
    profile = next((q for q in ("long_cpu", "cpu") if name.endswith(f"_{q}")), None)  # X_cpu: X.yaml --profile cpu
    stem = name[: -len(profile) - 1] if profile else name
    suite = load_suite(SUITES / f"{stem}.yaml", profile=profile)
    assert suite.name == name
    checked = 0
    for cell in suite.cells:
        if suite.uses_lm(cell):
            cfg = model_config(suite.run_config(cell, 0, Path("/tmp/unused")).model)
            if "interdomain" in cfg.mixer_types:
                want = "hermitian" if "hermitian" in cell.name else "real" if "real" in cell.name else "transpose"
                assert cfg.interdomain_readout == want, cell.name
                checked += 1
        for task in suite.recall_configs(cell, 0).values():
            rc = from_dict(RecallConfig, task)
            for mixer in rc.mixers:
                model = build_recall_model(rc, mixer, rc.d_models[0])
                readouts = {m.readout for m in model.modules() if type(m) is InterdomainAttention}
                assert readouts <= {"transpose"}, (cell.name, mixer)
                checked += bool(readouts)
    assert checked, "no Interdomain cell checked"
