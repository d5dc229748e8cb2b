"""Learning-rate schedule: linear warmup, then cosine decay to ``min_lr_ratio`` of the peak; a resumed run keeps
the schedule its checkpoint was written with (:func:`resume_schedule`)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from hybrid_attention.config.schema import read_yaml_mapping


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


class ExtendedSchedule:
    """The multiplier of a saved schedule (``saved``: a ``WarmupCosine`` or another ``ExtendedSchedule``) up to its
    last step, then, up to ``total_steps``, ``extend``: "constant" (its final multiplier, ``min_lr_ratio``) or
    "cosine" (a linear re-warm from ``min_lr_ratio`` to 1 over the saved warmup length, then a cosine down to
    ``min_lr_ratio`` at ``total_steps``)."""

    def __init__(self, saved: WarmupCosine | ExtendedSchedule, total_steps: int, extend: str):
        if extend not in EXTEND_RULES:
            raise ValueError(f"optim.extend_schedule must be one of {', '.join(EXTEND_RULES)}, got {extend!r}")
        self.saved, self.total_steps, self.extend = saved, total_steps, extend
        self.warmup_steps, self.min_lr_ratio = saved.warmup_steps, saved.min_lr_ratio

    def __call__(self, step: int) -> float:
        s = self.saved
        if step < s.total_steps or self.extend == "constant":
            return s(min(step, s.total_steps))
        k = step - s.total_steps
        if k < s.warmup_steps:
            return s.min_lr_ratio + (1 - s.min_lr_ratio) * (k + 1) / s.warmup_steps
        span = max(1, self.total_steps - s.total_steps - s.warmup_steps)
        progress = min(1.0, (k - s.warmup_steps) / span)
        return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


EXTEND_RULES = ("constant", "cosine")


def warmup_warning(f: WarmupCosine | ExtendedSchedule) -> str | None:
    """One warning line when a warm-up is as long as the steps it applies to or longer, so the learning rate only
    rises and never decays: ``optim.warmup_steps`` against ``train.steps``, or (``optim.extend_schedule: cosine``) the
    re-warm against the steps of the extension; None otherwise.

    Args:
        f: the multiplier the run follows (``scheduler.lr_lambdas[0]``).
    """
    if isinstance(f, ExtendedSchedule):
        if f.extend != "cosine":
            return None
        extension = f.total_steps - f.saved.total_steps
        if f.warmup_steps < extension:
            return None
        return (f"warning: optim.extend_schedule = cosine re-warms over {f.warmup_steps} steps but the extension "
                f"(train.steps {f.saved.total_steps} -> {f.total_steps}) has {extension}: the learning rate only "
                f"rises after step {f.saved.total_steps}; extend by more than {f.warmup_steps} steps or use "
                "optim.extend_schedule=constant")
    if f.warmup_steps < f.total_steps:
        return None
    return (f"warning: optim.warmup_steps = {f.warmup_steps} >= train.steps = {f.total_steps}: the learning rate only "
            f"rises and never decays; set optim.warmup_steps below {f.total_steps} (e.g. "
            f"optim.warmup_steps={max(1, f.total_steps // 10)})")


def schedule_spec(scheduler: torch.optim.lr_scheduler.LambdaLR) -> dict:
    """The schedule's shape as JSON, stored in every checkpoint: warmup, last step and final ratio of the first
    group's multiplier, nested under ``saved`` with ``extended_to`` / ``extend`` once a resume extended it."""
    return _spec(scheduler.lr_lambdas[0])


def _spec(f: WarmupCosine | ExtendedSchedule) -> dict:
    if isinstance(f, ExtendedSchedule):
        return {"saved": _spec(f.saved), "extended_to": f.total_steps, "extend": f.extend}
    return {"warmup_steps": f.warmup_steps, "total_steps": f.total_steps, "min_lr_ratio": f.min_lr_ratio}


def schedule_from_spec(spec: dict) -> WarmupCosine | ExtendedSchedule:
    """The multiplier that :func:`schedule_spec` describes."""
    if "saved" in spec:
        return ExtendedSchedule(schedule_from_spec(spec["saved"]), int(spec["extended_to"]), str(spec["extend"]))
    return WarmupCosine(int(spec["warmup_steps"]), int(spec["total_steps"]), float(spec["min_lr_ratio"]))


def resume_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, saved: dict, total_steps: int, extend: str,
                    step: int) -> str:
    """Make ``scheduler`` (built from the current config) continue the ``saved`` schedule (``schedule_spec`` of the
    checkpoint) for a run of ``total_steps`` resumed at ``step``; returns the rule as one line to print.

    Only the multiplier's shape is taken from ``saved``; the peak learning rates stay those of the current config
    (``optim.lr`` may change on resume). When ``total_steps`` asks for more steps than the saved schedule has, it runs
    to its end and then ``extend`` (``optim.extend_schedule``) decides the rest: "constant" (the default) holds its
    final lr, "cosine" warms back up to the peak over ``optim.warmup_steps`` and decays to ``min_lr_ratio`` again at
    the new last step (:class:`ExtendedSchedule`).

    DECISION: the saved schedule is continued rather than the cosine recomputed over the new length, which makes the
    lr jump at the resumed step (a finished run resumed at three quarters of its new length: 0.10 -> 0.23 x the
    peak)."""
    base = schedule_from_spec(saved)
    if total_steps <= base.total_steps:
        f = base
        rule = (f"the saved schedule to step {base.total_steps}"
                + (f", stopping at step {total_steps} before its end" if total_steps < base.total_steps else ""))
    else:
        f = ExtendedSchedule(base, total_steps, extend)
        after = ("constant at its final lr" if extend == "constant" else
                 f"a re-warm over {base.warmup_steps} steps and a new cosine to step {total_steps}")
        rule = (f"the saved schedule to step {base.total_steps}, then {after} "
                f"(optim.extend_schedule: {extend}; allowed: {', '.join(EXTEND_RULES)})")
    scheduler.lr_lambdas = [f] * len(scheduler.lr_lambdas)
    for g, base_lr in zip(scheduler.optimizer.param_groups, scheduler.base_lrs):
        g["lr"] = base_lr * f(scheduler.last_epoch)
    scheduler._last_lr = [g["lr"] for g in scheduler.optimizer.param_groups]
    return f"lr schedule from step {step}: {rule}"


def schedule_of_run_config(path: Path) -> dict | None:
    """The schedule spec of a run's ``config.yaml`` (``optim.warmup_steps``, ``train.steps``,
    ``optim.min_lr_ratio``), for a checkpoint that does not store its own; None when the file is absent."""
    if not path.exists():
        return None
    try:
        doc = read_yaml_mapping(path)
        optim, tr = doc.get("optim") or {}, doc.get("train") or {}
        return {"warmup_steps": int(optim["warmup_steps"]), "total_steps": int(tr["steps"]),
                "min_lr_ratio": float(optim["min_lr_ratio"])}
    except (KeyError, TypeError, ValueError, AttributeError):  # ConfigError is a ValueError
        return None


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
