"""Speed of the recall trainer (``hybrid_attention.training.recall``) per cell and task of a recall suite:
optimizer-step time eager, compiled and as CUDA graphs (``RecallConfig.compile``, ``compile_mode``), the example
generator's time per epoch, and what a cell would take at the suite's full budget (every epoch, no early stop).

    python -m benchmarks.recall_speed                                   # credible_recall, every cell, on CUDA
    python -m benchmarks.recall_speed --cells gdn natsl_hybrid --variants eager compiled
    python -m benchmarks.recall_speed --cells gdn --tasks mqar_t256 --variants compiled cudagraphs
    python -m benchmarks.recall_speed --dryrun                          # CPU smoke test: toy sizes, not a measurement

Why: on an H200 the softmax cell of ``credible_recall`` takes 443 s alone, while a GDN-family cell takes ~20 s per
epoch with three side by side. This measures where a cell's time goes. Rows: (cell, task, variant) with ms per step
(mean of ``--steps`` back-to-back steps after
``--warmup``; the compiled variant compiles during warmup, its compile seconds are a column), steps per epoch, the
generator's seconds per epoch (``fresh_data``: one call of ``make_examples`` per epoch), and the projected seconds
of the cell's sweep at the full budget: sum over the task's lrs of epochs x (steps x step + generation). The step is
the trainer's own (``recall.train_step``: loss at the queried positions gathered without a host sync, clipping,
AdamW, schedule), on random examples of the task; the generator runs in a thread beside training in the trainer,
so ``full budget`` counts it as if it did not overlap (an upper bound). Writes ``<--out>/recall_speed.json`` when
``--out`` is given.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import cuda_steps_ms, sync
from benchmarks.recall_suite import add_selection_args, selected_tasks
from hybrid_attention.config.run_config import from_dict
from hybrid_attention.device import set_tf32
from hybrid_attention.evaluation.recall import labels_per_row
from hybrid_attention.training.recall import (
    RecallConfig,
    build_recall_model,
    compiled_backbone,
    make_examples,
    recall_optimizer,
    train_step,
)

# compiled: torch.compile's default mode; cudagraphs: its "reduce-overhead" mode (RecallConfig.compile_mode), the
# backbone's forward and backward replayed as CUDA graphs
VARIANTS = ("eager", "compiled", "cudagraphs")


def time_steps(cfg: RecallConfig, mixer: str, variant: str, device: torch.device, warmup: int,
               steps: int) -> dict:
    """ms per optimizer step (the mean of ``steps`` back-to-back steps, as the trainer runs them: the CPU queues the
    next step while the GPU runs this one), the seconds of the warmup (compilation included) of one model, and the
    loss of its last step (same model, batches and step count in every variant: the variants must agree)."""
    set_tf32(device, cfg.tf32)  # the suite's recipe, as train_and_eval applies it
    torch.manual_seed(0)
    model = build_recall_model(cfg, mixer, cfg.d_models[0]).to(device)
    opt, sched = recall_optimizer(cfg, model, cfg.lrs[0])
    mode = "reduce-overhead" if variant == "cudagraphs" else "default"
    backbone = compiled_backbone(replace(cfg, compile=variant != "eager", compile_mode=mode), model)
    x, y = make_examples(cfg, cfg.batch_size * (warmup + steps), seed=1)
    n = labels_per_row(y)  # the trainer's sync-free query gather
    batches = iter(zip(x.to(device).split(cfg.batch_size), y.to(device).split(cfg.batch_size)))

    last = {}

    def step():
        last["loss"] = train_step(model, backbone, opt, sched, *next(batches), n)

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    sync()
    warm_s = time.perf_counter() - t0
    if device.type == "cuda":
        step_ms = cuda_steps_ms(step, steps)
    else:
        t = time.perf_counter()
        for _ in range(steps):
            step()
        step_ms = 1e3 * (time.perf_counter() - t) / steps
    return {"step_ms": step_ms, "warmup_s": warm_s, "loss": last["loss"].item()}


def generation_seconds(cfg: RecallConfig) -> float:
    t = time.perf_counter()
    make_examples(cfg, cfg.train_examples, seed=2)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_selection_args(p, VARIANTS)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=400.0, help="skip the remaining rows when spent")
    p.add_argument("--dryrun", action="store_true", help="CPU, toy sizes (a smoke test of this file)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    toy = dict(vocab_size=64, seq_len=32, num_kv_pairs=2, train_examples=64, batch_size=4, d_models=[16],
               device="cpu", epochs=2)
    tasks = selected_tasks(args, toy if args.dryrun else None)
    device = torch.device("cpu" if args.dryrun or not torch.cuda.is_available() else "cuda")
    rows, t_start, gen_cache = [], time.perf_counter(), {}
    print(f"recall_speed: {args.suite}, device {device}, torch {torch.__version__}")
    for cell, task, d in tasks:
        cfg = from_dict(RecallConfig, d)
        if task not in gen_cache:
            gen_cache[task] = generation_seconds(cfg)
        steps_per_epoch = -(-cfg.train_examples // cfg.batch_size)
        for variant in args.variants:
            if time.perf_counter() - t_start > args.budget_s:
                print(f"  budget spent: skipped {cell} {task} {variant}")
                continue
            mixer = cfg.mixers[0]
            try:
                r = time_steps(cfg, mixer, variant, device, args.warmup, args.steps)
            except Exception as e:  # noqa: BLE001  (one failing row is recorded, the others still run)
                print(f"  {cell} {task} {variant}: FAILED {type(e).__name__}: {str(e)[:200]}")
                rows.append(dict(cell=cell, task=task, variant=variant, error=f"{type(e).__name__}: {e}"))
                continue
            gen = gen_cache[task] if cfg.fresh_data else 0.0
            full_s = len(cfg.lrs) * cfg.epochs * (steps_per_epoch * r["step_ms"] / 1e3 + gen)
            rows.append(dict(cell=cell, task=task, variant=variant, steps_per_epoch=steps_per_epoch,
                             gen_s=gen_cache[task], full_budget_s=full_s, **r))
            print(f"  {cell:14s} {task:11s} {variant:8s} step {r['step_ms']:7.2f} ms  warmup "
                  f"{r['warmup_s']:6.1f} s  loss {r['loss']:.5f}  gen {gen_cache[task]:5.2f} s/epoch  "
                  f"full budget {full_s:7.0f} s")
    print("\n| cell | task | variant | step ms | steps/epoch | generation s/epoch | warmup s | last loss "
          "| full budget s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['cell']} | {r['task']} | {r['variant']} | failed | | | | | |")
            continue
        print(f"| {r['cell']} | {r['task']} | {r['variant']} | {r['step_ms']:.2f} | {r['steps_per_epoch']} | "
              f"{r['gen_s']:.2f} | {r['warmup_s']:.1f} | {r['loss']:.5f} | {r['full_budget_s']:.0f} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "recall_speed.json").write_text(json.dumps(
            dict(device=str(device), torch=torch.__version__, suite=args.suite, rows=rows), indent=1))


if __name__ == "__main__":
    main()
