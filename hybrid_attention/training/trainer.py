"""The training loop: one process on CPU, or many under torchrun (DDP / FSDP2). See :func:`train`."""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from tqdm.auto import tqdm

from hybrid_attention.data.errors import DataError
from hybrid_attention.data.lm_data import LMData, build_lm_data
from hybrid_attention.data.packing import local_slice
from hybrid_attention.data.tokenizer import check_vocab, token_byte_lengths
from hybrid_attention.evaluation.perplexity import LMScore, evaluate_lm

from .checkpoint import _FULL, latest_checkpoint, load_checkpoint, save_checkpoint
from .checkpointing import enable_block_checkpointing
from .config import RunConfig, model_config, save_config
from .config_schema import ConfigError, to_dict
from .distributed import DistContext, init_distributed, shutdown_distributed, unwrap, wrap_model
from .metrics import MetricsLog, read_metrics
from .optimizer import build_optimizer
from .plots import plot_training_curves
from .schedule import load_scheduler_state, scheduler_state, warmup_cosine_scheduler


class TrainingDiverged(RuntimeError):
    """Too many consecutive optimizer steps with a non-finite loss or gradient."""


@dataclass
class TrainResult:
    """What a finished run hands back (the model is the unwrapped, trained module)."""

    model: torch.nn.Module
    data: LMData
    steps: int
    tokens: int
    train_seconds: float
    tokens_per_second: float
    val: LMScore | None
    skipped_steps: int
    out_dir: Path


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _no_sync(model: torch.nn.Module, sync: bool):
    """Skip gradient all-reduce on non-final micro-batches (DDP ``no_sync``, FSDP2 ``set_requires_gradient_sync``)."""
    if sync:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)

        @contextlib.contextmanager
        def restore():
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return restore()
    return contextlib.nullcontext()


def _config_diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _config_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {a!r} -> {b!r}")
    return out


