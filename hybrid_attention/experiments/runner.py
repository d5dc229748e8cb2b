"""Run a suite cell by cell, resumable (``run_suite``): finished runs, recall tasks and sweep rows are skipped, an
unfinished run resumes from its newest checkpoint. Layout under ``out_dir``: ``cells/<cell>/seed<k>/`` (the training
run, then ``result.json``) and the report files of :func:`hybrid_attention.experiments.report.write_report`."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import torch

from hybrid_attention.config.schema import from_dict
from hybrid_attention.data.lm_data import LMData, build_lm_data
from hybrid_attention.data.packing import ShuffledBatches
from hybrid_attention.data.tokenizer import token_byte_lengths
from hybrid_attention.device import resolve_device
from hybrid_attention.evaluation.perplexity import evaluate_lm
from hybrid_attention.layers.natsl.routing import RoutingRecorder
from hybrid_attention.models.mixers import MODEL_REVISION
from hybrid_attention.training.recall import RecallConfig, train_and_eval
from hybrid_attention.training.run_lock import LOCK_NAME, RunLock
from hybrid_attention.training.trainer import train

from .paths import recall_rows_path, recall_task_path, result_path
from .report import collect, write_report
from .suite import CellSpec, Suite, load_suite


def machine_description() -> str:
    """``'<cpu count> CPU cores, torch X'`` plus the GPU name where CUDA is available."""
    s = (f"{platform.machine()}, {os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads, "
         f"torch {torch.__version__}")
    if torch.cuda.is_available():
        s += f", {torch.cuda.get_device_name(0)}"
    return s


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=float))
    os.replace(tmp, path)  # atomic: a killed run never leaves a half-written result


def _cached_data(cfg, cache: dict):
    """One corpus + tokenizer per data config (the stdlib corpus takes seconds to read); every run gets its own
    shuffled batch stream with its own seed, as a fresh ``build_lm_data`` would."""
    key = json.dumps({"data": vars(cfg.data), "batch": cfg.train.batch_size}, sort_keys=True, default=str)
    if cfg.data.source != "stdlib" and cfg.data.source != "local":
        return None  # streaming sources: let the trainer build its own
    if key not in cache:
        cache[key] = build_lm_data(cfg.data, cfg.train.batch_size, cfg.train.seed)
    base = cache[key]
    if not isinstance(base.train, ShuffledBatches):
        return None
    return LMData(base.tokenizer, ShuffledBatches(base.train.sequences, cfg.train.batch_size, cfg.train.seed),
                  base.val_tokens, base.description)


def length_eval(model, tokens: np.ndarray, train_len: int, multipliers, max_tokens: int, device, amp,
                byte_lengths, batch_tokens: int) -> list[dict]:
    """Perplexity at ``round(m * train_len)`` for each multiplier on the same token prefix (windows start fresh)."""
    lengths = [int(round(m * train_len)) for m in multipliers]
    budget = max(max_tokens, max(lengths))
    rows = []
    for m, L in zip(multipliers, lengths):
        if len(tokens) < L:
            rows.append({"multiplier": m, "seq_len": L, "loss": None, "ppl": None, "bpb": None, "tokens": 0})
            continue
        ctx = torch.autocast(device.type, dtype=amp) if amp is not None else contextlib.nullcontext()
        with ctx:
            s = evaluate_lm(model, tokens, L, batch_size=max(1, batch_tokens // L), device=device,
                            byte_lengths=byte_lengths, max_tokens=budget)
        rows.append({"multiplier": m, "seq_len": L, "loss": s.loss, "ppl": s.ppl, "bpb": s.bpb, "tokens": s.tokens})
    return rows


@torch.no_grad()
def routing_eval(model, tokens: np.ndarray, seq_len: int, windows: int, device, amp) -> dict[str, list[float]]:
    """{layer: softmax fraction per decision head}, averaged over ``windows`` validation windows (eval mode)."""
    n = min(windows, len(tokens) // seq_len)
    if n == 0 or not model.routing_layers():
        return {}
    x = torch.from_numpy(np.asarray(tokens[: n * seq_len], dtype=np.int64).reshape(n, seq_len))
    rec = RoutingRecorder()
    was = model.training
    model.eval()
    try:
        with rec.attach(model):
            for i in range(n):
                ctx = torch.autocast(device.type, dtype=amp) if amp is not None else contextlib.nullcontext()
                with ctx, torch.compiler.set_stance("force_eager"):  # as evaluate_lm: no recompiles per shape
                    model(input_ids=x[i : i + 1].to(device), use_cache=False)
    finally:
        model.train(was)
    acc = {k: rec.pass_fractions(k) for k in model.routing_layers()}
    return {str(k): torch.stack(v).mean(0).cpu().tolist() for k, v in sorted(acc.items()) if v}


def _train_lm(suite: Suite, cell: CellSpec, seed: int, run_dir: Path, cache: dict, log) -> dict:
    cfg = suite.run_config(cell, seed, run_dir)
    data = _cached_data(cfg, cache)
    resumed = (run_dir / "checkpoints").exists()
    t0 = time.perf_counter()
    res = train(cfg, resume=True, data=data, quiet=True)
    train_wall = time.perf_counter() - t0
    model, device = res.model, next(res.model.parameters()).device
    amp = torch.bfloat16 if (cfg.train.precision == "bf16" or (cfg.train.precision == "auto"
                                                               and device.type == "cuda")) else None
    byte_lengths = token_byte_lengths(res.data.tokenizer)
    L = cfg.data.seq_len
    t1 = time.perf_counter()
    last_pass = RoutingRecorder()  # NAtS-L: the last evaluation pass's softmax fractions are the state size's
    with last_pass.attach(model):
        lengths = length_eval(model, res.data.val_tokens, L, suite.eval.length_multipliers, suite.eval.length_tokens,
                              device, amp, byte_lengths, batch_tokens=cfg.train.batch_size * L)
        routing = routing_eval(model, res.data.val_tokens, L, suite.eval.routing_windows, device, amp) \
            if suite.eval.routing else {}
    eval_wall = time.perf_counter() - t1
    val = res.val
    out = {
        "layers": list(model.config.mixer_types), "params": model.num_parameters(),
        "state": model.state_size(L, last_pass.mean_fractions()),
        "seq_len": L, "steps": res.steps, "tokens": res.tokens, "train_seconds": res.train_seconds,
        "tokens_per_second": res.tokens_per_second, "skipped_steps": res.skipped_steps,
        "val_loss": val.loss if val else None, "val_ppl": val.ppl if val else None, "val_bpb": val.bpb if val else None,
        "length": lengths, "routing": routing, "train_wall_s": train_wall, "eval_wall_s": eval_wall,
        "resumed": resumed, "data": res.data.description,
    }
    log(f"  {cell.name} seed {seed}: val ppl {out['val_ppl']:.3f}, "
        + ", ".join(f"{r['multiplier']:g}x {r['ppl']:.3f}" for r in lengths if r["ppl"] is not None)
        + f" ({train_wall:.0f} s train, {eval_wall:.0f} s eval)")
    return out


def _recall_sweep(rc: RecallConfig, rows_path: Path, log) -> dict:
    """The best row (highest accuracy, the first of equals in sweep order) of one recall task's sweep over mixers x
    d_models x lrs. Each finished model's row is saved to ``rows_path`` at once, so a run cut by a time limit or
    a preemption keeps its finished models: the next run trains only the rest."""
    saved = json.loads(rows_path.read_text()) if rows_path.exists() else []
    done = {(r["mixer"], r["d_model"], r["lr"]): r for r in saved if r.get("model_revision") == MODEL_REVISION}
    device = resolve_device(rc.device)
    rows = []
    for mixer in rc.mixers:
        for dm in rc.d_models:
            for lr in rc.lrs:
                row = done.get((mixer, dm, lr))
                if row is None:
                    # per-epoch checkpoints: a model cut by a call's limit resumes at its last finished epoch
                    resume = rows_path.with_name(rows_path.name.replace(".rows.json", ".resume")) / \
                        f"{mixer}_d{dm}_lr{lr:g}"
                    row = train_and_eval(rc, mixer, dm, lr, device, log=log, resume_dir=resume)  # epochs logged
                    row = {**row, "model_revision": MODEL_REVISION}
                    done[(mixer, dm, lr)] = row
                    _write_json(rows_path, list(done.values()))
                    shutil.rmtree(resume, ignore_errors=True)  # the row is saved: its checkpoints are not needed
                else:
                    log(f"  {mixer} d={dm} lr={lr:g}: accuracy {row['accuracy']:.3f} (kept from {rows_path.name})")
                rows.append(row)
    # every model's row is saved: the task's resume folder goes too (an empty one would read as a model still cut)
    shutil.rmtree(rows_path.with_name(rows_path.name.replace(".rows.json", ".resume")), ignore_errors=True)
    best = max(rows, key=lambda r: r["accuracy"])  # max keeps the first of equal accuracies
    return {k: v for k, v in best.items() if k != "model_revision"}


def _recall(suite: Suite, cell: CellSpec, seed: int, run_dir: Path, log) -> tuple[dict, list[str]]:
    """({task: best row} of the tasks finished so far, the tasks among them read back from earlier processes); with
    ``suite.recall_only`` only those tasks are trained now, so the result may lack the others."""
    out, read_back = {}, []
    for task, d in suite.recall_configs(cell, seed).items():
        path = recall_task_path(run_dir, task)
        if path.exists():
            out[task] = json.loads(path.read_text())
            read_back.append(task)
            continue
        if suite.recall_only is not None and task not in suite.recall_only:
            continue
        rc = from_dict(RecallConfig, d)
        # names the task its epoch lines belong to, so a log cut before the accuracy line still reads
        log(f"  {cell.name} seed {seed} {task}: training")
        best = {**_recall_sweep(rc, recall_rows_path(run_dir, task), log), "machine": machine_description()}
        _write_json(path, best)
        log(f"  {cell.name} seed {seed} {task}: accuracy {best['accuracy']:.3f} ({best['seconds']:.0f} s)")
        out[task] = best
    return out, read_back


def _trained_on(recall: dict) -> str:
    """The machine(s) that trained a recall cell's tasks ("" when no task recorded one). A cell whose tasks ran on the
    GPU in several processes is finished by whichever run of the suite finds them all on disk (a later one, or one on
    a CPU machine that trains nothing): its ``result.json`` names the GPUs, not that process's machine."""
    return "; ".join(sorted({row["machine"] for row in recall.values() if row.get("machine")}))


