"""Readable plots and logs: log axes labelled with plain numbers, the ppl_bars y-label inside the figure, chance
lines on the recall plots, passkey and routing plots of a checkpoint, and progress in a log file as a line every N
seconds (no tqdm redraws); the demo's bar line fits 80 columns."""

from __future__ import annotations

import io
import re

import pytest

import hybrid_attention.experiments.report as report
import hybrid_attention.plots as plots
from hybrid_attention.cli import main
from hybrid_attention.evaluation.recall import chance_accuracy
from hybrid_attention.training.progress import LineProgress, fit_to_terminal, progress_bar
from hybrid_attention.training.recall import RecallConfig
from hybrid_attention.training.trainer import train


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions would save (kept open, not written)."""
    kept = []

    def keep(fig, path, dpi=110):
        kept.append(fig)
        return path

    monkeypatch.setattr(plots, "save_figure", keep)
    monkeypatch.setattr(report, "save_figure", keep)
    return kept


def _labels(axis) -> list[str]:
    axis.figure.canvas.draw()
    return [t.get_text() for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]


def test_log_axes_have_plain_numbers(figures, tmp_path):
    plots.plot_series({"a": [(256, 84.0), (1024, 12.5), (4096, 3.1)]}, tmp_path / "x.png", "length", "ppl",
                      logx=True, logy=True)
    ax = figures[0].axes[0]
    xs, ys = _labels(ax.xaxis), _labels(ax.yaxis)
    assert xs and ys and all(re.fullmatch(r"\d+(\.\d+)?[kM]?", t) for t in xs + ys), (xs, ys)
    assert "1024" in xs and "10" in ys
    assert [plots.plain_number(v) for v in (0.5, 80, 4096, 16384, 16000, 2e6)] == ["0.5", "80", "4096", "16384", "16k",
                                                                               "2M"]


def test_a_log_axis_within_a_decade_has_several_labels(figures, tmp_path):
    # the demo's length_sweep.png: perplexities from 8 to 14 on a log axis were labelled at "10" alone
    from hybrid_attention.evaluation.length_sweep import plot_length_sweep

    rows = {m: [{"seq_len": n, "ppl": p} for n, p in zip((256, 512, 1024), ppls, strict=True)]
            for m, ppls in {"softmax": (8.2, 9.1, 13.7), "s4d": (9.0, 9.4, 9.9)}.items()}
    plot_length_sweep(rows, tmp_path / "length_sweep.png")
    ax = figures[0].axes[0]
    low, high = ax.get_ylim()
    ys = [t for t in ax.yaxis.get_majorticklocs() if low <= t <= high]
    assert [plots.plain_number(t) for t in ys] == ["8", "10", "12", "14"], ys
    assert set(_labels(ax.yaxis)) >= {"8", "10", "12", "14"}
    assert {"256", "512", "1024"} <= set(_labels(ax.xaxis))


def test_ppl_bars_label_inside_the_figure(figures, tmp_path):
    # long cell names: the rotated tick labels leave a short axis (a one-line label of this length runs 20 px past
    # the top of the figure)
    doc = {"suite": "s", "summary": {f"natsl_hybrid_all_softmax_{i}": {"val_ppl": {"mean": 10.0 + i, "std": 0.5,
                                                                                   "values": [10.0 + i]}}
                                     for i in range(3)}}
    report._plot_ppl_bars(doc, tmp_path / "ppl_bars.png")
    fig = figures[0]
    fig.tight_layout()
    fig.canvas.draw()
    box, label = fig.bbox, fig.axes[0].yaxis.label.get_window_extent()
    assert box.y0 <= label.y0 and label.y1 <= box.y1 and box.x0 <= label.x0, (box, label)


def test_recall_plots_have_a_chance_line(figures, tmp_path):
    assert chance_accuracy(RecallConfig(vocab_size=8192)) == pytest.approx(1 / 4096)
    assert chance_accuracy(RecallConfig(task="passkey", seq_len=64)) == 0.1
    plots.plot_series({"softmax": [(100, 0.9)]}, tmp_path / "a.png", "state", "accuracy", logx=True, chance=0.01)
    assert [ln.get_ydata()[0] for ln in figures[0].axes[0].lines if ln.get_label().startswith("chance")] == [0.01]
    hist = [{"epoch": 1, "accuracy": 0.0}, {"epoch": 2, "accuracy": 0.5}]
    report.plot_accuracy_curves({"mqar": [("c", "c", 0, hist)]}, tmp_path / "b.png", "t", chance={"mqar": 0.004})
    assert any(list(ln.get_ydata()) == [0.004, 0.004] for ln in figures[1].axes[0].lines)
    doc = {"suite": "s", "summary": {"c": {"recall_history": {"mqar_t256": [
        {"seed": 0, "lr": 1e-3, "task": "mqar", "chance": 0.002, "history": hist}]}}}}
    report._plot_recall_curves(doc, tmp_path / "c.png")  # the rows' chance reaches the report's panel
    assert any(list(ln.get_ydata()) == [0.002, 0.002] for ln in figures[2].axes[0].lines)


def test_checkpoint_passkey_and_routing_plots(tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "plots"
    tiny = ["model.options={hidden_size: 32, num_heads: 2, head_dim: 16, state_size: 8, chunk_size: 8}",
            "data.max_bytes=200000", "data.val_fraction=0.2", "data.seq_len=32", "data.val_tokens=1024",
            "train.batch_size=2", "train.steps=1", "train.progress=false", "train.eval_every=0",
            "train.checkpoint_every=0", "optim.warmup_steps=1", "model.layers=[natsl, softmax]",
            f"train.out_dir={run}"]
    assert main(["train", "configs/tiny_cpu.yaml", *tiny]) == 0
    assert main(["info", str(run), "--seq-lens", "64", "--plot", "--out", str(out)]) == 0
    assert main(["eval", "passkey", "--checkpoint", str(run), "--lengths", "160", "--depths", "0", "1", "--trials",
                 "1", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["passkey.png", "routing.png"]
    capsys.readouterr()
    assert main(["eval", "passkey", "--checkpoint", str(run), "--lengths", "16", "--out", str(out)]) == 2
    assert "--lengths: passkey length 16 is shorter than the bare prompt" in capsys.readouterr().err
    assert (run / "final").is_dir() and main(["eval", "passkey", "--checkpoint", str(run / "final"), "--lengths",
                                              "160", "--depths", "0", "--trials", "1"]) == 0
    assert main(["info", str(run / "final"), "--seq-lens", "64", "--plot"]) == 0
    # default: the run folder (beside train's plots), not inside the model folder that --checkpoint names
    assert (run / "passkey.png").exists() and (run / "routing.png").exists()
    assert not {"passkey.png", "routing.png"} & {p.name for p in (run / "final").iterdir()}
    capsys.readouterr()


def test_info_plot_without_natsl_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    tiny = ["model.options={hidden_size: 32, num_heads: 2, head_dim: 16, state_size: 8, chunk_size: 8}",
            "data.max_bytes=200000", "data.val_fraction=0.2", "data.seq_len=32", "data.val_tokens=1024",
            "train.batch_size=2", "train.steps=1", "train.progress=false", "train.eval_every=0",
            "train.checkpoint_every=0", "optim.warmup_steps=1", "model.layers=[softmax]", f"train.out_dir={run}"]
    assert main(["train", "configs/tiny_cpu.yaml", *tiny]) == 0
    capsys.readouterr()
    assert main(["info", str(run), "--seq-lens", "64", "--plot"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: info --plot:") and "no NAtS-L layer" in err and err.count("\n") == 1


def test_line_progress_in_a_log():
    log = io.StringIO()
    bar = progress_bar(100, desc="softmax x2", stream=log, every_s=3600)
    assert isinstance(bar, LineProgress)
    for _ in range(100):
        bar.update(1)
        bar.set_postfix(loss="1.2345")
    bar.close()
    bar.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and "\r" not in log.getvalue()  # one line at the end, no redraws
    assert lines[0].startswith("softmax x2: 100/100 step (100%), ") and lines[0].endswith("loss=1.2345")
    log = io.StringIO()
    bar = progress_bar(5, stream=log, every_s=0.0)
    for _ in range(5):
        bar.update(1)
    assert len(log.getvalue().splitlines()) == 5


def test_trainer_progress_in_a_log_file(tmp_path, capsys):
    from training_helpers import tiny_config

    train(tiny_config(tmp_path / "run", "train.steps=6", "train.progress=true", "train.progress_every_s=3600"),
          quiet=True)
    err = capsys.readouterr().err  # pytest's capture is not a terminal
    assert "\r" not in err and "it/s" not in err
    assert [ln for ln in err.splitlines() if "/6 step" in ln] == [ln for ln in err.splitlines() if "6/6 step" in ln]
    assert len([ln for ln in err.splitlines() if "6/6 step" in ln]) == 1


def test_demo_description_fits_80_columns(monkeypatch):
    import os
    import shutil

    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(80, 24): os.terminal_size((80, 24)))
    desc = "123/600 s, 7:57 left; " + " ".join(f"mixer{i} 120/300 5.43" for i in range(5))
    cut = fit_to_terminal(desc, 23)
    assert len(cut) + 23 < 80 and cut.endswith("…") and desc.startswith(cut[:-1])
    assert fit_to_terminal("short", 23) == "short"
