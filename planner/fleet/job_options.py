"""Candidate plans of a job for procurement: for each GPU type and GPU count, the fastest plan.

Procurement trades GPUs against time (fewer GPUs for longer, or more for shorter), so a job's
top-10 list is not enough: it needs, for every GPU type, the best plan at each GPU count. With the
count fixed, the fastest plan is also the cheapest to rent and uses the fewest GPU-hours.

Counts come from :func:`gpu_counts` (every count to 8, then steps of about 1.5×). For each
(type, count) the classes whose tp·pp·cp divides the count and that fit in memory at that
data-parallel degree (planner.search.lattice.fitting_start: memory never rises with dp from two ranks up) are ranked by an
admissible lower bound of the job's time (compute alone at the catalog's utilisation; the same
bound the search uses), then evaluated in that order, a batch per round, until no unevaluated
class can beat the best found. The metrics are the search's own (planner.search.space.evaluate), so a
candidate here is exactly the column ``planner plan`` would report.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.core.errors import InputError
from planner.fleet.portfolio import JobRun
from planner.scenario.files import deep_merge
from planner.scenario.resolve import resolve
from planner.search.candidates import SearchOutcome
from planner.search.columns import Evaluated, feasible, lower_bounds, take_rows
from planner.search.cpsat import time_ms
from planner.search.evaluate import evaluate, gpu_table
from planner.search.lattice import build_lattice, fitting_start
from planner.search.request import SearchRequest, build_request
from planner.search.space import build_classes

#: Classes evaluated per (type, count) and round of the best-first loop.
ROUND_SIZE = 32


def coarse_counts(limit: int) -> list[int]:
    """The powers of two up to ``limit``: every job's first candidates when time is short."""
    return [c for c in gpu_counts(limit) if c & (c - 1) == 0]