def _run_one(suite: Suite, cell: CellSpec, seed: int, out: Path, cache: dict, log) -> bool:
    """Train/evaluate one (cell, seed) into ``out/cells/<cell>/seed<k>/``; ``result.json`` is written (atomically)
    only when everything succeeded, otherwise ``error.txt``. Returns success."""
    run_dir = out / "cells" / cell.name / f"seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result = {"cell": cell.name, "seed": seed, "machine": machine_description(), "model_revision": MODEL_REVISION}
    try:
        if suite.uses_lm(cell):
            result["lm"] = _train_lm(suite, cell, seed, run_dir, cache, log)
        if suite.recall_tasks:
            result["recall"], earlier = _recall(suite, cell, seed, run_dir, log)
            left = [t for t in suite.recall_tasks if t not in result["recall"]]
            if left:  # --tasks: the cell is finished (result.json) only when every task is
                log(f"  {cell.name} seed {seed}: recall tasks {', '.join(left)} not run yet (--tasks); "
                    "no result.json")
                return True
            if not suite.uses_lm(cell):  # the machines that trained the tasks, not the one that read them back
                result["machine"] = _trained_on(result["recall"]) or result["machine"]
    except Exception as e:  # noqa: BLE001  (one broken cell must not stop the suite; it is retried next time)
        import traceback

        (run_dir / "error.txt").write_text(traceback.format_exc())
        log(f"  {cell.name} seed {seed}: FAILED ({type(e).__name__}: {e}); see {run_dir / 'error.txt'}")
        return False
    (run_dir / "error.txt").unlink(missing_ok=True)
    result["wall_s"] = time.perf_counter() - t0
    if suite.recall_tasks:  # the tasks trained by earlier processes (--tasks, cut calls) count with their model seconds
        result["recall_read_back_s"] = sum(result["recall"][t].get("seconds", 0.0) for t in earlier)
        result["wall_s"] += result["recall_read_back_s"]
    _write_json(result_path(out, cell.name, seed), result)
    return True


