"""Collect the per-(cell, seed) results of a suite and write ``results.json``, ``results.md`` and PNG plots."""

from __future__ import annotations

import json
import math
import statistics
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..plots import plain_log_axis, save_figure  # noqa: E402
from ..training.trainer import describe_layers  # noqa: E402
from .paths import recall_rows_path, recall_task_path, result_path  # noqa: E402
from .suite import Suite  # noqa: E402


def _stats(values: list) -> dict | None:
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return None
    return {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else None, "min": min(v),
            "max": max(v), "n": len(v), "values": v}


def _fmt(st: dict | None, fmt: str = ".3f", with_n: bool = True) -> str:
    if st is None:
        return "–"
    s = format(st["mean"], fmt)
    if st["std"] is not None:
        s += f" ± {format(st['std'], fmt)}"
    return s + (f" (n={st['n']})" if with_n else "")


def _positive_finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in xs)


def _fmt_paired(st: dict | None) -> str:
    """``-8.2% ± 0.3 (2/2)``: mean ± std of the per-seed differences to the reference; seeds with the cell lower."""
    if st is None:
        return "–"
    spread = f" ± {st['std']:.1f}" if st["std"] is not None else ""
    return f"{st['mean']:+.1f}%{spread} ({st['lower']}/{st['n']})"


def _finished_tasks(out: Path, cell: str, seed: int, tasks) -> dict:
    """{task: best row} of the recall tasks a run without ``result.json`` has finished (``recall_<task>.json``)."""
    run_dir = result_path(out, cell, seed).parent
    return {t: json.loads(recall_task_path(run_dir, t).read_text()) for t in tasks
            if recall_task_path(run_dir, t).exists()}


def _rows_seconds(run_dir: Path, task: str) -> float:
    """The training seconds of every model of a finished recall task (its rows file; 0 where there is none)."""
    path = recall_rows_path(run_dir, task)
    return sum(r.get("seconds", 0.0) for r in json.loads(path.read_text())) if path.exists() else 0.0


