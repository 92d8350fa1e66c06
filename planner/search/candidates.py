"""Find the best plans for a scenario: bounded candidate generation, then CP-SAT.

1. Classes (planner.search.space): every legal layout without its data-parallel degree, per GPU type
   and relaxation tier, as arrays.
2. Memory: the smallest data-parallel degree at which each class fits, by bisection on its
   lattice of degrees (memory never rises with dp: ZeRO shards over it, and fewer in-flight
   micro-batches remain); classes that fit at no allowed degree are counted and dropped.
3. Windows of at most :data:`WINDOW` degrees per class are ranked by an admissible lower bound
   of the objective (compute time alone, at the catalog's utilisation, is a floor for time and
   cost; the smallest fitting degree for GPU count and hourly price) and evaluated in that
   order, in batches, until no unevaluated window can beat the k-th best distinct plan.
4. CP-SAT (planner.search.cpsat) picks the top k among the best column of each distinct group.

:func:`enumerate_all` evaluates every column with no bound, no bisection and no solver: the
oracle that the tests and the benchmark compare against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from planner.perf.timing import JOB_STARTUP_S, billed_gpus, model_flops, step_time_s
from planner.search.cpsat import (
    TIER_WEIGHT, Columns, Limits, budget_units, cost_units, deadline_ms, objective_units, time_ms, top_k,
)
from planner.search.lattice import build_lattice, degree_windows, fitting_windows
from planner.search.space import Classes, GpuTable, SearchRequest, build_classes, evaluate, gpu_table, memory_total
from planner.search.space import grad_accum_of, n_lora_of, perf_rows

#: Columns evaluated per batch: the first batch is small (the bound often stops the search
#: after it), later ones double up to the largest, which bounds the arrays' size.
FIRST_BATCH_COLUMNS = 20_000
BATCH_COLUMNS = 200_000
#: Groups handed to CP-SAT per plan asked for: the best by key, a superset of the top k.
CANDIDATES_PER_PLAN = 5

GROUP_KEYS = ("gpu", "tier", "precision", "optimizer", "tp", "pp", "cp", "ep", "zero", "offload")


def feasible(req: SearchRequest, ev: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each constraint's mask over evaluated columns (the one rule: generator, oracle, checker)."""
    masks = {"memory": ev["fits"], "host RAM": ev["host_ok"], "global batch": ev["ga_ok"]}
    priced = np.isfinite(ev["hourly_usd"])
    if req.objective in ("cost", "hourly") or req.budget_usd is not None:
        masks["price known"] = priced
    if req.budget_usd is not None:
        masks["budget"] = cost_units(ev["cost_usd"]) <= budget_units(req.budget_usd)
    if req.deadline_s is not None:
        masks["deadline"] = time_ms(ev["time_s"]) <= deadline_ms(req.deadline_s)
    return masks


def lower_bounds(req: SearchRequest, table: GpuTable, cls: Classes, dp_lo: np.ndarray, dp_hi: np.ndarray) -> np.ndarray:
    """Admissible lower bound of the objective (integer units) over dp in [dp_lo, dp_hi]."""
    a = cls.a
    g = a["gpu"]
    mp = a["tp"] * a["pp"] * a["cp"]
    node = table.gpus_per_node[g]
    price = table.perf.price_usd_per_hour[g]
    if req.objective in ("gpus", "hourly"):
        gpus = dp_lo * mp
        billed = billed_gpus(gpus, node, table.whole_node[g])
        units = objective_units(req.objective, {"gpus": gpus, "hourly_usd": billed * price})
    else:
        # Per micro-batch, everything but the data-parallel terms: compute, TP/PP/CP/EP traffic
        # (at the faster in-node link, as if the group fitted one node) and the pipeline bubble
        # at its smallest (the most accumulation steps in the range). Data-parallel traffic,
        # ZeRO gathers and offload only add to it, and billed GPUs ≥ GPUs.
        ga_lo = np.maximum(grad_accum_of(req, a["micro_batch"], dp_lo), 1)
        ga_hi = np.maximum(grad_accum_of(req, a["micro_batch"], dp_hi), 1)
        ga = ga_lo if req.objective == "cost" else ga_hi
        perf = perf_rows(table.perf, g)
        n_lora = np.where(a["method"] == 0, 0.0, n_lora_of(req.rs))
        step = step_time_s(model_flops(req.model), perf, method=a["method"],
                           checkpointing=a["checkpointing"], offload=np.zeros_like(g), zero=np.zeros_like(g),
                           seq_len=a["seq_len"], micro_batch=a["micro_batch"], grad_accum=ga, tp=a["tp"],
                           pp=a["pp"], cp=a["cp"], ep=a["ep"], dp=np.ones_like(g), n_lora=n_lora,
                           attention=a["attention"], fp8=int(bool(req.rs.workload.fp8)), intra_only=True,
                           fused=req.stack_recipe("fused_kernels", a["stack"]),
                           vp=req.rs.layout.pp_virtual_stages if req.rs.layout.pp_schedule == "interleaved" else 1)
        per_token_s = step / (a["micro_batch"] * ga * a["seq_len"])  # seconds per token per pipeline
        # The job's start-up cost is paid on every GPU whatever the layout (billed ≥ dp·mp).
        if req.objective == "cost":
            units = objective_units("cost", {"cost_usd": (req.tokens * per_token_s + JOB_STARTUP_S * dp_lo)
                                             * mp / 3600.0 * price})
        else:
            units = objective_units("time", {"time_s": JOB_STARTUP_S + req.tokens * per_token_s / dp_hi})
        units = np.floor(np.maximum(units - 1, 0))  # the bound is real-valued: never round it up
    return a["tier"] * float(TIER_WEIGHT) + units


