"""CI smoke of the experiment runner: the smallest CPU suite end to end (shrunk by overrides), resume, report files."""

import argparse
import json
import time
from pathlib import Path

import pytest

from hybrid_attention.config.schema import ConfigError
from hybrid_attention.experiments import load_suite, run_suite
from hybrid_attention.experiments import runner as runner_mod
from hybrid_attention.experiments.cli import add_parser, main

SUITES = Path(__file__).resolve().parents[2] / "configs" / "experiments"
SMALL = ["base.train.steps=3", "base.train.checkpoint_every=3", "base.data.seq_len=32", "base.data.val_tokens=512",
         "base.data.max_bytes=1000000", "base.train.batch_size=4", "eval.length_tokens=512",
         "eval.length_multipliers=[1, 2, 3.5]", "seeds=[0, 1]"]


def _lines():
    out = []
    return out, out.append


def test_every_suite_loads_and_has_a_cpu_profile():
    names = sorted(p.stem for p in SUITES.glob("*.yaml"))
    assert {"interdomain_vs_s4d", "interdomain_cube", "interdomain_length", "recall",
            "natsl_vs_baselines"} <= set(names)
    for n in names:
        suite = load_suite(SUITES / f"{n}.yaml")
        assert suite.name == n and suite.cells
        cpu = load_suite(SUITES / f"{n}.yaml", profile="cpu")
        assert cpu.name == f"{n}_cpu" and cpu.cells


def test_cpu_suite_end_to_end_and_resume(tmp_path, monkeypatch):
    t0 = time.perf_counter()
    out = tmp_path / "suite"
    suite = load_suite(SUITES / "interdomain_vs_s4d.yaml", ["profile=cpu", *SMALL, f"out_dir={out}"])
    lines, log = _lines()
    doc = run_suite(suite, log=log)
    names = [c.name for c in suite.cells]
    assert doc["failed"] == [], lines
    assert names == ["softmax", "interdomain", "s4d", "s4d_bilinear"]
    # every (cell, seed) trained to the budget and was evaluated at 1x, 2x, 3.5x the training length
    for name in names:
        s = doc["summary"][name]
        assert s["seeds"] == [0, 1] and s["val_ppl"]["n"] == 2 and s["tokens"] == 3 * 4 * 32
        assert [r["seq_len"] for r in s["length"]] == [32, 64, 112]
        assert all(1.0 < r["ppl"]["mean"] < 1000 for r in s["length"])
    assert doc["summary"]["softmax"]["vs_ref_pct"] == 0.0
    assert doc["summary"]["interdomain"]["state"] == doc["summary"]["s4d"]["state"]  # matched state
    assert doc["summary"]["s4d_bilinear"]["state"] == doc["summary"]["s4d"]["state"]
    # the two seeds are different runs
    ppl = doc["summary"]["interdomain"]["val_ppl"]["values"]
    assert ppl[0] != ppl[1]
    for f in ("results.json", "results.md", "ppl_bars.png", "length.png"):
        assert (out / f).stat().st_size > 0, f
    assert (out / "ppl_bars.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "results.md").read_text()
    assert "| interdomain |" in md and "ppl@3.5x" in md and "vs softmax" in md
    assert json.loads((out / "results.json").read_text())["summary"].keys() == set(names)

    # resume: finished cells are skipped (no training at all) ...
    def no_training(*a, **k):
        raise AssertionError("a finished cell was trained again")

    with monkeypatch.context() as m:
        m.setattr(runner_mod, "_train_lm", no_training)
        lines, log = _lines()
        run_suite(suite, log=log)
    assert sum("finished earlier, skipped" in x for x in lines) == 2 * len(names)

    # ... and a cell whose result is missing resumes from its checkpoint instead of starting over
    victim = out / "cells" / "s4d" / "seed1" / "result.json"
    before = json.loads(victim.read_text())["lm"]
    victim.unlink()
    lines, log = _lines()
    doc2 = run_suite(suite, log=log)
    after = json.loads(victim.read_text())["lm"]
    assert after["resumed"] is True and not before["resumed"]
    assert after["steps"] == before["steps"] == 3
    assert after["val_ppl"] == pytest.approx(before["val_ppl"], rel=1e-5)
    assert sum("finished earlier, skipped" in x for x in lines) == 2 * len(names) - 1
    assert doc2["summary"]["s4d"]["val_ppl"]["n"] == 2
    assert time.perf_counter() - t0 < 90


def test_natsl_routing_heatmap_and_recall_cell(tmp_path):
    out = tmp_path / "natsl"
    suite = load_suite(SUITES / "natsl_vs_baselines.yaml",
                       ["profile=cpu", *SMALL, f"out_dir={out}", "seeds=[0]", "eval.routing_windows=2"])
    suite.cells = [suite.cell("natsl_hybrid")]
    doc = run_suite(suite, log=lambda *_: None)
    assert doc["failed"] == []
    routing = doc["summary"]["natsl_hybrid"]["routing"]
    assert list(routing) == ["1"] and len(routing["1"]) == 2  # layer 1 is NAtS-L; one decision per GDN head (2)
    assert all(0.0 <= f <= 1.0 for f in routing["1"])
    assert (out / "routing_natsl_hybrid.png").read_bytes()[:4] == b"\x89PNG"
    assert "softmax fraction per layer" in (out / "results.md").read_text()

    rec = tmp_path / "recall"
    suite = load_suite(SUITES / "recall.yaml", ["profile=cpu", f"out_dir={rec}", "recall_tasks.mqar.train_examples=64",
                                                    "recall_tasks.mqar.test_examples=32", "recall_tasks.mqar.epochs=1",
                                                    "recall_tasks.passkey.train_examples=64",
                                                    "recall_tasks.passkey.test_examples=32",
                                                    "recall_tasks.passkey.epochs=1"])
    suite.cells = [suite.cell("softmax")]
    doc = run_suite(suite, log=lambda *_: None)
    acc = doc["summary"]["softmax"]["recall"]
    assert set(acc) == {"mqar", "passkey"} and all(0.0 <= acc[t]["mean"] <= 1.0 for t in acc)
    assert (rec / "cells" / "softmax" / "seed0" / "recall_mqar.json").exists()
    assert (rec / "recall.png").exists() and "mqar accuracy" in (rec / "results.md").read_text()


def test_bad_suites_fail_with_one_line(tmp_path):
    with pytest.raises(ConfigError, match="reference"):
        load_suite(SUITES / "interdomain_vs_s4d.yaml", ["profile=cpu", "reference=nope"])
    with pytest.raises(ConfigError, match="unknown key"):
        load_suite(SUITES / "interdomain_vs_s4d.yaml", ["profile=cpu", "base.train.stepz=3"])
    with pytest.raises(ConfigError, match="unique"):
        load_suite(SUITES / "interdomain_vs_s4d.yaml", ["profile=cpu", "cells=[{name: a}, {name: a}]"])
    assert main([str(SUITES / "interdomain_vs_s4d.yaml"), "profile=cpu", "seeds=[]"]) == 2


def test_add_parser_defines_the_experiment_subcommand():
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="command"))
    a = p.parse_args(["experiment", "x.yaml", "seeds=[0]", "--report-only"])
    assert a.command == "experiment" and a.suite == "x.yaml" and a.overrides == ["seeds=[0]"] and a.report_only
    assert callable(a.func)


