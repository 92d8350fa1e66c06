"""``planner validate --kind throughput``: predict the tokens/s per GPU of measured training runs.

Each row of ``data/measured_throughput.csv`` states a run's model, card, layout, batch, method,
precision and recompute; planner.validate.throughput_cases reads them into the arguments of
:func:`planner.perf.timing.step_time_s`, and this module predicts tokens/s per GPU =
micro_batch · dp · grad_accum · seq_len / (step time · GPUs). The figures: median absolute
percentage error (MdAPE), shares within 10 % and 25 %, the share of measured values inside the
band the catalog's utilisation priors give, per source; and the same on the same rows for the
naive baseline "6N FLOPs per token at 40 % of the dense 16-bit peak".

``fit`` refits the time model's few parameters (:class:`planner.perf.timing.TimeParams`) by
minimising the median absolute log error (Nelder–Mead on log-parameters, pure numpy);
``--loso`` predicts each source with parameters fitted on the other sources only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from planner.core.errors import InputError
from planner.perf import timing
from planner.perf.flops import ModelFlops
from planner.perf.hardware import GpuPerf
from planner.perf.timing import PRIOR, TimeParams, step_time_s
from planner.validate.before import THROUGHPUT_COLUMN, THROUGHPUT_SCALE, figures, recorded
from planner.validate.cells import Unmodelable, read_csv
from planner.validate.throughput_cases import ThroughputCase, case_of, lenient_num

REQUIRED_COLUMNS = ("id", "source", "model", "planner_model", "method", "planner_gpu", "gpus", "tp",
                    "pp", "cp", "dp", "seq_len", "micro_batch", "grad_accum", "tokens_per_s_per_gpu")
#: The naive baseline: 6N FLOPs per token (N: active parameters) at 40 % of the dense 16-bit peak.
BASELINE_MFU = 0.40
#: Parameters the fit moves, each within bounds (the fit works on their logarithms).
#: Each is the physical range its docstring in :class:`planner.perf.timing.TimeParams` gives.
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_hfu": (0.2, 0.70),
    "elementwise_vectors": (250.0, 600.0),
    "fp8_efficiency": (0.3, 1.0),
    "microbatch_half_tokens": (150.0, 270.0),
    "moe_route_vectors": (5.0, 60.0),
    "fused_elementwise_share": (0.1, 1.0),
    "attention_efficiency": (0.4, 1.0),
    "launch_s_per_layer": (0.0005, 0.005),
}


# --------------------------------------------------------------------------------------------
# Vectorised prediction over many cases


@dataclass
class Batch:
    """Cases stacked into arrays, so one call of the time model predicts them all."""

    cases: list[ThroughputCase]
    mf: ModelFlops
    perf: GpuPerf
    x: dict[str, np.ndarray]
    tokens_per_step: np.ndarray
    gpus: np.ndarray
    measured: np.ndarray
    util_low: np.ndarray
    util_high: np.ndarray
    peak: np.ndarray

    @classmethod
    def of(cls, cases: list[ThroughputCase]) -> Batch:
        mf = ModelFlops(*(np.array([getattr(c.mf, f.name) for c in cases], dtype=float)
                          for f in fields(ModelFlops)))
        perfs = [replace(GpuPerf.of(c.gpu_spec), gpus_per_node=c.gpus_per_node) for c in cases]
        perf = GpuPerf(*(np.array([getattr(p, f.name) for p in perfs], dtype=float) for f in fields(GpuPerf)))
        x = {k: np.array([c.x[k] for c in cases]) for k in cases[0].x}
        return cls(cases, mf, perf, x, np.array([c.tokens_per_step for c in cases]),
                   np.array([c.gpus for c in cases], dtype=float), np.array([c.measured for c in cases]),
                   np.array([c.gpu_spec.utilization_low for c in cases]),
                   np.array([c.gpu_spec.utilization_high for c in cases]),
                   np.array([(c.gpu_spec.peak_tflops_16bit or 0.0) * 1e12 for c in cases]))

    def predict(self, params: TimeParams, utilization: np.ndarray | None = None) -> np.ndarray:
        """Tokens/s per GPU; ``utilization`` per case (default: the fitted ``gemm_hfu``; another
        value moves the memory-bound kernels by the same ratio, as the catalog band does)."""
        util = np.full(len(self.cases), params.gemm_hfu) if utilization is None else utilization
        perf = replace(self.perf, utilization=util, kernel_speed=util / params.gemm_hfu)
        step = step_time_s(self.mf, perf, params, **self.x)
        return self.tokens_per_step / (step * self.gpus)

    def baseline(self) -> np.ndarray:
        """6N at 40 % of the dense 16-bit peak."""
        return BASELINE_MFU * self.peak / (6.0 * self.mf.active_params)

    def take(self, mask: np.ndarray) -> Batch:
        idx = np.flatnonzero(mask)
        pick = lambda v: v[idx]
        return Batch([self.cases[i] for i in idx],
                     ModelFlops(*(pick(getattr(self.mf, f.name)) for f in fields(ModelFlops))),
                     GpuPerf(*(pick(np.asarray(getattr(self.perf, f.name))) for f in fields(GpuPerf))),
                     {k: pick(v) for k, v in self.x.items()}, pick(self.tokens_per_step), pick(self.gpus),
                     pick(self.measured), pick(self.util_low), pick(self.util_high), pick(self.peak))


# --------------------------------------------------------------------------------------------
# Fitting


def _nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, *, iters: int = 400,
                 step: float = 0.3, tol: float = 1e-6) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (the textbook simplex method; a few hundred evaluations)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(s) for s in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        reflected = centroid + (centroid - worst)
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - worst)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (worst - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (s - best) for s in simplex[1:]]
                values = [values[0]] + [f(s) for s in simplex[1:]]
    return simplex[int(np.argmin(values))]


def fit(batch: Batch, start: TimeParams = PRIOR, names: tuple[str, ...] | None = None) -> TimeParams:
    """Parameters minimising the mean absolute log error of the predictions (a median-like,
    outlier-robust loss), each kept within :data:`FIT_BOUNDS`. A parameter the rows cannot
    inform (FP8 efficiency without FP8 rows) keeps its starting value."""
    names = names or tuple(FIT_BOUNDS)
    if not bool(np.any(batch.x["fp8"])):
        names = tuple(n for n in names if n != "fp8_efficiency")
    lo = np.log([FIT_BOUNDS[n][0] for n in names])
    hi = np.log([FIT_BOUNDS[n][1] for n in names])
    log_measured = np.log(batch.measured)

    def params_of(v: np.ndarray) -> TimeParams:
        v = np.clip(v, lo, hi)
        return replace(start, **{n: float(math.exp(val)) for n, val in zip(names, v)})

    def loss(v: np.ndarray) -> float:
        pred = batch.predict(params_of(v))
        err = np.abs(np.log(pred) - log_measured)
        return float(np.mean(err)) + 1e-3 * float(np.sum(np.maximum(np.abs(v - np.clip(v, lo, hi)), 0)))

    x0 = np.clip(np.log(np.maximum([getattr(start, n) for n in names], 1e-12)), lo, hi)
    best = _nelder_mead(loss, x0)
    best = _nelder_mead(loss, best, step=0.1)  # restart: the simplex may have collapsed early
    return params_of(best)


# --------------------------------------------------------------------------------------------
# Scoring


@dataclass(frozen=True)
class ThroughputResult:
    id: str
    source: str
    model: str
    gpu: str
    method: str
    measured: float
    predicted: float | None
    low: float | None  # band: the catalog's utilisation_low
    high: float | None
    baseline: float | None
    reason: str | None = None
    before: float | None = None  # the prediction recorded when the row was added
    size_band: str = ""  # :func:`size_band` of the model's parameter count ("" unknown)

    @property
    def signed_error(self) -> float | None:
        return None if self.predicted is None else (self.predicted - self.measured) / self.measured

    @property
    def ape(self) -> float:
        return 1.0 if self.predicted is None else abs(self.predicted - self.measured) / self.measured

    @property
    def baseline_ape(self) -> float:
        return 1.0 if self.baseline is None else abs(self.baseline - self.measured) / self.measured

    @property
    def in_band(self) -> bool:
        return self.low is not None and min(self.low, self.high) <= self.measured <= max(self.low, self.high)


#: Model-size bands the time model is scored in (total parameters; upper bounds exclusive).
SIZE_BANDS: tuple[tuple[float, str], ...] = ((3e9, "< 3B"), (30e9, "3–30B"), (float("inf"), "> 30B"))


def size_band(params: float | None) -> str:
    """The band of :data:`SIZE_BANDS` a model of ``params`` parameters falls in ("" unknown)."""
    if params is None or params <= 0:
        return ""
    return next(name for bound, name in SIZE_BANDS if params < bound)


def read_rows(path: str | Path) -> list[dict[str, str]]:
    return read_csv(path, REQUIRED_COLUMNS)


def cases_of(rows: list[dict[str, str]]) -> tuple[list[ThroughputCase], list[ThroughputResult]]:
    """The modelled cases, and a result (with its reason) for every row that is not."""
    cases, unmodelled = [], []
    for row in rows:
        try:
            cases.append(case_of(row))
        except (Unmodelable, InputError, ValueError) as exc:
            reason = "; ".join(exc.problems) if isinstance(exc, InputError) else str(exc)
            unmodelled.append(ThroughputResult(row["id"], row.get("source", ""), row.get("model", ""),
                                               row.get("planner_gpu", ""), row.get("method", ""),
                                               lenient_num(row, "tokens_per_s_per_gpu", 0.0) or 0.0,
                                               None, None, None, None, reason,
                                               recorded(row, THROUGHPUT_COLUMN, THROUGHPUT_SCALE),
                                               size_band(1e9 * (lenient_num(row, "params_b") or 0.0))))
    return cases, unmodelled


def band_utilizations(batch: Batch, params: TimeParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(middle, low, high) utilisation per case: the catalog's band moved so that its middle is
    ``params.gemm_hfu`` (the band keeps the catalog's relative width)."""
    mid_catalog = np.sqrt(batch.util_low * batch.util_high)
    scale = params.gemm_hfu / mid_catalog
    return np.full(len(batch.cases), params.gemm_hfu), batch.util_low * scale, batch.util_high * scale


