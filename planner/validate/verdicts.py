"""``planner validate --verdicts``: would the planner have called each published run right?

Each row of a verdicts file (``data/verdicts.csv``) is a configuration that is known to have run
(``ran``) or to have run out of memory (``oom``) on stated GPUs. The row is read into a scenario by
the same reader as the measured rows (:func:`planner.validate.rows.scenario_of`), its GPU's
capacity is read from the ``gpu_type`` cell, and the planner's fit verdict is the one ``plan`` and
``estimate`` give: predicted device bytes plus the fit margin within capacity
(:func:`planner.memory.estimate.usable_bytes`). A row the planner cannot model is listed with its
reason and counts as a wrong verdict.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from planner import catalog
from planner.core.errors import InputError
from planner.validate.rows import Unmodelable, read_csv, scenario_of

REQUIRED_COLUMNS = ("id", "verdict", "model", "method", "seq_len", "micro_batch", "gpus", "gpu_type")
VERDICTS = ("ran", "oom")

#: Words of a ``gpu_type`` cell -> catalog GPU, tried in order (the most specific first).
GPU_WORDS: tuple[tuple[str, str], ...] = (
    (r"h200", "h200-sxm-141gb"), (r"(?<!g)b200", "b200"), (r"h100.*pcie", "h100-pcie-80gb"),
    (r"h100", "h100-sxm-80gb"), (r"h800", "h800-sxm-80gb"), (r"a100.*40", "a100-sxm-40gb"),
    (r"a100", "a100-sxm-80gb"), (r"a800", "a800-sxm-80gb"), (r"3090", "rtx-3090"),
    (r"4090", "rtx-4090"), (r"5090", "rtx-5090"), (r"6000 ada|a6000 ada", "rtx-6000-ada"),
    (r"a6000", "rtx-a6000"), (r"a10g", "a10g"), (r"v100.*32", "v100-32gb"),
    (r"v100", "v100-16gb"), (r"\bt4\b", "t4"), (r"l40s", "l40s"), (r"mi300x", "mi300x"),
)


@dataclass(frozen=True)
class VerdictResult:
    id: str
    model: str
    method: str
    verdict: str  # what happened: ran | oom
    capacity_bytes: int | None
    usable_bytes: int | None  # the capacity by the profile's fit rule
    predicted_bytes: int | None  # device view
    judged_fit: bool | None
    reason: str | None  # why the row could not be modelled

    @property
    def right(self) -> bool:
        return self.judged_fit is not None and self.judged_fit == (self.verdict == "ran")


def capacity_of(gpu_type: str) -> int:
    """Bytes of one GPU of a ``gpu_type`` cell: a capacity the cell states in GiB, else a catalog
    card its words name, else the marketed size (``24GB`` -> 24 GiB, as cards are sized)."""
    text = gpu_type.lower()
    stated = re.search(r"(\d+(?:\.\d+)?)\s*gib\b", text)
    if stated:
        return int(float(stated.group(1)) * 2**30)
    for pattern, gpu_id in GPU_WORDS:
        if re.search(pattern, text):
            return catalog.get_gpu(gpu_id).memory_bytes
    marketed = re.search(r"(\d+(?:\.\d+)?)\s*g(?:b)?\b", text)
    if marketed:
        return int(float(marketed.group(1)) * 2**30)
    raise Unmodelable(f"gpu_type {gpu_type!r}: no capacity stated and no catalog GPU named")


def catalog_model(name: str) -> str:
    """The catalog id a row's model cell names: the name, or a hub id in its parentheses."""
    cat = catalog.models()
    inner = re.findall(r"\(([^)]*)\)", name)
    bare = re.sub(r"\([^)]*\)", "", name).strip()
    for candidate in [bare, *(w for part in inner for w in re.split(r"[\s,;:']+", part) if "/" in w)]:
        entry = cat.find(candidate)
        if entry is not None:
            return entry.id
    raise Unmodelable(f"model {name!r}: not in the catalog")