@dataclass
class Evaluated:
    """Feasible columns: class index, metrics, rank key and group id."""

    cls_index: np.ndarray
    ev: dict[str, np.ndarray]
    key: np.ndarray  # tier·W + objective units
    group: np.ndarray
    rejected: dict[str, int]


def _group_ids(req: SearchRequest, cls: Classes, ci: np.ndarray, dp: np.ndarray) -> np.ndarray:
    if req.distinct == "none":
        return ci * 100_000 + dp
    # With one data-parallel rank (dp·cp = 1) every ZeRO stage is the same plan: one group.
    zero_eff = np.where(dp * cls.a["cp"][ci] > 1, cls.a["zero"][ci], 0)
    stacked = np.stack([zero_eff if k == "zero" else cls.a[k][ci] for k in GROUP_KEYS], axis=1)
    # A stable integer per group: mixed radix over the small key values.
    gid = np.zeros(len(ci), dtype=np.int64)
    for col in range(stacked.shape[1]):
        gid = gid * 1_000_003 + stacked[:, col]
    return gid


def evaluate_windows(req, table, cls, lat, win_cls, win_start, win_end, known_to_fit=False) -> Evaluated:
    counts = win_end - win_start
    total = int(counts.sum())
    ci = np.repeat(win_cls, counts)
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    j = np.repeat(win_start, counts) + offsets
    dp = lat.value(ci, j)
    c = {k: v[ci] for k, v in cls.a.items()}
    host_upper = None
    if known_to_fit and req.rs.profile != "seed":
        # Offloaded host bytes at each window's first degree bound the window's (see evaluate).
        host_first = np.zeros(len(win_cls), dtype=np.int64)
        off = np.flatnonzero(cls.a["offload"][win_cls] > 0)
        if len(off):
            w = win_cls[off]
            dp0 = lat.value(w, win_start[off])
            host_first[off] = memory_total(req, {k: v[w] for k, v in cls.a.items()}, dp0,
                                           grad_accum_of(req, cls.a["micro_batch"][w], dp0))[1]
        host_upper = np.repeat(host_first, counts)
    ev = evaluate(req, table, c, dp, known_to_fit=known_to_fit, host_upper=host_upper)
    masks = feasible(req, ev)
    ok = np.ones(total, dtype=bool)
    rejected: dict[str, int] = {}
    for name, mask in masks.items():
        rejected[name] = int((ok & ~mask).sum())
        ok &= mask
    sel = np.flatnonzero(ok)
    ev = {k: np.asarray(v)[sel] for k, v in ev.items()}
    key = cls.a["tier"][ci[sel]] * float(TIER_WEIGHT) + objective_units(req.objective, ev)
    return Evaluated(ci[sel], ev, key, _group_ids(req, cls, ci[sel], ev["dp"]), rejected)


