"""``metrics.jsonl``: one JSON object per line, each with a ``step`` (train, validation and routing records)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsLog:
    """Append-only JSON-lines log. Opening it for a resumed run drops records logged after the resumed step."""

    def __init__(self, path: Path, resume_step: int | None = None, enabled: bool = True):
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        if resume_step is None:
            path.write_text("")
        elif path.exists():
            kept = [line for line in path.read_text().splitlines() if _step_of(line) <= resume_step]
            path.write_text("".join(line + "\n" for line in kept))

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")


def _step_of(line: str) -> float:
    try:
        return json.loads(line).get("step", math.inf)
    except json.JSONDecodeError:  # a line cut by a crash
        return math.inf


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All complete records of a metrics file."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
