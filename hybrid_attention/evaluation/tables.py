"""Plain-text tables for the terminal (right-aligned numbers, one header line, a rule)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_value(v: Any, fmt: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and fmt:
        return format(v, fmt)
    if isinstance(v, int) and not isinstance(v, bool) and fmt:
        return format(v, fmt)
    return str(v)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """``columns``: (key, header, format spec). Missing values print as '-'."""
    cells = [[header for _, header, _ in columns]]
    cells += [[format_value(r.get(key), fmt) for key, _, fmt in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for n, row in enumerate(cells):
        parts = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(parts))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