def concat_evaluated(parts: list[Evaluated]) -> Evaluated:
    rejected: dict[str, int] = {}
    for p in parts:
        for k, v in p.rejected.items():
            rejected[k] = rejected.get(k, 0) + v
    parts = [p for p in parts if p.ev]
    if not parts:
        return Evaluated(np.zeros(0, dtype=np.int64), {}, np.zeros(0), np.zeros(0, dtype=np.int64), rejected)
    keys = parts[0].ev.keys()
    return Evaluated(
        np.concatenate([p.cls_index for p in parts]),
        {k: np.concatenate([p.ev[k] for p in parts]) for k in keys},
        np.concatenate([p.key for p in parts]),
        np.concatenate([p.group for p in parts]),
        rejected,
    )


def best_per_group(cls: Classes, e: Evaluated) -> np.ndarray:
    """Index (into ``e``) of each group's best column: lowest key, then a canonical order."""
    if len(e.key) == 0:
        return np.zeros(0, dtype=np.int64)
    # Ties go to: FlashAttention, less recomputation, lower ZeRO stage, no offload, smaller
    # micro-batch, fewer GPUs (the last key below is the first criterion).
    a = {k: cls.a[k][e.cls_index] for k in ("attention", "checkpointing", "zero", "offload", "micro_batch")}
    canon = (e.ev["dp"], a["micro_batch"], a["offload"], a["zero"], a["checkpointing"], -a["attention"])
    order = np.lexsort((*canon, e.key, e.group))
    first = np.ones(len(order), dtype=bool)
    first[1:] = e.group[order][1:] != e.group[order][:-1]
    return order[first]


def _kth_key(e: Evaluated, best: np.ndarray, k: int) -> float:
    if len(best) < k:
        return np.inf
    return float(np.partition(e.key[best], k - 1)[k - 1])


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


def _reduce(cls: Classes, parts: list[Evaluated]) -> Evaluated:
    """Merge evaluated columns, keeping only each group's best (all that can matter)."""
    merged = concat_evaluated(parts)
    if len(merged.key) == 0:
        return merged
    keep = best_per_group(cls, merged)
    keep = keep[np.argsort(merged.key[keep], kind="stable")]
    return Evaluated(merged.cls_index[keep], {k: v[keep] for k, v in merged.ev.items()},
                     merged.key[keep], merged.group[keep], merged.rejected)


def search(req: SearchRequest, *, time_limit_s: float = 30.0) -> SearchOutcome:
    """Best-first over lower bounds: classes are expanded (memory bisected, windows formed)
    and windows evaluated in bound order, until no class or window left can beat the k-th best
    distinct plan found. Then CP-SAT selects the top k. A time limit stops it early, and the
    status then says the answer is not proven (``feasible``)."""
    t0 = time.perf_counter()
    bf = _BestFirst(req)
    proven = bf.run(deadline=t0 + time_limit_s)
    e = bf.e
    best = np.arange(len(e.key))
    # Only the best groups can be among the top k: hand CP-SAT a superset of them.
    n_cand = CANDIDATES_PER_PLAN * req.top
    if len(best) > n_cand:
        best = best[np.argsort(e.key, kind="stable")[:n_cand]]
    _fill_memory(req, bf.cls, e, best)
    left = time_limit_s - (time.perf_counter() - t0)
    status, picked_local = solve_top_k(req, bf.table, bf.cls, e, best, left)
    if not proven:
        status = "feasible" if picked_local else "unknown"
    stats = {"classes": len(bf.cls), "classes_expanded": bf.cpos, "windows_evaluated": bf.windows_evaluated,
             "columns_evaluated": bf.evaluated_cols, "groups": len(best),
             "seconds": time.perf_counter() - t0}
    return SearchOutcome(status, bf.cls, e, [int(best[j]) for j in picked_local], stats)