def collect(suite: Suite, command: str | None = None, session_wall_s: float | None = None) -> dict:
    """The results document: every finished (cell, seed) and per-cell summaries.

    Per cell: mean ± sample standard deviation over seeds (n shown); with one seed the spread is blank. The "vs ref"
    column is the relative difference of mean validation perplexity to the suite's reference cell; the "paired" column
    pairs the runs by seed (same data order and initialisation seed) and gives the mean ± std of the per-seed relative
    differences and in how many of the shared seeds the cell was lower. With seed spreads of several percent the two
    columns can differ by points; the paired one is the comparison to read.
    """
    out = Path(suite.out_dir)
    runs, summary = [], {}
    partial_machines: set[str] = set()  # the machines of recall tasks finished by runs without result.json
    partial_wall = 0.0  # and the training seconds of their models (each task's rows)
    ppl_by_seed: dict[str, dict] = {}  # cell -> {seed: val_ppl}, for the paired column
    for cell in suite.cells:
        rs = []
        for seed in suite.cell_seeds(cell):
            p = result_path(out, cell.name, seed)
            if p.exists():
                rs.append(json.loads(p.read_text()))
        runs += rs
        s: dict = {"label": cell.label, "seeds": [r["seed"] for r in rs], "wall_s": sum(r["wall_s"] for r in rs)}
        lms = [r["lm"] for r in rs if "lm" in r]
        ppl_by_seed[cell.name] = {r["seed"]: r["lm"]["val_ppl"] for r in rs if "lm" in r}
        if lms:
            s["layers"] = lms[0]["layers"]
            s["params"] = lms[0]["params"]
            s["state"] = lms[0]["state"]
            s["tokens"] = lms[0]["tokens"]
            s["seq_len"] = lms[0]["seq_len"]
            s["val_ppl"] = _stats([m["val_ppl"] for m in lms])
            s["val_loss"] = _stats([m["val_loss"] for m in lms])
            s["val_bpb"] = _stats([m["val_bpb"] for m in lms])
            s["tokens_per_second"] = _stats([m["tokens_per_second"] for m in lms])
            s["length"] = [{"multiplier": row["multiplier"], "seq_len": row["seq_len"],
                            "ppl": _stats([m["length"][j]["ppl"] for m in lms])}
                           for j, row in enumerate(lms[0]["length"])]
            if any(m["routing"] for m in lms):
                layers = sorted({k for m in lms for k in m["routing"]}, key=int)
                s["routing"] = {k: [statistics.fmean(vals) for vals in zip(*[m["routing"][k] for m in lms
                                                                             if k in m["routing"]])]
                                for k in layers}
        recs = [r["recall"] for r in rs if "recall" in r]
        # recall tasks finished by seeds whose run is not (cut, or --tasks): each task's row is final once written
        partial = {seed: _finished_tasks(out, cell.name, seed, suite.recall_tasks)
                   for seed in suite.cell_seeds(cell) if seed not in s["seeds"]}
        partial = {seed: tasks for seed, tasks in partial.items() if tasks}
        if partial:
            recs += list(partial.values())
            s["unfinished_seeds"] = sorted(partial)
            partial_machines.update(row.get("machine", "") for tasks in partial.values() for row in tasks.values())
            partial_wall += sum(_rows_seconds(result_path(out, cell.name, seed).parent, t)
                                for seed, tasks in partial.items() for t in tasks)
        if recs:
            s["recall"] = {t: _stats([rc[t]["accuracy"] for rc in recs if t in rc]) for t in suite.recall_tasks}
            # the best lr's per-epoch test accuracy (rows that carry one): when each model left
            # the chance plateau, which the final accuracy alone does not show
            seeds = [r["seed"] for r in rs if "recall" in r] + list(partial)
            s["recall_history"] = {
                t: [{"seed": sd, "lr": rc[t]["lr"], "task": rc[t].get("task"), "history": rc[t]["history"],
                     **({"chance": rc[t]["chance"]} if rc[t].get("chance") is not None else {})}
                    for sd, rc in zip(seeds, recs)
                    if t in rc and rc[t].get("history")] for t in suite.recall_tasks}
        summary[cell.name] = s
    ref = summary.get(suite.reference or "", {}).get("val_ppl")
    for s in summary.values():
        if ref and s.get("val_ppl"):
            s["vs_ref_pct"] = 100.0 * (s["val_ppl"]["mean"] / ref["mean"] - 1.0)
    ref_by_seed = ppl_by_seed.get(suite.reference or "", {})
    for name, s in summary.items():
        if name == suite.reference or not s.get("val_ppl"):
            continue
        mine = ppl_by_seed[name]
        shared = sorted(k for k in set(mine) & set(ref_by_seed) if _positive_finite(mine[k], ref_by_seed[k]))
        diffs = [100.0 * (mine[k] / ref_by_seed[k] - 1.0) for k in shared]
        st = _stats(diffs)
        if st:
            st["lower"] = sum(d < 0 for d in diffs)
            st["seeds"] = shared
            s["vs_ref_paired_pct"] = st
    machines = sorted(({r.get("machine", "") for r in runs} | partial_machines) - {""})
    errors = sorted(str(p.parent.relative_to(out)) for p in out.glob("cells/*/seed*/error.txt"))
    return {"suite": suite.name, "description": suite.description, "claims": suite.claims, "seeds": suite.seeds,
            "reference": suite.reference, "command": command, "machines": machines,
            "session_wall_s": session_wall_s, "total_run_wall_s": sum(r["wall_s"] for r in runs) + partial_wall,
            "unfinished_recall_s": partial_wall,
            "summary": summary, "runs": runs, "failed": errors}


def _plot_ppl_bars(doc: dict, path: Path) -> Path | None:
    cells = [(n, s) for n, s in doc["summary"].items() if s.get("val_ppl")]
    if not cells:
        return None
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(cells) + 2), 4))
    xs = range(len(cells))
    means = [s["val_ppl"]["mean"] for _, s in cells]
    errs = [s["val_ppl"]["std"] or 0.0 for _, s in cells]
    ax.bar(xs, means, yerr=errs, capsize=4, color="tab:blue", alpha=0.7)
    for x, (_, s) in zip(xs, cells):
        ax.plot([x] * len(s["val_ppl"]["values"]), s["val_ppl"]["values"], "k.", ms=6)
    ax.set_xticks(list(xs), [n for n, _ in cells], rotation=30, ha="right")
    lo = min(min(s["val_ppl"]["values"]) for _, s in cells)
    ax.set_ylim(bottom=max(0.0, 0.9 * lo))
    # two short lines: one line of this length is taller than the 4-inch axis and was cut at both ends
    ax.set(ylabel="validation perplexity\n(mean ± std; dots: seeds)", title=doc["suite"])
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path, dpi=100)


