"""``hybrid-attention demo``: the main job in one command, sized to a time budget.

Trains one small model per available mixer (softmax, interdomain, s4d, and gdn / natsl once they exist) on the
embedded corpus (the interpreter's standard library, byte-level) with the *same token budget*, then prints one
table: parameters, state size, validation perplexity at the training length and at 2x / 4x of it, training tokens/s.
Writes each run to ``<out>/<mixer>/`` (metrics, plots, final model), the comparison plots to ``<out>/``, and prints a
sample from the model with the lowest validation perplexity.

The budget: after loading the corpus, every model is timed for a few steps; the common number of steps is what fits
the remaining time (minus a reserve for evaluation), at least ``min_steps``. The models then train round robin, one
step each per round, so that a slower machine than timed (other load) only ends every model at the same earlier step:
the token budgets stay equal and the wall time stays within the budget.
"""

from __future__ import annotations

import copy
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from hybrid_attention.data.config import DataConfig
from hybrid_attention.data.lm_data import LMData, build_lm_data
from hybrid_attention.data.packing import ShuffledBatches
from hybrid_attention.data.tokenizer import token_byte_lengths

from .config import ModelSection, OptimSection, RunConfig, TrainSection, check, model_config
from .metrics import read_metrics
from .plots import plot_series

DEMO_MIXERS = ("softmax", "interdomain", "s4d", "gdn", "natsl")


@dataclass
class DemoOptions:
    minutes: float = 10.0
    device: str = "auto"
    out: str = "runs/demo"
    mixers: tuple[str, ...] | None = None  # default: every available mixer of DEMO_MIXERS
    preset: str | None = None  # default: tiny on CPU, small on CUDA
    seq_len: int | None = None  # default: 256 on CPU, 1024 on CUDA
    batch_size: int | None = None  # default: 8 on CPU, 32 on CUDA
    lr: float = 3e-3
    min_steps: int = 5
    sample_tokens: int = 300
    seed: int = 0


def available_mixers() -> list[str]:
    from hybrid_attention.models.mixers import MIXER_BUILDERS

    return [m for m in DEMO_MIXERS if m in MIXER_BUILDERS]


def _fit_mixer(cfg: RunConfig, mixer: str) -> RunConfig:
    """NAtS-L's softmax heads must divide the GDN key/value widths: when the preset's default does not fit, use two
    softmax heads per GDN head (recorded in the run's config)."""
    if mixer != "natsl":
        return cfg
    try:
        return check(cfg)
    except ValueError:
        from hybrid_attention.models import PRESETS

        heads = cfg.model.options.get("num_heads", PRESETS[cfg.model.preset]["num_heads"])
        cfg.model.options = {**cfg.model.options, "mixer_options": {"natsl": {"num_attn_heads": 2 * heads}}}
        return cfg


