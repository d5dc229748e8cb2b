"""Learning-rate schedule: linear warmup, then cosine decay to ``min_lr_ratio`` of the peak."""

from __future__ import annotations

import math

import torch


class WarmupCosine:
    """Multiplier of the base lr at optimizer step ``step`` (0-based); a picklable-free callable for LambdaLR."""

    def __init__(self, warmup_steps: int, total_steps: int, min_lr_ratio: float):
        self.warmup_steps, self.total_steps, self.min_lr_ratio = warmup_steps, total_steps, min_lr_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_cosine_scheduler(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over every param group (each group's own base lr is scaled, so the SSM lr cap is kept)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(warmup_steps, total_steps, min_lr_ratio))


def scheduler_state(scheduler: torch.optim.lr_scheduler.LRScheduler) -> dict:
    """The scheduler's state as JSON-able scalars and lists (the lambdas themselves are rebuilt from the config)."""
    return {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}


def load_scheduler_state(scheduler: torch.optim.lr_scheduler.LRScheduler, state: dict) -> None:
    scheduler.load_state_dict({**state, "lr_lambdas": [None] * len(scheduler.optimizer.param_groups)})
