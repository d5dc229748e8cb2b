"""``hybrid-attention compare RUN_DIR...``: training runs side by side at equal training tokens, one table and one
plot set, read from what ``train`` wrote (``config.yaml``, ``metrics.jsonl``, ``tokenizer/``); no model is loaded.

The runs are compared at the largest number of training tokens at which every one of them has a validation result
(``--tokens`` picks another shared count): training loss, validation loss / perplexity / bits per byte, training
tokens/s up to that point, parameters and the state size per sequence, as the demo's table compares its models.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hybrid_attention.config.run_config import RunConfig, model_config
from hybrid_attention.config.schema import ConfigError, from_dict, read_yaml_mapping
from hybrid_attention.data.tokenizer import load_tokenizer
from hybrid_attention.errors import DataError
from hybrid_attention.evaluation.info import has_routing, measured_fraction, state_note, state_size
from hybrid_attention.evaluation.tables import format_table
from hybrid_attention.models import HybridForCausalLM
from hybrid_attention.training.metrics import read_metrics
from hybrid_attention.training.trainer import describe_layers

RUN_FILES = ("config.yaml", "metrics.jsonl", "tokenizer")  # what makes a folder a run to compare


@dataclass
class RunLog:
    """One run as ``train`` wrote it: its folder, config, training records and validation records by token count."""

    folder: Path
    name: str
    config: RunConfig
    tokens_per_step: int
    train: list[dict[str, Any]] = field(default_factory=list)  # records with a training loss, in step order
    val: dict[int, dict[str, Any]] = field(default_factory=dict)  # training tokens -> the validation record there
    params: int = 0
    layers: str = ""
    model: torch.nn.Module | None = None  # on the meta device: shapes only, for the state size


def _short_names(folders: Sequence[Path]) -> list[str]:
    """The shortest trailing parts of each path that tell the runs apart (``seed0`` twice: ``a/seed0``, ``b/seed0``)."""
    parts = [f.resolve().parts for f in folders]
    for n in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-n:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(f) for f in folders]


def read_run(folder: str | os.PathLike, name: str | None = None) -> RunLog:
    """The :class:`RunLog` of a run folder; DataError (one line) when ``folder`` is not a run ``train`` wrote."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"compare: {folder} is not a folder")
    missing = [f for f in RUN_FILES if not (folder / f).exists()]
    if missing:
        raise DataError(f"compare: {folder} is not a training run folder (no {', '.join(missing)}; `train` writes "
                        "config.yaml, metrics.jsonl and tokenizer/ into train.out_dir)")
    try:
        cfg = from_dict(RunConfig, read_yaml_mapping(folder / "config.yaml"))
        tok = load_tokenizer(folder / "tokenizer", scope=folder)
        mcfg = model_config(cfg.model, vocab_size=len(tok))
    except (ConfigError, DataError) as e:
        raise DataError(f"compare: {folder}: {' '.join(str(e).split())}") from e
    with torch.device("meta"):
        model = HybridForCausalLM(mcfg)
    run = RunLog(folder, name or folder.name, cfg, cfg.train.batch_size * cfg.data.seq_len,
                 params=model.num_parameters(), layers=describe_layers(mcfg.mixer_types), model=model)
    steps_seen: dict[int, dict] = {}
    for r in read_metrics(folder / "metrics.jsonl"):
        if not isinstance(r.get("step"), int):
            continue
        if r.get("loss") is not None:
            steps_seen[r["step"]] = r
        if r.get("val_loss") is not None:
            run.val[r["step"] * run.tokens_per_step] = r  # a step validated twice (a resumed run): the last one
    run.train = [steps_seen[s] for s in sorted(steps_seen)]
    if not run.val:
        raise DataError(f"compare: {folder} has no validation result in metrics.jsonl yet (a run validates every "
                        "train.eval_every steps and at its end)")
    return run


def _counts(tokens: Sequence[int], most: int = 6) -> str:
    shown = [f"{t:,}" for t in sorted(tokens)]
    return ", ".join(shown if len(shown) <= most else [*shown[: most - 1], "...", shown[-1]])


def common_tokens(runs: Sequence[RunLog], tokens: int | None = None) -> int:
    """The training-token count the runs are compared at: ``tokens`` when every run has a validation result there,
    else the largest such count; DataError naming each run's validation counts when they share none."""
    shared = set.intersection(*(set(r.val) for r in runs))
    said = "; ".join(f"{r.name}: {_counts(r.val)} ({r.tokens_per_step:,} tokens per step)" for r in runs)
    if tokens is not None:
        if tokens not in shared:
            allowed = _counts(shared) if shared else "none"
            raise DataError(f"compare --tokens {tokens:,}: not a training-token count at which every run has a "
                            f"validation result; shared counts: {allowed} (validated at {said})")
        return tokens
    if not shared:
        raise DataError("compare: the runs share no training-token count with a validation result, so they cannot be "
                        f"compared at equal tokens; validated at {said}; train them with the same train.batch_size x "
                        "data.seq_len and train.eval_every")
    return max(shared)


def _tokens_per_second(run: RunLog, tokens: int) -> float | None:
    """Training tokens per second up to ``tokens``: the tokens over the seconds of every logged interval (each record's
    ``tok_per_s`` covers the tokens since the record before it)."""
    seen, seconds, total = 0, 0.0, 0
    for r in run.train:
        t, rate = r.get("tokens"), r.get("tok_per_s")
        if not isinstance(t, int) or t > tokens:
            break
        if isinstance(rate, (int, float)) and rate > 0 and t > seen:
            seconds += (t - seen) / rate
            total += t - seen
        seen = t
    return total / seconds if seconds > 0 else None


