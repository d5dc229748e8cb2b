"""A suite's ``cpu`` / ``long_cpu`` profile: the resolved suite (name, out_dir, seeds, cells, the first cell's run or
recall config) and the ``--profile`` / ``profile=`` selection."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hybrid_attention.config.schema import ConfigError, from_dict
from hybrid_attention.experiments.cli import main as experiment_main
from hybrid_attention.experiments.suite import load_suite
from hybrid_attention.training.recall import RecallConfig

SUITES = Path(__file__).resolve().parents[2] / "configs" / "experiments"

# (suite, profile): seeds, cells, and the first cell's lm (preset, device, steps, batch_size, seq_len, compile,
# precision) or recall (task, device, seq_len, epochs, compile)
EXPECTED = {
    ("credible_cube", "cpu"): ([0, 1], ["full", "no_rope", "single_input_q", "dual_input_no_q", "s4d", "s4d_rope"],
                               ("tiny", "cpu", 20, 8, 128, False, "auto"), None),
    ("credible_mqar_curriculum", "cpu"): ([0], ["interdomain", "gdn", "s4d", "gdn_hybrid", "natsl_hybrid", "softmax"],
                                          None, ("mqar_t1024_from_t256", "cpu", 64, 2, False)),
    ("credible_mqar_pairs_curriculum", "cpu"): ([0], ["interdomain", "natsl_hybrid", "gdn_hybrid"],
                                                None, ("mqar_t1024_from_t256_16pairs", "cpu", 64, 2, False)),
    ("credible_natsl", "cpu"): ([0, 1], ["softmax", "gdn", "gdn_hybrid", "natsl_hybrid"],
                                ("tiny", "cpu", 20, 8, 128, False, "auto"), None),
    ("credible_passkey_length", "cpu"): ([0], ["interdomain", "interdomain_slow_dt", "gdn", "s4d", "softmax"],
                                         None, ("passkey_t128", "cpu", 32, 1, False)),
    ("credible_prose_200m", "cpu"): ([0], ["softmax", "interdomain", "s4d"],
                                     ("tiny", "cpu", 20, 8, 128, False, "auto"), None),
    ("credible_prose", "cpu"): ([0, 1], ["softmax", "interdomain", "s4d", "s4d_bilinear", "interdomain_hermitian",
                                         "interdomain_real"], ("tiny", "cpu", 20, 8, 128, False, "auto"), None),
    ("credible_recall", "cpu"): ([0], ["softmax", "interdomain", "s4d", "gdn", "gdn_hybrid", "natsl_hybrid"],
                                 None, ("mqar_t256", "cpu", 64, 2, False)),
    ("interdomain_cube", "cpu"): ([0, 1, 2, 3], ["full", "no_rope", "single_input_q", "dual_input_no_q", "s4d",
                                                 "s4d_rope"], ("tiny", "cpu", 80, 8, 128, False, "auto"), None),
    ("interdomain_cube", "long_cpu"): ([0, 1, 2, 3, 4, 5, 6], ["full", "no_rope", "single_input_q", "dual_input_no_q",
                                                              "s4d", "s4d_rope"],
                                       ("tiny", "cpu", 640, 8, 128, False, "auto"), None),
    ("interdomain_length", "cpu"): ([0, 1, 2, 3], ["softmax", "interdomain", "s4d"],
                                    ("tiny", "cpu", 100, 16, 64, False, "auto"), None),
    ("interdomain_length", "long_cpu"): ([0, 1, 2, 3, 4], ["softmax", "interdomain", "s4d", "interdomain_no_rope"],
                                         ("tiny", "cpu", 600, 16, 64, False, "auto"), None),
    ("interdomain_readout_ab", "cpu"): ([0, 1], ["softmax", "interdomain_transpose", "interdomain_hermitian",
                                                 "interdomain_real", "s4d", "s4d_bilinear"],
                                        ("tiny", "cpu", 150, 8, 128, False, "auto"), None),
    ("interdomain_vs_s4d", "cpu"): ([0, 1, 2, 3], ["softmax", "interdomain", "s4d", "s4d_bilinear"],
                                    ("tiny", "cpu", 150, 8, 128, False, "auto"), None),
    ("natsl_vs_baselines", "cpu"): ([0, 1], ["softmax", "gdn", "gdn_hybrid", "natsl_hybrid", "natsl_all",
                                             "natsl_hybrid_w_from_x", "natsl_hybrid_shared_norm"],
                                    ("tiny", "cpu", 100, 8, 128, False, "auto"), None),
    ("recall", "cpu"): ([0], ["softmax", "interdomain", "s4d", "gdn", "gdn_hybrid", "natsl_hybrid"],
                        None, ("mqar", "cpu", 64, 12, False)),
}


@pytest.mark.parametrize("suite_name,profile", sorted(EXPECTED))
def test_profile_resolves_to_the_cpu_suite(suite_name, profile):
    seeds, cells, lm, recall = EXPECTED[(suite_name, profile)]
    s = load_suite(SUITES / f"{suite_name}.yaml", profile=profile)
    assert s.name == f"{suite_name}_{profile}"
    assert s.out_dir == f"runs/experiments/{suite_name}_{profile}"  # results/<suite>_<profile> keep their names
    assert s.seeds == seeds
    assert [c.name for c in s.cells] == cells
    first = s.cells[0]
    if lm is not None:
        r = s.run_config(first, 0, Path("run"))
        assert (r.model.preset, r.train.device, r.train.steps, r.train.batch_size, r.data.seq_len, r.train.compile,
                r.train.precision) == lm
    if recall is not None:
        task, spec = next(iter(s.recall_configs(first, 0).items()))
        rc = from_dict(RecallConfig, spec)
        assert (task, rc.device, rc.seq_len, rc.epochs, rc.compile) == recall


def test_no_cpu_twin_files_remain():
    assert sorted(p.name for p in SUITES.glob("*_cpu.yaml")) == []


def test_without_profile_the_suite_is_as_written():
    s = load_suite(SUITES / "credible_cube.yaml")
    assert s.name == "credible_cube" and s.out_dir == "runs/experiments/credible_cube"
    r = s.run_config(s.cells[0], 0, Path("run"))
    assert (r.model.preset, r.train.device, r.train.compile) == ("small", "cuda", True)


def test_profile_override_equals_profile_flag():
    flag = load_suite(SUITES / "recall.yaml", profile="cpu")
    word = load_suite(SUITES / "recall.yaml", ["profile=cpu"])
    assert dataclasses.asdict(flag) == dataclasses.asdict(word)


def test_overrides_apply_after_the_profile():
    s = load_suite(SUITES / "interdomain_vs_s4d.yaml", ["seeds=[7]", "base.train.steps=3"], profile="cpu")
    assert s.seeds == [7] and s.base["train"]["steps"] == 3 and s.base["train"]["device"] == "cpu"


def test_unknown_profile_is_one_line_naming_the_flag_and_the_profiles():
    with pytest.raises(ConfigError) as e:
        load_suite(SUITES / "interdomain_cube.yaml", profile="gpu")
    msg = str(e.value)
    assert "\n" not in msg and "--profile" in msg and "cpu, long_cpu" in msg and "'gpu'" in msg


def test_cli_unknown_profile_exits_with_one_error_line(capsys):
    assert experiment_main([str(SUITES / "recall.yaml"), "--profile", "nope", "--list"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "--profile" in err[0]


def test_cli_profile_lists_the_profile_cells(capsys, tmp_path):
    out = tmp_path / "out"
    assert experiment_main([str(SUITES / "recall.yaml"), f"out_dir={out}", "--profile", "cpu", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "softmax: seeds [0], finished []"


def test_profile_null_removes_a_key_and_a_set_name_is_kept(tmp_path):
    text = (SUITES / "interdomain_vs_s4d.yaml").read_text().split("\nprofiles:")[0]
    path = tmp_path / "s.yaml"
    path.write_text(text + "\nprofiles:\n  cpu: {base: {train: {tf32: null, device: cpu}}}\n"
                    "  named: {name: other, out_dir: elsewhere, base: {train: {device: cpu}}}\n")
    written = load_suite(path)
    assert written.base["train"]["tf32"] is False  # the suite as written pins tf32 off
    cpu = load_suite(path, profile="cpu")
    assert "tf32" not in cpu.base["train"] and cpu.run_config(cpu.cells[0], 0, Path("run")).train.tf32 is True
    assert (cpu.name, cpu.out_dir) == ("interdomain_vs_s4d_cpu", "runs/experiments/interdomain_vs_s4d_cpu")
    named = load_suite(path, profile="named")
    assert (named.name, named.out_dir) == ("other", "elsewhere")
