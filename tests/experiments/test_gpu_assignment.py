"""``experiment ... --gpus 0,1``: one worker process per run, each seeing one GPU through CUDA_VISIBLE_DEVICES, at
most ``jobs`` at once, each started on the GPU with the fewest running workers. The workers here are fakes that
record their environment and write the run's result, so no model trains."""

import subprocess
from pathlib import Path

import pytest

from hybrid_attention.config.schema import ConfigError
from hybrid_attention.experiments import load_suite, run_suite
from hybrid_attention.experiments.cli import main, parse_gpus
from hybrid_attention.experiments.paths import result_path
from hybrid_attention.experiments.runner import pick_gpu

SUITES = Path(__file__).resolve().parents[2] / "configs" / "experiments"


class _FakeWorker:
    """Stands in for ``subprocess.Popen`` of a worker: records (cell, seed, CUDA_VISIBLE_DEVICES, the GPUs of the
    workers running beside it) and finishes on its second poll."""

    launched: list = []
    alive: list = []

    def __init__(self, args, stdout=None, stderr=None, cwd=None, env=None):
        self.cell, self.seed = args[-2], int(args[-1])
        self.gpu = env.get("CUDA_VISIBLE_DEVICES")
        self.pid = 1000 + len(self.launched)
        self.returncode = None
        self._polls = 0
        _FakeWorker.alive.append(self)
        _FakeWorker.launched.append((self.cell, self.seed, self.gpu, [w.gpu for w in _FakeWorker.alive]))
        self.out = Path(args[-3]).parent

    def poll(self):
        self._polls += 1
        if self._polls < 2:
            return None
        if self.returncode is None:
            path = result_path(self.out, self.cell, self.seed)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}")
            self.returncode = 0
            _FakeWorker.alive.remove(self)
        return self.returncode

    def terminate(self):
        pass

    def wait(self, timeout=None):
        return self.returncode


@pytest.fixture
def fake_workers(monkeypatch):
    _FakeWorker.launched, _FakeWorker.alive = [], []
    monkeypatch.setattr(subprocess, "Popen", _FakeWorker)
    monkeypatch.setattr("hybrid_attention.experiments.runner.collect", lambda *a, **k: {})
    monkeypatch.setattr("hybrid_attention.experiments.runner.write_report", lambda *a, **k: None)
    return _FakeWorker


def test_each_run_sees_one_gpu_and_no_gpu_runs_two_workers(tmp_path, fake_workers):
    suite = load_suite(SUITES / "interdomain_vs_s4d.yaml", ["profile=cpu", f"out_dir={tmp_path}", "seeds=[0,1]"])
    n_runs = sum(len(suite.cell_seeds(c)) for c in suite.cells)
    run_suite(suite, log=lambda *_: None, gpus=["0", "1"])
    launched = fake_workers.launched
    assert len(launched) == n_runs > 2
    assert {gpu for *_, gpu, _ in launched} == {"0", "1"}
    for *_, beside in launched:  # one worker per GPU at a time
        assert len(beside) <= 2 and len(set(beside)) == len(beside), beside
    assert launched[0][2] == "0" and launched[1][2] == "1"


def test_jobs_above_the_gpu_count_share_the_least_busy_gpu(tmp_path, fake_workers):
    suite = load_suite(SUITES / "interdomain_vs_s4d.yaml", ["profile=cpu", f"out_dir={tmp_path}", "seeds=[0]"])
    run_suite(suite, log=lambda *_: None, jobs=4, gpus=["2", "5"])
    first = [gpu for *_, gpu, _ in fake_workers.launched[:4]]
    assert first == ["2", "5", "2", "5"]


def test_without_gpus_workers_inherit_the_environment(tmp_path, fake_workers, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    suite = load_suite(SUITES / "interdomain_vs_s4d.yaml", ["profile=cpu", f"out_dir={tmp_path}", "seeds=[0]"])
    run_suite(suite, log=lambda *_: None, jobs=2)
    assert fake_workers.launched and all(gpu is None for *_, gpu, _ in fake_workers.launched)


def test_pick_gpu_takes_the_least_busy_then_the_first():
    assert pick_gpu(["0", "1"], []) == "0"
    assert pick_gpu(["0", "1"], ["0"]) == "1"
    assert pick_gpu(["0", "1", "2"], ["0", "1", "2", "0"]) == "1"


@pytest.mark.parametrize("bad", ["", "0,0", "a", "0;1", "-1"])
def test_bad_gpus_flag_is_one_line_naming_it(bad, capsys):
    with pytest.raises(ConfigError, match="--gpus"):
        parse_gpus(bad)
    assert main([str(SUITES / "interdomain_vs_s4d.yaml"), "profile=cpu", "--gpus", bad, "--list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "--gpus" in err and "\n" not in err


def test_parse_gpus_keeps_the_order():
    assert parse_gpus("1, 0,3") == ["1", "0", "3"]