def _plot_length(doc: dict, path: Path) -> Path | None:
    cells = [(n, s) for n, s in doc["summary"].items() if s.get("length") and len(s["length"]) > 1]
    if not cells:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for n, s in cells:
        pts = [(r["multiplier"], r["ppl"]["mean"], r["ppl"]["std"] or 0.0) for r in s["length"] if r["ppl"]]
        if pts:
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                        label=n)
    ax.set_yscale("log")
    plain_log_axis(ax.yaxis)
    ax.set(xlabel="evaluation length / training length", ylabel="validation perplexity",
           title=f"{doc['suite']}: length extrapolation")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=100)


def _plot_routing(name: str, routing: dict, path: Path, title: str) -> Path:
    from ..evaluation.checkpoint_plots import plot_routing

    return plot_routing(routing, path, title)


def _plot_recall(doc: dict, path: Path) -> Path | None:
    tasks = sorted({t for s in doc["summary"].values() for t in (s.get("recall") or {})})
    cells = [(n, s) for n, s in doc["summary"].items() if s.get("recall")]
    if not tasks or not cells:
        return None
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(cells) + 2), 4))
    w = 0.8 / len(tasks)
    for j, t in enumerate(tasks):
        xs = [i + (j - (len(tasks) - 1) / 2) * w for i in range(len(cells))]
        st = [s["recall"].get(t) for _, s in cells]
        ax.bar(xs, [x["mean"] if x else 0 for x in st], w, yerr=[(x["std"] or 0) if x else 0 for x in st],
               capsize=3, label=t)
    ax.set_xticks(range(len(cells)), [n for n, _ in cells], rotation=30, ha="right")
    ax.set(ylabel="test accuracy (mean ± std over seeds)", ylim=(0, 1.05), title=f"{doc['suite']}: recall")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path, dpi=100)


def _switch(history: list[dict]) -> dict | None:
    """A length curriculum's first epoch at the new training length (None: one length throughout)."""
    return next((e for e in history if e.get("seq_len") != history[0].get("seq_len")), None)


def plot_accuracy_curves(panels: dict[str, list[tuple[str, str, int, list[dict]]]], path: Path,
                         title: str, chance: dict[str, float] | None = None) -> Path | None:
    """Test accuracy against epoch, one panel per recall task: ``panels`` = {task: [(cell, label, style, history)]},
    one colour per cell, line style ``style`` (an index), the legend below each panel (``label`` None: unlabelled);
    ``chance``: {task: the accuracy of guessing}, a dashed line in that task's panel."""
    panels = {t: rows for t, rows in panels.items() if rows}
    if not panels:
        return None
    cells = list(dict.fromkeys(c for rows in panels.values() for c, *_ in rows))
    n_lines = max(len(rows) for rows in panels.values())
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4 + 0.06 * n_lines), squeeze=False)
    cmap = plt.get_cmap("tab10" if len(cells) <= 10 else "tab20")  # distinct hues while they last
    styles = ["-", "--", ":", "-."]
    for ax, (task, rows) in zip(axes[0], panels.items()):
        for cell, label, style, h in rows:
            color = cmap(cells.index(cell) % cmap.N)
            ax.plot([e["epoch"] for e in h], [e["accuracy"] for e in h], color=color,
                    ls=styles[style % len(styles)], label=label)
            switch = _switch(h)
            if switch is not None:  # a length curriculum: mark the first epoch at the new training length
                ax.axvline(switch["epoch"] - 0.5, color=color, ls=":", alpha=0.6)
                a, b = h[0], switch
                pa, pb = a.get("num_kv_pairs"), b.get("num_kv_pairs")  # MQAR rows that record their pairs
                pairs = f" ({pa} → {pb} pairs)" if None not in (pa, pb) and pa != pb else ""
                ax.annotate(f"train T {a['seq_len']} → {b['seq_len']}{pairs}", (switch["epoch"] - 0.5, 0.02),
                            fontsize=7, color=color, rotation=90, ha="right", va="bottom")
        if chance and chance.get(task) is not None:
            ax.axhline(chance[task], color="gray", ls="--", lw=1)
            ax.annotate(f"chance {chance[task]:.2g}", (0.99, chance[task]), xycoords=("axes fraction", "data"),
                        ha="right", va="bottom", fontsize=7, color="gray")
        ax.set(xlabel="epoch", ylabel="test accuracy", ylim=(-0.02, 1.05), title=task)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0.0, -0.17), ncol=2)  # below: curves stay visible
    # wrapped to the figure's width (~11 characters per inch at 10 pt): a one-panel figure is 5 inches wide and the
    # title, unwrapped, ran past both edges
    fig.suptitle(textwrap.fill(title, width=int(11 * fig.get_figwidth())), fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)