def compare_rows(runs: Sequence[RunLog], tokens: int, state_len: int) -> list[dict[str, Any]]:
    """One row per run at ``tokens`` training tokens: run, layers, params, state (numbers per sequence after
    ``state_len`` tokens), steps, train loss (the last logged window at or before ``tokens``), val loss / ppl / bpb,
    train tok/s and, for NAtS-L, the routing the state size assumes."""
    rows = []
    for run in runs:
        val = run.val[tokens]
        before = [r for r in run.train if isinstance(r.get("tokens"), int) and r["tokens"] <= tokens]
        routing = has_routing(run.model)
        rows.append({"run": run.name, "folder": str(run.folder), "layers": run.layers, "params": run.params,
                     "state": state_size(run.model, state_len), "steps": tokens // run.tokens_per_step,
                     "tokens": tokens, "loss": before[-1]["loss"] if before else None, "val_loss": val["val_loss"],
                     "val_ppl": val.get("val_ppl"), "val_bpb": val.get("val_bpb"),
                     "tok_s": _tokens_per_second(run, tokens),
                     "note": state_note(routing, measured_fraction(val.get("routing") or {}) if routing else None,
                                        measured_on="the last validation batch")})
    return rows


def compare_table(rows: list[dict[str, Any]], state_len: int) -> str:
    """The terminal table of :func:`compare_rows` (the demo's columns), with one line per NAtS-L run's routing."""
    columns = [("run", "run", ""), ("layers", "layers", ""), ("params", "params", ","),
               ("state", f"state@{state_len}", ","), ("steps", "steps", ","), ("loss", "train loss", ".4f"),
               ("val_loss", "val loss", ".4f"), ("val_ppl", "val ppl", ".3f"), ("val_bpb", "bits/byte", ".3f"),
               ("tok_s", "train tok/s", ",.0f")]
    notes = [f"{r['run']}, state@{state_len}: {r['note']}" for r in rows if r["note"]]
    return "\n".join([format_table(rows, columns), *notes])


def plot_compare(runs: Sequence[RunLog], tokens: int, out: Path) -> list[Path]:
    """``compare_loss.png`` (training loss), ``compare_val_ppl.png`` (validation perplexity) and
    ``compare_tokens_per_s.png`` (training tokens/s) against training tokens, one line per run, a dashed line at the
    compared count. Each is drawn into a partial file that is renamed when complete."""
    from hybrid_attention.plots import plot_series

    series = {
        "compare_loss.png": ({r.name: [(x["tokens"], x["loss"]) for x in r.train if "tokens" in x] for r in runs},
                             "training loss", "training loss (nats/token)", True, False),
        "compare_val_ppl.png": ({r.name: sorted((t, v.get("val_ppl")) for t, v in r.val.items()) for r in runs},
                                "validation perplexity", "validation perplexity", True, True),
        "compare_tokens_per_s.png": ({r.name: [(x["tokens"], x.get("tok_per_s")) for x in r.train if "tokens" in x]
                                      for r in runs}, "training throughput", "training tokens/s", False, False),
    }
    paths = []
    for name, (data, title, ylabel, logy, markers) in series.items():
        partial = out / f".{name}.partial.png"
        try:
            plot_series(data, partial, "training tokens", ylabel, f"{title}; compared at {tokens:,} tokens (dotted)",
                        logy=logy, markers=markers, mark_x=tokens)
            os.replace(partial, out / name)
        finally:
            partial.unlink(missing_ok=True)
        paths.append(out / name)
    return paths


def write_text(path: Path, text: str) -> Path:
    """``text`` into ``path`` through a temporary file renamed into place (never half-written)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def compare_runs(folders: Sequence[str | os.PathLike], out: str | os.PathLike, tokens: int | None = None,
                 plots: bool = True) -> dict[str, Any]:
    """Compare the runs in ``folders`` at equal training tokens; returns {"tokens", "state_len", "rows", "table",
    "files"} and writes ``compare.json``, ``table.txt`` and (``plots``) the plots of :func:`plot_compare` into
    ``out``. Every run is read and checked before anything is written.

    Args:
        folders: run folders (``train.out_dir`` of each run).
        out: the folder of the table, the JSON and the plots (created if needed).
        tokens: the training-token count to compare at (default: the largest one every run validated at).
        plots: also write the plots.
    """
    paths = [Path(f) for f in folders]
    if len({p.resolve() for p in paths}) != len(paths):
        raise DataError("compare: a run folder is named twice; name each run once")
    runs = [read_run(p, n) for p, n in zip(paths, _short_names(paths))]
    at = common_tokens(runs, tokens)
    state_len = max(r.config.data.seq_len for r in runs)
    rows = compare_rows(runs, at, state_len)
    table = compare_table(rows, state_len)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = plot_compare(runs, at, out) if plots else []
    doc = {"tokens": at, "state_len": state_len, "runs": [str(p) for p in paths], "rows": rows}
    files.append(write_text(out / "compare.json", json.dumps(doc, indent=1) + "\n"))
    files.append(write_text(out / "table.txt", table + "\n"))
    return {"tokens": at, "state_len": state_len, "rows": rows, "table": table, "files": files}