def import_results(suite: Suite, results_json: Path | str, log=print) -> int:
    """Unpack the runs of an earlier report of the same suite (its ``results.json``, ``runs`` list) into
    ``<out_dir>/cells/<cell>/seed<k>/result.json``, so that they count as finished here (skipped, and part of the next
    report). Runs whose (cell, seed) is not in the suite are left out (and counted in the log line); a run that
    already has a ``result.json`` keeps it. Raises ``ValueError`` naming the file for anything that is not such a
    report. Returns the number of runs written."""
    path = Path(results_json)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--import-results {path}: cannot read it as JSON ({e})") from e
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list):
        raise ValueError(f"--import-results {path}: no 'runs' list (expected a results.json of an experiment report)")
    if doc.get("suite") != suite.name:
        raise ValueError(f"--import-results {path}: it reports suite {doc.get('suite')!r}, not {suite.name!r}")
    wanted = {(c.name, s) for c in suite.cells for s in suite.cell_seeds(c)}
    written = outside = stale = 0
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or "cell" not in run or "seed" not in run:
            got = sorted(run) if isinstance(run, dict) else type(run).__name__
            raise ValueError(f"--import-results {path}: run {i} needs 'cell' and 'seed', got {got}")
        try:
            seed = int(run["seed"])
        except (TypeError, ValueError):
            raise ValueError(f"--import-results {path}: run {i} has seed {run['seed']!r}, not an integer") from None
        if (run["cell"], seed) not in wanted:  # also keeps arbitrary cell names out of the file system
            outside += 1
            continue
        if run.get("model_revision", 1) != MODEL_REVISION:  # the same cell name computed something else then
            stale += 1
            continue
        target = result_path(Path(suite.out_dir), run["cell"], seed)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_json(target, {**run, "seed": seed})
        written += 1
    log(f"imported {written} finished run(s) from {path} into {suite.out_dir}"
        + (f"; {outside} run(s) of cells/seeds not in this suite left out" if outside else "")
        + (f"; {stale} run(s) of an earlier model revision left out (models.mixers.MODEL_REVISION = "
           f"{MODEL_REVISION})" if stale else ""))
    return written