def results_of(batch: Batch, params: TimeParams) -> list[ThroughputResult]:
    mid, low, high = band_utilizations(batch, params)
    pred = batch.predict(params, mid)
    slow = batch.predict(params, low)
    fast = batch.predict(params, high)
    base = batch.baseline()
    return [ThroughputResult(c.id, c.source, c.model, c.gpu, c.method, c.measured, float(pred[i]),
                             float(slow[i]), float(fast[i]), float(base[i]), before=c.before,
                             size_band=size_band(c.mf.params))
            for i, c in enumerate(batch.cases)]


def summarize(results: list[ThroughputResult]) -> dict[str, Any]:
    if not results:
        return {"rows": 0}
    apes = [r.ape for r in results]
    base = [r.baseline_ape for r in results]
    signed = [r.signed_error for r in results if r.signed_error is not None]
    return {
        "rows": len(results),
        "modelled": len(signed),
        "median_ape": statistics.median(apes),
        "within_10": sum(a <= 0.10 for a in apes) / len(apes),
        "within_25": sum(a <= 0.25 for a in apes) / len(apes),
        "band_coverage": sum(r.in_band for r in results) / len(results),
        "median_signed": statistics.median(signed) if signed else None,
        "baseline_median_ape": statistics.median(base),
        "baseline_within_25": sum(a <= 0.25 for a in base) / len(base),
    }


