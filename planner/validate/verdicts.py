"""``planner validate --verdicts``: would the planner have called each published run right?

Each row of a verdicts file (``data/verdicts.csv``) is a configuration that is known to have run
(``ran``) or to have run out of memory (``oom``) on stated GPUs. The row is read into a scenario by
the same reader as the measured rows (:func:`planner.validate.rows.scenario_of`), its GPU's
capacity from its ``planner_gpu`` or ``capacity_gib`` column, and the planner's fit verdict is the one ``plan`` and
``estimate`` give: predicted bytes needed plus the fit margin within capacity
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
from planner.validate.cells import Unmodelable, read_csv
from planner.validate.rows import scenario_of

REQUIRED_COLUMNS = ("id", "verdict", "model", "method", "seq_len", "micro_batch", "gpus", "gpu_type")
VERDICTS = ("ran", "oom")
#: The three-class verdict each outcome contradicts: a run that ran called out of memory, an OOM
#: report called fitting.
CONTRADICTS = {"ran": "does_not_fit", "oom": "fits"}

@dataclass(frozen=True)
class VerdictResult:
    id: str
    source: str  # the project (memory_loso.source_of)
    model: str
    method: str
    verdict: str  # what happened: ran | oom
    capacity_bytes: int | None
    usable_bytes: int | None  # the capacity by the profile's fit rule
    predicted_bytes: int | None  # device view
    judged_fit: bool | None
    reason: str | None  # why the row could not be modelled
    #: within the method's error band of the usable bytes, either side (the estimate's ``tight``)
    tight: bool | None = None
    #: the share of the card a colocated GRPO engine holds beside the step (0 while it sleeps)
    step_share: float = 0.0
    #: the three-class verdict recorded when the row was added (``judged_before``), if any
    judged_before: str | None = None

    @property
    def judged(self) -> str | None:
        """The estimate's three-class verdict: ``fits``, ``tight`` or ``does_not_fit``."""
        if self.judged_fit is None:
            return None
        return "tight" if self.tight else ("fits" if self.judged_fit else "does_not_fit")

    @property
    def right(self) -> bool:
        return self.judged_fit is not None and self.judged_fit == (self.verdict == "ran")

    @property
    def within_card(self) -> bool:
        """Predicted at most the card's capacity (the fit rule without its margin)."""
        return self.predicted_bytes is not None and self.predicted_bytes <= (self.capacity_bytes or 0)


def capacity_of(row: dict[str, str]) -> int:
    """Bytes of one GPU of a row: its ``planner_gpu`` (a catalog card, nvidia-smi's capacity), else
    its ``capacity_gib`` (the size the source states, or the marketed one: cards are sized in GiB,
    a "24GB" card has 24,576 MiB)."""
    gpu = (row.get("planner_gpu") or "").strip()
    if gpu:
        try:
            return catalog.get_gpu(gpu).memory_bytes
        except catalog.UnknownName as exc:
            raise Unmodelable(f"planner_gpu: {exc}") from None
    stated = (row.get("capacity_gib") or "").strip()
    if stated:
        return int(float(stated) * 2**30)
    raise Unmodelable(f"gpu_type {row.get('gpu_type', '')!r}: neither planner_gpu nor capacity_gib given")


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


def _model_cell(row: dict[str, str]) -> str:
    """The catalog id of the row's model, or, where the row gives the dimensions itself
    (``layers``, ``hidden`` …; a model no hub hosts), its own cell."""
    try:
        return catalog_model(row["model"])
    except Unmodelable:
        if (row.get("layers") or "").strip() and (row.get("hidden") or "").strip():
            return row["model"]
        raise


