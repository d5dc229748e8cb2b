"""Tracked scalars of a training run: TensorBoard (``train.tensorboard: true``) and Weights & Biases (``train.wandb``),
next to ``metrics.jsonl``.

Every record the trainer logs goes to ``metrics.jsonl`` and, when tracking is on, to ``<out_dir>/tensorboard/`` and
the W&B run (training/wandb_tracker.py): ``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/tokens_per_s``,
``val/loss``, ``val/ppl``, ``val/bpb`` and ``natsl/softmax_share/layer_<i>`` (the share of a NAtS-L layer's chunks
routed to softmax, mean over its heads).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hybrid_attention.config.run_config import check_tensorboard

from .metrics import MetricsLog
from .wandb_tracker import WandbTracker

# metrics.jsonl key -> TensorBoard / W&B tag
SCALARS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tok_per_s": "train/tokens_per_s",
           "val_loss": "val/loss", "val_ppl": "val/ppl", "val_bpb": "val/bpb"}


def routing_shares(routing: dict[str, list[float]]) -> dict[str, float]:
    """Mean softmax share per layer of a validation record's ``routing`` ({layer: [share per decision head]})."""
    return {str(layer): sum(f) / len(f) for layer, f in routing.items() if f}


def tracked_scalars(record: dict[str, Any]) -> dict[str, float]:
    """{tag: value} of one metrics record: the finite numbers of :data:`SCALARS` and the NAtS-L softmax share per
    layer (``natsl/softmax_share/layer_<i>``)."""
    out = {}
    for key, tag in SCALARS.items():
        v = record.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[tag] = v
    for layer, share in routing_shares(record.get("routing") or {}).items():
        out[f"natsl/softmax_share/layer_{layer}"] = share
    return out


class TrackedLog(MetricsLog):
    """``metrics.jsonl`` plus, with ``tensorboard``, the same scalars as TensorBoard events in ``out_dir/tensorboard``
    and, with ``wandb`` (a started :class:`WandbTracker`, which the log then finishes), in that W&B run.

    ``resume_step``: a resumed run; the events logged after it by the run that stopped are dropped (TensorBoard's
    ``purge_step``), as ``metrics.jsonl`` drops its records; the W&B run continues under the same id."""

    def __init__(self, path: Path, resume_step: int | None = None, enabled: bool = True, tensorboard: bool = False,
                 wandb: WandbTracker | None = None):
        super().__init__(path, resume_step=resume_step, enabled=enabled)
        self.writer, self.wandb = None, wandb
        if enabled and tensorboard:
            check_tensorboard()
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_step + 1 if resume_step is not None else None
            self.writer = SummaryWriter(str(Path(path).parent / "tensorboard"), purge_step=purge, flush_secs=10)

    def log(self, record: dict[str, Any]) -> None:
        """Append ``record`` (with its ``step``) to metrics.jsonl and, when tracking, its scalars to TensorBoard and
        W&B."""
        super().log(record)
        if self.writer is None and self.wandb is None:
            return
        step, scalars = int(record["step"]), tracked_scalars(record)
        if self.writer is not None:
            for tag, v in scalars.items():
                self.writer.add_scalar(tag, v, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step)

    def close(self, failed: bool = False) -> None:
        """Flush and close the TensorBoard writer and finish the W&B run (``failed``: marked as crashed);
        metrics.jsonl is written line by line. Idempotent."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.wandb is not None:
            self.wandb.close(failed=failed)
            self.wandb = None