@contextlib.contextmanager
def suite_lock(suite: Suite):
    """Hold the suite folder's lock while the block runs: ``<out_dir>/.lock`` under an exclusive OS lock, the
    one-process-per-folder lock of ``train`` (``training/run_lock.py``; the kernel drops it when the process ends in
    any way). A second ``experiment`` on the same ``out_dir`` is refused with one ConfigError line (naming the holder's
    PID) before it writes anything: no cell, report or plot of the running suite is touched."""
    lock = RunLock(Path(suite.out_dir), field="out_dir", process="experiment", entries=(LOCK_NAME, "cells"),
                   probe=("cells",))
    try:
        yield
    finally:
        lock.release()


def run_suite(suite: Suite, log=print, command: str | None = None, jobs: int | None = None,
              gpus: list[str] | None = None, lock: bool = True) -> dict:
    """Run every unfinished (cell, seed), then write the report; returns the results document, whose
    ``session_failed`` lists the runs (``"<cell> seed <k>"``) that failed in this call.

    ``lock``: hold the suite folder's lock (:func:`suite_lock`) for the call; False when the caller holds it (the
    ``experiment`` command, which also imports and reports under it).

    ``jobs`` (default: the suite's ``jobs``, 1) > 1 runs that many (cell, seed) runs at once, each in its own
    subprocess on the same device (see :func:`_run_parallel`); ``jobs=1`` runs them one after the other in this
    process. ``gpus`` (GPU indices, e.g. ``["0", "1"]``) spreads the runs over those GPUs of this machine: one worker
    subprocess per run, each seeing only its GPU (``CUDA_VISIBLE_DEVICES``), ``jobs`` workers at once (default: one
    per GPU), each started on the GPU with the fewest running workers.

    Resuming: a (cell, seed) with ``result.json`` is skipped, an unfinished training run resumes from its newest
    checkpoint, finished recall tasks (``recall_<task>.json``) are not re-run, and neither are the finished models of an
    unfinished task's sweep (``recall_<task>.rows.json``, one row per mixer / d_model / lr, stamped with
    ``MODEL_REVISION``: a row of another revision is trained again), and a model cut mid-training resumes at its last
    finished epoch (``recall_<task>.resume/<mixer>_d<d>_lr<lr>/``, removed once its row is saved).
    """

    if gpus is not None and (not gpus or len(set(gpus)) != len(gpus)):
        raise ValueError(f"gpus must be distinct GPU indices, got {gpus!r}")
    if jobs is None:
        jobs = len(gpus) if gpus else suite.jobs
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    with suite_lock(suite) if lock else contextlib.nullcontext():
        return _run_suite(suite, log, command, jobs, gpus)


