"""The training loop: one process on CPU, or many under torchrun (DDP / FSDP2). See :func:`train`."""

from __future__ import annotations

import contextlib
import math
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from tqdm.auto import tqdm

from hybrid_attention.checkpoints.integrity import (
    CheckpointError,
    CheckpointMismatch,
    NonFiniteState,
    max_abs,
    nonfinite_count,
    publish_folder,
)
from hybrid_attention.checkpoints.model_folder import refuse_newer, unverified_warning
from hybrid_attention.checkpoints.step_checkpoints import (
    _FULL,
    apply_checkpoint,
    checkpoint_dirs,
    move_aside,
    newest_intact,
    one_line,
    save_checkpoint,
    saved_vocab_size,
    vocab_size_of,
)
from hybrid_attention.config.run_config import RunConfig, model_config, save_config
from hybrid_attention.config.schema import ConfigError, to_dict
from hybrid_attention.data.lm_data import LMData, build_lm_data
from hybrid_attention.data.packing import local_slice, varlen_inputs
from hybrid_attention.data.tokenizer import check_vocab, separator_id, token_byte_lengths
from hybrid_attention.device import set_tf32
from hybrid_attention.errors import DataError
from hybrid_attention.evaluation.perplexity import LMScore, evaluate_lm
from hybrid_attention.layers.natsl.routing import RoutingRecorder
from hybrid_attention.models import HybridForCausalLM
from hybrid_attention.models.configuration import CONFIG_REVISION
from hybrid_attention.modules.activation_checkpointing import enable_block_checkpointing
from hybrid_attention.plots import plot_training_curves

from .compile import compile_model
from .distributed import DistContext, init_distributed, shutdown_distributed, unwrap, wrap_model
from .loop import Hook, TrainingLoop
from .metrics import read_metrics
from .optimizer import build_optimizer
from .progress import progress_bar
from .resume_fields import check_resume_config
from .run_lock import RunLock, check_out_dir, refuse_linked_entries
from .schedule import (
    load_scheduler_state,
    resume_schedule,
    schedule_of_run_config,
    schedule_spec,
    scheduler_state,
    warmup_cosine_scheduler,
    warmup_warning,
)
from .step import optimizer_step
from .tracking import TrackedLog
from .wandb_tracker import WandbTracker


class TrainingDiverged(RuntimeError):
    """The run cannot go on: too many consecutive steps with a non-finite loss or gradient, weights or optimizer state
    that became non-finite, or a non-finite validation loss. The message names the last finite checkpoint."""


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
    val_routing: dict[int, list[float]] = field(default_factory=dict)  # NAtS-L: of the last validation batch


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def save_final_model(model: torch.nn.Module, tok, path: Path, state_dict: dict | None = None) -> None:
    """HF-format model (safetensors) and tokenizer in one directory, without transformers' progress bar.

    Written like a checkpoint: into ``.tmp-<name>`` with a ``manifest.json`` (sizes + sha256) last, then renamed into
    place. An I/O error (disk full, ...) removes the partial copy and raises one CheckpointError line.
    """
    from safetensors import SafetensorError
    from transformers.utils import logging as hf_logging

    path = Path(path)
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()

    def fill(tmp: Path) -> None:
        model.save_pretrained(str(tmp), state_dict=state_dict)
        tok.save_pretrained(str(tmp))

    try:
        publish_folder(path, fill, kind="final")
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"could not write the final model to {path}: {one_line(e)}; the partial copy was "
                              "removed (the checkpoints are intact)") from e
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
    status lines (the progress bar follows ``train.progress``). Raises ConfigError / DataError for bad input
    (CheckpointError, a DataError, for checkpoints that cannot be read or written) and TrainingDiverged after
    ``train.max_nonfinite`` non-finite steps in a row or as soon as weights / optimizer state / validation loss are
    non-finite.

    Nothing is written to ``train.out_dir`` before the data and the model config have loaded. ``resume`` takes the
    newest checkpoint that verifies; newer damaged ones are named in a note and moved to ``damaged-step-…``.
    """
    ctx = init_distributed(cfg.train.device)
    finished = False
    try:
        with _one_interrupt(ctx.world_size > 1):
            trainer = Trainer(cfg, ctx, resume, data, quiet)
            try:
                result = trainer.run()
            except BaseException:
                trainer.close(failed=True)  # the trackers record the run as failed
                raise
            finally:
                trainer.close()
        finished = True
        return result
    finally:
        shutdown_distributed(ctx, finished)


@contextlib.contextmanager
def _one_interrupt(enabled: bool):
    """Under torchrun a Ctrl-C reaches every rank twice: from the terminal (the whole process group) and again from
    the launcher, which forwards SIGINT to its workers. The first one raises KeyboardInterrupt; later ones are ignored,
    so that they cannot break the cleanup it starts (lock release, process group shutdown) and leave the rank hanging
    until the launcher kills it, nor turn its exit status 130 into death by SIGINT. Active in the main thread of a
    distributed run only; the previous handler returns when the run ends without an interrupt."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rank ends with status 130: a repeat changes nothing
        raise
    except BaseException:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        raise
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