def judge_row(row: dict[str, str]) -> VerdictResult:
    from planner.memory.estimate import fit_of, memory_of
    from planner.scenario.resolve import resolve
    from planner.validate.memory_loso import source_of

    verdict = row["verdict"].strip().lower()
    base = {"id": row["id"], "source": source_of(row), "model": row["model"], "method": row["method"],
            "verdict": verdict, "judged_before": (row.get("judged_before") or "").strip() or None}
    try:
        if verdict not in VERDICTS:
            raise Unmodelable(f"verdict {verdict!r}: one of {', '.join(VERDICTS)}")
        capacity = capacity_of(row)
        raw = scenario_of(stated_or_least({**row, "model": _model_cell(row)}))
        try:
            rs = resolve(raw)
            mem = memory_of(rs)
        except InputError as exc:
            raise Unmodelable("; ".join(exc.problems)) from None
    except Unmodelable as exc:
        return VerdictResult(**base, capacity_bytes=None, usable_bytes=None, predicted_bytes=None,
                             judged_fit=None, reason=str(exc))
    # the estimate's own fit rule on the row's card: a colocated engine's share and phases too
    fit = fit_of(mem, capacity, profile=rs.profile, reserve=rs.overrides.reserve, wl=rs.workload,
                 lay=rs.layout, model=rs.model)
    within = mem.total_bytes <= fit.usable_bytes and (
        fit.generation_bytes is None or fit.generation_bytes <= (fit.generation_usable_bytes or 0))
    return VerdictResult(**base, capacity_bytes=capacity, usable_bytes=fit.usable_bytes,
                         predicted_bytes=mem.total_bytes, judged_fit=within and (fit.fits or bool(fit.tight)),
                         reason=None, tight=fit.tight, step_share=fit.step_share)


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
            # judged to fit but marked tight: the warning a user of ``estimate`` or ``plan`` sees
            "tight": sum(bool(r.judged_fit and r.tight) for r in rows),
            # the three-class verdict: tight on either side of the line, and the share of runs
            # the verdict does not contradict (a run that ran not called does_not_fit; an OOM
            # report not called fits)
            "judged_tight": sum(r.judged == "tight" for r in rows),
            "not_contradicted": sum(r.judged is not None and r.judged != CONTRADICTS[verdict] for r in rows),
            "share_right": sum(r.right for r in rows) / len(rows) if rows else None,
            "share_right_modelled": (sum(r.right for r in modelled) / len(modelled)
                                     if modelled else None),
        }
    return out


#: The shares of the card kept free (``--reserve``) the trade-off table tries besides the
#: profile's own fit rule: from none to the seed profile's 10 % and beyond.
TRADE_OFF_RESERVES = (0.0, 0.05, 0.08, 0.10, 0.15, 0.20, 0.25, 0.30)


def reserve_trade_off(results: list[VerdictResult]) -> list[dict[str, Any]]:
    """What a user who keeps more or less of the card free (``--reserve``) would have been told:
    per reserve, the share of ``ran`` rows judged to fit and of ``oom`` rows judged not to fit
    (unmodelled rows wrong, as in :func:`summarize`). The first entry is the profile's own rule
    (``reserve`` None); every verdict is the estimate's, only the capacity it is held to moves."""
    out = []
    for reserve in (None, *TRADE_OFF_RESERVES):
        entry: dict[str, Any] = {"reserve": reserve}
        for verdict in VERDICTS:
            rows = [r for r in results if r.verdict == verdict]
            right = sum(1 for r in rows if r.judged_fit is not None and r.capacity_bytes is not None
                        and _fits_at(r, reserve) == (verdict == "ran"))
            entry[verdict] = {"right": right, "share_right": right / len(rows) if rows else None}
        out.append(entry)
    return out


def _fits_at(r: VerdictResult, reserve: float | None) -> bool:
    """The row judged at ``reserve``: the verdict itself for the profile's rule (None); else the
    predicted step within the card less a colocated engine's share, then the reserve."""
    from planner.memory.estimate import usable_bytes

    if reserve is None:
        return bool(r.judged_fit)
    return (r.predicted_bytes or 0) <= usable_bytes(r.capacity_bytes or 0, "detailed", reserve, r.step_share)


def before_and_now(results: list[VerdictResult]) -> dict[str, Any]:
    """On the rows with a recorded verdict (``judged_before``): per outcome, the rows whose
    verdict was not contradicted (a run that ran not called ``does_not_fit``, an OOM report not
    called ``fits``) when the row was added and now, and the share called ``tight`` then."""
    out: dict[str, Any] = {}
    for verdict in VERDICTS:
        rows = [r for r in results if r.verdict == verdict and r.judged_before]
        wrong = CONTRADICTS[verdict]
        out[verdict] = {"rows": len(rows),
                        "before": sum(r.judged_before != wrong for r in rows),
                        "now": sum(r.judged is not None and r.judged != wrong for r in rows),
                        "tight_before": sum(r.judged_before == "tight" for r in rows)}
    return out


