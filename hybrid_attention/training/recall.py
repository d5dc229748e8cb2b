"""Training on synthetic recall (MQAR, zoology-style; or synthetic passkey), one command for a sweep.

For each (mixer, d_model, lr) a fresh ``num_layers``-layer model is trained on ``train_examples`` generated examples
with cross-entropy on the labelled positions only (labels are targets *at* their position, no shift), evaluated after
every epoch on ``test_examples`` held-out examples, and stopped early once test accuracy exceeds ``early_stop``
(zoology: 0.99). Accuracy counts labelled (query) positions only (``evaluation/recall.py`` measures it). The best lr
per (mixer, d_model) is reported.
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from hybrid_attention.config.run_config import OptimSection
from hybrid_attention.config.schema import ConfigError
from hybrid_attention.data.mqar import MQARConfig, multiquery_ar
from hybrid_attention.data.passkey import passkey_tokens
from hybrid_attention.device import resolve_device, set_tf32
from hybrid_attention.evaluation.recall import _accuracy, chance_accuracy, labels_per_row, query_logits, query_positions
from hybrid_attention.layers.natsl.routing import RoutingRecorder
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.plots import plot_series

from .loop import Hook, TrainingLoop
from .optimizer import build_optimizer
from .recall_resume import fingerprint, restore_epoch, save_epoch
from .schedule import warmup_cosine_scheduler
from .step import optimizer_step


@dataclass
class RecallConfig:
    """One sweep. The defaults are the CPU-sized MQAR smoke config (vocab 256, T 64, 4 pairs, d 64, 2 layers)."""

    task: Literal["mqar", "passkey"] = "mqar"
    mixers: list[str] = field(default_factory=lambda: ["softmax", "interdomain", "s4d"])
    d_models: list[int] = field(default_factory=lambda: [64])
    lrs: list[float] = field(default_factory=lambda: [3e-3])
    vocab_size: int = 256
    seq_len: int = 64
    num_kv_pairs: int = 4  # mqar
    power_a: float = 0.01  # mqar
    passkey_digits: int = 4  # passkey
    num_layers: int = 2
    num_heads: int = 2
    model_options: dict = field(default_factory=dict)  # further HybridConfig fields (state_size, chunk_size, ...)
    train_examples: int = 4000  # per epoch
    test_examples: int = 500
    fresh_data: bool = False  # new training examples every epoch (no memorisation; zoology keeps one fixed set)
    batch_size: int = 32
    epochs: int = 6
    weight_decay: float = 0.1
    warmup_fraction: float = 0.1
    early_stop: float = 0.99
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    tf32: bool = True  # CUDA: the float32 training's matmuls on TF32 tensor cores (device.set_tf32)
    # torch.compile the backbone of the training step (static shapes: one graph per batch size). The tiny recall
    # models are launch-bound on a GPU in eager mode; the evaluation passes stay eager (same parameters)
    compile: bool = False
    # torch.compile's mode for that backbone: "reduce-overhead" replays its forward and backward as CUDA graphs (one
    # launch each instead of one per kernel: a 2-layer d 128 model at B 64 is launch-bound). Same kernels, same math
    compile_mode: Literal["default", "reduce-overhead"] = "default"
    # a length curriculum: epochs 1..short_epochs train on examples of short_seq_len tokens,
    # the later ones on seq_len; the test set is always at seq_len, so the first epochs' test accuracy is the short
    # model's transfer to the full length. Off (None / 0) by default. It tells a plateau of the optimisation
    # (learned after the start) from a limit of the mixer at that length (not learned).
    short_seq_len: int | None = None
    short_epochs: int = 0
    # MQAR only: the short stage's pairs (None: num_kv_pairs): a start on a task the mixer learns (e.g. 16 pairs at
    # 256 tokens) asks whether its state then holds more pairs at the full length
    short_num_kv_pairs: int | None = None
    out_dir: str = "runs/recall"

    def __post_init__(self) -> None:
        for mixer in self.mixers:  # every model of the sweep, before any of them trains or anything is written
            for d in self.d_models:
                try:
                    recall_model_config(self, mixer, d)
                except ValueError as e:
                    raise ConfigError(f"config error: mixers / d_models / model_options: {e}") from None
        # the generator's limits (data/mqar.py: even length, num_kv_pairs pairs and as many queries, vocabulary above
        # the length) at every length trained: checked here, not at the first epoch of a run (a curriculum's short
        # length is generated only then)
        if self.short_num_kv_pairs is not None and (self.task != "mqar" or self.short_seq_len is None
                                                    or self.short_num_kv_pairs < 1):
            raise ConfigError("config error: short_num_kv_pairs must be a positive count, for task mqar with "
                              f"short_seq_len set; got {self.short_num_kv_pairs} (task {self.task}, short_seq_len "
                              f"{self.short_seq_len})")
        if self.task == "mqar":
            for name in ("seq_len", "short_seq_len"):
                t = getattr(self, name)
                if t is None:
                    continue
                pairs = self.train_num_kv_pairs(1) if name == "short_seq_len" else self.num_kv_pairs
                try:
                    MQARConfig(vocab_size=self.vocab_size, input_seq_len=t, num_kv_pairs=pairs)
                except ValueError as e:
                    raise ConfigError(f"config error: {name} = {t} does not fit mqar: {e}") from None
        if self.short_seq_len is None:
            if self.short_epochs:
                raise ConfigError(f"config error: short_epochs ({self.short_epochs}) needs short_seq_len; "
                                  "set both or neither")
            return
        if not 0 < self.short_seq_len < self.seq_len:
            raise ConfigError(f"config error: short_seq_len must be in [1, seq_len - 1] = [1, {self.seq_len - 1}], "
                              f"got {self.short_seq_len}")
        if not 0 < self.short_epochs < self.epochs:
            raise ConfigError(f"config error: short_epochs must be in [1, epochs - 1] = [1, {self.epochs - 1}] "
                              f"with short_seq_len, got {self.short_epochs}")

    def train_seq_len(self, epoch: int) -> int:
        """The length of epoch ``epoch``'s training examples (1-based; the curriculum above)."""
        return self.short_seq_len if self._in_short_stage(epoch) else self.seq_len

    def train_num_kv_pairs(self, epoch: int) -> int:
        """MQAR: the pairs of epoch ``epoch``'s training examples (``short_num_kv_pairs`` in the short stage)."""
        short = self._in_short_stage(epoch) and self.short_num_kv_pairs is not None
        return self.short_num_kv_pairs if short else self.num_kv_pairs

    def _in_short_stage(self, epoch: int) -> bool:
        return self.short_seq_len is not None and epoch <= self.short_epochs


