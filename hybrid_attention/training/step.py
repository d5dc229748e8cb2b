"""One optimizer step, the same for every training loop: the LM trainer, the recall tasks and the demo's timing.

The caller supplies the forward (a function from micro-batch index to loss); the order of the rest is fixed: backward
of every micro-batch (loss / accum), the mean loss, gradient-norm clipping, ``optimizer.step()`` (skipped for a
non-finite loss or gradient when asked), ``optimizer.zero_grad``, ``scheduler.step()``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class StepResult:
    """What one optimizer step hands back (tensors on the model's device, not synced to the host)."""

    loss: torch.Tensor  # 0-d: the mean loss of the step's micro-batches (after ``reduce``), detached
    grad_norm: torch.Tensor  # 0-d: the total gradient norm before clipping
    applied: bool  # False when the step was skipped for a non-finite loss or gradient (``skip_nonfinite``)


def no_sync(model: torch.nn.Module, sync: bool):
    """Skip the gradient all-reduce on non-final micro-batches (DDP ``no_sync``, FSDP2
    ``set_requires_gradient_sync``); a plain module needs nothing."""
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


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler, micro_loss: Callable[[int], torch.Tensor], *,
                   accum: int = 1, grad_clip: float = 1.0, autocast_dtype: torch.dtype | None = None,
                   device_type: str = "cpu", reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
                   skip_nonfinite: bool = False, after_update: Callable[[], None] | None = None) -> StepResult:
    """One optimizer step over ``accum`` micro-batches.

    Args:
        model: the module whose gradients are synchronised (DDP / FSDP) and clipped (its ``parameters()``).
        optimizer, scheduler: stepped once each (the scheduler also when the step is skipped).
        micro_loss: ``micro_loss(a)`` runs the forward of micro-batch ``a`` (0 <= a < accum) and returns its 0-d
            loss; it runs under ``torch.autocast(device_type, autocast_dtype)`` when ``autocast_dtype`` is set.
        accum: micro-batches per step; each one's backward sees ``loss / accum`` (``loss`` itself when accum is 1).
        grad_clip: the gradient-norm limit; 0 clips nothing (the norm is still computed and returned).
        reduce: applied to the mean loss before the finiteness check (the trainer's mean over ranks).
        skip_nonfinite: skip ``optimizer.step()`` when the loss or the gradient norm is not finite (one host sync
            per step); without it the step never reads a value back to the host.
        after_update: called right after ``optimizer.step()`` (before ``zero_grad`` and the scheduler step): the
            trainer's check of the new weights, which names the learning rate that step used.
    """
    total = None
    for a in range(accum):
        with no_sync(model, a == accum - 1):
            autocast = torch.autocast(device_type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
            with autocast:
                loss = micro_loss(a)
            (loss / accum if accum > 1 else loss).backward()
        part = loss.detach().float()
        total = part if total is None else total + part
    mean = total / accum if accum > 1 else total
    if reduce is not None:
        mean = reduce(mean)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else math.inf)
    applied = not skip_nonfinite or (bool(torch.isfinite(mean)) and bool(torch.isfinite(grad_norm)))
    if applied:
        optimizer.step()
        if after_update is not None:
            after_update()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return StepResult(mean, grad_norm, applied)
