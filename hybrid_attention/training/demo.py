"""``hybrid-attention demo``: the main job in one command, sized to a time budget: one small model per available
mixer trained on the embedded corpus with the same time budget, then one comparison table (:func:`run_demo`)."""

from __future__ import annotations

import copy
import math
import shutil
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from hybrid_attention.config.run_config import (
    ModelSection,
    OptimSection,
    RunConfig,
    TrainSection,
    check,
    save_config,
)
from hybrid_attention.config.schema import ConfigError
from hybrid_attention.data.config import DataConfig
from hybrid_attention.data.lm_data import LMData, build_lm_data
from hybrid_attention.data.packing import ShuffledBatches
from hybrid_attention.data.tokenizer import token_byte_lengths
from hybrid_attention.device import resolve_device
from hybrid_attention.plots import plot_series

from .metrics import read_metrics
from .progress import LineProgress, fit_to_terminal, progress_bar

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
    max_bytes: int | None = None  # corpus characters read (default: 4M for budgets under 3 minutes, else all)
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


class ClockPlan:
    """Steps per model from the clock: every model gets an equal share of the training time.

    ``record`` each step's seconds; ``replan(seconds_left)`` shares the time left among the models still training so
    that their total training times end as equal as possible (water filling: a model that is behind gets more) and
    turns each share into steps with the model's re-measured seconds per step: the median of its last ``window``
    plain steps (the first timing counts as one), so that a step or two slowed by a spike of load on a shared machine
    does not move the plan, while a lasting change of speed does within about ``window // 2`` steps. ``next_model`` is
    the unfinished model with the least training time so far, None when all are done. A model is finished when it
    reaches its planned steps; every model gets at least ``min_steps``.
    """

    def __init__(self, seconds_per_step: dict[str, float], min_steps: int = 1, window: int = 7):
        self.order = list(seconds_per_step)
        self.recent = {m: deque([max(float(t), 1e-9)], maxlen=window) for m, t in seconds_per_step.items()}
        self.rate = {m: times[0] for m, times in self.recent.items()}
        self.min_steps = min_steps
        self.done = dict.fromkeys(self.order, 0)
        self.spent = dict.fromkeys(self.order, 0.0)
        self.planned = dict.fromkeys(self.order, min_steps)
        self.finished: set[str] = set()

    def record(self, m: str, seconds: float, measure: bool = True) -> None:
        """One step of ``m`` took ``seconds`` (``measure=False``: not a plain step, e.g. one that also validated)."""
        self.done[m] += 1
        self.spent[m] += seconds
        if measure:
            self.recent[m].append(max(seconds, 1e-9))
            self.rate[m] = statistics.median(self.recent[m])
        if self.done[m] >= self.planned[m]:
            self.finished.add(m)

    def replan(self, seconds_left: float) -> dict[str, int]:
        active = [m for m in self.order if m not in self.finished]
        level = _water_level([self.spent[m] for m in active], max(0.0, seconds_left))
        for m in active:
            share = max(0.0, level - self.spent[m])
            self.planned[m] = max(self.min_steps, self.done[m] + int(share / self.rate[m]))
            if self.done[m] >= self.planned[m]:
                self.finished.add(m)
        return dict(self.planned)

    def next_model(self) -> str | None:
        active = [m for m in self.order if m not in self.finished]
        return min(active, key=lambda m: self.spent[m]) if active else None

    def seconds_per_step(self) -> float:
        """The current estimate of one step of every model."""
        return sum(self.rate.values())


def _water_level(spent: list[float], extra: float) -> float:
    """The level L with sum(max(0, L - s) for s in spent) == extra (the time each model's total rises to)."""
    if not spent:
        return 0.0
    xs = sorted(spent)
    for i in range(len(xs)):
        level = (sum(xs[: i + 1]) + extra) / (i + 1)
        if i + 1 == len(xs) or level <= xs[i + 1]:
            return level
    return xs[-1]


# The window of training tokens over which the demo averages each model's logged training loss at the token count
# every model reached: the last tenth of it (one logged interval alone is a few batches, too noisy to rank models).
EQUAL_TOKENS_WINDOW = 0.1


def loss_at_tokens(curve: list[tuple[int, float]], tokens: int, window: float = EQUAL_TOKENS_WINDOW) -> float | None:
    """A model's training loss at ``tokens`` training tokens: the mean of its logged training loss over the tokens
    ((1 - window) · tokens, tokens], each logged interval weighted by the tokens it shares with that window.

    Args:
        curve: the logged records in order, (training tokens at the end of the interval, mean loss over the interval),
            the first interval starting at 0 tokens (``metrics.jsonl``: one record per ``train.log_every`` steps).
        tokens: the token count to read the loss at.
        window: the width of the window, as a fraction of ``tokens`` (0 < window <= 1).

    Returns None when no logged interval with a finite loss overlaps the window.
    """
    lo, num, den, start = (1 - window) * tokens, 0.0, 0.0, 0
    for end, loss in curve:
        overlap = min(end, tokens) - max(start, lo)
        if overlap > 0 and math.isfinite(loss):
            num, den = num + overlap * loss, den + overlap
        start = end
    return num / den if den > 0 else None


