"""Find the best plans for a scenario: CP-SAT over the decisions, seeded by a best-first search.

1. Classes (planner.search.space): every legal layout without its data-parallel degree, per GPU type
   and relaxation tier, as arrays.
2. Hints (optional, the default): a best-first expansion. Memory: the smallest data-parallel
   degree at which each class fits, by bisection on its lattice of degrees (memory never rises
   with dp from two ranks up). Windows of at most :data:`WINDOW` degrees per class are ranked by
   an admissible lower bound of the objective (compute time alone, at the catalog's utilisation,
   is a floor for time and cost; the smallest degree for GPU count and hourly price) and
   evaluated in that order until no unevaluated window can beat the k-th best distinct plan.
3. The region: every plan whose objective is at most that k-th best (all plans without hints),
   fitting or not, with its memory per step phase, host bytes, time and cost.
4. CP-SAT (planner.search.cpsat) searches the region's decisions under every constraint and
   returns the top k distinct plans; the best-first's plans are its hints.

:func:`enumerate_all` evaluates every column with no bound, no bisection and no solver: the
oracle that the tests and the benchmark compare against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from planner.core.arrays import unique_rows
from planner.core.units import zero_degree
from planner.search.columns import (
    BATCH_COLUMNS,
    FIRST_BATCH_COLUMNS,
    Evaluated,
    best_per_group,
    concat_evaluated,
    evaluate_windows,
    feasible,
    kth_key,
    lower_bounds,
    reduce_parts,
    take_rows,
)
from planner.search.cpsat import (
    TIER_WEIGHT,
    Limits,
    Space,
    budget_units,
    cost_units,
    deadline_ms,
    time_ms,
    top_k,
)
from planner.search.evaluate import (
    GpuTable,
    gpu_table,
    host_bytes_per_node,
    memory_flags,
    memory_of,
)
from planner.search.lattice import Lattice, build_lattice, degree_windows, fitting_windows
from planner.search.request import CLASS_KEYS, SearchRequest
from planner.search.space import Classes, build_classes


@dataclass
class SearchOutcome:
    status: str  # optimal | feasible | infeasible | unknown
    cls: Classes
    evaluated: Evaluated
    picked: list[int]  # indices into ``evaluated``
    stats: dict[str, float]


#: Classes whose memory is bisected together when the search expands them: few at first (the
#: bound often stops the search early), doubling up to the largest batch.
FIRST_CLASS_BATCH = 512
CLASS_BATCH = 16_384


#: Where the time limit passes before the best-first has found any plan, it goes on for at most
#: this many seconds more: an answer a moment late is worth more than "unknown" (the limit
#: benchmark, bench/bench_limits.py, allows 10 % of the limit plus half a second).
FIRST_PLAN_GRACE_S = 0.3


def search(req: SearchRequest, *, time_limit_s: float = 30.0, hints: bool = True,
           started: float | None = None) -> SearchOutcome:
    """The top k plans, chosen by CP-SAT (planner.search.cpsat) over the decisions.

    With ``hints`` a best-first expansion first finds good plans quickly: classes expanded in
    order of a lower bound (memory bisected, windows of degrees formed), windows evaluated in
    bound order until nothing left can beat the k-th best distinct plan. What it found seeds
    CP-SAT's search, and the k-th best objective bounds the region CP-SAT is given (no plan
    worse than it can be in the top k). Every plan of that region is handed to CP-SAT whether it
    fits or not: CP-SAT decides memory, GPU count, host RAM, budget and deadline itself. Without
    hints the region is the whole space.

    The time limit counts from ``started`` (a ``time.perf_counter()`` reading: the caller's
    start, so that reading the scenario counts too; default now). When it passes during the
    best-first, the answer is the best plans found so far (status ``feasible``, with
    ``stats["gap"]``: how far the best may be from the optimum, as a share of its objective),
    without the region and CP-SAT: that is the work the limit cuts. Where nothing was found by
    then, the best-first goes on for at most :data:`FIRST_PLAN_GRACE_S`; ``unknown`` means
    nothing was found even so. A CP-SAT stage cut short keeps what it proved (``feasible``)."""
    t0 = time.perf_counter() if started is None else started
    deadline = t0 + time_limit_s
    cls, table = build_classes(req), gpu_table(req)
    lat = build_lattice(req, table, cls)
    threshold, proven, seeds, stats = np.inf, True, None, {}
    if hints:
        bf = _BestFirst(req, cls, table, lat)
        proven = bf.run(deadline=deadline, hard_deadline=deadline + FIRST_PLAN_GRACE_S)
        threshold = _region_bound(req, bf)
        seeds = bf.e
        stats = {"classes_expanded": bf.cpos, "windows_evaluated": bf.windows_evaluated,
                 "best_first_columns": bf.evaluated_cols, "best_first_s": time.perf_counter() - t0}
        if not proven:
            return _best_found(req, table, cls, bf, stats, t0)
    t1 = time.perf_counter()
    e = region(req, table, cls, lat, threshold, seeds)
    if seeds is not None:  # what the best-first saw violate each constraint (for explanations)
        e.rejected = dict(seeds.rejected)
    space, limits = decision_space(req, table, cls, e)
    t2 = time.perf_counter()
    hint_cols = None
    if seeds is not None:  # the seeds in the order CP-SAT ranks plans: the k it should find
        rows = _seed_rows(e, seeds)
        hint_cols = rows[np.argsort(space.c_rank[rows], kind="stable")][: req.top].tolist()
    status, picked = top_k(space, limits, req.top, max(0.05, deadline - t2), hints=hint_cols, stats=stats)
    if not picked and status == "unknown" and hint_cols:  # cut short before its first answer
        picked, status = hint_cols, "feasible"
    stats.update({"classes": len(cls), "columns_evaluated": len(e.key), "region_plans": len(space.c_gpu),
                  "region_s": t2 - t1, "cpsat_s": time.perf_counter() - t2,
                  "seconds": time.perf_counter() - t0})
    return SearchOutcome(status, cls, e, picked, stats)


def _best_found(req: SearchRequest, table: GpuTable, cls: Classes, bf: _BestFirst, stats: dict,
                t0: float) -> SearchOutcome:
    """The answer when time ran out during the best-first: its k best distinct plans, ranked as
    CP-SAT ranks them, with the gap to the lowest bound of what it left unexplored."""
    e = bf.e
    if not len(e.key):
        stats["seconds"] = time.perf_counter() - t0
        return SearchOutcome("unknown", cls, e, [], stats)
    rank = plan_ranks(req, {k: v[e.cls_index] for k, v in cls.a.items()}, e)
    e = take_rows(e, np.argsort(rank, kind="stable")[: req.top])
    _fill_memory(req, table, cls, e)  # the best-first skips memory where it knows a plan fits
    e.rejected = dict(bf.e.rejected)
    stats.update(gap=_gap(float(e.key.min()), bf.lower_bound()), columns_evaluated=len(e.key),
                 seconds=time.perf_counter() - t0)
    return SearchOutcome("feasible", cls, e, list(range(len(e.key))), stats)


def _gap(best_key: float, bound_key: float) -> float | None:
    """(best − bound) / best in objective units, both in the same relaxation tier; None where
    that cannot be said (another tier may still hold a better plan, or no bound)."""
    if bound_key >= best_key:  # nothing left unexplored can beat it (inf: nothing left at all)
        return 0.0
    if not np.isfinite(bound_key) or int(best_key // TIER_WEIGHT) != int(bound_key // TIER_WEIGHT):
        return None
    best_units, bound_units = best_key % TIER_WEIGHT, bound_key % TIER_WEIGHT
    return float((best_units - bound_units) / best_units) if best_units > 0 else None


def _region_bound(req: SearchRequest, bf: _BestFirst) -> float:
    """The objective bound the best-first hands CP-SAT: the k-th best distinct plan's key, or,
    where it found fewer (it proved no more exist, or its time ran out), the worst of them
    (−inf: none found, nothing to hand over)."""
    keys = np.sort(bf.e.key)
    if len(keys) >= req.top:
        return float(keys[req.top - 1])
    return float(keys[-1]) if len(keys) else -np.inf


def region(req: SearchRequest, table: GpuTable, cls: Classes, lat, threshold: float,
           seeds: Evaluated | None = None) -> Evaluated:
    """Every plan (class at an allowed data-parallel degree) whose key is at most ``threshold``,
    with all its metrics and no constraint applied; the windows whose lower bound exceeds the
    threshold are never evaluated (their plans cannot reach it). With ``seeds`` (feasible plans
    of distinct groups, found by the best-first) the bound is the lexicographic order itself:
    plans ranked after the k-th best seed cannot be in the top k either."""
    if threshold == -np.inf:
        return concat_evaluated([])
    idx = np.flatnonzero(lat.count > 0)
    if np.isfinite(threshold) and len(idx):
        lb0 = lower_bounds(req, table, cls.take(idx), lat.value(idx, np.zeros(len(idx), dtype=np.int64)),
                           lat.value(idx, lat.count[idx] - 1))
        idx = idx[lb0 <= threshold]
    wc, ws, we = degree_windows(Lattice(lat.count[idx], None, None), np.zeros(len(idx), dtype=np.int64))
    wc = idx[wc]
    if np.isfinite(threshold) and len(wc):
        keep = lower_bounds(req, table, cls.take(wc), lat.value(wc, ws), lat.value(wc, we - 1)) <= threshold
        wc, ws, we = wc[keep], ws[keep], we[keep]
    parts = []
    sizes = we - ws
    cuts = np.searchsorted(np.cumsum(sizes), np.arange(BATCH_COLUMNS, int(sizes.sum()) + BATCH_COLUMNS, BATCH_COLUMNS))
    begin = 0
    for end in [*cuts.tolist(), len(wc)]:
        end = max(int(end), begin + 1) if begin < len(wc) else begin
        if end > begin:
            part = evaluate_windows(req, table, cls, lat, wc[begin:end], ws[begin:end], we[begin:end], apply=False)
            parts.append(take_rows(part, np.flatnonzero(part.key <= threshold)))
        begin = end
    e = concat_evaluated(parts)
    if seeds is not None and len(e.key):
        e = take_rows(e, _lexicographic_cut(req, cls, e, seeds))
    _fill_memory(req, table, cls, e)
    return e


def _lexicographic_cut(req: SearchRequest, cls: Classes, e: Evaluated, seeds: Evaluated) -> np.ndarray:
    """The plans of ``e`` ranked no later than the k-th best seed (all, if a seed is missing)."""
    rank = plan_ranks(req, {k: v[e.cls_index] for k, v in cls.a.items()}, e)
    found = _seed_rows(e, seeds)
    if len(found) < min(req.top, len(seeds.key)):
        return np.arange(len(e.key))
    last = np.sort(rank[found])[min(req.top, len(found)) - 1]
    return np.flatnonzero(rank <= last)


#: Keys of a region's columns holding one phase's device bytes per GPU (``PHASE_PREFIX + phase``).
PHASE_PREFIX = "phase_bytes:"


def _fill_memory(req: SearchRequest, table: GpuTable, cls: Classes, e: Evaluated) -> None:
    """Memory and host bytes of the region's plans (the same formulas as ``planner estimate``),
    the flags they decide, and how many plans break each constraint (for explanations)."""
    if not len(e.key):
        return
    c = {k: v[e.cls_index] for k, v in cls.a.items()}
    memory = memory_of(req, c, e.ev["dp"], np.maximum(e.ev["grad_accum"], 1))
    mem, host = memory["total"], memory["host"]
    e.ev["memory_bytes"], e.ev["host_bytes"] = mem, host
    for phase, values in memory["phases"].items():  # CP-SAT's memory rows (decision_space)
        e.ev[PHASE_PREFIX + phase] = values
    e.ev["fits"], e.ev["host_ok"] = memory_flags(table, c["gpu"], e.ev["gpus"], mem, host, memory["phases"])
    ok = np.ones(len(e.key), dtype=bool)
    for name, mask in feasible(req, e.ev).items():
        e.rejected[name] = int((ok & ~mask).sum())
        ok &= mask


def _seed_rows(e: Evaluated, seeds: Evaluated) -> np.ndarray:
    """The rows of ``e`` that are seeds (the best-first's plans within the region), in row order."""
    if not len(e.key) or not len(seeds.key):
        return np.zeros(0, dtype=np.int64)
    width = int(max(e.ev["dp"].max(), seeds.ev["dp"].max())) + 1  # (class, dp) as one integer
    return np.flatnonzero(np.isin(e.cls_index * width + e.ev["dp"], seeds.cls_index * width + seeds.ev["dp"]))


#: Where a plan's cost or time is unknown (no price): above any budget or deadline.
UNBOUNDED = 10**15


def decision_space(req: SearchRequest, table: GpuTable, cls: Classes, e: Evaluated) -> tuple[Space, Limits]:
    """The CP-SAT tables of the region ``e`` (planner.search.cpsat.Space) and the request's limits."""
    a = {k: v[e.cls_index] for k, v in cls.a.items()}
    shape_keys = [k for k in CLASS_KEYS if k != "gpu"]
    n = len(e.key)
    if n:
        shapes, s_of = unique_rows(np.stack([a[k] for k in shape_keys], axis=1).astype(np.int64))
        degrees, k_of = unique_rows(np.stack([s_of, e.ev["dp"]], axis=1).astype(np.int64))
    else:
        shapes = np.zeros((0, len(shape_keys)), dtype=np.int64)
        degrees, s_of, k_of = np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    k_of = k_of.ravel()
    dims = {k: shapes[:, i] for i, k in enumerate(shape_keys)}
    first = np.zeros(len(degrees), dtype=np.int64)
    first[k_of[::-1]] = np.arange(n)[::-1]  # a column of each degree row
    phases = {key.removeprefix(PHASE_PREFIX): v[first] for key, v in e.ev.items() if key.startswith(PHASE_PREFIX)}
    cap = int(table.asleep_usable_bytes.max(initial=0)) + 1  # above every card: as infeasible as any larger value
    ram = np.where(np.isfinite(table.host_bytes_per_node), table.host_bytes_per_node, -1).astype(np.int64)
    host_node = host_bytes_per_node(table, a["gpu"], e.ev["gpus"], e.ev["host_bytes"]) if n else np.zeros(0)
    need_price = req.objective in ("cost", "hourly") or req.budget_usd is not None
    space = Space(
        mp=dims["tp"] * dims["pp"] * dims["cp"], micro_batch=dims["micro_batch"],
        k_shape=degrees[:, 0], k_dp=degrees[:, 1],
        k_phases={p: np.minimum(v, cap) for p, v in phases.items()},
        c_gpu=a["gpu"], c_k=k_of, c_rank=plan_ranks(req, a, e),
        c_group=np.unique(e.group, return_inverse=True)[1].ravel(),
        c_grad_accum=np.asarray(e.ev["grad_accum"], dtype=np.int64) if n else np.zeros(0, dtype=np.int64),
        # above every node's RAM is as infeasible as any larger value
        c_host_node=np.minimum(host_node, int(ram.max(initial=0)) + 1).astype(np.int64),
        c_cost=_bounded(cost_units(e.ev["cost_usd"])) if req.budget_usd is not None and n else None,
        c_time=_bounded(time_ms(e.ev["time_s"])) if req.deadline_s is not None and n else None,
    )
    limits = Limits(
        usable_bytes=table.usable_bytes, asleep_usable_bytes=table.asleep_usable_bytes, gpu_limit=table.limit, gpus_per_node=table.gpus_per_node,
        host_bytes_per_node=ram, priced=np.isfinite(table.perf.price_usd_per_hour), max_gpus=req.max_gpus,
        global_batch=req.global_batch,
        budget_units=None if req.budget_usd is None else budget_units(req.budget_usd),
        deadline_ms=None if req.deadline_s is None else deadline_ms(req.deadline_s), need_price=need_price,
    )
    return space, limits


def _bounded(units: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(units), np.minimum(units, UNBOUNDED), UNBOUNDED).astype(np.int64)


def plan_ranks(req: SearchRequest, a: dict[str, np.ndarray], e: Evaluated) -> np.ndarray:
    """Each plan's place in the lexicographic order CP-SAT minimises: relaxation tier and
    objective (the key); among equals the cheaper hour (fewest GPUs, shortest time) or the faster
    job (cost, hourly); then the simpler plan: no offload, a lower ZeRO stage, fewer
    model-parallel ranks, the catalog's GPU order; within a group, the canonical order of
    :func:`best_per_group` (fewer GPUs, smaller micro-batch, less recomputation, FlashAttention)."""
    if not len(e.key):
        return np.zeros(0, dtype=np.int64)
    ev = e.ev
    second = ev["hourly_usd"] if req.objective in ("gpus", "time") else ev.get("time_s", ev["hourly_usd"])
    second = np.where(np.isfinite(second), second, np.inf)
    zero_eff = np.where(zero_degree(ev["dp"], a["cp"]) > 1, a["zero"], 0)
    key = np.where(np.isfinite(e.key), e.key, np.inf)
    order = np.lexsort((e.cls_index, -a["attention"], a["checkpointing"], a["zero"], a["micro_batch"], ev["dp"],
                        a["gpu"], a["tp"] * a["pp"] * a["cp"] * a["ep"], zero_eff, a["offload"], second, key))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


class _BestFirst:
    """The state of the best-first expansion: classes in bound order, pending windows, the
    columns evaluated so far and the k-th best key (the threshold nothing worse can pass)."""

    def __init__(self, req: SearchRequest, cls: Classes, table: GpuTable, lat: Lattice):
        self.req, self.cls, self.table, self.lat = req, cls, table, lat
        has = np.flatnonzero(self.lat.count > 0)
        self.cls.rejected["no allowed data-parallel degree (GPU limit, global batch)"] += len(self.cls) - len(has)
        lb0 = lower_bounds(req, self.table, self.cls.take(has), self.lat.value(has, np.zeros(len(has), dtype=np.int64)),
                           self.lat.value(has, self.lat.count[has] - 1))
        self.corder = has[np.argsort(lb0, kind="stable")]
        self.lb0_sorted = np.sort(lb0, kind="stable")
        self.cpos, self.class_batch, self.batch_columns = 0, FIRST_CLASS_BATCH, FIRST_BATCH_COLUMNS
        self.pend_c = self.pend_s = self.pend_e = np.zeros(0, dtype=np.int64)
        self.pend_lb = np.zeros(0)
        self.e = concat_evaluated([])
        self.threshold = np.inf
        self.evaluated_cols = self.windows_evaluated = 0

    def run(self, *, deadline: float, hard_deadline: float | None = None) -> bool:
        """Expand until nothing left can beat the threshold (True: proven) or the deadline passes
        (False); with nothing found by then, on until ``hard_deadline``."""
        while True:
            next_class, next_window = self._next_bounds()
            if min(next_class, next_window) > self.threshold or (next_class == np.inf and next_window == np.inf):
                return True
            now = time.perf_counter()
            if now > deadline and (len(self.e.key) or hard_deadline is None or now > hard_deadline):
                return False
            if next_window <= next_class:
                self._evaluate_windows(next_class)
            else:
                self._expand_classes()

    def _next_bounds(self) -> tuple[float, float]:
        """The lower bounds of the next class to expand and of the best pending window."""
        next_class = self.lb0_sorted[self.cpos] if self.cpos < len(self.corder) else np.inf
        return next_class, (self.pend_lb.min() if len(self.pend_lb) else np.inf)

    def lower_bound(self) -> float:
        """The lowest key any plan not yet evaluated can have."""
        return float(min(self._next_bounds()))

    def _evaluate_windows(self, next_class: float) -> None:
        """Evaluate the pending windows of lowest bound (a batch that doubles up to its largest)."""
        order = np.argsort(self.pend_lb, kind="stable")
        sizes = (self.pend_e - self.pend_s)[order]
        eligible = int(np.searchsorted(self.pend_lb[order], next_class, side="right"))
        n_take = min(max(1, int(np.searchsorted(np.cumsum(sizes), self.batch_columns))), max(1, eligible))
        self.batch_columns = min(2 * self.batch_columns, BATCH_COLUMNS)
        take, rest = order[:n_take], order[n_take:]
        evaluated = evaluate_windows(self.req, self.table, self.cls, self.lat, self.pend_c[take],
                                     self.pend_s[take], self.pend_e[take], known_to_fit=True)
        self.e = reduce_parts(self.cls, [self.e, evaluated])
        self.evaluated_cols += int(sizes[:n_take].sum())
        self.windows_evaluated += n_take
        self.pend_c, self.pend_s = self.pend_c[rest], self.pend_s[rest]
        self.pend_e, self.pend_lb = self.pend_e[rest], self.pend_lb[rest]
        self.threshold = kth_key(self.e, np.arange(len(self.e.key)), self.req.top)

    def _expand_classes(self) -> None:
        """Bisect the next classes' memory and queue their fitting windows with their bounds."""
        idx = self.corder[self.cpos: self.cpos + self.class_batch]
        self.cpos += len(idx)
        self.class_batch = min(2 * self.class_batch, CLASS_BATCH)
        wc, ws, we, never = fitting_windows(self.req, self.table, self.cls, self.lat, idx)
        self.cls.rejected["does not fit in memory at any allowed GPU count"] += int(never.sum())
        lb = lower_bounds(self.req, self.table, self.cls.take(wc), self.lat.value(wc, ws), self.lat.value(wc, we - 1))
        self.pend_c, self.pend_s = np.concatenate([self.pend_c, wc]), np.concatenate([self.pend_s, ws])
        self.pend_e, self.pend_lb = np.concatenate([self.pend_e, we]), np.concatenate([self.pend_lb, lb])


def enumerate_all(req: SearchRequest) -> tuple[Classes, Evaluated, np.ndarray]:
    """The oracle: every column of the space, no bounds, no solver. Returns the top-k
    (indices into the evaluated columns), ranked by (tier, objective units, canonical order)."""
    cls = build_classes(req)
    table = gpu_table(req)
    lat = build_lattice(req, table, cls)
    wc, ws, we = degree_windows(lat, np.zeros(len(cls), dtype=np.int64))
    parts = []
    sizes = we - ws
    ends = np.searchsorted(np.cumsum(sizes), np.arange(BATCH_COLUMNS, int(sizes.sum()) + BATCH_COLUMNS,
                                                       BATCH_COLUMNS))
    begin = 0
    for end in list(ends) + [len(wc)]:
        end = max(end, begin + 1) if begin < len(wc) else begin
        if end > begin:
            parts.append(evaluate_windows(req, table, cls, lat, wc[begin:end], ws[begin:end], we[begin:end]))
        begin = end
    e = concat_evaluated(parts)
    if not parts:
        return cls, e, np.zeros(0, dtype=np.int64)
    best = best_per_group(cls, e)
    ranked = best[np.argsort(e.key[best], kind="stable")]
    return cls, e, ranked[: req.top]