def _run_suite(suite: Suite, log, command: str | None, jobs: int, gpus: list[str] | None) -> dict:
    """:func:`run_suite` with its arguments checked and the suite folder locked."""
    out = Path(suite.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache: dict = {}
    t_start = time.perf_counter()
    # seed-major: every cell's first seed before any second seed, so a cut-off run still compares all cells
    seeds = list(dict.fromkeys([*suite.seeds, *(s for c in suite.cells for s in suite.cell_seeds(c))]))
    todo = [(c, s) for s in seeds for c in suite.cells if s in suite.cell_seeds(c)]
    failed: list[str] = []
    ran = 0
    pending = []
    for i, (cell, seed) in enumerate(todo, 1):
        if result_path(out, cell.name, seed).exists():
            log(f"[{i}/{len(todo)}] {cell.name} seed {seed}: finished earlier, skipped")
        else:
            pending.append((i, cell, seed))
    if jobs == 1 and not gpus:
        for i, cell, seed in pending:
            log(f"[{i}/{len(todo)}] {cell.name} seed {seed}")
            if _run_one(suite, cell, seed, out, cache, log):
                ran += 1
            else:
                failed.append(f"{cell.name} seed {seed}")
    else:
        ran, failed = _run_parallel(suite, pending, len(todo), jobs, out, log, gpus=gpus)
    wall = time.perf_counter() - t_start
    log(f"{ran} run(s) in {wall:.0f} s; {len(failed)} failed; {len(todo) - ran - len(failed)} skipped")
    doc = collect(suite, command=command, session_wall_s=wall)
    doc["session_failed"] = failed
    write_report(suite, doc)
    return doc


def _exit_reason(returncode: int) -> str:
    """``worker exit 1``, or ``worker killed by SIGTERM`` for a negative return code (a signal from outside)."""
    if returncode < 0:
        try:
            return f"worker killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"worker killed by signal {-returncode}"
    return f"worker exit {returncode}"


def pick_gpu(gpus: list[str], busy: list[str]) -> str:
    """The GPU of ``gpus`` with the fewest entries in ``busy`` (the GPUs of the running workers); the first on ties."""
    return min(gpus, key=lambda g: (busy.count(g), gpus.index(g)))


def _run_parallel(suite: Suite, pending: list, total: int, jobs: int, out: Path, log,
                  gpus: list[str] | None = None) -> tuple[int, list[str]]:
    """Run the pending (index, cell, seed) runs as up to ``jobs`` concurrent worker subprocesses (with ``gpus``:
    each worker's ``CUDA_VISIBLE_DEVICES`` is the GPU :func:`pick_gpu` chooses); returns (runs done, the failed runs
    as ``"<cell> seed <k>"``).

    Design decisions:
    - subprocesses, not threads: every run gets its own CUDA context, RNG state and Triton/torch caches, exactly as
      a ``jobs=1`` run in a fresh process would, and a crash (or CUDA OOM) in one run cannot take the others down;
    - the workers read the *resolved* suite (after command-line overrides and ``--only``) from
      ``out/.suite_resolved.yaml``, so they run exactly the configuration this process validated;
    - each worker writes its console output to ``cells/<cell>/seed<k>/worker.log``; when it ends, its lines are
      echoed into this log, so the console shows the same per-run lines as a ``jobs=1`` run;
    - a run counts as finished only through its atomically written ``result.json`` (the report reads nothing else),
      so a killed worker leaves at most a checkpoint, from which the next invocation resumes;
    - on SIGTERM/SIGINT (e.g. ``timeout``) the workers are terminated before this process exits.
    """
    import subprocess
    import sys

    import yaml

    spec = out / ".suite_resolved.yaml"
    tmp = spec.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(suite_to_dict(suite), sort_keys=False))
    os.replace(tmp, spec)
    queue = list(pending)
    running: dict = {}  # Popen -> (index, cell, seed, log file, start time)
    gpu_of: dict = {}  # Popen -> its GPU (with gpus)
    ran, failed = 0, []

    def _stop(signum, frame):  # noqa: ARG001
        # ignore repeats while the workers are being stopped (`timeout` signals the whole process group)
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        raise KeyboardInterrupt

    old = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while queue or running:
            while queue and len(running) < jobs:
                i, cell, seed = queue.pop(0)
                run_dir = out / "cells" / cell.name / f"seed{seed}"
                run_dir.mkdir(parents=True, exist_ok=True)
                f = open(run_dir / "worker.log", "w")  # noqa: SIM115  (closed when the worker ends)
                env = {**os.environ, "PYTHONUNBUFFERED": "1"}
                gpu = pick_gpu(gpus, list(gpu_of.values())) if gpus else None
                if gpu is not None:
                    env["CUDA_VISIBLE_DEVICES"] = gpu
                p = subprocess.Popen([sys.executable, "-m", "hybrid_attention.experiments.runner", str(spec),
                                      cell.name, str(seed)], stdout=f, stderr=subprocess.STDOUT,
                                     cwd=os.getcwd(), env=env)
                running[p] = (i, cell, seed, f, time.perf_counter())
                if gpu is not None:
                    gpu_of[p] = gpu
                where = f", GPU {gpu}" if gpu is not None else ""
                log(f"[{i}/{total}] {cell.name} seed {seed} (worker {p.pid}{where}, {len(running)} running)")
            time.sleep(0.2)
            for p in [p for p in running if p.poll() is not None]:
                i, cell, seed, f, t0 = running.pop(p)
                gpu_of.pop(p, None)
                f.close()
                text = (out / "cells" / cell.name / f"seed{seed}" / "worker.log").read_text(errors="replace")
                for line in text.splitlines():
                    if line.startswith("  "):  # the per-run result lines of _train_lm / _recall / _run_one
                        log(line)
                # with --tasks (recall_only) a worker may end with some tasks left: done, with no result.json yet
                finished = result_path(out, cell.name, seed).exists()
                ok = p.returncode == 0 and (finished or suite.recall_only is not None)
                if ok:
                    ran += 1
                else:
                    failed.append(f"{cell.name} seed {seed}")
                    if not any(ln.startswith("  ") and "FAILED" in ln for ln in text.splitlines()):
                        tail = text.strip().splitlines()[-1:] or ["(no output)"]
                        log(f"  {cell.name} seed {seed}: FAILED ({_exit_reason(p.returncode)}; last log line: "
                            f"{tail[0]}); see {out / 'cells' / cell.name / f'seed{seed}' / 'worker.log'}")
                state = ("done" if finished else "done, tasks left") if ok else "failed"
                log(f"[{i}/{total}] {cell.name} seed {seed}: {state} "
                    f"({time.perf_counter() - t0:.0f} s)")
    except KeyboardInterrupt:
        for p in running:
            p.terminate()
        for p, (_, _, _, f, _) in running.items():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
            f.close()
        log(f"interrupted: {len(running)} running worker(s) stopped (they resume from their checkpoints)")
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return ran, failed


def suite_to_dict(suite: Suite) -> dict:
    """The suite as plain data that :func:`~hybrid_attention.experiments.suite.load_suite` reads back unchanged."""
    import dataclasses

    d = dataclasses.asdict(suite)
    if d["reference"] not in [c.name for c in suite.cells]:
        d["reference"] = None  # --only may leave the reference cell out; a worker never needs it
    return d


def _worker_main(argv: list[str]) -> int:
    """``python -m hybrid_attention.experiments.runner RESOLVED_SUITE.yaml CELL SEED``: one run (used by jobs > 1)."""

    if len(argv) != 3:
        print("usage: python -m hybrid_attention.experiments.runner RESOLVED_SUITE.yaml CELL SEED")
        return 2
    suite = load_suite(argv[0])
    ok = _run_one(suite, suite.cell(argv[1]), int(argv[2]), Path(suite.out_dir), {}, print)
    return 0 if ok else 1


if __name__ == "__main__":
    import sys

    sys.exit(_worker_main(sys.argv[1:]))
