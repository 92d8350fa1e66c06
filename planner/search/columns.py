"""Evaluated columns (classes at data-parallel degrees): which fit, an admissible lower bound of
the objective per window of degrees, windows evaluated and merged, and the best column of each
distinct-plan group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.perf.flops import model_flops
from planner.perf.timing import JOB_STARTUP_S, billed_gpus, step_time_s
from planner.search.cpsat import (
    TIER_WEIGHT,
    budget_units,
    cost_units,
    deadline_ms,
    objective_units,
    time_ms,
)
from planner.search.evaluate import (
    GpuTable,
    evaluate,
    grad_accum_of,
    memory_total,
    perf_rows,
    step_args,
)
from planner.search.request import SearchRequest
from planner.search.space import Classes

#: Columns evaluated per batch: the first batch is small (the bound often stops the search
#: after it), later ones double up to the largest, which bounds the arrays' size.
FIRST_BATCH_COLUMNS = 20_000
BATCH_COLUMNS = 200_000
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
        x = step_args(req, a, dp=np.ones_like(g), grad_accum=ga, offload=np.zeros_like(g), zero=np.zeros_like(g),
                      intra_only=True)
        # GRPO's trainer states moved out for generation are sharded by ZeRO, which the bound
        # leaves out: their transfer only adds to it.
        x["gen_rollout_offload"] = 0
        step = step_time_s(model_flops(req.model), perf, **x)
        per_token_s = step / (x["micro_batch"] * ga * a["seq_len"])  # seconds per token per pipeline
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


def evaluate_windows(req, table, cls, lat, win_cls, win_start, win_end, known_to_fit=False,
                     apply: bool = True) -> Evaluated:
    """The columns of the windows with their metrics; with ``apply`` only those every constraint
    allows (the rest counted by reason), else all of them without their memory (CP-SAT applies
    the constraints; :func:`region` fills memory in for the plans it keeps)."""
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
    ev = evaluate(req, table, c, dp, known_to_fit=known_to_fit, host_upper=host_upper, memory=apply)
    if not apply:
        key = cls.a["tier"][ci] * float(TIER_WEIGHT) + objective_units(req.objective, ev)
        return Evaluated(ci, ev, key, _group_ids(req, cls, ci, ev["dp"]), {})
    masks = feasible(req, ev)
    ok = np.ones(total, dtype=bool)
    rejected: dict[str, int] = {}
    for name, mask in masks.items():
        rejected[name] = int((ok & ~mask).sum())
        ok &= mask
    sel = np.flatnonzero(ok) if apply else np.arange(total)
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


def kth_key(e: Evaluated, best: np.ndarray, k: int) -> float:
    if len(best) < k:
        return np.inf
    return float(np.partition(e.key[best], k - 1)[k - 1])


def reduce_parts(cls: Classes, parts: list[Evaluated]) -> Evaluated:
    """Merge evaluated columns, keeping only each group's best (all that can matter)."""
    merged = concat_evaluated(parts)
    if len(merged.key) == 0:
        return merged
    keep = best_per_group(cls, merged)
    keep = keep[np.argsort(merged.key[keep], kind="stable")]
    return Evaluated(merged.cls_index[keep], {k: v[keep] for k, v in merged.ev.items()},
                     merged.key[keep], merged.group[keep], merged.rejected)


def take_rows(e: Evaluated, rows: np.ndarray) -> Evaluated:
    return Evaluated(e.cls_index[rows], {k: v[rows] for k, v in e.ev.items()}, e.key[rows], e.group[rows],
                     dict(e.rejected))
