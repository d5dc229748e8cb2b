"""TensorBoard scalars of a training run (``train.tensorboard: true``), written next to ``metrics.jsonl``.

Every record the trainer logs goes to ``metrics.jsonl`` and, when tracking is on, to ``<out_dir>/tensorboard/``:
``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/tokens_per_s``, ``val/loss``, ``val/ppl``, ``val/bpb`` and
``natsl/softmax_share/layer_<i>`` (the share of a NAtS-L layer's chunks routed to softmax, mean over its heads).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hybrid_attention.config.run_config import check_tensorboard

from .metrics import MetricsLog

# metrics.jsonl key -> TensorBoard tag
SCALARS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tok_per_s": "train/tokens_per_s",
           "val_loss": "val/loss", "val_ppl": "val/ppl", "val_bpb": "val/bpb"}
def routing_shares(routing: dict[str, list[float]]) -> dict[str, float]:
    """Mean softmax share per layer of a validation record's ``routing`` ({layer: [share per decision head]})."""
    return {str(layer): sum(f) / len(f) for layer, f in routing.items() if f}


class TrackedLog(MetricsLog):
    """``metrics.jsonl`` plus, with ``tensorboard``, the same scalars as TensorBoard events in ``out_dir/tensorboard``.

    ``resume_step``: a resumed run; the events logged after it by the run that stopped are dropped (TensorBoard's
    ``purge_step``), as ``metrics.jsonl`` drops its records."""

    def __init__(self, path: Path, resume_step: int | None = None, enabled: bool = True, tensorboard: bool = False):
        super().__init__(path, resume_step=resume_step, enabled=enabled)
        self.writer = None
        if enabled and tensorboard:
            check_tensorboard()
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_step + 1 if resume_step is not None else None
            self.writer = SummaryWriter(str(Path(path).parent / "tensorboard"), purge_step=purge, flush_secs=10)

    def log(self, record: dict[str, Any]) -> None:
        """Append ``record`` (with its ``step``) to metrics.jsonl and, when tracking, its scalars to TensorBoard."""
        super().log(record)
        if self.writer is None:
            return
        step = int(record["step"])
        for key, tag in SCALARS.items():
            v = record.get(key)
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.writer.add_scalar(tag, v, step)
        for layer, share in routing_shares(record.get("routing") or {}).items():
            self.writer.add_scalar(f"natsl/softmax_share/layer_{layer}", share, step)

    def close(self) -> None:
        """Flush and close the TensorBoard writer (metrics.jsonl is written line by line)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
