"""``benchmarks.natsl_ops.sweep``: a job that breaks the CUDA context stops the sweep with the index to resume at,
a failure that leaves the context working is skipped, and ``start`` skips the jobs an earlier process ran.

The kernels are replaced by a fake job (no GPU, no Triton): this tests the sweep's control flow only."""

import pytest
import torch

pytest.importorskip("triton")

from benchmarks import natsl_ops  # noqa: E402
from benchmarks.common import BenchSettings  # noqa: E402


def _tiny_inputs(dev, T, H, K, V, G, C, frac, seed, with_s0=True):
    x = torch.zeros(1)
    return dict(q=x, rb=x), None, dict(do_s=x, do_g=x)


@pytest.fixture
def fake(monkeypatch):
    """Patch the sweep's inputs and results; returns (calls, set_failure) where calls lists (kind, var) per job run."""
    calls, fail = [], {"at": None, "broken": True}

    def job(kind, var, C, G, xs, routing, req, dos, dog, o_default):
        calls.append((kind, var))
        if len(calls) - 1 == fail["at"]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        row = dict(fwd=1.0) if kind == "fla_gdn" else dict(fwd=1.0, fb=2.0)
        if kind == "gdn":
            row.update(o_rel=0.0, o=torch.zeros(1))
        return row

    monkeypatch.setattr(natsl_ops, "_sweep_job", job)
    monkeypatch.setattr(natsl_ops, "_context_broken", lambda: fail["broken"])
    monkeypatch.setattr(natsl_ops, "make_inputs", _tiny_inputs)
    monkeypatch.setattr(natsl_ops, "RESULTS", {"errors": [], "sweep": []})

    def set_failure(at, broken=True):
        fail["at"], fail["broken"] = at, broken

    return calls, set_failure


SETTINGS = BenchSettings(dryrun=False, budget_s=1e9)


def test_full_sweep_runs_every_job(fake):
    calls, _ = fake
    natsl_ops.sweep(SETTINGS)
    assert len(calls) == len(natsl_ops.RESULTS["sweep"]) > 10
    assert "sweep_resume" not in natsl_ops.RESULTS
    assert {r["T"] for r in natsl_ops.RESULTS["sweep"]} == {16384, 65536}


def test_broken_context_stops_and_resume_skips_the_done_jobs(fake):
    calls, set_failure = fake
    natsl_ops.sweep(SETTINGS)
    every = list(calls)
    calls.clear()
    natsl_ops.RESULTS["sweep"].clear()

    set_failure(4)
    natsl_ops.sweep(SETTINGS)
    assert natsl_ops.RESULTS["sweep_resume"] == 5
    assert calls == every[:5]  # stopped right after the failing job
    assert len(natsl_ops.RESULTS["sweep"]) == 4

    calls.clear()
    set_failure(None)
    natsl_ops.sweep(SETTINGS, start=5)
    assert calls == every[5:]


def test_failure_with_a_working_context_is_skipped(fake):
    calls, set_failure = fake
    set_failure(2, broken=False)
    natsl_ops.sweep(SETTINGS)
    assert "sweep_resume" not in natsl_ops.RESULTS
    assert len(natsl_ops.RESULTS["sweep"]) == len(calls) - 1


def test_gdn_sweep_call_keys_change_the_call_not_the_launch():
    commit = torch.ones(1)
    cfg, call = natsl_ops.gdn_sweep_call(dict(call_commit=False, call_chunk=128, par_warps=8), 64, commit)
    assert cfg.par_warps == 8 and call == dict(chunk_size=128, commit=None)
    cfg, call = natsl_ops.gdn_sweep_call(dict(seqf_stages=4), 64, commit)
    assert cfg.seqf_stages == 4 and call["chunk_size"] == 64 and call["commit"] is commit
    with pytest.raises(ValueError, match="unknown call keys"):
        natsl_ops.gdn_sweep_call(dict(call_chunks=128), 64, commit)