def _retarget(tr, steps: int) -> None:
    """Set a trainer's run length to ``steps`` (learning-rate schedule included) at any point of the run: the demo
    plans by the clock, so a model's length changes as its measured speed does. Warmup only ever shrinks, to about a
    tenth of the run, and never below the steps already taken."""
    for f in tr.scheduler.lr_lambdas:
        f.total_steps = steps
        if tr.step < f.warmup_steps:
            f.warmup_steps = max(1, tr.step + 1, min(f.warmup_steps, steps // 10))
        tr.cfg.optim.warmup_steps = f.warmup_steps
    tr.tc.steps = steps


def visible_share(text: str) -> float:
    """The fraction of ``text``'s characters that are not whitespace (0 for an empty text)."""
    return sum(not c.isspace() for c in text) / len(text) if text else 0.0


def readable_sample(generate: Callable[[int], str], seed: int, tries: int = 3, min_share: float = 0.5) -> str:
    """The first of up to ``tries`` samples ``generate(seed)``, ``generate(seed + 1)``, ... whose characters are at
    least ``min_share`` visible (:func:`visible_share`), else the most visible one. A small model trained for a few
    minutes on code often continues with runs of indentation and blank lines; the demo shows what it writes.

    Args:
        generate: the sampler, called with a seed.
        seed: the first seed.
        tries: at most this many samples.
        min_share: the visible fraction that ends the search.
    """
    best = ""
    for i in range(tries):
        text = generate(seed + i)
        if visible_share(text) >= min_share:
            return text
        if i == 0 or visible_share(text) > visible_share(best):
            best = text
    return best


def _loss(value: float) -> str:
    """A training loss for the progress line ("-" before the model's first step)."""
    return f"{value:.2f}" if math.isfinite(value) else "-"


def _time_steps(cfg: RunConfig, data: LMData, device: torch.device, warmup: int = 1, n: int = 3) -> float:
    """Median seconds per ``Trainer.train_step`` of this config (after ``warmup`` steps), in a scratch run folder
    that is removed afterwards; the median keeps a spike of load on a shared machine from skewing the first plan (the
    demo re-measures as it trains)."""
    from .distributed import DistContext
    from .trainer import Trainer

    c = copy.deepcopy(cfg)
    c.train.steps = warmup + n + 1  # never the last step: no validation or final checkpoint is timed
    c.optim.warmup_steps = 1  # the lr does not change a step's time; a short schedule of its own
    c.train.eval_every = c.train.checkpoint_every = 0
    c.train.progress = False
    times = []
    with tempfile.TemporaryDirectory() as scratch:
        c.train.out_dir = str(Path(scratch) / "run")
        batches = ShuffledBatches(data.train.sequences, c.train.batch_size, c.train.seed)
        tr = Trainer(c, DistContext(device=device), data=LMData(data.tokenizer, batches, data.val_tokens,
                                                                  data.description), quiet=True)
        try:
            for i in range(warmup + n):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                tr.train_step()  # reads the loss back to the host: the step has finished
                if i >= warmup:
                    times.append(time.perf_counter() - t)
        finally:
            tr.bar.close()
            tr.log.close()
            tr.close()
    return sorted(times)[len(times) // 2]


def _check_options(opts: DemoOptions) -> None:
    """One-line ConfigError naming the flag for options that the command line cannot check by type."""
    from hybrid_attention.models import PRESETS

    if not (math.isfinite(opts.minutes) and opts.minutes > 0):
        raise ConfigError(f"demo --minutes {opts.minutes:g}: must be a number > 0")
    for flag, value in (("--seq-len", opts.seq_len), ("--batch-size", opts.batch_size)):
        if value is not None and value < 1:
            raise ConfigError(f"demo {flag} {value}: must be >= 1")
    if opts.preset is not None and opts.preset not in PRESETS:
        raise ConfigError(f"demo --preset {opts.preset}: not a preset; allowed values: {', '.join(sorted(PRESETS))}")
    if opts.mixers is not None:
        unknown = [m for m in opts.mixers if m not in available_mixers()]
        if unknown or not opts.mixers:
            raise ConfigError(f"demo --mixers {' '.join(unknown)}: not a demo mixer; allowed values: "
                              + ", ".join(available_mixers()))
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: CUDA is not available on this machine; use --device cpu")


def run_demo(opts: DemoOptions, log=print) -> dict:
    """Run the demo; returns {"rows": [...], "table": str, "sample": str, "best": mixer, "seconds": float,
    "steps": {mixer: steps}, "tokens": {mixer: training tokens}, "equal_tokens": int}.

    Trains one small model per available mixer (:func:`available_mixers`: those of softmax, interdomain, s4d, gdn and
    natsl that the mixer registry builds) on the embedded corpus (the interpreter's standard library, byte-level)
    with the *same time budget*, then prints one table: parameters, state size, validation perplexity at the training
    length and at 2x / 4x of it, training tokens/s, steps and training tokens, and beside these equal-time results
    each model's training loss at the same number of training tokens (``equal_tokens``, the smallest count every
    model reached; :func:`loss_at_tokens`), so that a model that is behind for lack of steps can be read fairly.
    Writes each run to ``<out>/<mixer>/`` (metrics, plots, final model), the comparison plots to ``<out>/``, and prints
    a sample from the model with the lowest validation perplexity.

    DECISION: the budget is planned by the clock (:class:`ClockPlan`). After loading the corpus every model is timed
    for a few steps; then the models train interleaved, always stepping the one that has used the least training time
    so far, so that every model gets a fair share of the time (and a spike of load on a shared machine hits them all
    alike). Before every step the plan is redone from each model's re-measured seconds per step: the time left until
    the deadline (the budget minus a reserve for evaluation, the final models, plots and the sample) is shared out so
    that the models' training times end up equal, and each model's remaining steps (and its learning-rate schedule)
    follow its share. A faster model therefore gets more steps: the table says how many steps and training tokens
    each model got. Every model trains at least ``min_steps``; the progress bar counts seconds against the budget.

    Args:
        opts: the command's options (minutes, mixers, preset, device, output folder, ...).
        log: where progress lines go.
    """
    from hybrid_attention.evaluation.generation import generate_text
    from hybrid_attention.evaluation.info import has_routing, measured_fraction, state_note, state_size
    from hybrid_attention.evaluation.length_sweep import length_sweep
    from hybrid_attention.evaluation.tables import format_table

    from .distributed import DistContext
    from .trainer import Trainer

    _check_options(opts)
    t_start = time.perf_counter()
    budget = opts.minutes * 60
    device = resolve_device(opts.device)
    cuda = device.type == "cuda"
    preset = opts.preset or ("small" if cuda else "tiny")
    seq_len = opts.seq_len or (1024 if cuda else 256)
    batch = opts.batch_size or (32 if cuda else 8)
    requested = list(opts.mixers or available_mixers())
    small_budget = budget < 180
    eval_tokens = 4 * seq_len * (4 if small_budget else 16)  # the same tokens at 1x, 2x and 4x
    out = Path(opts.out)
    max_bytes = opts.max_bytes or (4_000_000 if small_budget else None)
    base = RunConfig(
        model=ModelSection(preset=preset),
        data=DataConfig(source="stdlib", tokenizer="byte", seq_len=seq_len, val_tokens=eval_tokens,
                        max_bytes=max_bytes),
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
    plan = ClockPlan(per_step, min_steps=opts.min_steps)

    def deadline() -> float:
        # Reserve for evaluation (validation at 1x, 2x, 4x: about 8 steps' worth of forwards per model, at the
        # re-measured speed), the final models, plots and the sample.
        return t_start + budget - (0.05 * budget + 5.0 + 8 * plan.seconds_per_step())

    planned = plan.replan(deadline() - time.perf_counter())
    log(f"demo: {len(mixers)} models, {batch} x {seq_len} tokens per step, first plan "
        + ", ".join(f"{m} {n} steps" for m, n in planned.items())
        + f" (budget {opts.minutes:g} min on {device}; re-planned from the measured speed as they train)")
    trainers: dict[str, Trainer] = {}
    ctx = DistContext(device=device)
    for m, c in cfgs.items():
        c.train.steps = planned[m]
        c.optim.warmup_steps = max(1, min(100, planned[m] // 10))
        c.train.log_every = max(1, min(c.train.log_every, planned[m] // 20 or 1))
        c.train.progress = False
        if (Path(c.train.out_dir) / "config.yaml").exists():
            shutil.rmtree(c.train.out_dir)  # a previous demo run of this mixer
        run_data = LMData(data.tokenizer, ShuffledBatches(data.train.sequences, batch, opts.seed), data.val_tokens,
                          data.description)  # the same batches for every model
        trainers[m] = Trainer(c, ctx, data=run_data, quiet=True)
    # Progress counts seconds against the budget (the evaluation after training included).
    # In a log, the plain line is the description alone: it says the seconds against the budget once.
    bar_format = "demo {percentage:3.0f}%|{bar}| {desc}"
    bar = progress_bar(round(budget), unit="s", desc="demo", dynamic_ncols=True, bar_format=bar_format, counts=False)

    def show(phase: str) -> None:
        elapsed = time.perf_counter() - t_start
        bar.n = min(round(elapsed), bar.total)
        left = round(max(0.0, budget - elapsed))
        desc = f"{elapsed:.0f}/{budget:.0f} s, {left // 60}:{left % 60:02d} left; {phase}"
        # on a terminal: one line that fits (the bar keeps 10 columns; a wrapped bar line is redrawn as a new line)
        bar.set_description_str(f"demo: {desc}" if isinstance(bar, LineProgress) else fit_to_terminal(desc, 23))

    while (m := plan.next_model()) is not None:
        tr = trainers[m]
        if tr.tc.steps != plan.planned[m]:
            _retarget(tr, plan.planned[m])
        t0 = time.perf_counter()
        tr.train_step()
        plan.record(m, time.perf_counter() - t0, measure=not tr.done)  # the last step also validates
        planned = plan.replan(deadline() - time.perf_counter())
        show(" ".join(f"{k} {plan.done[k]}/{planned[k]} {_loss(trainers[k].last_loss)}" for k in mixers))
    show("evaluating")
    rows, sweeps, models = [], {}, {}
    byte_lengths = token_byte_lengths(data.tokenizer)
    for m, tr in trainers.items():
        _retarget(tr, plan.done[m])  # the saved config says how long the run was
        save_config(tr.cfg, Path(tr.tc.out_dir) / "config.yaml")
        res = tr.finish()
        routing = measured_fraction(res.val_routing)  # of the last validation batch
        sweep = length_sweep(res.model, data.val_tokens, seq_len, (2, 4), max_tokens=eval_tokens, device=device,
                             byte_lengths=byte_lengths, batch_tokens=batch * seq_len)
        sweeps[m] = [{"seq_len": seq_len, "ppl": res.val.ppl}] + sweep
        models[m] = res.model
        rows.append({"model": m, "params": res.model.num_parameters(), "state": state_size(res.model, seq_len),
                     "ppl": res.val.ppl, "bpb": res.val.bpb, "ppl2": sweep[0]["ppl"], "ppl4": sweep[1]["ppl"],
                     "tok_s": res.tokens_per_second, "steps": res.steps, "tokens": res.tokens,
                     "note": state_note(has_routing(res.model), routing, measured_on="the last validation batch")})
        show(f"evaluated {m}")
    bar.close()
    curves = {}
    for m in cfgs:
        recs = read_metrics(out / m / "metrics.jsonl")
        curves[m] = [(r["tokens"], r["loss"]) for r in recs if r.get("loss") is not None]
    equal_tokens = min(r["tokens"] for r in rows)  # the training tokens every model reached
    for r in rows:
        r["loss_eq"] = loss_at_tokens(curves[r["model"]], equal_tokens)
    columns = [("model", "model", ""), ("params", "params", ","), ("state", f"state@{seq_len}", ","),
               ("ppl", "val ppl", ".3f"), ("bpb", "bits/byte", ".3f"), ("loss_eq", f"loss@{equal_tokens:,} tok", ".3f"),
               ("ppl2", f"ppl@{2 * seq_len}", ".3f"), ("ppl4", f"ppl@{4 * seq_len}", ".3f"),
               ("tok_s", "train tok/s", ",.0f"), ("steps", "steps", ","), ("tokens", "train tokens", ",")]
    table = format_table(rows, columns)
    notes = [f"{r['model']}, state@{seq_len}: {r['note']}" for r in rows if r["note"]]
    notes.append(f"loss@{equal_tokens:,} tok: training loss (nats/token) at the {equal_tokens:,} training tokens "
                 f"every model reached (mean over the last {EQUAL_TOKENS_WINDOW:.0%} of them); the other columns: "
                 "after each model's equal share of the time")
    table = "\n".join([table, *notes])
    from hybrid_attention.evaluation.length_sweep import plot_length_sweep

    plot_length_sweep(sweeps, out / "length_sweep.png", "demo: validation perplexity vs context length")
    plot_series(curves, out / "train_loss.png", "training tokens", "training loss (nats/token)",
                "demo: training loss", logy=True, markers=False)
    best = min(rows, key=lambda r: r["ppl"])["model"]
    sample = readable_sample(lambda seed: generate_text(models[best], data.tokenizer, "def ",
                                                        max_new_tokens=opts.sample_tokens, temperature=0.8, top_k=40,
                                                        top_p=0.95, seed=seed, device=device), opts.seed)
    seconds = time.perf_counter() - t_start
    (out / "table.txt").write_text(table + "\n")
    return {"rows": rows, "table": table, "sample": "def " + sample, "best": best, "seconds": seconds,
            "steps": {r["model"]: r["steps"] for r in rows}, "tokens": {r["model"]: r["tokens"] for r in rows},
            "equal_tokens": equal_tokens}
