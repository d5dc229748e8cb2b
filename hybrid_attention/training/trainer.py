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
    status lines (the progress bar follows ``train.progress``). Raises ConfigError /
    DataError for bad input and TrainingDiverged after ``train.max_nonfinite`` non-finite steps in a row.
    """
    tc = cfg.train
    ctx = init_distributed(tc.device)
    try:
        return _train(cfg, tc, ctx, resume, data, quiet)
    finally:
        shutdown_distributed(ctx)


def _train(cfg: RunConfig, tc, ctx: DistContext, resume: bool, data: LMData | None, quiet: bool) -> TrainResult:
    from hybrid_attention.models import HybridForCausalLM

    out_dir = Path(tc.out_dir)
    ckpt_root = out_dir / "checkpoints"
    latest = latest_checkpoint(ckpt_root)
    if latest is not None and not resume:
        raise ConfigError(f"config error: train.out_dir = {str(out_dir)!r} already has checkpoints; pass --resume to "
                          "continue that run or choose another train.out_dir")
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
        out_dir.mkdir(parents=True, exist_ok=True)
        data.tokenizer.save_pretrained(str(out_dir / "tokenizer"))
    tok = data.tokenizer
    mcfg = model_config(cfg.model, vocab_size=len(tok))
    check_vocab(tok, mcfg.vocab_size)
    mcfg.bos_token_id, mcfg.eos_token_id, mcfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    if len(data.val_tokens) < cfg.data.seq_len * ctx.world_size:
        raise DataError(f"validation split has {len(data.val_tokens)} tokens, too few for seq_len={cfg.data.seq_len}")

    _seed_everything(tc.seed)  # identical initial weights on every rank and for every data source
    model = HybridForCausalLM(mcfg).to(ctx.device)
    user_model = model
    n_params = sum(p.numel() for p in model.parameters())
    model = wrap_model(model, ctx, tc.parallel)
    optimizer = build_optimizer(unwrap(model), cfg.optim)
    scheduler = warmup_cosine_scheduler(optimizer, cfg.optim.warmup_steps, tc.steps, cfg.optim.min_lr_ratio)
    state: dict[str, Any] = {"tokens": 0, "skipped": 0, "train_seconds": 0.0}
    start = 0
    if resume and latest is not None:
        doc = load_checkpoint(latest, unwrap(model), optimizer, ctx.rank)
        load_scheduler_state(scheduler, doc["scheduler"])
        data.train.load_state_dict(doc["data"])
        state.update({k: doc[k] for k in state})
        start = doc["step"]
        _say(ctx, f"resumed from {latest} at step {start}")
    elif resume:
        _say(ctx, f"no checkpoint in {ckpt_root}: starting from scratch")
    if tc.compile:
        model.compile()
    amp = _autocast_dtype(tc.precision, ctx.device)
    byte_lengths = token_byte_lengths(tok)
    log = MetricsLog(out_dir / "metrics.jsonl", resume_step=start if resume else None, enabled=ctx.is_main)
    seq_len, accum = cfg.data.seq_len, tc.grad_accum
    tokens_per_step = tc.batch_size * seq_len
    if not quiet:
        _say(ctx, f"{data.description}")
        state_numbers = user_model.state_size(seq_len)
        _say(ctx, f"model: {describe_layers(mcfg.mixer_types)}, {n_params / 1e6:.2f}M parameters, "
                  f"state {state_numbers:,} numbers/sequence at {seq_len} tokens")
        _say(ctx, f"device {ctx.device} x{ctx.world_size}, {'bf16 autocast' if amp else 'fp32'}; "
                  f"{tc.steps} steps of {tokens_per_step:,} tokens")

    def validate(step: int) -> LMScore:
        score = evaluate_lm(unwrap(model) if tc.parallel == "ddp" else model, data.val_tokens, seq_len,
                            batch_size=max(1, tc.batch_size // (accum * ctx.world_size)), device=ctx.device,
                            byte_lengths=byte_lengths, max_tokens=cfg.data.val_tokens, autocast_dtype=amp,
                            rank=ctx.rank, world_size=ctx.world_size, all_reduce_sum=ctx.all_reduce_sum)
        record = {"step": step, "val_loss": score.loss, "val_ppl": score.ppl, "val_bpb": score.bpb}
        fractions = user_model.routing_fractions()
        if fractions:
            record["routing"] = {str(i): f.detach().float().cpu().tolist() for i, f in fractions.items()}
        log.log(record)
        return score

    def checkpoint(step: int) -> None:
        extra = {"scheduler": scheduler_state(scheduler), "data": data.train.state_dict(), **state}
        save_checkpoint(ckpt_root, step, unwrap(model), optimizer, extra, tc.keep_checkpoints, ctx.rank, ctx.barrier)

    show = tc.progress and ctx.is_main
    bar = tqdm(total=tc.steps, initial=start, disable=not show, unit="step", dynamic_ncols=True,
               desc=describe_layers(mcfg.mixer_types))
    streak, interval_loss, interval_steps, interval_tokens, interval_time = 0, 0.0, 0, 0, 0.0
    val: LMScore | None = None
    model.train()
    for step in range(start, tc.steps):
        t0 = time.perf_counter()
        micro = local_slice(data.train.next_batch(), accum, ctx.rank, ctx.world_size)
        loss_sum = torch.zeros((), device=ctx.device)
        for a in range(accum):
            x = micro[a].to(ctx.device, non_blocking=True)
            with _no_sync(model, a == accum - 1):
                with torch.autocast(ctx.device.type, dtype=amp) if amp else contextlib.nullcontext():
                    loss = model(input_ids=x, labels=x, use_cache=False).loss
                (loss / accum).backward()
            loss_sum += loss.detach().float()
        step_loss = ctx.all_reduce_mean(loss_sum / accum)
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        finite = bool(torch.isfinite(step_loss)) and bool(torch.isfinite(grad_norm))
        if finite:
            optimizer.step()
            streak = 0
        else:
            streak += 1
            state["skipped"] += 1
            _say(ctx, f"step {step + 1}: non-finite loss/gradient ({step_loss.item()}, grad norm {grad_norm.item()}); "
                      f"step skipped ({streak} in a row, {state['skipped']} total)")
            if streak >= tc.max_nonfinite:
                raise TrainingDiverged(
                    f"stopping at step {step + 1}: {streak} consecutive steps with a non-finite loss or gradient "
                    f"(train.max_nonfinite={tc.max_nonfinite}); lower optim.lr, raise optim.warmup_steps or use "
                    "train.precision=fp32"
                )
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        dt = time.perf_counter() - t0
        state["tokens"] += tokens_per_step
        state["train_seconds"] += dt
        done = step + 1
        if finite:
            interval_loss += step_loss.item()
            interval_steps += 1
        interval_tokens += tokens_per_step
        interval_time += dt
        lr = optimizer.param_groups[-1]["lr"]
        bar.update(1)
        if done % tc.log_every == 0 or done == tc.steps:
            mean_loss = interval_loss / interval_steps if interval_steps else float("nan")
            tps = interval_tokens / max(interval_time, 1e-9)
            log.log({"step": done, "loss": mean_loss, "lr": lr, "grad_norm": grad_norm.item(),
                     "tokens": state["tokens"], "tok_per_s": tps, "skipped": state["skipped"]})
            bar.set_postfix(loss=f"{mean_loss:.4f}", tok_s=f"{tps:,.0f}", lr=f"{lr:.2e}")
            interval_loss, interval_steps, interval_tokens, interval_time = 0.0, 0, 0, 0.0
        if done == tc.steps or (tc.eval_every and done % tc.eval_every == 0):
            val = validate(done)
            if not quiet:
                bpb = f", {val.bpb:.3f} bits/byte" if val.bpb is not None else ""
                _say(ctx, f"step {done}: validation loss {val.loss:.4f}, ppl {val.ppl:.3f}{bpb}")
        if done == tc.steps or (tc.checkpoint_every and done % tc.checkpoint_every == 0):
            checkpoint(done)
    bar.close()
    if val is None:  # resumed a finished run
        val = validate(tc.steps)
    if tc.save_final:
        full = get_model_state_dict(unwrap(model), options=_FULL)
        if ctx.is_main:
            save_final_model(user_model, tok, out_dir / "final", full)
    if tc.plots and ctx.is_main:
        plot_training_curves(read_metrics(out_dir / "metrics.jsonl"), out_dir, title=str(cfg.model.layers))
    tps = state["tokens"] / max(state["train_seconds"], 1e-9)
    return TrainResult(user_model, data, tc.steps, state["tokens"], state["train_seconds"], tps, val,
                       state["skipped"], out_dir)
