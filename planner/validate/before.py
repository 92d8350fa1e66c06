"""The error a measured row had before any rule was changed for it.

A row added to a measured file carries the planner's prediction at the moment it was added
(``predicted_before_gb`` in a memory file, GB = 1e9 bytes; ``predicted_before_tokens_per_s`` in
a throughput file). Scored against the measurement, it is the model's error on a run it had never
seen: the honest figure, which a rule shaped after seeing the row cannot improve. ``planner
validate`` prints it beside the current error on the same rows.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

#: The columns that hold the prediction recorded when a row was added, and their unit in the
#: base unit the validator compares (bytes, tokens/s).
MEMORY_COLUMN, MEMORY_SCALE = "predicted_before_gb", 1e9
THROUGHPUT_COLUMN, THROUGHPUT_SCALE = "predicted_before_tokens_per_s", 1.0


def recorded(row: dict[str, str], column: str, scale: float) -> float | None:
    """The prediction a row recorded when it was added, in base units (None: none recorded)."""
    text = (row.get(column) or "").strip()
    try:
        value = float(text) * scale if text else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def figures(pairs: Iterable[tuple[float, float | None, float | None]]) -> dict[str, Any] | None:
    """(measured, before, now) per row -> the before and current figures over the rows that
    recorded a prediction (None when none did). A row the model cannot predict now counts as a
    miss (100 %) in the current figures."""
    rows = [(m, b, n) for m, b, n in pairs if b is not None and m > 0]
    if not rows:
        return None
    before = [(b - m) / m for m, b, _ in rows]
    now = [abs(n - m) / m if n is not None else 1.0 for m, _, n in rows]
    apes = [abs(e) for e in before]
    return {
        "rows": len(rows),
        "before_median_ape": statistics.median(apes),
        "before_within_10": sum(a <= 0.10 for a in apes) / len(apes),
        "before_within_25": sum(a <= 0.25 for a in apes) / len(apes),
        "before_median_signed": statistics.median(before),
        "now_median_ape": statistics.median(now),
    }