def test_parallel_jobs_match_sequential_and_resume(tmp_path):
    """--jobs 2: (cell, seed) runs as concurrent worker subprocesses give the same numbers as the in-process
    ``jobs=1`` run of the same (cell, seed), each keeps its own log, and a second invocation skips them."""
    t0 = time.perf_counter()
    par = tmp_path / "par"
    over = [*SMALL, "seeds=[0]", "cells=[{name: softmax, overrides: {model: {layers: softmax}}}, "
            "{name: interdomain, overrides: {model: {layers: interdomain}}}]", "reference=softmax"]
    # the CLI path: --only drops the reference cell from what the workers see (they must not need it)
    assert main([str(SUITES / "interdomain_vs_s4d.yaml"), "profile=cpu", *over, f"out_dir={par}", "--jobs", "2",
                 "--only", "interdomain"]) == 0
    assert not (par / "cells" / "softmax").exists()
    suite = load_suite(SUITES / "interdomain_vs_s4d.yaml", ["profile=cpu", *over, f"out_dir={par}", "jobs=2"])
    lines, log = _lines()
    doc = run_suite(suite, log=log)
    assert doc["failed"] == [], lines
    assert sum("finished earlier, skipped" in x for x in lines) == 1  # interdomain from the --only call
    assert any("(worker " in x for x in lines) and any("softmax seed 0: val ppl" in x for x in lines)
    for name in ("softmax", "interdomain"):
        assert "val ppl" in (par / "cells" / name / "seed0" / "worker.log").read_text()
    # the sequential in-process run of the same (cell, seed) gives the same numbers
    seq = tmp_path / "seq"
    suite1 = load_suite(SUITES / "interdomain_vs_s4d.yaml", ["profile=cpu", *over, f"out_dir={seq}"])
    suite1.cells = [suite1.cell("interdomain")]
    doc1 = run_suite(suite1, log=lambda *_: None, jobs=1)
    a = doc["summary"]["interdomain"]["val_ppl"]["mean"]
    assert doc1["summary"]["interdomain"]["val_ppl"]["mean"] == pytest.approx(a, rel=1e-5)
    # a run without result.json is not reported, whatever else its directory holds
    (par / "cells" / "softmax" / "seed0" / "result.json").unlink()
    with pytest.raises(ValueError, match="jobs"):
        run_suite(suite, log=lambda *_: None, jobs=0)
    from hybrid_attention.experiments.report import collect

    s = collect(suite)["summary"]["softmax"]
    assert s["seeds"] == [] and "val_ppl" not in s
    with pytest.raises(ConfigError, match="jobs"):
        load_suite(SUITES / "interdomain_vs_s4d.yaml", ["profile=cpu", "jobs=0"])
    assert time.perf_counter() - t0 < 60