def loso_results(batch: Batch, start: TimeParams = PRIOR) -> tuple[list[ThroughputResult], dict[str, TimeParams]]:
    """Each source predicted with the parameters fitted on all the other sources."""
    sources = sorted({c.source for c in batch.cases})
    out: dict[str, ThroughputResult] = {}
    fitted: dict[str, TimeParams] = {}
    src = np.array([c.source for c in batch.cases])
    for s in sources:
        params = fit(batch.take(src != s), start)
        fitted[s] = params
        for r in results_of(batch.take(src == s), params):
            out[r.id] = r
    return [out[c.id] for c in batch.cases], fitted


def implied_peak_share(case: ThroughputCase) -> float:
    """The share of its card's dense peak a run would have sustained, were it the configuration its
    row codes: measured tokens/s per GPU × the FLOPs the hardware must execute per token (weights,
    adapters, the recomputed forward, attention: timing.executed_flops_per_token, which the time
    model divides by the card's rate) / the peak (FP8 where the row runs FP8 on a card that has it). Pipeline bubbles, communication and memory-bound work only
    add time, so above 1 the measurement cannot be of the coded configuration: a misread row (a
    total read per GPU, a different model or card), whatever its error says about the model."""
    lin, att = timing.executed_flops_per_token(case.mf, case.x)
    perf = GpuPerf.of(case.gpu_spec)
    fp8 = bool(np.asarray(case.x.get("fp8", 0)) > 0) and bool(np.isfinite(perf.peak_fp8_flops))
    peak = perf.peak_fp8_flops if fp8 else perf.peak_flops
    return float(case.measured * (lin + att) / peak)


