"""``planner validate``: predict every measured run of a CSV and score the predictions.

Each row is compared with the prediction of the kind it measured: ``max_allocated`` with the
allocated view, ``max_reserved`` and ``reported`` (method unstated) with the reserved view,
``nvidia_smi`` with the device view; a row measured on the last pipeline rank (``measured_rank``
``last``) with that stage's own view (the seed profile, which has no stages, gives its one peak).
A row the profile cannot model is listed with its reason and counts as a miss (an absolute error
of 100 %) in every figure.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from planner.core.errors import InputError
from planner.validate.before import MEMORY_COLUMN, MEMORY_SCALE, figures, recorded
from planner.validate.cells import Unmodelable, read_csv
from planner.validate.rows import measured_bytes, scenario_of

#: The view of the prediction each measure kind is compared with.
KIND_VIEW = {"max_allocated": "allocated_bytes", "max_reserved": "reserved_bytes",
             "reported": "reserved_bytes", "nvidia_smi": "device_bytes"}
#: The views of the last pipeline stage, for rows measured on that rank (``measured_rank: last``:
#: Megatron's TensorBoard and W&B memory scalars, which only the last rank writes).
LAST_STAGE_VIEW = {"allocated_bytes": "last_stage_allocated_bytes", "reserved_bytes": "last_stage_reserved_bytes",
                   "device_bytes": "last_stage_device_bytes"}
#: An unmodelable row counts as this absolute error (a miss in every band).
MISS_APE = 1.0
REQUIRED_COLUMNS = ("id", "model", "method", "seq_len", "micro_batch", "measured_gb", "measure_kind")


@dataclass(frozen=True)
class RowResult:
    id: str
    model: str
    method: str
    kind: str
    measured_bytes: float
    predicted_bytes: float | None
    signed_error: float | None  # (predicted − measured) / measured
    phase: str | None
    reason: str | None  # why the row could not be modelled
    before_bytes: float | None = None  # the prediction recorded when the row was added

    @property
    def ape(self) -> float:
        return MISS_APE if self.signed_error is None else abs(self.signed_error)


def read_rows(path: str | Path) -> list[dict[str, str]]:
    return read_csv(path, REQUIRED_COLUMNS)


def predict_row(row: dict[str, str], profile: str) -> tuple[dict[str, int], str | None]:
    """The three views predicted for a row under ``profile`` (the seed profile has one)."""
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve

    raw = scenario_of(row)
    raw["profile"] = profile
    if profile == "seed":
        model = raw["model"]
        raw["model"] = model
        raw["workload"] = {k: v for k, v in raw["workload"].items()
                           if k in ("method", "seq_len", "micro_batch", "precision", "optimizer",
                                    "grad_accum", "lora_rank", "lora_targets", "quant_bits",
                                    "double_quant")}
        raw["workload"]["lora_targets"] = [t for t in raw["workload"].get("lora_targets", ["all"])
                                           if t != "lm_head"] or ["all"]
        raw["layout"] = {k: v for k, v in raw["layout"].items()
                         if k in ("gpus", "tp", "pp", "cp", "sp", "zero", "offload",
                                  "checkpointing", "attention")}
        raw.pop("recipe", None)
    try:
        est = estimate_resolved(resolve(raw))
    except InputError as exc:
        raise Unmodelable("; ".join(exc.problems)) from None
    if est.predicted is None:
        views = {v: est.total_bytes for v in ("allocated_bytes", "reserved_bytes", "device_bytes")}
        return views, None
    phase = next((a[len("peak phase: "):] for a in est.assumptions if a.startswith("peak phase: ")), None)
    return dict(est.predicted), phase


def validate_rows(rows: list[dict[str, str]], profile: str) -> list[RowResult]:
    out = []
    for row in rows:
        kind = row["measure_kind"].strip()
        measured = measured_bytes(row)
        before = recorded(row, MEMORY_COLUMN, MEMORY_SCALE) if profile == "detailed" else None
        try:
            if kind not in KIND_VIEW:
                raise Unmodelable(f"measure_kind {kind!r} unknown")
            views, phase = predict_row(row, profile)
        except Unmodelable as exc:
            out.append(RowResult(row["id"], row["model"], row["method"], kind, measured,
                                 None, None, None, str(exc), before))
            continue
        view = KIND_VIEW[kind]
        rank = (row.get("measured_rank") or "").strip() or "peak"
        if rank not in ("peak", "last"):
            out.append(RowResult(row["id"], row["model"], row["method"], kind, measured, None, None, None,
                                 f"measured_rank {rank!r} unknown (peak, last)", before))
            continue
        if rank == "last" and LAST_STAGE_VIEW[view] in views:  # without a pipeline: the one stage
            view = LAST_STAGE_VIEW[view]
        pred = float(views[view])
        out.append(RowResult(row["id"], row["model"], row["method"], kind, measured, pred,
                             (pred - measured) / measured, phase, None, before))
    return out


def before_figures(results: list[RowResult]) -> dict[str, Any] | None:
    """The error of the predictions recorded when the rows were added, beside the current one on
    the same rows, overall and by method and kind (None: no row recorded one)."""
    def of(rs: list[RowResult]) -> dict[str, Any] | None:
        return figures((r.measured_bytes, r.before_bytes, r.predicted_bytes) for r in rs)

    overall = of(results)
    if overall is None:
        return None
    groups = {f"method {m}": of([r for r in results if r.method == m]) for m in sorted({r.method for r in results})}
    groups.update({f"measured as {k}": of([r for r in results if r.kind == k])
                   for k in sorted({r.kind for r in results})})
    return {**overall, "groups": {k: v for k, v in groups.items() if v is not None}}


def summarize(results: list[RowResult]) -> dict[str, Any]:
    """rows, median and mean absolute % error, shares within 10 % and 25 %, median signed error
    (over modelled rows), as fractions."""
    if not results:
        return {"rows": 0, "modelled": 0, "median_ape": None, "mean_ape": None,
                "within_10": None, "within_25": None, "median_signed": None}
    apes = [r.ape for r in results]
    signed = [r.signed_error for r in results if r.signed_error is not None]
    return {
        "rows": len(results),
        "modelled": len(signed),
        "median_ape": statistics.median(apes),
        "mean_ape": statistics.fmean(apes),
        "within_10": sum(a <= 0.10 for a in apes) / len(apes),
        "within_25": sum(a <= 0.25 for a in apes) / len(apes),
        "median_signed": statistics.median(signed) if signed else None,
    }


def report(results: list[RowResult], profile: str) -> dict[str, Any]:
    """The ``--json`` object: overall figures, ``by_method``, ``by_kind``, rows, unmodelled."""
    methods = sorted({r.method for r in results})
    kinds = sorted({r.kind for r in results})
    return {
        "profile": profile,
        **summarize(results),
        "by_method": {m: summarize([r for r in results if r.method == m]) for m in methods},
        "by_kind": {k: summarize([r for r in results if r.kind == k]) for k in kinds},
        "unmodelled": [{"id": r.id, "reason": r.reason} for r in results if r.reason],
        "before": before_figures(results),
        "results": [asdict(r) for r in results],
    }


def validate_file(path: str | Path, profile: str = "detailed") -> dict[str, Any]:
    return report(validate_rows(read_rows(path), profile), profile)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:+.1f} %"


def render_tables(result: dict[str, Any]) -> list[Any]:
    """Rich tables: one row per measured run, then the summary overall, by method and by kind."""
    from rich.table import Table

    rows = Table(title=f"profile {result['profile']}: predicted vs measured (GB = 1e9 bytes)",
                 header_style="bold")
    for col in ("id", "model", "method", "measured as", "measured", "predicted", "error", "peak / why not"):
        rows.add_column(col, justify="right" if col in ("measured", "predicted", "error") else "left")
    for r in result["results"]:
        pred = r["predicted_bytes"]
        rows.add_row(r["id"], r["model"], r["method"], r["kind"], f"{r['measured_bytes'] / 1e9:.2f}",
                     "—" if pred is None else f"{pred / 1e9:.2f}",
                     "miss" if r["signed_error"] is None else _pct(r["signed_error"]),
                     r["phase"] or r["reason"] or "")
    summary = Table(title="summary (unmodelled rows count as misses)", header_style="bold")
    for col in ("group", "rows", "MdAPE", "mean APE", "within 10 %", "within 25 %", "median signed"):
        summary.add_column(col, justify="left" if col == "group" else "right")

    def line(name: str, s: dict[str, Any]) -> None:
        if not s["rows"]:
            return
        summary.add_row(name, str(s["rows"]), f"{s['median_ape'] * 100:.1f} %",
                        f"{s['mean_ape'] * 100:.1f} %", f"{s['within_10'] * 100:.0f} %",
                        f"{s['within_25'] * 100:.0f} %", _pct(s["median_signed"]))

    line("all", result)
    for name, s in result["by_method"].items():
        line(f"method {name}", s)
    for name, s in result["by_kind"].items():
        line(f"measured as {name}", s)
    tables = [rows, summary]
    if result.get("before"):
        tables.append(render_before(result["before"]))
    return tables


def render_before(before: dict[str, Any]) -> Any:
    """The table of the errors recorded before any fit, beside the current ones."""
    from rich.table import Table

    t = Table(title="before any fit: the prediction recorded when each row was added (an unseen error) "
                    "vs now, on the same rows", header_style="bold")
    for col in ("group", "rows", "MdAPE before", "within 10 %", "within 25 %", "median signed", "MdAPE now"):
        t.add_column(col, justify="left" if col == "group" else "right")
    for name, s in [("all", before), *before["groups"].items()]:
        t.add_row(name, str(s["rows"]), f"{s['before_median_ape'] * 100:.1f} %",
                  f"{s['before_within_10'] * 100:.0f} %", f"{s['before_within_25'] * 100:.0f} %",
                  _pct(s["before_median_signed"]), f"{s['now_median_ape'] * 100:.1f} %")
    return t


#: The error band an estimate carries: this quantile of |error| over a method's rows.
BAND_QUANTILE = 0.9


def error_bands(results: list[RowResult]) -> dict[str, float]:
    """Per method, the 90th percentile of the absolute error (unmodelled rows count as 100 %):
    what :data:`planner.memory.detailed.ERROR_BANDS` records for ``data/measured_calibration.csv``."""
    out = {}
    for method in sorted({r.method for r in results}):
        apes = sorted(r.ape for r in results if r.method == method)
        k = BAND_QUANTILE * (len(apes) - 1)
        lo = int(k)
        hi = min(lo + 1, len(apes) - 1)
        out[method] = apes[lo] + (apes[hi] - apes[lo]) * (k - lo)
    return out
