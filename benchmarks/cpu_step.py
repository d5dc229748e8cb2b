"""The demo's training step on the CPU: ms per step of every demo mixer's model, in one process, side by side.

    python -m benchmarks.cpu_step [--mixers softmax interdomain s4d gdn natsl] [--preset tiny] [--batch 8]
        [--seq 256] [--rounds 7] [--steps 3] [--threads N] [--profile N] [--top 15]

Each model is built as ``hybrid-attention demo`` builds it on a CPU (``training/demo.py``: the preset with every
layer the mixer, NAtS-L's heads fitted, byte vocabulary, the demo's AdamW parameter groups and schedule, float32,
no autocast, no compile) and stepped as the trainer steps it (``training/step.py``: forward with the LM loss,
backward, gradient clipping, AdamW, scheduler) on random byte ids of the demo's shape (8 × 256 on the CPU).

Timing: one warm-up step per model, then ``--rounds`` rounds; in each round every model runs ``--steps`` steps back
to back (timed together, wall clock), the models interleaved so that a spike of load on a shared machine hits them
all alike. The table gives the median wall-clock ms/step over the rounds, the fastest round, the median process
CPU time per step (all threads; less sensitive than the wall clock to other processes on a shared machine), and the
ratios of the medians to softmax. ``--threads`` sets ``torch.set_num_threads`` (default: torch's own choice, as the
demo leaves it).
``--profile N``: afterwards, N steps of each model under ``torch.profiler`` (CPU activity), printed as the operators
with the largest self CPU time (``key_averages``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hybrid_attention.config.run_config import ModelSection, OptimSection, RunConfig, model_config
from hybrid_attention.models import HybridForCausalLM
from hybrid_attention.training.demo import DEMO_MIXERS, _fit_mixer
from hybrid_attention.training.optimizer import build_optimizer
from hybrid_attention.training.schedule import warmup_cosine_scheduler
from hybrid_attention.training.step import optimizer_step

__all__ = ["demo_step", "time_rounds", "main"]

BYTE_VOCAB = 259  # the demo's byte tokenizer: 256 bytes + 3 specials


def demo_step(mixer: str, preset: str, batch: int, seq: int, lr: float = 3e-3, seed: int = 0):
    """One demo model's CPU training step as a closure (returns the loss); the ids are fixed random bytes."""
    cfg = _fit_mixer(RunConfig(model=ModelSection(preset=preset, layers=mixer), optim=OptimSection(lr=lr)), mixer)
    torch.manual_seed(seed)
    model = HybridForCausalLM(model_config(cfg.model, vocab_size=BYTE_VOCAB)).train()
    opt = build_optimizer(model, cfg.optim)
    sched = warmup_cosine_scheduler(opt, 10, 10**6, cfg.optim.min_lr_ratio)
    ids = torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(seed))

    def step() -> float:
        res = optimizer_step(model, opt, sched, lambda a: model(input_ids=ids, labels=ids, use_cache=False).loss,
                             grad_clip=cfg.optim.grad_clip, skip_nonfinite=True)
        return float(res.loss)

    return step


def time_rounds(steps: dict, rounds: int, per_round: int) -> dict[str, dict[str, list[float]]]:
    """{mixer: {"wall": [...], "cpu": [...]}}: ms per step of each round, wall clock and process CPU time (all
    threads), every step closure warmed up once, then ``rounds`` interleaved rounds of ``per_round`` steps each."""
    for step in steps.values():
        step()
    out: dict[str, dict[str, list[float]]] = {m: {"wall": [], "cpu": []} for m in steps}
    for _ in range(rounds):
        for m, step in steps.items():
            t, c = time.perf_counter(), time.process_time()
            for _ in range(per_round):
                step()
            out[m]["wall"].append((time.perf_counter() - t) * 1e3 / per_round)
            out[m]["cpu"].append((time.process_time() - c) * 1e3 / per_round)
    return out


def table(times: dict[str, dict[str, list[float]]], base: str = "softmax") -> str:
    """Markdown: median and fastest wall ms/step, median CPU ms/step, and the ratios of the wall and CPU medians to
    ``base`` (when timed)."""
    wall = {m: statistics.median(t["wall"]) for m, t in times.items()}
    cpu = {m: statistics.median(t["cpu"]) for m, t in times.items()}
    rows = [f"| model | median ms/step | fastest round | CPU ms/step | vs {base} (wall) | vs {base} (CPU) |",
            "|---|---:|---:|---:|---:|---:|"]
    for m, t in times.items():
        ratios = [f"{x[m] / x[base]:.2f}x" if base in x else "-" for x in (wall, cpu)]
        rows.append(f"| {m} | {wall[m]:.1f} | {min(t['wall']):.1f} | {cpu[m]:.1f} | {ratios[0]} | {ratios[1]} |")
    return "\n".join(rows)


def profile_ops(step, steps: int, top: int) -> str:
    """The operators with the largest self CPU time over ``steps`` calls of ``step`` (torch.profiler's table)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mixers", nargs="+", default=list(DEMO_MIXERS))
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=3, help="steps per model and round")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--profile", type=int, default=0, help="steps per model under torch.profiler afterwards")
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    steps = {m: demo_step(m, a.preset, a.batch, a.seq) for m in a.mixers}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, preset {a.preset}, B={a.batch}, "
          f"T={a.seq}, float32; {a.rounds} rounds x {a.steps} steps per model", flush=True)
    print(table(time_rounds(steps, a.rounds, a.steps)), flush=True)
    for m, step in steps.items() if a.profile else ():
        print(f"\n#### {m}: {a.profile} steps under torch.profiler\n{profile_ops(step, a.profile, a.top)}", flush=True)


if __name__ == "__main__":
    main()