def test_parallel_run_stops_cleanly_on_sigterm(tmp_path):
    """SIGTERM (what `timeout` sends) to a --jobs 2 run: the workers are stopped, the command exits 130 with a one-line
    message, and no unfinished run has a result.json (the report never sees half-written work)."""
    import os
    import re
    import signal
    import subprocess
    import sys

    out = tmp_path / "stop"
    cmd = [sys.executable, "-m", "hybrid_attention.experiments", str(SUITES / "interdomain_vs_s4d.yaml"),
           "profile=cpu", *SMALL,
           "base.train.steps=2000", "base.train.checkpoint_every=1000", "seeds=[0]", f"out_dir={out}",
           "--jobs", "2", "--only", "softmax", "interdomain"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=Path(__file__).resolve().parents[2], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    pids = []
    t0 = time.perf_counter()
    while len(pids) < 2 and time.perf_counter() - t0 < 60:
        line = p.stdout.readline()
        pids += [int(x) for x in re.findall(r"\(worker (\d+),", line)]
    assert len(pids) == 2
    time.sleep(2.0)
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=60)
    err = p.stderr.read()
    assert rc == 130 and "interrupted" in err, err
    for pid in pids:  # the workers were stopped (and reaped) by the runner
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not list(out.glob("cells/*/seed*/result.json"))


@pytest.mark.parametrize("suite_name", ["interdomain_cube", "interdomain_length"])
def test_remaining_cpu_suites_smoke_run(tmp_path, suite_name):
    """The CPU variants not exercised above run end to end at a few steps: every cell trains and is evaluated, and
    the report is written (a broken cell config must fail here, not after minutes of a real run)."""
    tiny = ["base.train.steps=2", "base.train.checkpoint_every=2", "base.data.seq_len=32", "base.data.val_tokens=256",
            "base.data.max_bytes=1000000", "base.train.batch_size=2", "eval.length_tokens=256", "seeds=[0]"]
    suite = load_suite(SUITES / f"{suite_name}.yaml", [*tiny, f"out_dir={tmp_path / 'out'}"], profile="cpu")
    lines, log = _lines()
    doc = run_suite(suite, log=log)
    assert doc["failed"] == [], lines
    assert set(doc["summary"]) == {c.name for c in suite.cells}
    for s in doc["summary"].values():
        assert 1.0 < s["val_ppl"]["mean"] < 1000
    assert (tmp_path / "out" / "results.md").stat().st_size > 0


def test_import_results_merges_earlier_runs(tmp_path):
    """--import-results: the runs of an earlier report of the suite become finished runs of this out_dir (skipped,
    reported, seeds stored as integers); an existing result.json is kept; runs of cells/seeds outside the suite are
    left out; another suite's report, a file without a runs list and a non-integer seed are refused with the file
    name (one-line ConfigError through the CLI)."""
    first = tmp_path / "first"
    over = [*SMALL, "seeds=[0, 1]", "cells=[{name: softmax, overrides: {model: {layers: softmax}}}]",
            "reference=softmax"]
    assert main([str(SUITES / "interdomain_vs_s4d.yaml"), "profile=cpu", *over, "seeds=[0]", f"out_dir={first}"]) == 0
    earlier = json.loads((first / "results.json").read_text())
    second = tmp_path / "second"
    suite = load_suite(SUITES / "interdomain_vs_s4d.yaml", ["profile=cpu", *over, f"out_dir={second}"])
    kept = runner_mod.result_path(second, "softmax", 1)
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({"cell": "softmax", "seed": 1, "marker": True}))
    run0 = {**earlier["runs"][0], "seed": "0"}  # a string seed is normalised
    stray = [{**run0, "cell": "../elsewhere"}, {**run0, "seed": 7}]  # not in the suite: left out
    assert run0["model_revision"] == runner_mod.MODEL_REVISION
    stale = {k: v for k, v in run0.items() if k != "model_revision"}  # an earlier revision's run: left out
    (tmp_path / "r.json").write_text(json.dumps(dict(earlier, runs=[stale, run0, {**run0, "seed": 1}, *stray])))
    lines, log = _lines()
    assert runner_mod.import_results(suite, tmp_path / "r.json", log=log) == 1
    assert "2 run(s) of cells/seeds not in this suite left out" in lines[0]
    assert "1 run(s) of an earlier model revision left out" in lines[0]
    assert not (tmp_path / "elsewhere").exists() and not (second / "cells" / "softmax" / "seed7").exists()
    assert json.loads(kept.read_text()) == {"cell": "softmax", "seed": 1, "marker": True}
    got = json.loads(runner_mod.result_path(second, "softmax", 0).read_text())
    assert got["seed"] == 0 and got["lm"]["val_ppl"] == earlier["runs"][0]["lm"]["val_ppl"]
    suite = load_suite(SUITES / "interdomain_vs_s4d.yaml", ["profile=cpu", *over, "seeds=[0]", f"out_dir={second}"])
    lines, log = _lines()
    run_suite(suite, log=log)
    assert any("finished earlier, skipped" in x for x in lines)
    bad = {"bad.json": "{}", "other.json": json.dumps(dict(earlier, suite="recall")),
           "seed.json": json.dumps(dict(earlier, runs=[{**run0, "seed": "one"}]))}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=name):
            runner_mod.import_results(suite, tmp_path / name)
    assert main([str(SUITES / "interdomain_vs_s4d.yaml"), "profile=cpu", *over, f"out_dir={second}", "--list",
                 "--import-results", str(tmp_path / "other.json")]) == 2