def judge_row(row: dict[str, str]) -> VerdictResult:
    from planner.memory.estimate import estimate_resolved, usable_bytes
    from planner.scenario.resolve import resolve

    verdict = row["verdict"].strip().lower()
    base = {"id": row["id"], "model": row["model"], "method": row["method"], "verdict": verdict}
    try:
        if verdict not in VERDICTS:
            raise Unmodelable(f"verdict {verdict!r}: one of {', '.join(VERDICTS)}")
        capacity = capacity_of(row.get("gpu_type", ""))
        raw = scenario_of(stated_or_least({**row, "model": catalog_model(row["model"])}))
        try:
            est = estimate_resolved(resolve(raw))
        except InputError as exc:
            raise Unmodelable("; ".join(exc.problems)) from None
    except Unmodelable as exc:
        return VerdictResult(**base, capacity_bytes=None, usable_bytes=None, predicted_bytes=None,
                             judged_fit=None, reason=str(exc))
    usable = usable_bytes(capacity, est.profile, est.reserve)
    return VerdictResult(**base, capacity_bytes=capacity, usable_bytes=usable,
                         predicted_bytes=est.total_bytes, judged_fit=est.total_bytes <= usable, reason=None)


#: Cells a source may leave unstated, and the value that needs the least memory: a run that ran
#: fits under some reading of what its source left out, and one that ran out of memory is called
#: out of memory only if even that reading does not fit.
LEAST_MEMORY_WHEN_UNSTATED = {"grad_ckpt": "yes (unstated: full recomputation, the least memory)"}


def stated_or_least(row: dict[str, str]) -> dict[str, str]:
    """The row with each unstated cell of :data:`LEAST_MEMORY_WHEN_UNSTATED` filled in."""
    return {**row, **{k: v for k, v in LEAST_MEMORY_WHEN_UNSTATED.items() if not (row.get(k) or "").strip()}}


def read_rows(path: str | Path) -> list[dict[str, str]]:
    return read_csv(path, REQUIRED_COLUMNS)


def summarize(results: list[VerdictResult]) -> dict[str, Any]:
    """Share of ``ran`` rows judged fitting and of ``oom`` rows judged not fitting, over all rows
    (unmodelled ones wrong) and over the modelled ones."""
    out: dict[str, Any] = {}
    for verdict in VERDICTS:
        rows = [r for r in results if r.verdict == verdict]
        modelled = [r for r in rows if r.judged_fit is not None]
        out[verdict] = {
            "rows": len(rows), "modelled": len(modelled),
            "right": sum(r.right for r in rows),
            "share_right": sum(r.right for r in rows) / len(rows) if rows else None,
            "share_right_modelled": (sum(r.right for r in modelled) / len(modelled)
                                     if modelled else None),
        }
    return out


def validate_verdicts(path: str | Path) -> dict[str, Any]:
    from planner.memory.estimate import FIT_MARGIN

    results = [judge_row(row) for row in read_rows(path)]
    return {"fit_margin": FIT_MARGIN, **summarize(results),
            "unmodelled": [{"id": r.id, "reason": r.reason} for r in results if r.reason],
            "results": [asdict(r) | {"right": r.right} for r in results]}


def render_tables(result: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    rows = Table(title=f"fit verdicts (predicted device bytes · (1 + {result['fit_margin']:.0%}) ≤ capacity; GB = 1e9)",
                 header_style="bold")
    for col in ("id", "model", "method", "happened", "capacity", "usable", "predicted", "judged", "right"):
        rows.add_column(col, justify="right" if col in ("capacity", "usable", "predicted") else "left")
    for r in result["results"]:
        def gb(v: int | None) -> str:
            return "—" if v is None else f"{v / 1e9:.1f}"
        judged = "—" if r["judged_fit"] is None else ("fits" if r["judged_fit"] else "OOM")
        rows.add_row(r["id"], r["model"][:32], r["method"], r["verdict"], gb(r["capacity_bytes"]),
                     gb(r["usable_bytes"]), gb(r["predicted_bytes"]), judged,
                     "yes" if r["right"] else (r["reason"] or "no"))
    summary = Table(title="summary (unmodelled rows count as wrong)", header_style="bold")
    for col in ("what happened", "rows", "modelled", "judged right", "share", "share of modelled"):
        summary.add_column(col, justify="left" if col == "what happened" else "right")
    for verdict, label in (("ran", "ran (judged to fit)"), ("oom", "oom (judged not to fit)")):
        s = result[verdict]
        if s["rows"]:
            summary.add_row(label, str(s["rows"]), str(s["modelled"]), str(s["right"]),
                            f"{s['share_right'] * 100:.0f} %",
                            "—" if s["share_right_modelled"] is None else f"{s['share_right_modelled'] * 100:.0f} %")
    return [rows, summary]