def validate_verdicts(path: str | Path) -> dict[str, Any]:
    from planner.memory.estimate import FIT_MARGIN

    results = [judge_row(row) for row in read_rows(path)]
    ran_missed = [r for r in results if r.verdict == "ran" and r.judged_fit is False]
    return {"fit_margin": FIT_MARGIN, **summarize(results),
            # runs that ran, judged out of memory by the margin alone: predicted within the card
            "ran_judged_oom_within_card": sum(r.within_card for r in ran_missed),
            "reserve_trade_off": reserve_trade_off(results),
            "before": before_and_now(results),
            "by_source": {s: summarize([r for r in results if r.source == s])
                          for s in sorted({r.source for r in results})},
            "unmodelled": [{"id": r.id, "reason": r.reason} for r in results if r.reason],
            "results": [asdict(r) | {"right": r.right} for r in results]}


def render_tables(result: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    rows = Table(title=f"fit verdicts (predicted bytes needed · (1 + {result['fit_margin']:.0%}) ≤ capacity; GB = 1e9)",
                 header_style="bold")
    for col in ("id", "model", "method", "happened", "capacity", "usable", "predicted", "judged", "right"):
        rows.add_column(col, justify="right" if col in ("capacity", "usable", "predicted") else "left")
    for r in result["results"]:
        def gb(v: int | None) -> str:
            return "—" if v is None else f"{v / 1e9:.1f}"
        judged = "—" if r["judged_fit"] is None else (
            ("fits, tight" if r["tight"] else "fits") if r["judged_fit"] else ("OOM, tight" if r["tight"] else "OOM"))
        rows.add_row(r["id"], r["model"][:32], r["method"], r["verdict"], gb(r["capacity_bytes"]),
                     gb(r["usable_bytes"]), gb(r["predicted_bytes"]), judged,
                     "yes" if r["right"] else (r["reason"] or "no"))
    summary = Table(title="summary (unmodelled rows count as wrong)", header_style="bold")
    for col in ("what happened", "rows", "modelled", "judged right", "share", "share of modelled",
                "judged to fit, tight", "tight (either side)", "not contradicted"):
        summary.add_column(col, justify="left" if col == "what happened" else "right")
    for verdict, label in (("ran", "ran (judged to fit)"), ("oom", "oom (judged not to fit)")):
        s = result[verdict]
        if s["rows"]:
            summary.add_row(label, str(s["rows"]), str(s["modelled"]), str(s["right"]),
                            f"{s['share_right'] * 100:.0f} %",
                            "—" if s["share_right_modelled"] is None else f"{s['share_right_modelled'] * 100:.0f} %",
                            str(s["tight"]), str(s["judged_tight"]),
                            f"{s['not_contradicted']} ({s['not_contradicted'] / s['rows'] * 100:.0f} %)")
    by_source = Table(title=f"by source ({result['ran_judged_oom_within_card']} runs that ran were judged "
                            "out of memory by the margin alone: predicted within their card)",
                      header_style="bold")
    for col in ("source", "ran: judged to fit", "oom: judged not to fit"):
        by_source.add_column(col, justify="left" if col == "source" else "right")
    for source, s in result["by_source"].items():
        by_source.add_row(source, *(f"{s[v]['right']} / {s[v]['rows']}" if s[v]["rows"] else "—"
                                    for v in VERDICTS))
    trade = Table(title="what keeping another share of the card free (--reserve) would have judged",
                  header_style="bold")
    for col in ("reserve", "ran: judged to fit", "oom: judged not to fit"):
        trade.add_column(col, justify="left" if col == "reserve" else "right")
    for t in result["reserve_trade_off"]:
        label = (f"{t['reserve']:.0%}" if t["reserve"] is not None
                 else f"fit rule ({result['fit_margin']:.0%} margin)")
        trade.add_row(label, *("—" if t[v]["share_right"] is None
                               else f"{t[v]['right']} ({t[v]['share_right'] * 100:.0f} %)" for v in VERDICTS))
    tables = [rows, summary, trade, by_source]
    before = result.get("before") or {}
    if any(before[v]["rows"] for v in VERDICTS):
        first = Table(title="before any fit: the verdict recorded when each row was added (an unseen "
                            "verdict) vs now, not contradicted", header_style="bold")
        for col in ("what happened", "rows", "before", "now", "tight before"):
            first.add_column(col, justify="left" if col == "what happened" else "right")
        for verdict, label in (("ran", "ran (not does_not_fit)"), ("oom", "oom (not fits)")):
            b = before[verdict]
            if b["rows"]:
                first.add_row(label, str(b["rows"]), f"{b['before']} ({b['before'] / b['rows'] * 100:.0f} %)",
                              f"{b['now']} ({b['now'] / b['rows'] * 100:.0f} %)", str(b["tight_before"]))
        tables.append(first)
    return tables