def _fake_run(cell, seed, ppl):
    lm = {"layers": ["softmax"], "params": 10, "state": 4, "tokens": 100, "seq_len": 32, "val_ppl": ppl,
          "val_loss": 1.0, "val_bpb": 1.0, "tokens_per_second": 1.0, "routing": {},
          "length": [{"multiplier": 1.0, "seq_len": 32, "ppl": ppl}]}
    return {"cell": cell, "seed": seed, "wall_s": 1.0, "lm": lm}


def test_report_pairs_cells_with_the_reference_by_seed(tmp_path):
    """The paired column uses only seeds both cells finished: mean ± std of the per-seed differences and the count of
    seeds where the cell was lower; it differs from the ratio of means when seeds disagree."""
    from hybrid_attention.experiments.report import collect, markdown

    over = ["seeds=[0, 1, 2, 3]", "reference=softmax", f"out_dir={tmp_path}",
            "cells=[{name: softmax, overrides: {model: {layers: softmax}}}, "
            "{name: interdomain, overrides: {model: {layers: interdomain}}}]"]
    suite = load_suite(SUITES / "interdomain_vs_s4d.yaml", over, profile="cpu")
    runs = [_fake_run("softmax", 0, 10.0), _fake_run("softmax", 1, 20.0),
            _fake_run("interdomain", 0, 9.0), _fake_run("interdomain", 1, 22.0), _fake_run("interdomain", 2, 1.0),
            _fake_run("softmax", 3, 5.0), _fake_run("interdomain", 3, float("inf"))]  # a diverged run is not paired
    for r in runs:
        p = runner_mod.result_path(tmp_path, r["cell"], r["seed"])
        p.parent.mkdir(parents=True)
        p.write_text(json.dumps(r))
    doc = collect(suite)
    paired = doc["summary"]["interdomain"]["vs_ref_paired_pct"]
    assert paired["seeds"] == [0, 1] and paired["n"] == 2 and paired["lower"] == 1  # seed 2 has no softmax run
    assert paired["values"] == pytest.approx([-10.0, 10.0]) and paired["mean"] == pytest.approx(0.0)
    # the plain column: ratio of the means over all finite runs
    assert doc["summary"]["interdomain"]["vs_ref_pct"] == pytest.approx(100 * (32 / 35 - 1))
    assert "vs_ref_paired_pct" not in doc["summary"]["softmax"]
    assert "+0.0% ± 14.1 (1/2)" in markdown(doc, [])


def test_worker_exit_reason_names_the_signal():
    assert runner_mod._exit_reason(-15) == "worker killed by SIGTERM"
    assert runner_mod._exit_reason(2) == "worker exit 2"


def test_suite_yaml_with_duplicate_keys_is_one_line(tmp_path):
    """A suite file gets the run configs' checks: duplicate keys and a non-mapping top level are one ConfigError."""
    from hybrid_attention.config.schema import ConfigError

    dup = tmp_path / "dup.yaml"
    dup.write_text((SUITES / "interdomain_vs_s4d.yaml").read_text() + "seeds: [5]\n")
    with pytest.raises(ConfigError, match="seeds"):
        load_suite(dup)
    top = tmp_path / "list.yaml"
    top.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_suite(top)