def gpu_counts(limit: int) -> list[int]:
    """1–8, then 12, 16, 24, 32, 48, 64, 96, … (2^k and 3·2^(k−1)) up to ``limit``."""
    counts = list(range(1, 9))
    k = 8
    while True:
        for c in (k * 3 // 2, k * 2):
            if c <= limit:
                counts.append(c)
        k *= 2
        if k > limit:
            break
    return [c for c in counts if c <= limit]


@dataclass
class JobOptions:
    """A job's candidates: one per (GPU type, count) with the fastest plan there."""

    job: JobRun
    req: SearchRequest
    raw: dict[str, Any]  # the scenario as searched
    outcome: SearchOutcome  # evaluated = the candidates; assemble() turns one into a Plan
    gpu_id: np.ndarray  # catalog ids (str)
    gpus: np.ndarray
    billed_gpus: np.ndarray  # rented whole-node-only types bill whole nodes
    time_s: np.ndarray

    def __len__(self) -> int:
        return len(self.gpus)


def job_request(job: JobRun, gpu_types: list[str] | None, max_gpus: int) -> tuple[SearchRequest, dict[str, Any]]:
    """The job's scenario as a time-minimising search over the portfolio's GPU types."""
    raw = deep_merge(job.raw, {"objective": "time", "top": 1})
    search = dict(raw.get("search") or {})
    if gpu_types is not None and not search.get("gpu_types"):
        search["gpu_types"] = gpu_types
    search["max_gpus"] = min(int(search.get("max_gpus") or max_gpus), max_gpus)
    raw["search"] = search
    constraints = dict(raw.get("constraints") or {})
    constraints.pop("deadline_hours", None)  # the job's window is its deadline
    constraints.pop("budget_usd", None)
    raw["constraints"] = constraints
    try:
        rs = resolve(raw, source=job.source, base_dir=job.base_dir, search=True)
        if rs.workload.tokens is None:
            raise InputError([f"{job.source}: workload.tokens: required (a job's duration needs its token budget)"])
        return build_request(rs), raw
    except InputError as exc:
        raise InputError([m if m.startswith(job.source) else f"{job.source}: {m}" for m in exc.problems]) from None


def job_options(job: JobRun, gpu_types: list[str] | None, max_gpus: int, counts: list[int] | None = None) -> JobOptions:
    """The job's candidates at ``counts`` GPUs (default: :func:`gpu_counts`)."""
    req, raw = job_request(job, gpu_types, max_gpus)
    req_t = dataclasses.replace(req, objective="time")
    cls = build_classes(req)
    cls = cls.take(np.flatnonzero(cls.a["tier"] == 0))  # as asked: procurement does not relax the job
    table = gpu_table(req)
    lat = build_lattice(req, table, cls)
    start, alone = fitting_start(req, table, cls, lat)
    n = len(cls)
    idx = np.arange(n)
    ok = start < lat.count
    dp_min = np.full(n, np.iinfo(np.int64).max)
    dp_min[ok] = lat.value(idx[ok], start[ok])
    a = cls.a
    mp = a["tp"] * a["pp"] * a["cp"]
    dmax = table.limit[a["gpu"]] // np.maximum(mp, 1)
    pair_c, pair_dp = [], []
    for count in (gpu_counts(req.max_gpus) if counts is None else [c for c in counts if c <= req.max_gpus]):
        dp = count // mp
        m = (count % mp == 0) & ((dp >= dp_min) | ((dp == 1) & alone)) & (dp <= dmax)
        if req.dp_pin is not None:
            m &= dp == req.dp_pin
        if req.global_batch:
            m &= (req.global_batch // a["micro_batch"]) % np.maximum(dp, 1) == 0
        pair_c.append(idx[m])
        pair_dp.append(dp[m])
    ci = np.concatenate(pair_c) if pair_c else np.zeros(0, dtype=np.int64)
    dp = np.concatenate(pair_dp) if pair_dp else np.zeros(0, dtype=np.int64)
    e = _best_per_count(req_t, table, cls, ci, dp)
    ids = np.array([req.gpus[int(g)].id for g in a["gpu"][e.cls_index]], dtype=object)
    outcome = SearchOutcome("optimal", cls, e, [], {})
    col = {k: np.asarray(e.ev.get(k, np.zeros(0))) for k in ("gpus", "billed_gpus", "time_s")}
    return JobOptions(job, req, raw, outcome, ids, col["gpus"].astype(np.int64),
                      col["billed_gpus"].astype(np.int64), col["time_s"].astype(float))


def token_free_key(job: JobRun) -> str:
    """What a job's candidates depend on besides its token budget (jobs with equal keys and equal
    global batches share one search: :func:`options_like`)."""
    raw = {k: v for k, v in job.raw.items() if k != "name"}
    wl = raw.get("workload")
    if isinstance(wl, dict):
        raw["workload"] = {k: v for k, v in wl.items() if k != "tokens"}
    return repr([_canonical(raw), str(job.base_dir)])


def _canonical(value: Any) -> Any:
    """A mapping's items sorted by their keys' text (YAML keys may be numbers or booleans)."""
    if isinstance(value, dict):
        return sorted(((repr(k), _canonical(v)) for k, v in value.items()), key=lambda kv: kv[0])
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def options_like(base: JobOptions, job: JobRun, gpu_types: list[str] | None, max_gpus: int) -> JobOptions:
    """The candidates of a job that differs from ``base.job`` only in its token budget: the same
    plans, their metrics evaluated for this job. Exact because a job's time is start-up plus tokens
    × time per token (planner.perf.timing.job_time_s), so the fastest plan at each (type, count)
    does not depend on the budget; memory does not depend on it either."""
    req, raw = job_request(job, gpu_types, max_gpus)
    e = base.outcome.evaluated
    if len(e.cls_index) == 0:
        return dataclasses.replace(base, job=job, req=req, raw=raw)
    req_t = dataclasses.replace(req, objective="time")
    c = {k: v[e.cls_index] for k, v in base.outcome.cls.a.items()}
    ev = evaluate(req_t, gpu_table(req), c, np.asarray(e.ev["dp"]))
    e2 = Evaluated(e.cls_index, {k: np.asarray(v) for k, v in ev.items()}, e.key, e.group, {})
    outcome = dataclasses.replace(base.outcome, evaluated=e2)
    return JobOptions(job, req, raw, outcome, base.gpu_id, ev["gpus"].astype(np.int64),
                      ev["billed_gpus"].astype(np.int64), ev["time_s"].astype(float))


def same_search(a: SearchRequest, b: SearchRequest) -> bool:
    """Two requests of one token-free key that still search differently (a default global batch
    that depends on the token budget)."""
    return (a.global_batch, a.grad_accum, a.max_gpus) == (b.global_batch, b.grad_accum, b.max_gpus)


def _pair_bounds(req: SearchRequest, table, cls, ci: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """The search's admissible time bound of each (class, dp) pair. Without a fixed global batch
    the accumulation steps do not depend on dp, so the bound is computed once per class at dp = 1
    and divided by dp (rounded down: still admissible), not once per pair."""
    if req.global_batch:
        return lower_bounds(req, table, cls.take(ci), dp, dp)
    uniq, inv = np.unique(ci, return_inverse=True)
    one = np.ones(len(uniq), dtype=np.int64)
    per_class = lower_bounds(req, table, cls.take(uniq), one, one)
    return np.floor(per_class[inv] / np.maximum(dp, 1))


def _best_per_count(req: SearchRequest, table, cls, ci: np.ndarray, dp: np.ndarray) -> Evaluated:
    """Best-first over (type, count) groups: the fastest feasible column of each."""
    empty = Evaluated(np.zeros(0, dtype=np.int64), {}, np.zeros(0), np.zeros(0, dtype=np.int64), {})
    if len(ci) == 0:
        return _pareto(take_rows(empty, np.zeros(0, dtype=np.int64)))
    a = cls.a
    lb = _pair_bounds(req, table, cls, ci, dp)
    group = a["gpu"][ci] * 10_000_000 + dp * (a["tp"] * a["pp"] * a["cp"])[ci]
    order = np.lexsort((lb, group))
    ci, dp, lb, group = ci[order], dp[order], lb[order], group[order]
    first = np.ones(len(group), dtype=bool)
    first[1:] = group[1:] != group[:-1]
    starts = np.flatnonzero(first)
    ends = np.append(starts[1:], len(group))
    gid = np.cumsum(first) - 1
    n_groups = len(starts)
    best_time = np.full(n_groups, np.inf)
    best_row = np.full(n_groups, -1)
    parts: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
    done = np.zeros(n_groups, dtype=bool)
    step = np.arange(ROUND_SIZE)
    r = 0
    while not done.all():
        active = np.flatnonzero(~done)  # the next ROUND_SIZE classes of each group not done
        idx = starts[active][:, None] + r * ROUND_SIZE + step[None, :]
        sel = idx[idx < ends[active][:, None]]
        if len(sel) == 0:
            break
        c = {k: v[ci[sel]] for k, v in cls.a.items()}
        ev = evaluate(req, table, c, dp[sel])
        masks = feasible(req, ev)
        good = np.logical_and.reduce(list(masks.values()))
        t = np.where(good, ev["time_s"], np.inf)
        base = sum(len(p[0]) for p in parts)
        parts.append((sel, ev))
        f = np.flatnonzero(np.isfinite(t))
        if len(f):  # each group's fastest column of this round, if it beats the group's best
            gg, tt = gid[sel[f]], t[f]
            o = np.lexsort((tt, gg))
            first_of = np.ones(len(o), dtype=bool)
            first_of[1:] = gg[o][1:] != gg[o][:-1]
            cg, ct, crow = gg[o][first_of], tt[o][first_of], base + f[o][first_of]
            better = ct < best_time[cg]
            best_time[cg[better]], best_row[cg[better]] = ct[better], crow[better]
        r += 1
        # A group is done when its next class's bound cannot beat its best (in the same ms units).
        nxt = starts + r * ROUND_SIZE
        exhausted = nxt >= ends
        bound = np.where(exhausted, np.inf, lb[np.minimum(nxt, len(group) - 1)])
        done |= exhausted | (bound > time_ms(best_time))
    keep = np.flatnonzero(best_row >= 0)
    rows = best_row[keep]
    all_sel = np.concatenate([p[0] for p in parts])
    all_ev = {k: np.concatenate([np.asarray(p[1][k]) for p in parts]) for k in parts[0][1]}
    e = Evaluated(ci[all_sel][rows], {k: v[rows] for k, v in all_ev.items()}, np.zeros(len(rows)),
                  group[all_sel][rows], {})
    return _pareto(e)


def _pareto(e: Evaluated) -> Evaluated:
    """Per GPU type, keep a count only if it is faster than every smaller count of that type."""
    if len(e.cls_index) == 0:
        return e
    gtype = e.group // 10_000_000
    order = np.lexsort((e.ev["gpus"], gtype))
    keep = []
    last_type, best = None, np.inf
    for j in order:
        if gtype[j] != last_type:
            last_type, best = gtype[j], np.inf
        if e.ev["time_s"][j] < best:
            keep.append(j)
            best = e.ev["time_s"][j]
    return take_rows(e, np.array(keep, dtype=np.int64))


def option_plan(opts: JobOptions, j: int) -> Any:
    """The full Plan (memory re-estimated and checked) of candidate ``j``."""
    from planner.search.results import assemble

    outcome = dataclasses.replace(opts.outcome, picked=[j])
    return assemble(opts.req, opts.raw, outcome)[0]