class Trainer:
    """One run, step by step: ``Trainer(...)`` sets everything up (and resumes), ``train_step()`` does one optimizer
    step with its logging, validation and checkpoint, ``finish()`` writes the final model and plots.

    The steps run in a ``loop.TrainingLoop``: the unit is one optimizer step (``step.optimizer_step``), its hooks are
    the validation (every ``train.eval_every`` steps) and the checkpoint (every ``train.checkpoint_every`` steps, or
    the first finite step after one that was put off), both also after the last step. ``run()`` is the plain loop;
    the demo interleaves the steps of several trainers and may ``finish`` early.
    """

    def __init__(self, cfg: RunConfig, ctx: DistContext, resume: bool = False, data: LMData | None = None,
                 quiet: bool = False):
        self.cfg, self.tc, self.ctx, self.quiet = cfg, cfg.train, ctx, quiet
        tc = self.tc
        self.out_dir = out_dir = Path(tc.out_dir)
        self.ckpt_root = out_dir / "checkpoints"
        existing = checkpoint_dirs(self.ckpt_root)
        if existing and not resume:
            raise ConfigError(f"config error: train.out_dir = {str(out_dir)!r} already has checkpoints; pass "
                              "--resume to continue that run or choose another train.out_dir")
        # a resume keeps every field that changes the model or its data (training/resume_fields.py), checked
        # before the data loads and before anything is written
        check_out_dir(out_dir)
        refuse_linked_entries(out_dir)
        # a run never resumes from, nor replaces, what a newer version of the library wrote (its formats are unknown)
        for folder in (*existing, out_dir / "final"):
            if folder.is_dir():
                refuse_newer(folder, CONFIG_REVISION)
        resume_note = check_resume_config(out_dir / "config.yaml", cfg, existing) if resume and existing else None
        # one process per run folder (training/run_lock.py): taken here when the folder exists, else just before
        # the first write, so that a run refused for its data or model config leaves no folder behind
        self._lock: RunLock | None = None
        self._wandb: WandbTracker | None = None  # started before the run's first write (_start_tracking)
        new_folder = not out_dir.exists()
        if ctx.is_main and out_dir.is_dir():
            self._lock = RunLock(out_dir)
        try:
            self._setup(resume, existing, resume_note, data)
        except BaseException:
            self.close(failed=True)
            if new_folder and ctx.is_main:  # a run refused at its first write (its W&B run could not start) leaves
                with contextlib.suppress(OSError):  # no empty folder behind; rmdir removes only an empty one
                    out_dir.rmdir()
            raise

    def close(self, failed: bool = False) -> None:
        """Close the trackers (``failed``: the run stopped on an error) and free the run folder's lock (``train``
        calls it when the run ends, however it ends); idempotent."""
        log = getattr(self, "log", None)
        if log is not None:
            log.close(failed=failed)  # finishes the W&B run too
        elif self._wandb is not None:
            self._wandb.close(failed=failed)
        self._wandb = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _take_lock(self) -> None:
        if self._lock is None and self.ctx.is_main:
            self._lock = RunLock(self.out_dir)

    def _setup(self, resume: bool, existing: list[Path], resume_note: str | None, data: LMData | None) -> None:
        cfg, tc, ctx, quiet, out_dir = self.cfg, self.tc, self.ctx, self.quiet, self.out_dir
        self._graphs = tc.compile and tc.compile_mode == "reduce-overhead"
        if self._graphs and ctx.world_size > 1:
            raise ConfigError(f"config error: train.compile_mode = 'reduce-overhead' (CUDA graphs) runs in one "
                              f"process only, got {ctx.world_size}; allowed with torchrun: default, "
                              "max-autotune-no-cudagraphs")
        if tc.batch_size % (tc.grad_accum * ctx.world_size):
            raise ConfigError(f"config error: train.batch_size = {tc.batch_size} is not divisible by grad_accum * "
                              f"world_size = {tc.grad_accum * ctx.world_size}")
        _seed_everything(tc.seed)
        # Rank 0 loads the data (and for BPE trains the tokenizer) and checks it against the model config before
        # anything is written to out_dir; then it writes tokenizer/, which the other ranks load. config.yaml is
        # written once the model is built and (when resuming) the checkpoint has loaded.
        tok_dir = out_dir / "tokenizer"
        saved_tok = (tok_dir / "tokenizer_config.json").exists()
        mcfg = None
        if ctx.is_main:
            if data is None:
                data = build_lm_data(cfg.data, tc.batch_size, tc.seed, tok_dir if saved_tok else None)
            mcfg = self._model_config(data)
            if resume_note:
                _say(ctx, resume_note)
            if resume and existing and not saved_tok:  # a refused resume writes nothing: check before tokenizer/
                self._check_saved_vocab(existing, data.tokenizer, tok_dir, mcfg.vocab_size)
            if not saved_tok:
                self._take_lock()
                self._start_tracking(resume)
                data.tokenizer.save_pretrained(str(tok_dir))
        ctx.barrier()
        if not ctx.is_main:
            if data is None:
                data = build_lm_data(cfg.data, tc.batch_size, tc.seed, tok_dir)
            mcfg = self._model_config(data)
        self.data = data
        tok = data.tokenizer

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
        self.last_checkpoint: Path | None = None  # the newest checkpoint this run wrote or resumed from (finite)
        self._ckpt_pending = False
        if resume and existing:
            self._resume(tok, tok_dir, mcfg.vocab_size)
        elif resume and not quiet:
            _say(ctx, f"no checkpoint in {self.ckpt_root}: starting from scratch")
        warning = warmup_warning(self.scheduler.lr_lambdas[0])  # printed in quiet runs too (experiment suites)
        if warning:
            _say(ctx, warning)
        if ctx.is_main:
            self._take_lock()
            self._start_tracking(resume)
            save_config(cfg, out_dir / "config.yaml")
        if tc.compile:
            # static shapes: training uses one (batch, length); evaluation at other lengths recompiles once per shape
            # instead of switching to automatic dynamic shapes, whose recompile failed in inductor on the CPU
            # (torch 2.13: "cannot determine truth value of Relational"; tests/models/test_compile.py)
            compile_model(self.model, tc.compile_scope, None if tc.compile_mode == "default" else tc.compile_mode)
        self.amp = _autocast_dtype(tc.precision, ctx.device)
        set_tf32(ctx.device, tc.tf32)
        self.byte_lengths = token_byte_lengths(tok)
        self.log = TrackedLog(out_dir / "metrics.jsonl", resume_step=self.step if resume else None,
                              enabled=ctx.is_main, tensorboard=tc.tensorboard, wandb=self._wandb)
        self.seq_len, self.accum = cfg.data.seq_len, tc.grad_accum
        self.tokens_per_step = tc.batch_size * self.seq_len
        self.layers = describe_layers(mcfg.mixer_types)
        if not quiet:
            _say(ctx, f"{data.description}")
            _say(ctx, f"model: {self.layers}, {n_params / 1e6:.2f}M parameters, "
                      f"state {self.user_model.state_size(self.seq_len):,} numbers/sequence at {self.seq_len} tokens")
            _say(ctx, f"device {ctx.device} x{ctx.world_size}, {'bf16 autocast' if self.amp else 'fp32'}; "
                      f"{tc.steps} steps of {self.tokens_per_step:,} tokens")
        self.bar = progress_bar(tc.steps, initial=self.step, desc=self.layers, unit="step",
                                disable=not (tc.progress and ctx.is_main), every_s=tc.progress_every_s,
                                dynamic_ncols=True)
        self.streak = 0
        self._interval = [0.0, 0, 0, 0.0]  # loss sum, finite steps, tokens, seconds
        self.val: LMScore | None = None
        self.val_routing: dict[int, list[float]] = {}  # NAtS-L softmax fraction per decision head, by layer
        self.val_step = -1
        self.last_loss = float("nan")
        self.loop = TrainingLoop(self._optimizer_step, last=lambda: self.tc.steps, hooks=[
            Hook(lambda step: self.validate(), every=tc.eval_every),
            Hook(self._checkpoint_hook, every=tc.checkpoint_every, pending=lambda: self._ckpt_pending),
        ])
        self.model.train()

    def _start_tracking(self, resume: bool) -> None:
        """Start the W&B run (``train.wandb``, main rank) before the run's first write, so that a W&B run that cannot
        start (e.g. online without a login) refuses the run with nothing written; idempotent."""
        if self._wandb is None and self.tc.wandb is not None and self.ctx.is_main:
            self._wandb = WandbTracker(self.tc.wandb, self.out_dir, to_dict(self.cfg), resume=resume)

    def _model_config(self, data: LMData):
        """The model config for ``data``'s tokenizer; ConfigError / DataError when they do not fit."""
        cfg, tok = self.cfg, data.tokenizer
        mcfg = model_config(cfg.model, vocab_size=len(tok))
        check_vocab(tok, mcfg.vocab_size)
        mcfg.bos_token_id, mcfg.eos_token_id, mcfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
        if len(data.val_tokens) < cfg.data.seq_len * self.ctx.world_size:
            raise DataError(f"validation split has {len(data.val_tokens)} tokens, too few for "
                            f"seq_len={cfg.data.seq_len}")
        return mcfg

    @staticmethod
    def _refuse_vocab(path: Path, ckpt_vocab: int | None, tok, tok_dir: Path, vocab_size: int) -> None:
        """CheckpointMismatch (one line) when checkpoint ``path`` has another vocabulary size than the model built
        for the tokenizer ``tok``."""
        if ckpt_vocab is not None and ckpt_vocab != vocab_size:
            raise CheckpointMismatch(f"checkpoint {path} has vocab_size {ckpt_vocab} but the tokenizer "
                                     f"({tok_dir}) has {len(tok)} tokens, so the model would have vocab_size "
                                     f"{vocab_size}: resume with the run's own tokenizer and model config")

    def _check_saved_vocab(self, existing: list[Path], tok, tok_dir: Path, vocab_size: int) -> None:
        """A resume whose ``tokenizer/`` is missing: the newest readable checkpoint's vocabulary (read from its
        header, the folder admitted first) must fit the tokenizer about to be written there."""
        for path in reversed(existing):
            ckpt_vocab = saved_vocab_size(path, self.out_dir)
            if ckpt_vocab is not None:
                self._refuse_vocab(path, ckpt_vocab, tok, tok_dir, vocab_size)
                return

    def _resume(self, tok, tok_dir: Path, vocab_size: int) -> None:
        """Load the newest intact checkpoint (falling back past damaged ones, which are named and moved aside)."""
        ctx, root = self.ctx, self.ckpt_root
        found, damaged = newest_intact(root, ctx.rank, state_keys=("scheduler", "data", *self.state),
                                       scope=self.out_dir)
        if found is None:
            raise CheckpointError(f"no intact checkpoint to resume from in {root}: "
                                  + "; ".join(d.short for d in damaged)
                                  + "; move the checkpoints folder away to start from scratch")
        self._refuse_vocab(found.path, vocab_size_of(found.model), tok, tok_dir, vocab_size)
        configured = [g["initial_lr"] for g in self.optimizer.param_groups]  # the learning rates of this config
        doc = apply_checkpoint(found, unwrap(self.model), self.optimizer)
        load_scheduler_state(self.scheduler, doc["scheduler"])
        self._apply_configured_lr(configured)
        saved = doc.get("schedule") or schedule_of_run_config(self.out_dir / "config.yaml")
        if saved is not None:  # the saved schedule's shape, then optim.extend_schedule (training/schedule.py)
            _say(ctx, resume_schedule(self.scheduler, saved, self.tc.steps, self.cfg.optim.extend_schedule,
                                      doc["step"]))
        self.data.train.load_state_dict(doc["data"])
        self.state.update({k: doc[k] for k in self.state})
        self.step = doc["step"]
        self.last_checkpoint = found.path
        if damaged:
            ctx.barrier()  # every rank has read its checkpoint before rank 0 renames the damaged ones
            moved = move_aside(damaged) if ctx.is_main else []
            where = f" (moved to {', '.join(p.name for p in moved)})" if moved else ""
            _say(ctx, f"note: newest checkpoint damaged: {'; '.join(d.short for d in damaged)}{where}; "
                      f"falling back to {found.path.name}")
        if not found.verified:
            _say(ctx, unverified_warning(found.path))
        _say(ctx, f"resumed from {found.path} at step {self.step}")

    def _apply_configured_lr(self, configured: list[float]) -> None:
        """Resuming with a changed optim.lr (e.g. after a divergence) uses the new peak learning rates from the
        resumed step on; the checkpoint's param groups and scheduler state would otherwise keep the old ones."""
        sched, groups = self.scheduler, self.optimizer.param_groups
        if len(configured) != len(groups) or configured == list(sched.base_lrs):
            return
        sched.base_lrs = list(configured)
        for g, base, f in zip(groups, configured, sched.lr_lambdas):
            g["initial_lr"], g["lr"] = base, base * f(sched.last_epoch)
        sched._last_lr = [g["lr"] for g in groups]

    def _last_good(self) -> str:
        p = self.last_checkpoint
        if p is None:
            return "; no checkpoint was written"
        return f"; the last finite checkpoint is {p} (--resume continues from it)"

    def _diverged(self, what: str, step: int | None = None) -> TrainingDiverged:
        step = self.step if step is None else step
        return TrainingDiverged(f"stopping at step {step}: {what}{self._last_good()}; lower optim.lr, raise "
                                "optim.warmup_steps or use train.precision=fp32")

    def _check_weights(self, step: int) -> None:
        """Right after optimizer step ``step``: TrainingDiverged when any weight is NaN/inf (one fused reduction per
        step)."""
        params = list(unwrap(self.model).parameters())
        m = max_abs(params)
        flag = torch.zeros((), device=self.ctx.device) if m is None else (~torch.isfinite(m)).float()
        if self.ctx.all_reduce_sum(flag.to(self.ctx.device)).item() > 0:
            lr = self.optimizer.param_groups[-1]["lr"]
            raise self._diverged(f"the optimizer step (lr {lr:.3g}) made {nonfinite_count(params)} weight(s) "
                                 "non-finite", step)

    def _check_state(self) -> None:
        """Before a checkpoint: TrainingDiverged when weights or optimizer state hold NaN/inf (nothing is written)."""
        params = list(unwrap(self.model).parameters())
        opt = [v for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        flags = []
        for group in (params, opt):
            m = max_abs(group)
            flags.append(torch.zeros((), device=self.ctx.device) if m is None
                         else (~torch.isfinite(m)).float().to(self.ctx.device))
        bad = self.ctx.all_reduce_sum(torch.stack(flags)).tolist()
        if any(bad):
            raise self._diverged(f"{nonfinite_count(params)} weight(s) and {nonfinite_count(opt)} optimizer state "
                                 f"value(s) are non-finite, so checkpoint step-{self.step:08d} was not written")

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
        routing = RoutingRecorder()  # NAtS-L chunk types of the validation passes
        with routing.attach(self.user_model):
            score = evaluate_lm(model, self.data.val_tokens, self.seq_len,
                                batch_size=max(1, tc.batch_size // (self.accum * ctx.world_size)), device=ctx.device,
                                byte_lengths=self.byte_lengths, max_tokens=self.cfg.data.val_tokens,
                                autocast_dtype=self.amp, rank=ctx.rank, world_size=ctx.world_size,
                                all_reduce_sum=ctx.all_reduce_sum)
        record = {"step": self.step, "val_loss": score.loss, "val_ppl": score.ppl, "val_bpb": score.bpb}
        self.val_routing = {i: f.float().cpu().tolist() for i, f in routing.fractions().items()}
        if self.val_routing:
            record["routing"] = {str(i): f for i, f in self.val_routing.items()}
        self.log.log(record)
        self.val, self.val_step = score, self.step
        if not math.isfinite(score.loss):
            raise self._diverged(f"the validation loss is {score.loss}")
        if not self.quiet:
            bpb = f", {score.bpb:.3f} bits/byte" if score.bpb is not None else ""
            _say(ctx, f"step {self.step}: validation loss {score.loss:.4f}, ppl {score.ppl:.3f}{bpb}")
        return score

    def checkpoint(self) -> None:
        """Write the checkpoint of the current step, only when weights and optimizer state are finite."""
        self._check_state()
        extra = {"scheduler": scheduler_state(self.scheduler), "schedule": schedule_spec(self.scheduler),
                 "data": self.data.train.state_dict(), "config": to_dict(self.cfg), **self.state}
        try:
            path = save_checkpoint(self.ckpt_root, self.step, unwrap(self.model), self.optimizer, extra,
                                   self.tc.keep_checkpoints, self.ctx.rank, self.ctx.barrier,
                                   self.ctx.gather_to_main)
        except NonFiniteState as e:  # a buffer, or a state the collective check did not see
            raise self._diverged(str(e)) from e
        self.last_checkpoint, self._ckpt_pending = path, False

    def _lm_inputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Model inputs of a micro-batch of packed rows x [B, L]: the rows themselves (``data.pack: concat``), or one
        row of documents with cu_seqlens (``varlen``: every document from a fresh state, the same targets)."""
        if self.cfg.data.pack != "varlen":
            return {"input_ids": x, "labels": x}
        ids, labels, cu = varlen_inputs(x, separator_id(self.data.tokenizer))
        return {"input_ids": ids, "labels": labels, "cu_seqlens": cu}

    def train_step(self) -> float:
        """One optimizer step (skipped when the loss or gradient is not finite) and the validation and checkpoint
        due after it; returns the step's mean loss."""
        self.loop.advance(self.step + 1)
        return self.last_loss

    def _optimizer_step(self, step: int) -> None:
        """The loop's unit: optimizer step number ``step`` (``self.step`` becomes ``step``) with its logging."""
        tc, ctx, cfg, model = self.tc, self.ctx, self.cfg, self.model
        t0 = time.perf_counter()
        micro = local_slice(self.data.train.next_batch(), self.accum, ctx.rank, ctx.world_size)

        def micro_loss(a: int) -> torch.Tensor:
            x = micro[a].to(ctx.device, non_blocking=True)
            if self._graphs:  # a new iteration: the previous replay's outputs (loss, gradients) are consumed
                torch.compiler.cudagraph_mark_step_begin()
            return model(**self._lm_inputs(x), use_cache=False).loss

        result = optimizer_step(model, self.optimizer, self.scheduler, micro_loss, accum=self.accum,
                                grad_clip=cfg.optim.grad_clip, autocast_dtype=self.amp, device_type=ctx.device.type,
                                reduce=ctx.all_reduce_mean, skip_nonfinite=True,
                                after_update=lambda: self._check_weights(step))
        step_loss, grad_norm, finite = result.loss, result.grad_norm, result.applied
        self.step = step
        if finite:
            self.streak = 0
        else:
            self.streak += 1
            self.state["skipped"] += 1
            _say(ctx, f"step {self.step}: non-finite loss/gradient ({step_loss.item()}, grad norm "
                      f"{grad_norm.item()}); step skipped ({self.streak} in a row, {self.state['skipped']} total)")
            if self.streak >= tc.max_nonfinite:
                raise self._diverged(f"{self.streak} consecutive steps with a non-finite loss or gradient "
                                     f"(train.max_nonfinite={tc.max_nonfinite})")
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
        self.last_loss = step_loss.item()

    def _checkpoint_hook(self, step: int) -> None:
        """The loop's checkpoint: written now, or (the newest step was not finite) put off to the next finite step
        so that older checkpoints are not rotated away for it."""
        if self.streak and not self.done:
            self._ckpt_pending = True
        else:
            self.checkpoint()

    def finish(self) -> TrainResult:
        """Validate and checkpoint the current step if not yet done (a finished or stopped run), then write the
        final model (HF format + tokenizer) and the plots."""
        self.bar.close()
        try:
            return self._finish()
        finally:
            self.log.close()
            self.close()

    def _finish(self) -> TrainResult:
        ctx = self.ctx
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
                           tps, self.val, self.state["skipped"], self.out_dir, self.val_routing)

    def run(self) -> TrainResult:
        """The plain loop: ``train_step`` to the run's last step, then ``finish``."""
        while not self.done:
            self.train_step()
        return self.finish()
