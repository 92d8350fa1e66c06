"""``planner validate FILE... --loso``: memory accuracy on sources the profile never saw.

The detailed profile's formulas carry no per-row figures, but some of its constants were chosen by
looking at measured rows (:data:`FITTED`). Leave one source out: for each source, each such
constant is refitted on the rows of every other source (the grid value with the least mean
absolute error, the one nearest its prior on a tie: rows that do not depend on it leave it at
the prior), and the held-out source's rows are predicted with it. A source is the first word of
the ``source`` column (``litgpt``, ``torchtune``, ``Answer.AI``…): one project's tables, however
many, are one source.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from planner.memory import detailed
from planner.validate.score import RowResult, read_rows, summarize, validate_rows

#: Constants of the detailed profile chosen from measured rows: name -> (prior, grid). The prior
#: is what the profile would use with no measurement (the unsharded fragmentation).
FITTED: dict[str, tuple[float, tuple[float, ...]]] = {
    "ALLOCATOR_FRAGMENTATION_SHARDED": (detailed.ALLOCATOR_FRAGMENTATION,
                                        (0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)),
}


def source_of(row: dict[str, str]) -> str:
    """The project a row comes from: the first word of its ``source`` (``lit-gpt`` = ``litgpt``)."""
    found = re.match(r"[A-Za-z0-9.\-]+", row.get("source", "").strip())
    return (found.group(0) if found else "unknown").lower().replace("-", "")


@contextmanager
def constants(values: dict[str, float]) -> Iterator[None]:
    """The detailed profile with ``values`` for its fitted constants, restored afterwards."""
    saved = {name: getattr(detailed, name) for name in values}
    try:
        for name, value in values.items():
            setattr(detailed, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(detailed, name, value)


def _mean_ape(results: list[RowResult]) -> float:
    return statistics.fmean(r.ape for r in results) if results else 0.0


def loso(rows: list[dict[str, str]]) -> tuple[list[RowResult], dict[str, dict[str, float]]]:
    """Every row predicted with the constants refitted without its source; the values used."""
    (name, (prior, grid)), = FITTED.items()  # one fitted constant today
    by_value: dict[float, list[RowResult]] = {}
    for value in grid:
        with constants({name: value}):
            by_value[value] = validate_rows(rows, "detailed")
    sources = [source_of(r) for r in rows]
    out: list[RowResult | None] = [None] * len(rows)
    chosen: dict[str, dict[str, float]] = {}
    for held in sorted(set(sources)):
        train = [i for i, s in enumerate(sources) if s != held]
        best = min(grid, key=lambda v: (round(_mean_ape([by_value[v][i] for i in train]), 6), abs(v - prior)))
        chosen[held] = {name: best}
        for i, s in enumerate(sources):
            if s == held:
                out[i] = by_value[best][i]
    return [r for r in out if r is not None], chosen


def validate_loso(paths: list[str | Path]) -> dict[str, Any]:
    rows = [row for path in paths for row in read_rows(path)]
    results, chosen = loso(rows)
    sources = [source_of(r) for r in rows]
    per_source = {s: summarize([r for r, t in zip(results, sources) if t == s]) for s in sorted(set(sources))}
    shipped = {name: getattr(detailed, name) for name in FITTED}
    return {"profile": "detailed", "loso": True, **summarize(results), "shipped": shipped,
            "refitted": chosen, "by_source": per_source,
            "by_method": {m: summarize([r for r in results if r.method == m])
                          for m in sorted({r.method for r in results})},
            "unmodelled": [{"id": r.id, "reason": r.reason} for r in results if r.reason]}


def render_tables(result: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    table = Table(title="detailed profile, leave one source out (unmodelled rows count as misses)",
                  header_style="bold")
    for col in ("scope", "rows", "MdAPE", "within 10 %", "within 25 %", "median signed", "refitted"):
        table.add_column(col, justify="left" if col in ("scope", "refitted") else "right")

    def line(name: str, s: dict[str, Any], note: str = "") -> None:
        if s["rows"]:
            signed = "—" if s["median_signed"] is None else f"{s['median_signed'] * 100:+.1f} %"
            table.add_row(name, str(s["rows"]), f"{s['median_ape'] * 100:.1f} %",
                          f"{s['within_10'] * 100:.0f} %", f"{s['within_25'] * 100:.0f} %", signed, note)

    line("all", result)
    for source, s in result["by_source"].items():
        note = ", ".join(f"{v:g}" for v in result["refitted"][source].values())
        line(source, s, note)
    for method, s in result["by_method"].items():
        line(f"method {method}", s)
    return [table]