def report(results: list[ThroughputResult], unmodelled: list[ThroughputResult], params: TimeParams,
           *, loso: bool, fitted: dict[str, TimeParams] | None = None,
           above_peak: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    every = results + unmodelled
    sources = sorted({r.source for r in every})
    out = {
        "kind": "throughput",
        "mode": "leave-one-source-out" if loso else "in-sample",
        "params": asdict(params),
        **summarize(every),
        "by_source": {s: summarize([r for r in every if r.source == s]) for s in sources},
        "by_method": {m: summarize([r for r in every if r.method == m])
                      for m in sorted({r.method for r in every})},
        "by_size": {name: summarize([r for r in every if r.size_band == name])
                    for _, name in SIZE_BANDS if any(r.size_band == name for r in every)},
        "unmodelled": [{"id": r.id, "reason": r.reason} for r in unmodelled],
        "above_peak": above_peak or [],
        "before": before_figures(every),
        "results": [{**asdict(r), "signed_error": r.signed_error, "in_band": r.in_band} for r in every],
    }
    if fitted:
        out["params_by_held_out_source"] = {s: asdict(p) for s, p in fitted.items()}
    return out


def before_figures(results: list[ThroughputResult]) -> dict[str, Any] | None:
    """The error of the predictions recorded when the rows were added, beside the current one and
    the 6N@40 % baseline on the same rows, overall and per source (None: no row recorded one)."""
    def of(rs: list[ThroughputResult]) -> dict[str, Any] | None:
        out = figures((r.measured, r.before, r.predicted) for r in rs)
        if out is not None:
            out["baseline_median_ape"] = statistics.median(r.baseline_ape for r in rs if r.before is not None)
        return out

    overall = of(results)
    if overall is None:
        return None
    groups = {s: of([r for r in results if r.source == s]) for s in sorted({r.source for r in results})}
    groups |= {f"size {name}": of([r for r in results if r.size_band == name]) for _, name in SIZE_BANDS}
    return {**overall, "groups": {k: v for k, v in groups.items() if v is not None}}


def validate_file(path: str | Path | list[str | Path], *, loso: bool = False,
                  params: TimeParams | None = None) -> dict[str, Any]:
    """Score the time model on CSVs of measured runs (columns of data/measured_throughput.csv;
    several files are scored, and left out source by source, together)."""
    paths = path if isinstance(path, list) else [path]
    cases, unmodelled = cases_of([row for p in paths for row in read_rows(p)])
    if not cases:
        raise InputError([f"{', '.join(map(str, paths))}: no row could be modelled"])
    batch = Batch.of(cases)
    params = params or timing.FITTED
    above = [{"id": c.id, "source": c.source, "implied_peak_share": share}
             for c in cases if (share := implied_peak_share(c)) > 1.0]
    if loso:
        results, fitted = loso_results(batch, timing.PRIOR)
        return report(results, unmodelled, params, loso=True, fitted=fitted, above_peak=above)
    return report(results_of(batch, params), unmodelled, params, loso=False, above_peak=above)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def render_tables(result: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    title = f"Throughput ({result['mode']}): tokens/s per GPU, model vs 6N at 40 % of peak"
    t = Table(title=title)
    for col in ("rows", "scope", "MdAPE", "≤10 %", "≤25 %", "in band", "signed", "6N@40 % MdAPE"):
        t.add_column(col, justify="right" if col not in ("scope",) else "left")
    scopes = [("all", result)] + [(s, v) for s, v in result["by_source"].items()]
    scopes += [(f"method {m}", v) for m, v in result["by_method"].items()]
    scopes += [(f"size {b}", v) for b, v in result.get("by_size", {}).items()]
    for name, s in scopes:
        t.add_row(str(s["rows"]), name, _pct(s["median_ape"]), _pct(s["within_10"]), _pct(s["within_25"]),
                  _pct(s["band_coverage"]), _pct(s["median_signed"]), _pct(s["baseline_median_ape"]))
    out: list[Any] = [t]
    if result["unmodelled"]:
        u = Table(title="Rows not modelled")
        u.add_column("id")
        u.add_column("reason")
        for r in result["unmodelled"]:
            u.add_row(r["id"], r["reason"])
        out.append(u)
    if result.get("above_peak"):
        a = Table(title="Rows faster than their card's dense peak allows for the configuration they code "
                        "(kept in every figure; check how they were read)")
        for col in ("id", "source", "implied share of peak"):
            a.add_column(col, justify="right" if col != "source" else "left")
        for r in result["above_peak"]:
            a.add_row(r["id"], r["source"], _pct(r["implied_peak_share"]))
        out.append(a)
    if result.get("before"):
        b = Table(title="Before any fit: the prediction recorded when each row was added (an unseen error) "
                        "vs now and vs 6N@40 %, on the same rows")
        for col in ("rows", "scope", "MdAPE before", "≤10 %", "≤25 %", "signed", "MdAPE now", "6N@40 % MdAPE"):
            b.add_column(col, justify="right" if col != "scope" else "left")
        for name, s in [("all", result["before"]), *result["before"]["groups"].items()]:
            b.add_row(str(s["rows"]), name, _pct(s["before_median_ape"]), _pct(s["before_within_10"]),
                      _pct(s["before_within_25"]), _pct(s["before_median_signed"]), _pct(s["now_median_ape"]),
                      _pct(s["baseline_median_ape"]))
        out.append(b)
    p = Table(title="Time-model parameters used" + (" (LOSO refits them per held-out source)"
                                                    if result["mode"] != "in-sample" else ""))
    p.add_column("parameter")
    p.add_column("value", justify="right")
    for k, v in result["params"].items():
        p.add_row(k, f"{v:.4g}")
    out.append(p)
    return out