def _plot_recall_curves(doc: dict, path: Path) -> Path | None:
    """Each cell's best-lr test accuracy per epoch (the rows' ``history``), one line per seed, its line style
    the seed's (seed 0 solid, seed 1 dashed, ...)."""
    tasks = sorted({t for s in doc["summary"].values() for t in (s.get("recall_history") or {})})
    panels = {t: [(name, name if j == 0 else None, row["seed"], row["history"])
                  for name, s in doc["summary"].items()
                  for j, row in enumerate((s.get("recall_history") or {}).get(t, []))] for t in tasks}
    chance = {t: next((row["chance"] for s in doc["summary"].values()
                       for row in (s.get("recall_history") or {}).get(t, []) if row.get("chance")), None)
              for t in tasks}
    return plot_accuracy_curves(panels, path, f"{doc['suite']}: recall during training (best lr; seed 0 solid, "
                                              "seed 1 dashed)", chance)


def markdown(doc: dict, plots: list[str]) -> str:
    """The suite's results as markdown (tables + plot links)."""
    lines = [f"## {doc['suite']}", ""]
    if doc["description"]:
        lines += [doc["description"].strip(), ""]
    for c in doc["claims"]:
        lines.append(f"- claim: {c}")
    machines = "; ".join(doc["machines"]) or "none recorded"
    unfinished = (f" ({doc['unfinished_recall_s']:.0f} s of it: the finished recall models of unfinished runs)"
                  if doc.get("unfinished_recall_s") else "")
    lines += ["", f"Machine(s): {machines}. Seeds: {doc['seeds']}. "
                  f"Sum of run wall times: {doc['total_run_wall_s']:.0f} s{unfinished}.", ""]
    if doc.get("command"):
        lines += [f"Command: `{doc['command']}`", ""]
    summ = doc["summary"]
    lm = [(n, s) for n, s in summ.items() if s.get("val_ppl")]
    if lm:
        mults = [r["multiplier"] for r in lm[0][1]["length"]]
        L = lm[0][1]["seq_len"]
        head = ["cell", "layers", "params", f"state@{L}", "tokens", "val ppl", "bits/byte"]
        if doc["reference"]:
            head += [f"vs {doc['reference']}", "paired by seed (lower in)"]
        head += [f"ppl@{m:g}x" for m in mults] + ["train tok/s"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for n, s in lm:
            row = [n + (f" ({s['label']})" if s["label"] else ""), _layers(s["layers"]), f"{s['params']:,}",
                   f"{s['state']:,}", f"{s['tokens']:,}", _fmt(s["val_ppl"]), _fmt(s["val_bpb"])]
            if doc["reference"]:
                row.append(f"{s['vs_ref_pct']:+.1f}%" if "vs_ref_pct" in s else "–")
                row.append(_fmt_paired(s.get("vs_ref_paired_pct")))
            row += [_fmt(r["ppl"], ".2f", with_n=False) for r in s["length"]]
            row.append(f"{s['tokens_per_second']['mean']:,.0f}")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    rec = [(n, s) for n, s in summ.items() if s.get("recall")]
    if rec:
        tasks = list(rec[0][1]["recall"])
        lines += ["| cell | " + " | ".join(f"{t} accuracy" for t in tasks) + " |", "|---|" + "---|" * len(tasks)]
        for n, s in rec:
            name = n + (f" (unfinished: seed {', '.join(map(str, s['unfinished_seeds']))})"
                        if s.get("unfinished_seeds") else "")
            lines.append(f"| {name} | " + " | ".join(_fmt(s["recall"][t]) for t in tasks) + " |")
        lines.append("")
    lines += plateau_table(summ)
    for n, s in summ.items():
        if s.get("routing"):
            lines += [f"NAtS-L softmax fraction per layer and decision head, cell `{n}` (mean over seeds and "
                      "validation windows):", ""]
            heads = max(len(v) for v in s["routing"].values())
            lines += ["| layer | " + " | ".join(f"head {h}" for h in range(heads)) + " | mean |",
                      "|---|" + "---|" * (heads + 1)]
            for k, v in s["routing"].items():
                lines.append(f"| {k} | " + " | ".join(f"{x:.3f}" for x in v) + f" | {statistics.fmean(v):.3f} |")
            lines.append("")
    if doc.get("failed"):
        lines += ["Failed (error.txt in these run directories): " + ", ".join(doc["failed"]), ""]
    if plots:
        lines += ["Plots: " + ", ".join(f"`{p}`" for p in plots), ""]
    return "\n".join(lines)


# test accuracy that counts as "left the chance plateau", per task kind: MQAR's chance is ~1 / (vocabulary / 2)
# (0.0002 at 8192), passkey's 0.1 per digit (twice that)
LEFT_CHANCE = {"mqar": 0.01, "passkey": 0.2}


def _first_epoch(history: list[dict], at_least: float) -> str:
    return next((str(e["epoch"]) for e in history if e["accuracy"] >= at_least), "–")


def plateau_table(summary: dict) -> list[str]:
    """Markdown lines: per recall task, one row per (cell, seed) with a per-epoch history (the best lr's): its final
    test accuracy and epochs, the first epoch at ≥ ``LEFT_CHANCE`` and at ≥ 0.8 (when it left the chance plateau, and
    when it had learned: the reading the recall suites quote) and a curriculum's switch (the first epoch at the full
    length). Empty when no row has a history (rows stored without one)."""
    tasks = list(dict.fromkeys(t for s in summary.values() for t in (s.get("recall_history") or {})))
    lines = []
    for t in tasks:
        rows = [(n, r) for n, s in summary.items() for r in (s.get("recall_history") or {}).get(t, [])]
        if not rows:
            continue
        left = LEFT_CHANCE.get(rows[0][1].get("task"), 0.01)
        lines += [f"When each model left the plateau, `{t}` (best lr; test accuracy per epoch in `recall_curves.png`):",
                  "", f"| cell | seed | lr | accuracy | epochs | first epoch ≥ {left:g} | first epoch ≥ 0.8 | switch |",
                  "|---|---|---|---|---|---|---|---|"]
        for n, r in rows:
            h = r["history"]
            switch = _switch(h)
            where = (f"epoch {switch['epoch']} (T {h[0]['seq_len']} → {switch['seq_len']})" if switch else "–")
            lines.append(f"| {n} | {r['seed']} | {r['lr']:g} | {h[-1]['accuracy']:.3f} | {h[-1]['epoch']} | "
                         f"{_first_epoch(h, left)} | {_first_epoch(h, 0.8)} | {where} |")
        lines.append("")
    return lines


def _layers(layers: list[str]) -> str:
    return describe_layers(layers)


def write_report(suite: Suite, doc: dict) -> list[Path]:
    """``results.json``, ``results.md`` and the PNGs in ``suite.out_dir``; returns the paths written."""
    out = Path(suite.out_dir)
    plots = [p for p in (_plot_ppl_bars(doc, out / "ppl_bars.png"), _plot_length(doc, out / "length.png"),
                         _plot_recall(doc, out / "recall.png"), _plot_recall_curves(doc, out / "recall_curves.png"))
             if p is not None]
    for n, s in doc["summary"].items():
        if s.get("routing"):
            plots.append(_plot_routing(n, s["routing"], out / f"routing_{n}.png",
                                       f"{n}: softmax fraction\n(mean over {len(s['seeds'])} seed(s))"))
    doc["plots"] = [p.name for p in plots]
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    md = out / "results.md"
    md.write_text(markdown(doc, doc["plots"]) + "\n")
    return [out / "results.json", md, *plots]