class _BestFirst:
    """The state of the best-first expansion: classes in bound order, pending windows, the
    columns evaluated so far and the k-th best key (the threshold nothing worse can pass)."""

    def __init__(self, req: SearchRequest):
        self.req = req
        self.cls = build_classes(req)
        self.table = gpu_table(req)
        self.lat = build_lattice(req, self.table, self.cls)
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

    def run(self, *, deadline: float) -> bool:
        """Expand until nothing left can beat the threshold (True: proven) or the deadline passes."""
        while True:
            next_class = self.lb0_sorted[self.cpos] if self.cpos < len(self.corder) else np.inf
            next_window = self.pend_lb.min() if len(self.pend_lb) else np.inf
            if min(next_class, next_window) > self.threshold or (next_class == np.inf and next_window == np.inf):
                return True
            if time.perf_counter() > deadline:
                return False
            if next_window <= next_class:
                self._evaluate_windows(next_class)
            else:
                self._expand_classes()

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
        self.e = _reduce(self.cls, [self.e, evaluated])
        self.evaluated_cols += int(sizes[:n_take].sum())
        self.windows_evaluated += n_take
        self.pend_c, self.pend_s = self.pend_c[rest], self.pend_s[rest]
        self.pend_e, self.pend_lb = self.pend_e[rest], self.pend_lb[rest]
        self.threshold = _kth_key(self.e, np.arange(len(self.e.key)), self.req.top)

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


def _fill_memory(req: SearchRequest, cls: Classes, e: Evaluated, rows: np.ndarray) -> None:
    """Exact memory and host bytes of the candidate columns whose figures were skipped or
    bounded (see ``evaluate``)."""
    if not len(rows):
        return
    todo = rows[(e.ev["memory_bytes"][rows] < 0) | (e.ev["host_bytes"][rows] < 0)]
    if len(todo):
        c = {k: v[e.cls_index[todo]] for k, v in cls.a.items()}
        mem, host = memory_total(req, c, e.ev["dp"][todo], e.ev["grad_accum"][todo])
        e.ev["memory_bytes"][todo], e.ev["host_bytes"][todo] = mem, host


def solve_top_k(req, table, cls, e: Evaluated, best: np.ndarray, time_limit_s: float) -> tuple[str, list[int]]:
    """CP-SAT over the best column of each group; returns indices into ``best``."""
    if len(best) == 0:
        return "infeasible", []
    ev = {k: v[best] for k, v in e.ev.items()}
    g = cls.a["gpu"][e.cls_index[best]]
    a = {k: cls.a[k][e.cls_index[best]] for k in ("offload", "zero", "tp", "pp", "cp", "ep")}
    zero_eff = np.where(ev["dp"] * a["cp"] > 1, a["zero"], 0)
    # The lexicographic order as ranks (small integers): relaxation tier and objective (the
    # key), then, among equals, the cheaper plan per hour (for fewest GPUs or shortest time; the
    # faster for a cost objective), then the simpler plan: no offload, a lower ZeRO stage, fewer
    # model-parallel ranks, then the catalog's order.
    if req.objective in ("gpus", "time"):
        second = np.where(np.isfinite(ev["hourly_usd"]), ev["hourly_usd"], np.inf)
    else:
        second = ev["time_s"]
    order = np.lexsort((g, a["tp"] * a["pp"] * a["cp"] * a["ep"], zero_eff, a["offload"], second, e.key[best]))
    rank = np.empty(len(best), dtype=np.int64)
    rank[order] = np.arange(len(best))
    cols = Columns(
        gpu=g, group=np.arange(len(best)), tier=np.zeros(len(best), dtype=np.int64), objective=rank,
        memory_bytes=ev["memory_bytes"].astype(np.int64) if len(best) else np.zeros(0, dtype=np.int64),
        gpus=ev["gpus"] if len(best) else np.zeros(0, dtype=np.int64),
        cost_units=cost_units(ev["cost_usd"]).astype(np.int64) if req.budget_usd is not None else None,
        time_ms=time_ms(ev["time_s"]).astype(np.int64) if req.deadline_s is not None else None,
        host_bytes=(ev["host_bytes"] * np.minimum(ev["gpus"], table.gpus_per_node[g])).astype(np.int64)
        if len(best) else None,
    )
    limits = Limits(
        usable_bytes={i: int(u) for i, u in enumerate(table.usable_bytes)},
        max_gpus=req.max_gpus,
        fleet=None if req.fleet is None else {i: int(table.limit[i]) for i in range(len(req.gpus))},
        budget_units=None if req.budget_usd is None else budget_units(req.budget_usd),
        deadline_ms=None if req.deadline_s is None else deadline_ms(req.deadline_s),
        host_bytes={i: int(h) for i, h in enumerate(table.host_bytes_per_node) if np.isfinite(h)},
    )
    return top_k(cols, limits, req.top, max(0.05, time_limit_s))


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