def save_final_model(model: torch.nn.Module, tok, path: Path, state_dict: dict | None = None) -> None:
    """HF-format model (safetensors) and tokenizer in one directory, without transformers' progress bar."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(path), state_dict=state_dict)
        tok.save_pretrained(str(path))
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def describe_layers(mixers: list[str]) -> str:
    """``["gdn", "gdn", "natsl"]`` -> ``"gdn x2, natsl x1"`` (runs of equal mixers, in order)."""
    runs: list[list] = []
    for m in mixers:
        if runs and runs[-1][0] == m:
            runs[-1][1] += 1
        else:
            runs.append([m, 1])
    return ", ".join(f"{m} x{n}" for m, n in runs)


def _say(ctx: DistContext, msg: str) -> None:
    if ctx.is_main:
        tqdm.write(msg)


def train(cfg: RunConfig, resume: bool = False, data: LMData | None = None, quiet: bool = False) -> TrainResult:
    """Train ``cfg`` to ``cfg.train.steps`` optimizer steps; ``resume`` continues from the newest checkpoint.

    ``data`` (optional) is a pre-built pipeline (the demo shares one corpus between runs); ``quiet`` drops the
    status lines (the progress bar follows ``train.progress``). Raises ConfigError / DataError for bad input and
    TrainingDiverged after ``train.max_nonfinite`` non-finite steps in a row.
    """
    ctx = init_distributed(cfg.train.device)
    try:
        return Trainer(cfg, ctx, resume, data, quiet).run()
    finally:
        shutdown_distributed(ctx)


class Trainer:
    """One run, step by step: ``Trainer(...)`` sets everything up (and resumes), ``train_step()`` does one optimizer
    step with its logging, validation and checkpoint, ``finish()`` writes the final model and plots.

    ``run()`` is the plain loop; the demo interleaves the steps of several trainers and may ``finish`` early.
    """

    def __init__(self, cfg: RunConfig, ctx: DistContext, resume: bool = False, data: LMData | None = None,
                 quiet: bool = False):
        from hybrid_attention.models import HybridForCausalLM

        self.cfg, self.tc, self.ctx, self.quiet = cfg, cfg.train, ctx, quiet
        tc = self.tc
        self.out_dir = out_dir = Path(tc.out_dir)
        self.ckpt_root = out_dir / "checkpoints"
        latest = latest_checkpoint(self.ckpt_root)
        if latest is not None and not resume:
            raise ConfigError(f"config error: train.out_dir = {str(out_dir)!r} already has checkpoints; pass "
                              "--resume to continue that run or choose another train.out_dir")
        if tc.batch_size % (tc.grad_accum * ctx.world_size):
            raise ConfigError(f"config error: train.batch_size = {tc.batch_size} is not divisible by grad_accum * "
                              f"world_size = {tc.grad_accum * ctx.world_size}")
        _seed_everything(tc.seed)
        if ctx.is_main:
            out_dir.mkdir(parents=True, exist_ok=True)
            cfg_path = out_dir / "config.yaml"
            if resume and cfg_path.exists():
                import yaml

                diff = _config_diff(yaml.safe_load(cfg_path.read_text()) or {}, to_dict(cfg))
                if diff:
                    _say(ctx, "note: resuming with a changed config: " + "; ".join(diff))
            save_config(cfg, cfg_path)
        # Rank 0 builds (and for BPE trains) the tokenizer first; the other ranks then load the saved one.
        if data is None:
            tok_dir = out_dir / "tokenizer"
            if ctx.is_main:
                data = build_lm_data(cfg.data, tc.batch_size, tc.seed, tok_dir)
            ctx.barrier()
            if not ctx.is_main:
                data = build_lm_data(cfg.data, tc.batch_size, tc.seed, tok_dir)
        elif ctx.is_main:
            data.tokenizer.save_pretrained(str(out_dir / "tokenizer"))
        self.data = data
        tok = data.tokenizer
        mcfg = model_config(cfg.model, vocab_size=len(tok))
        check_vocab(tok, mcfg.vocab_size)
        mcfg.bos_token_id, mcfg.eos_token_id, mcfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
        if len(data.val_tokens) < cfg.data.seq_len * ctx.world_size:
            raise DataError(f"validation split has {len(data.val_tokens)} tokens, too few for "
                            f"seq_len={cfg.data.seq_len}")

        _seed_everything(tc.seed)  # identical initial weights on every rank and for every data source
        self.user_model = HybridForCausalLM(mcfg).to(ctx.device)
        n_params = sum(p.numel() for p in self.user_model.parameters())
        if tc.checkpointing:
            enable_block_checkpointing(self.user_model)  # before wrapping / compiling
        self.model = wrap_model(self.user_model, ctx, tc.parallel)
        self.optimizer = build_optimizer(unwrap(self.model), cfg.optim)
        self.scheduler = warmup_cosine_scheduler(self.optimizer, cfg.optim.warmup_steps, tc.steps,
                                                 cfg.optim.min_lr_ratio)
        self.state: dict[str, Any] = {"tokens": 0, "skipped": 0, "train_seconds": 0.0}
        self.step = 0
        if resume and latest is not None:
            doc = load_checkpoint(latest, unwrap(self.model), self.optimizer, ctx.rank)
            load_scheduler_state(self.scheduler, doc["scheduler"])
            data.train.load_state_dict(doc["data"])
            self.state.update({k: doc[k] for k in self.state})
            self.step = doc["step"]
            _say(ctx, f"resumed from {latest} at step {self.step}")
        elif resume and not quiet:
            _say(ctx, f"no checkpoint in {self.ckpt_root}: starting from scratch")
        if tc.compile:
            self.model.compile()
        self.amp = _autocast_dtype(tc.precision, ctx.device)
        self.byte_lengths = token_byte_lengths(tok)
        self.log = MetricsLog(out_dir / "metrics.jsonl", resume_step=self.step if resume else None,
                              enabled=ctx.is_main)
        self.seq_len, self.accum = cfg.data.seq_len, tc.grad_accum
        self.tokens_per_step = tc.batch_size * self.seq_len
        self.layers = describe_layers(mcfg.mixer_types)
        if not quiet:
            _say(ctx, f"{data.description}")
            _say(ctx, f"model: {self.layers}, {n_params / 1e6:.2f}M parameters, "
                      f"state {self.user_model.state_size(self.seq_len):,} numbers/sequence at {self.seq_len} tokens")
            _say(ctx, f"device {ctx.device} x{ctx.world_size}, {'bf16 autocast' if self.amp else 'fp32'}; "
                      f"{tc.steps} steps of {self.tokens_per_step:,} tokens")
        self.bar = tqdm(total=tc.steps, initial=self.step, disable=not (tc.progress and ctx.is_main), unit="step",
                        dynamic_ncols=True, desc=self.layers)
        self.streak = 0
        self._interval = [0.0, 0, 0, 0.0]  # loss sum, finite steps, tokens, seconds
        self.val: LMScore | None = None
        self.val_step = -1
        self.last_loss = float("nan")
        self.model.train()

    def set_total_steps(self, steps: int) -> None:
        """Change the run's length before the cosine phase starts (the demo re-plans after timing real steps); the
        schedule stays an exact warmup + cosine over the new length."""
        if self.step > self.cfg.optim.warmup_steps:
            raise ValueError(f"cannot change the run length after warmup (step {self.step})")
        self.tc.steps = steps
        for f in self.scheduler.lr_lambdas:
            f.total_steps = steps
        self.bar.total = steps
        if self.ctx.is_main:
            save_config(self.cfg, self.out_dir / "config.yaml")

    @property
    def done(self) -> bool:
        return self.step >= self.tc.steps

    def validate(self) -> LMScore:
        """Validation loss/ppl/bpb at the current step (logged, with NAtS-L routing fractions when present)."""
        tc, ctx = self.tc, self.ctx
        model = unwrap(self.model) if tc.parallel == "ddp" else self.model
        score = evaluate_lm(model, self.data.val_tokens, self.seq_len,
                            batch_size=max(1, tc.batch_size // (self.accum * ctx.world_size)), device=ctx.device,
                            byte_lengths=self.byte_lengths, max_tokens=self.cfg.data.val_tokens,
                            autocast_dtype=self.amp, rank=ctx.rank, world_size=ctx.world_size,
                            all_reduce_sum=ctx.all_reduce_sum)
        record = {"step": self.step, "val_loss": score.loss, "val_ppl": score.ppl, "val_bpb": score.bpb}
        fractions = self.user_model.routing_fractions()
        if fractions:
            record["routing"] = {str(i): f.detach().float().cpu().tolist() for i, f in fractions.items()}
        self.log.log(record)
        self.val, self.val_step = score, self.step
        if not self.quiet:
            bpb = f", {score.bpb:.3f} bits/byte" if score.bpb is not None else ""
            _say(ctx, f"step {self.step}: validation loss {score.loss:.4f}, ppl {score.ppl:.3f}{bpb}")
        return score

    def checkpoint(self) -> None:
        extra = {"scheduler": scheduler_state(self.scheduler), "data": self.data.train.state_dict(), **self.state}
        save_checkpoint(self.ckpt_root, self.step, unwrap(self.model), self.optimizer, extra,
                        self.tc.keep_checkpoints, self.ctx.rank, self.ctx.barrier)

    def train_step(self) -> float:
        """One optimizer step (skipped when the loss or gradient is not finite); returns the step's mean loss."""
        tc, ctx, cfg, model = self.tc, self.ctx, self.cfg, self.model
        t0 = time.perf_counter()
        micro = local_slice(self.data.train.next_batch(), self.accum, ctx.rank, ctx.world_size)
        loss_sum = torch.zeros((), device=ctx.device)
        for a in range(self.accum):
            x = micro[a].to(ctx.device, non_blocking=True)
            with _no_sync(model, a == self.accum - 1):
                with torch.autocast(ctx.device.type, dtype=self.amp) if self.amp else contextlib.nullcontext():
                    loss = model(input_ids=x, labels=x, use_cache=False).loss
                (loss / self.accum).backward()
            loss_sum += loss.detach().float()
        step_loss = ctx.all_reduce_mean(loss_sum / self.accum)
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        finite = bool(torch.isfinite(step_loss)) and bool(torch.isfinite(grad_norm))
        self.step += 1
        if finite:
            self.optimizer.step()
            self.streak = 0
        else:
            self.streak += 1
            self.state["skipped"] += 1
            _say(ctx, f"step {self.step}: non-finite loss/gradient ({step_loss.item()}, grad norm "
                      f"{grad_norm.item()}); step skipped ({self.streak} in a row, {self.state['skipped']} total)")
            if self.streak >= tc.max_nonfinite:
                raise TrainingDiverged(
                    f"stopping at step {self.step}: {self.streak} consecutive steps with a non-finite loss or "
                    f"gradient (train.max_nonfinite={tc.max_nonfinite}); lower optim.lr, raise optim.warmup_steps "
                    "or use train.precision=fp32"
                )
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        dt = time.perf_counter() - t0
        self.state["tokens"] += self.tokens_per_step
        self.state["train_seconds"] += dt
        iv = self._interval
        if finite:
            iv[0] += step_loss.item()
            iv[1] += 1
        iv[2] += self.tokens_per_step
        iv[3] += dt
        self.bar.update(1)
        if self.step % tc.log_every == 0 or self.done:
            mean_loss = iv[0] / iv[1] if iv[1] else float("nan")
            tps = iv[2] / max(iv[3], 1e-9)
            lr = self.optimizer.param_groups[-1]["lr"]
            self.log.log({"step": self.step, "loss": mean_loss, "lr": lr, "grad_norm": grad_norm.item(),
                          "tokens": self.state["tokens"], "tok_per_s": tps, "skipped": self.state["skipped"]})
            self.bar.set_postfix(loss=f"{mean_loss:.4f}", tok_s=f"{tps:,.0f}", lr=f"{lr:.2e}")
            self._interval = [0.0, 0, 0, 0.0]
        if self.done or (tc.eval_every and self.step % tc.eval_every == 0):
            self.validate()
        if self.done or (tc.checkpoint_every and self.step % tc.checkpoint_every == 0):
            self.checkpoint()
        self.last_loss = step_loss.item()
        return self.last_loss

    def finish(self) -> TrainResult:
        """Validate and checkpoint the current step if not yet done (a finished or stopped run), then write the
        final model (HF format + tokenizer) and the plots."""
        ctx = self.ctx
        self.bar.close()
        if self.val_step != self.step:
            self.validate()
        if not (self.ckpt_root / f"step-{self.step:08d}").exists():
            self.checkpoint()
        if self.tc.save_final:
            full = get_model_state_dict(unwrap(self.model), options=_FULL)
            if ctx.is_main:
                save_final_model(self.user_model, self.data.tokenizer, self.out_dir / "final", full)
        if self.tc.plots and ctx.is_main:
            plot_training_curves(read_metrics(self.out_dir / "metrics.jsonl"), self.out_dir,
                                 title=str(self.cfg.model.layers))
        tps = self.state["tokens"] / max(self.state["train_seconds"], 1e-9)
        return TrainResult(self.user_model, self.data, self.step, self.state["tokens"], self.state["train_seconds"],
                           tps, self.val, self.state["skipped"], self.out_dir)

    def run(self) -> TrainResult:
        while not self.done:
            self.train_step()
        return self.finish()
