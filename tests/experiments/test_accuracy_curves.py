"""report.plot_accuracy_curves: a length curriculum's switch epoch is marked on the panel."""

from pathlib import Path

from hybrid_attention.experiments import report


def _history(lengths: list[int]) -> list[dict]:
    return [{"epoch": i + 1, "loss": 1.0, "accuracy": 0.1 * i, "seq_len": t} for i, t in enumerate(lengths)]


def _panel_lines(monkeypatch, histories: list[list[dict]]):
    figs = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path, dpi=100: figs.append(fig) or Path(path))
    report.plot_accuracy_curves({"passkey": [("c", "c", s, h) for s, h in enumerate(histories)]}, Path("x.png"), "t")
    (ax,) = figs[0].axes
    return ax.lines


def test_the_first_epoch_at_the_new_training_length_is_marked(monkeypatch):
    lines = _panel_lines(monkeypatch, [_history([384] * 3 + [512] * 2)])
    verticals = [ln for ln in lines if len(set(ln.get_xdata())) == 1]
    assert len(lines) == 2 and [v.get_xdata()[0] for v in verticals] == [3.5]  # between epochs 3 and 4
    assert lines[0].get_linestyle() == "-"


def test_no_mark_without_a_curriculum_and_seed_1_is_dashed(monkeypatch):
    lines = _panel_lines(monkeypatch, [_history([512] * 5), _history([512] * 4)])
    assert len(lines) == 2 and [ln.get_linestyle() for ln in lines] == ["-", "--"]


def test_a_long_title_stays_inside_a_one_panel_figure(monkeypatch):
    figs = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path, dpi=100: figs.append(fig) or Path(path))
    title = "credible_mqar_curriculum: recall during training (best lr; seed 0 solid, seed 1 dashed)"
    report.plot_accuracy_curves({"mqar": [("c", "c", 0, _history([256] * 2 + [1024] * 3))]}, Path("x.png"), title)
    fig = figs[0]
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width  # the whole title is on the canvas
    assert fig._suptitle.get_text().replace("\n", " ") == title


def test_a_curriculum_over_pairs_names_them_at_the_switch(monkeypatch):
    h = [{**e, "num_kv_pairs": 16 if e["seq_len"] == 256 else 64} for e in _history([256] * 2 + [1024] * 2)]
    figs = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path, dpi=100: figs.append(fig) or Path(path))
    report.plot_accuracy_curves({"mqar": [("c", "c", 0, h), ("d", "d", 1, _history([256] * 2 + [1024] * 2))]},
                                Path("x.png"), "t")
    texts = sorted(t.get_text() for t in figs[0].axes[0].texts)
    assert texts == ["train T 256 → 1024", "train T 256 → 1024 (16 → 64 pairs)"]


def test_the_plateau_table_names_when_each_model_left_chance():
    acc = [0.0, 0.0, 0.005, 0.02, 0.5, 0.85, 0.99]
    h = [{"epoch": i + 1, "loss": 1.0, "accuracy": a, "seq_len": 256 if i < 2 else 1024} for i, a in enumerate(acc)]
    flat = [{"epoch": i + 1, "loss": 8.3, "accuracy": 0.0, "seq_len": 1024} for i in range(48)]
    summary = {"softmax": {"recall_history": {"mqar": [{"seed": 0, "lr": 1e-3, "task": "mqar", "history": h}]}},
               "gdn": {"recall_history": {"mqar": [{"seed": 1, "lr": 3e-3, "task": "mqar", "history": flat}]}},
               "old": {"recall_history": {"mqar": []}}}
    lines = report.plateau_table(summary)
    assert "first epoch ≥ 0.01 |" in lines[2]
    assert lines[4] == "| softmax | 0 | 0.001 | 0.990 | 7 | 4 | 6 | epoch 3 (T 256 → 1024) |"
    assert lines[5] == "| gdn | 1 | 0.003 | 0.000 | 48 | – | – | – |"
    assert len(lines) == 7 and report.plateau_table({"x": {"recall": {}}}) == []
    # passkey: chance is 0.1 per digit, so leaving it means 0.2
    pk = [{**e, "accuracy": a} for e, a in zip(h, [0.1, 0.12, 0.25, 0.5, 0.7, 0.9, 0.99])]
    lines = report.plateau_table({"c": {"recall_history": {"passkey": [{"seed": 0, "lr": 3e-3, "task": "passkey",
                                                                        "history": pk}]}}})
    assert "first epoch ≥ 0.2 |" in lines[2]
    assert lines[4] == "| c | 0 | 0.003 | 0.990 | 7 | 3 | 6 | epoch 3 (T 256 → 1024) |"