def make_examples(cfg: RecallConfig, n: int, seed: int, seq_len: int | None = None,
                  num_kv_pairs: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, labels)`` [n, seq_len] of the configured task (``seq_len`` defaults to ``cfg.seq_len``; MQAR's
    ``num_kv_pairs`` to ``cfg.num_kv_pairs``)."""
    seq_len = cfg.seq_len if seq_len is None else seq_len
    if cfg.task == "mqar":
        pairs = cfg.num_kv_pairs if num_kv_pairs is None else num_kv_pairs
        mq = MQARConfig(vocab_size=cfg.vocab_size, input_seq_len=seq_len, num_kv_pairs=pairs,
                        power_a=cfg.power_a)
        return multiquery_ar(mq, n, seed)
    return passkey_tokens(n, seq_len, cfg.vocab_size, n_digits=cfg.passkey_digits, seed=seed)


def recall_model_config(cfg: RecallConfig, mixer: str, d_model: int) -> HybridConfig:
    """The model of one sweep cell: ``num_layers`` layers of ``mixer`` at width ``d_model`` (ValueError naming the
    field for a mixer that does not exist or options that do not fit)."""
    head_dim = d_model // cfg.num_heads
    return HybridConfig.from_preset(
        "tiny", **{"layers": [mixer] * cfg.num_layers, "vocab_size": cfg.vocab_size, "hidden_size": d_model,
                   "num_heads": cfg.num_heads, "head_dim": head_dim, "max_position_embeddings": cfg.seq_len,
                   **cfg.model_options})


def build_recall_model(cfg: RecallConfig, mixer: str, d_model: int) -> HybridForCausalLM:
    """A fresh model of one sweep cell (:func:`recall_model_config`)."""
    return HybridForCausalLM(recall_model_config(cfg, mixer, d_model))


def compiled_backbone(cfg: RecallConfig, model: HybridForCausalLM):
    """What runs ``model.model`` in the training step: itself, or (``cfg.compile``) its ``torch.compile`` with static
    shapes and ``cfg.compile_mode``."""
    if not cfg.compile:
        return model.model
    return torch.compile(model.model, dynamic=False, mode=cfg.compile_mode)


def recall_optimizer(cfg: RecallConfig, model: HybridForCausalLM, lr: float):
    """(optimizer, scheduler) of one recall run: the trainer's AdamW (over the SSM parameter groups) and schedule
    (linear warmup, cosine decay), with this task's settings: torch's default AdamW betas / eps (beta2 0.999, not the
    LM trainer's 0.95) and a cosine down to 0 over the run (the numbers of the former local copy of both)."""
    opt = build_optimizer(model, OptimSection(lr=lr, weight_decay=cfg.weight_decay, beta1=0.9, beta2=0.999, eps=1e-8))
    total = math.ceil(cfg.train_examples / cfg.batch_size) * cfg.epochs
    warmup = max(1, int(cfg.warmup_fraction * total))
    return opt, warmup_cosine_scheduler(opt, warmup, total, min_lr_ratio=0.0)


def train_step(model: HybridForCausalLM, backbone, opt, sched, xb: torch.Tensor, yb: torch.Tensor,
               n: int | None = None) -> torch.Tensor:
    """One optimizer step on a batch xb, yb [B, T] (cross-entropy at the labelled positions, gradient norm clipped to
    1, AdamW, schedule: ``step.optimizer_step``); ``backbone``: see ``query_logits``; ``n``: labels per row
    (``labels_per_row``; then no host sync), None for the masked form. Returns the loss (a 0-d tensor, not synced)."""

    def loss(_: int) -> torch.Tensor:
        if n is not None:
            pos = query_positions(yb, n)
            return F.cross_entropy(query_logits(model, xb, yb, backbone, pos).float(), yb.gather(1, pos).flatten())
        return F.cross_entropy(query_logits(model, xb, yb, backbone).float(), yb[yb != -100])

    return optimizer_step(model, opt, sched, loss, grad_clip=1.0).loss


def train_and_eval(cfg: RecallConfig, mixer: str, d_model: int, lr: float, device: torch.device, log=None,
                   resume_dir: Path | None = None) -> dict:
    """Train one model; returns {mixer, d_model, lr, params, state_size, accuracy, epochs, seconds, loss, tf32,
    compiled, compile_mode, history} (loss: the last training step's; tf32: the setting it trained with, read by
    tests/experiments/test_tf32_pins.py; compiled: ``cfg.compile``; compile_mode: its mode, None when eager;
    history: one {epoch, loss, accuracy, seq_len} per epoch trained, the epoch's last step's loss and the test
    accuracy after it: when a model leaves the chance plateau, the reading of the recall suites).
    ``resume_dir``: a checkpoint after every epoch there, and a start from the last one found (``recall_resume``: the
    same result as an uncut run).

    The epochs run in ``loop.TrainingLoop`` (one unit per epoch): the test accuracy, the checkpoint and the log line
    are its hooks after every epoch, and the stopping rule is ``early_stop``."""
    # applied here, where the row records it (the experiment runner calls this function directly, not
    # ``recall_sweep``)
    set_tf32(device, cfg.tf32)
    torch.manual_seed(cfg.seed)
    model = build_recall_model(cfg, mixer, d_model).to(device)
    x_te, y_te = make_examples(cfg, cfg.test_examples, cfg.seed + 10_000)
    opt, sched = recall_optimizer(cfg, model, lr)
    # the logits gather (a data-dependent shape) stays outside the compiled graph
    backbone = compiled_backbone(cfg, model)
    g = torch.Generator().manual_seed(cfg.seed)
    t0 = time.perf_counter()
    acc, epoch, first, done_s, loss, history = 0.0, 0, 1, 0.0, None, []
    fp = fingerprint(cfg, mixer, d_model, lr)
    if resume_dir is not None and (doc := restore_epoch(resume_dir, model, opt, sched, g, fp, log)) is not None:
        epoch = doc["epoch"]
        first, done_s, acc, loss = epoch + 1, doc["seconds"], doc["accuracy"], torch.tensor(doc["loss"])
        history = list(doc.get("history", []))
        if acc > cfg.early_stop:  # it had stopped early: nothing left to train
            first = cfg.epochs + 1
        if log:
            log(f"  {mixer} d={d_model} lr={lr:g}: resumed after epoch {epoch} (test accuracy {acc:.3f})")
    routing = RoutingRecorder()  # the test passes' NAtS-L routing: the softmax fraction of the state size

    def epoch_seed(e: int) -> int:  # fresh_data: epoch e's examples (e > 1), independent of training
        return cfg.seed + 7919 * e if cfg.fresh_data and e > 1 else cfg.seed

    def epoch_examples(e: int) -> tuple[torch.Tensor, torch.Tensor]:  # epoch e's training examples
        return make_examples(cfg, cfg.train_examples, epoch_seed(e), cfg.train_seq_len(e), cfg.train_num_kv_pairs(e))

    x_tr, y_tr = epoch_examples(first) if first <= cfg.epochs else (None, None)
    # the next epoch's examples are generated in a background thread while this one trains (the generator is ~3-12 s
    # per 20k MQAR examples at vocabulary 8192)
    pool = ThreadPoolExecutor(max_workers=1)
    ahead = cfg.fresh_data and first < cfg.epochs
    nxt = pool.submit(epoch_examples, first + 1) if ahead else None
    # where an epoch's seconds go (logged): waiting for its examples, the training steps, the test pass, the
    # checkpoint (an MQAR T 1024 epoch takes 10.9 s on the H200 for ~4 s of projected steps)
    clock: dict[str, float] = {}
    seen: dict = {}  # the epoch's last loss (host value) and labels per row, read by the hooks

    def train_epoch(e: int) -> None:
        nonlocal x_tr, y_tr, nxt, loss
        clock["epoch"] = time.perf_counter()
        if cfg.fresh_data and e > first:
            x_tr, y_tr = nxt.result()
            if e < cfg.epochs:
                nxt = pool.submit(epoch_examples, e + 1)
        elif x_tr.shape[1] != cfg.train_seq_len(e):  # one fixed set: regenerated where the length changes
            x_tr, y_tr = epoch_examples(e)
        n = labels_per_row(y_tr)  # MQAR: train_num_kv_pairs(e) queries per row; passkey: its digits
        # the epoch's examples and order go to the device once: a per-step copy from pageable host memory
        # would wait for the GPU to finish the previous step (a host sync per step, like a mask index)
        x_dev, y_dev = x_tr.to(device), y_tr.to(device)
        perm = torch.randperm(cfg.train_examples, generator=g).to(device)
        clock["train"] = time.perf_counter()
        for i in range(0, cfg.train_examples, cfg.batch_size):
            idx = perm[i : i + cfg.batch_size]
            loss = train_step(model, backbone, opt, sched, x_dev[idx], y_dev[idx], n)
        seen["loss"], seen["n"] = loss.item(), n  # waits for the epoch's last step (the one host sync of its steps)

    def evaluate(e: int) -> None:
        nonlocal acc
        clock["test"] = time.perf_counter()
        with routing.attach(model):
            acc = _accuracy(model, x_te, y_te, 4 * cfg.batch_size, device)
        history.append({"epoch": e, "loss": seen["loss"], "accuracy": acc, "seq_len": x_tr.shape[1],
                        **({"num_kv_pairs": seen["n"]} if cfg.task == "mqar" else {})})

    def checkpoint(e: int) -> None:
        clock["checkpoint"] = time.perf_counter()
        if resume_dir is not None:
            save_epoch(resume_dir, e, model, opt, sched, g, fp, done_s + time.perf_counter() - t0, seen["loss"], acc,
                       log, history)

    def report(e: int) -> None:
        if log:
            t_end = time.perf_counter()
            log(f"  {mixer} d={d_model} lr={lr:g} epoch {e}: loss {seen['loss']:.3f}, test accuracy {acc:.3f} "
                f"(seconds: examples {clock['train'] - clock['epoch']:.1f}, train {clock['test'] - clock['train']:.1f}"
                f", test {clock['checkpoint'] - clock['test']:.1f}, checkpoint {t_end - clock['checkpoint']:.1f})")

    loop = TrainingLoop(train_epoch, last=lambda: cfg.epochs, hooks=[Hook(evaluate), Hook(checkpoint), Hook(report)],
                        stop=lambda e: acc > cfg.early_stop)
    try:
        if first <= cfg.epochs:
            epoch = loop.run(done=first - 1)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if first > cfg.epochs:  # resumed with nothing left to train: one evaluation pass for the routing (state size)
        with routing.attach(model):
            acc = _accuracy(model, x_te, y_te, 4 * cfg.batch_size, device)
    return {"task": cfg.task, "chance": chance_accuracy(cfg), "mixer": mixer, "d_model": d_model, "lr": lr,
            "params": model.num_parameters(),
            "state_size": model.state_size(cfg.seq_len, routing.mean_fractions()), "accuracy": acc, "epochs": epoch,
            "seconds": done_s + time.perf_counter() - t0, "loss": loss.item(), "tf32": cfg.tf32,
            "compiled": cfg.compile, "compile_mode": cfg.compile_mode if cfg.compile else None, "history": history}


def recall_sweep(cfg: RecallConfig, log=print) -> list[dict]:
    """Run the whole sweep; writes ``results.jsonl``, ``accuracy_vs_state.png`` and returns the best row per
    (mixer, d_model)."""

    device = resolve_device(cfg.device)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=1))
    best: dict[tuple[str, int], dict] = {}
    with (out / "results.jsonl").open("w") as f:
        for mixer in cfg.mixers:
            for d in cfg.d_models:
                for lr in cfg.lrs:
                    row = train_and_eval(cfg, mixer, d, lr, device, log)
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    if (mixer, d) not in best or row["accuracy"] > best[(mixer, d)]["accuracy"]:
                        best[(mixer, d)] = row
    rows = list(best.values())
    series = {m: sorted((r["state_size"], r["accuracy"]) for r in rows if r["mixer"] == m) for m in cfg.mixers}
    plot_series(series, out / "accuracy_vs_state.png", "state size (numbers per sequence)", "test accuracy",
                f"{cfg.task}: T={cfg.seq_len}" + (f", {cfg.num_kv_pairs} pairs" if cfg.task == "mqar" else ""),
                logx=True, chance=chance_accuracy(cfg))
    return rows


