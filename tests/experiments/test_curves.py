"""hybrid_attention.experiments.curves: the seed-paired training-perplexity gap between two cells over training."""

import json
import math

import pytest

from hybrid_attention.experiments import curves


def _cell(root, name, losses_by_seed):
    for seed, losses in losses_by_seed.items():
        d = root / name / f"seed{seed}"
        d.mkdir(parents=True)
        recs = [{"step": 10 * (i + 1), "loss": loss, "tokens": 640 * (i + 1)} for i, loss in enumerate(losses)]
        recs.append({"step": 10 * len(losses), "val_loss": 1.0})  # a validation record is not a training window
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return root / name


def test_paired_gaps_pair_by_seed_and_step(tmp_path, capsys):
    a = _cell(tmp_path, "a", {0: [3.0, 2.5, 2.2], 1: [3.1, 2.6, 2.3], 2: [9.0, 9.0, 9.0]})
    b = _cell(tmp_path, "b", {0: [3.2, 2.4, 2.0], 1: [3.0, 2.6, 2.4]})  # seed 2 only in a: left out
    seeds, rows = curves.paired_gaps(a, b)
    assert seeds == ["seed0", "seed1"]
    assert [(step, tokens) for step, tokens, _ in rows] == [(10, 640), (20, 1280), (30, 1920)]
    want = [[math.exp(3.0 - 3.2) - 1, math.exp(3.1 - 3.0) - 1], [math.exp(0.1) - 1, 0.0],
            [math.exp(2.2 - 2.0) - 1, math.exp(2.3 - 2.4) - 1]]
    for (_, _, got), w in zip(rows, want):
        assert got == pytest.approx(w, abs=1e-12)
    assert curves.main([str(a), str(b), "--every", "1", "--out", str(tmp_path / "gap.png")]) == 0
    out = capsys.readouterr().out
    assert "| 30 | 0.0 | +22.1% | -9.5% | +6.3% |" in out and (tmp_path / "gap.png").stat().st_size > 0


def test_cells_without_common_seeds_or_runs_are_one_line(tmp_path):
    a = _cell(tmp_path, "a", {0: [3.0]})
    b = _cell(tmp_path, "b", {1: [3.0]})
    with pytest.raises(SystemExit, match=r"no seed in common \(\['seed0'\] vs \['seed1'\]\)"):
        curves.paired_gaps(a, b)
    with pytest.raises(SystemExit, match="no seed.*metrics.jsonl under"):
        curves.paired_gaps(a, tmp_path / "missing")