def _time_steps(cfg: RunConfig, data: LMData, device: torch.device, warmup: int = 2, n: int = 5) -> float:
    """Median seconds per optimizer step of this model on random tokens (after ``warmup`` steps); the median keeps
    a spike of load on a shared machine from skewing the plan."""
    from hybrid_attention.models import HybridForCausalLM

    from .optimizer import build_optimizer

    torch.manual_seed(cfg.train.seed)
    model = HybridForCausalLM(model_config(cfg.model, vocab_size=len(data.tokenizer))).to(device)
    opt = build_optimizer(model, cfg.optim)
    x = torch.randint(0, 256, (cfg.train.batch_size, cfg.data.seq_len), device=device)
    amp = torch.bfloat16 if device.type == "cuda" else None
    times = []
    for i in range(warmup + n):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            model(input_ids=x, labels=x, use_cache=False).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def run_demo(opts: DemoOptions, log=print) -> dict:
    """Run the demo; returns {"rows": [...], "table": str, "sample": str, "best": mixer, "seconds": float}."""
    from hybrid_attention.evaluation.generation import generate_text
    from hybrid_attention.evaluation.length_sweep import length_sweep
    from hybrid_attention.evaluation.tables import format_table

    from .distributed import DistContext, resolve_device
    from .trainer import Trainer

    t_start = time.perf_counter()
    budget = opts.minutes * 60
    device = resolve_device(opts.device)
    cuda = device.type == "cuda"
    preset = opts.preset or ("small" if cuda else "tiny")
    seq_len = opts.seq_len or (1024 if cuda else 256)
    batch = opts.batch_size or (32 if cuda else 8)
    requested = list(opts.mixers or available_mixers())
    missing = [m for m in requested if m not in available_mixers()]
    if missing:
        raise ValueError(f"mixers {missing} are not available; available: {available_mixers()}")
    small_budget = budget < 180
    eval_tokens = 4 * seq_len * (4 if small_budget else 16)  # the same tokens at 1x, 2x and 4x
    out = Path(opts.out)
    base = RunConfig(
        model=ModelSection(preset=preset),
        data=DataConfig(source="stdlib", tokenizer="byte", seq_len=seq_len, val_tokens=eval_tokens,
                        max_bytes=4_000_000 if small_budget else None),
        optim=OptimSection(lr=opts.lr, warmup_steps=10),
        train=TrainSection(batch_size=batch, seed=opts.seed, device="cuda" if cuda else "cpu", eval_every=0,
                           checkpoint_every=0, keep_checkpoints=1, log_every=5, progress=True),
    )
    check(base)
    data = build_lm_data(base.data, batch, opts.seed)
    log(data.description)
    cfgs = {}
    for m in requested:
        c = copy.deepcopy(base)
        c.model.layers = m
        c.train.out_dir = str(out / m)
        try:
            check(_fit_mixer(c, m))
        except ValueError as e:  # a mixer that cannot be built at this preset
            if opts.mixers:
                raise
            log(f"skipping {m}: {e}")
            continue
        cfgs[m] = c
    mixers = list(cfgs)
    per_step = {m: _time_steps(c, data, device) for m, c in cfgs.items()}
    log("seconds per step: " + ", ".join(f"{m} {t:.3f}" for m, t in per_step.items()))
    elapsed = time.perf_counter() - t_start
    # Reserve for evaluation (validation at 1x, 2x, 4x: about 8 steps' worth of forwards per model), the final
    # models, plots and the sample. If the machine turns out slower than timed, the deadline stops every model at the
    # same step, so the token budgets stay equal.
    reserve = 0.05 * budget + 10.0 + 8 * sum(per_step.values())
    steps = max(opts.min_steps, int((budget - elapsed - reserve) / sum(per_step.values())))
    deadline = t_start + budget - reserve
    warmup = max(1, min(100, steps // 10))
    log(f"demo: {len(mixers)} models x {steps} steps x {batch} x {seq_len} tokens = {steps * batch * seq_len:,} "
        f"tokens each (budget {opts.minutes:g} min on {device})")
    trainers: dict[str, Trainer] = {}
    ctx = DistContext(device=device)
    for m, c in cfgs.items():
        c.train.steps, c.optim.warmup_steps = steps, warmup
        c.train.log_every = max(1, min(c.train.log_every, steps // 20 or 1))
        c.train.progress = False
        if (Path(c.train.out_dir) / "config.yaml").exists():
            shutil.rmtree(c.train.out_dir)  # a previous demo run of this mixer
        run_data = LMData(data.tokenizer, ShuffledBatches(data.train.sequences, batch, opts.seed), data.val_tokens,
                          data.description)  # the same batches for every model
        trainers[m] = Trainer(c, ctx, data=run_data, quiet=True)
    # Round robin: one step of every model per round, so all models always hold the same number of tokens.
    bar = tqdm(total=steps, unit="round", desc="training " + ", ".join(mixers), dynamic_ncols=True)
    replan_at = max(3, min(warmup, 20))  # re-plan once, from real rounds, before the cosine phase starts
    round_times: list[float] = []
    done = 0
    while done < steps:
        t0 = time.perf_counter()
        for tr in trainers.values():
            tr.train_step()
        done += 1
        round_times.append(time.perf_counter() - t0)
        bar.update(1)
        bar.set_postfix_str(" ".join(f"{m}={tr.last_loss:.3f}" for m, tr in trainers.items()))
        if done == replan_at <= warmup and done < steps:
            per_round = sorted(round_times[1:])[len(round_times[1:]) // 2]  # median, first round excluded
            new_steps = max(opts.min_steps, done + int((deadline - time.perf_counter()) / per_round))
            if abs(new_steps - steps) > 0.05 * steps:
                bar.write(f"re-planned from the measured {per_round:.2f} s/round: {steps} -> {new_steps} steps")
                steps = new_steps
                for tr in trainers.values():
                    tr.set_total_steps(steps)
                bar.total = steps
        if time.perf_counter() > deadline and done < steps:
            bar.write(f"time budget reached: every model stops at step {done} of {steps}")
            break
    bar.close()
    tokens = done * batch * seq_len
    rows, sweeps, models = [], {}, {}
    byte_lengths = token_byte_lengths(data.tokenizer)
    for m, tr in trainers.items():
        res = tr.finish()
        sweep = length_sweep(res.model, data.val_tokens, seq_len, (2, 4), max_tokens=eval_tokens, device=device,
                             byte_lengths=byte_lengths, batch_tokens=batch * seq_len)
        sweeps[m] = [{"seq_len": seq_len, "ppl": res.val.ppl}] + sweep
        models[m] = res.model
        rows.append({"model": m, "params": res.model.num_parameters(), "state": res.model.state_size(seq_len),
                     "ppl": res.val.ppl, "bpb": res.val.bpb, "ppl2": sweep[0]["ppl"], "ppl4": sweep[1]["ppl"],
                     "tok_s": res.tokens_per_second})
    columns = [("model", "model", ""), ("params", "params", ","), ("state", f"state@{seq_len}", ","),
               ("ppl", "val ppl", ".3f"), ("bpb", "bits/byte", ".3f"), ("ppl2", f"ppl@{2 * seq_len}", ".3f"),
               ("ppl4", f"ppl@{4 * seq_len}", ".3f"), ("tok_s", "train tok/s", ",.0f")]
    table = format_table(rows, columns)
    from hybrid_attention.evaluation.length_sweep import plot_length_sweep

    plot_length_sweep(sweeps, out / "length_sweep.png", "demo: validation perplexity vs context length")
    curves = {}
    for m in cfgs:
        recs = read_metrics(out / m / "metrics.jsonl")
        curves[m] = [(r["tokens"], r["loss"]) for r in recs if r.get("loss") is not None]
    plot_series(curves, out / "train_loss.png", "training tokens", "training loss (nats/token)",
                "demo: training loss", logy=True, markers=False)
    best = min(rows, key=lambda r: r["ppl"])["model"]
    sample = generate_text(models[best], data.tokenizer, "def ", max_new_tokens=opts.sample_tokens,
                           temperature=0.8, top_k=40, top_p=0.95, seed=opts.seed, device=device)
    seconds = time.perf_counter() - t_start
    (out / "table.txt").write_text(table + "\n")
    return {"rows": rows, "table": table, "sample": "def " + sample, "best": best, "seconds": seconds,
            "steps": done, "tokens": tokens}
