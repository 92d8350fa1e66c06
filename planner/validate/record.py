"""Record the planner's prediction in every measured row that has none yet.

``planner validate FILE --record-before`` writes, into each row of a memory or throughput CSV
whose before column (:data:`planner.validate.before.MEMORY_COLUMN`,
:data:`~planner.validate.before.THROUGHPUT_COLUMN`) is empty, or of a verdicts CSV whose
:data:`VERDICT_COLUMN` is (``--verdicts``), what the planner predicts for it
now, and in :data:`SOURCE_COLUMN` which planner made the prediction (the commit of the checkout,
``+modified`` when its code or catalogs differ from that commit). A recorded value is never
overwritten: run it when rows are added, before any rule is changed for them, and the column
keeps the error the model had on runs it had not seen.
"""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path
from typing import Any

from planner.validate.before import MEMORY_COLUMN, MEMORY_SCALE, THROUGHPUT_COLUMN, THROUGHPUT_SCALE, recorded

#: The column naming the planner that recorded a row's before value.
SOURCE_COLUMN = "predicted_before_by"
#: A verdicts file's before column: the three-class verdict (``fits``, ``tight``,
#: ``does_not_fit``) the planner gave the row when it was added.
VERDICT_COLUMN = "judged_before"


def planner_revision() -> str:
    """The git commit of the planner's checkout (``+modified`` when ``planner/`` or ``catalogs/``
    differ from it), else the package version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        __version__ = version("planner")
    except PackageNotFoundError:
        __version__ = "unknown"
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "planner", "catalogs"], cwd=root,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"planner {__version__}"
    return f"{head}+modified" if dirty else head


def _predict_memory(rows: list[dict[str, str]]) -> list[float | None]:
    """GB per row, as ``planner validate`` predicts it (None: a row the model cannot read)."""
    from planner.validate.score import validate_rows

    return [None if r.predicted_bytes is None else r.predicted_bytes / MEMORY_SCALE
            for r in validate_rows(rows, "detailed")]


def _predict_throughput(rows: list[dict[str, str]]) -> dict[str, float]:
    from planner.perf import timing
    from planner.validate.throughput import Batch, cases_of

    cases, _ = cases_of(rows)
    if not cases:
        return {}
    predicted = Batch.of(cases).predict(timing.FITTED)
    return {case.id: float(p) / THROUGHPUT_SCALE for case, p in zip(cases, predicted)}


def _predict_verdicts(rows: list[dict[str, str]]) -> list[str | None]:
    """Each row's three-class verdict, as ``planner validate --verdicts`` judges it (None: a row
    the model cannot read)."""
    from planner.validate.verdicts import judge_row

    return [judge_row(r).judged for r in rows]


def record_before(path: str | Path, kind: str) -> dict[str, Any]:
    """Fill the before column of ``path``'s rows that have none; returns the counts and the
    planner revision that predicted them."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    column, scale = {"throughput": (THROUGHPUT_COLUMN, THROUGHPUT_SCALE),
                     "verdicts": (VERDICT_COLUMN, 1.0)}.get(kind, (MEMORY_COLUMN, MEMORY_SCALE))
    for name in (column, SOURCE_COLUMN):
        if name not in fields:
            fields.append(name)
    if kind == "verdicts":
        todo = [r for r in rows if not (r.get(column) or "").strip()]
    else:
        todo = [r for r in rows if recorded(r, column, scale) is None]
    revision = planner_revision()
    values: dict[int, Any]
    if kind == "throughput":
        found = _predict_throughput(todo)
        values = {id(r): found.get(r["id"]) for r in todo}
    elif kind == "verdicts":
        values = {id(r): v for r, v in zip(todo, _predict_verdicts(todo))}
    else:
        values = {id(r): v for r, v in zip(todo, _predict_memory(todo))}
    written = 0
    for r in todo:
        value = values[id(r)]
        if value is None:
            continue
        r[column] = value if kind == "verdicts" else (f"{value:.3f}" if kind != "throughput" else f"{value:.1f}")
        r[SOURCE_COLUMN] = revision
        written += 1
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: r.get(k, "") for k in fields})
    return {"file": str(path), "rows": len(rows), "already_recorded": len(rows) - len(todo),
            "recorded": written, "not_modelled": len(todo) - written, "by": revision}
