"""Every metric of the search's columns (a class at a data-parallel degree): memory per phase of a
step from the profile's own formulas, host bytes, GPUs and nodes, time and cost from the time
model, and the constraint flags, on numpy arrays (the same formulas as planner estimate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.core.arrays import unique_rows
from planner.memory.breakdown import GENERATION_RECIPE, STACK_RECIPE
from planner.memory.estimate import usable_bytes
from planner.memory.generation import engine_fits, engine_share, phase_limit
from planner.memory.profiles import memory_components
from planner.perf.arguments import forwards_beside_training, step_arguments
from planner.perf.flops import model_flops
from planner.perf.hardware import GpuPerf
from planner.perf.timing import billed_gpus, job_cost_usd, job_time_s, step_time_s
from planner.search.request import CLASS_KEYS, SearchRequest, gpu_limit


@dataclass
class GpuTable:
    """Per GPU type arrays (indexed by the class's ``gpu``)."""

    usable_bytes: np.ndarray
    #: What a step may hold while a colocated engine sleeps (phases named with ``ASLEEP_SUFFIX``):
    #: the card without the engine's share.
    asleep_usable_bytes: np.ndarray
    host_bytes_per_node: np.ndarray  # inf where unknown
    gpus_per_node: np.ndarray
    whole_node: np.ndarray
    limit: np.ndarray
    perf: GpuPerf
    perf_low: GpuPerf  # utilisation at the catalog's low prior
    perf_high: GpuPerf


def gpu_table(req: SearchRequest) -> GpuTable:
    reserve = req.rs.overrides.reserve
    rs = req.rs
    share = engine_share(rs.workload, rs.layout)

    def usable(g, engine: float) -> int:
        """What a plan's phase may hold on this card beside ``engine`` (its share): none where a
        colocated engine cannot start."""
        if not engine_fits(rs.model, rs.workload, rs.layout, g.memory_bytes):
            return -1
        return usable_bytes(g.memory_bytes, rs.profile, reserve, engine)

    def perf(which: str) -> GpuPerf:
        rows = []
        for g in req.gpus:
            util = {"mid": req.utilization, "low": g.utilization_low, "high": g.utilization_high}[which]
            rows.append(GpuPerf.of(g, util))
        return GpuPerf(*(np.array([getattr(r, f) for r in rows], dtype=float)
                         for f in GpuPerf.__dataclass_fields__))

    return GpuTable(
        usable_bytes=np.array([usable(g, share) for g in req.gpus], dtype=np.int64),
        asleep_usable_bytes=np.array([usable(g, 0.0) for g in req.gpus], dtype=np.int64),
        host_bytes_per_node=np.array([g.host_ram_budget_bytes for g in req.gpus]),
        gpus_per_node=np.array([g.gpus_per_node for g in req.gpus], dtype=np.int64),
        whole_node=np.array([g.whole_node_only for g in req.gpus]),
        limit=np.array([gpu_limit(req, g) for g in req.gpus], dtype=np.int64),
        perf=perf("mid"), perf_low=perf("low"), perf_high=perf("high"),
    )


def perf_rows(perf: GpuPerf, gpu_idx: np.ndarray) -> GpuPerf:
    return GpuPerf(*(np.asarray(getattr(perf, f))[gpu_idx] for f in GpuPerf.__dataclass_fields__))


def grad_accum_of(req: SearchRequest, micro_batch: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """Gradient-accumulation steps: global_batch / (micro_batch · dp), or the scenario's value."""
    if req.global_batch:
        return req.global_batch // (micro_batch * dp)
    return np.full(np.shape(dp), req.grad_accum, dtype=np.int64)


def memory_total(req: SearchRequest, c: dict[str, np.ndarray], dp: np.ndarray, ga: np.ndarray) -> tuple:
    """(bytes per GPU a plan must fit, host bytes per GPU), exactly as ``planner estimate`` sums them."""
    mem = memory_of(req, c, dp, ga)
    return mem["total"], mem["host"]


def memory_of(req: SearchRequest, c: dict[str, np.ndarray], dp: np.ndarray, ga: np.ndarray) -> dict[str, Any]:
    """``total`` and ``host`` bytes per GPU, and ``phases``: the bytes each phase of a step must
    fit (the search's one memory constraint per phase; the largest is ``total``).

    The seed profile is evaluated on the arrays directly. Other profiles evaluate each distinct
    layout once per search (the GPU type changes memory only through the recipe keys it decides,
    :data:`~planner.memory.breakdown.CARD_RECIPE`, so rows repeat across types and across the
    bisection's probes): results are kept in ``req.memory_cache``."""
    x = {k: c[k] for k in CLASS_KEYS if k not in ("gpu", "tier", "stack") and (k != "ep" or req.model.moe is not None)}
    x.update(lora_rank=np.full(np.shape(dp), req.rs.workload.lora_rank), dp=dp, grad_accum=ga)
    if req.rs.layout.etp is not None:  # the experts' own TP, pinned for every class
        x["etp"] = np.full(np.shape(dp), req.rs.layout.etp)
    # the stack's recipe where memory depends on it
    for key in STACK_RECIPE:
        if req.stack_sets(key) and (key not in GENERATION_RECIPE or req.rs.workload.generates):
            x[key] = req.stack_recipe(key, c["stack"])
    # the card's, where the scenario leaves it to the card: FP8 weights' transposed copies
    rec = req.rs.recipe
    if req.rs.profile != "seed" and req.rs.workload.fp8 and rec.fp8_params and rec.fp8_transpose_cache is None:
        x["fp8_transpose_cache"] = np.array([g.keeps_fp8_transpose for g in req.gpus], dtype=np.int64)[c["gpu"]]

    def run(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        return memory_components(req.rs.profile, req.model, req.rs.overrides,
                                 base=(req.rs.workload, req.rs.layout, req.rs.recipe), **arrays)

    if req.rs.profile == "seed":
        comps = run(x)
        shape = np.shape(dp)
        return {"total": np.broadcast_to(comps["total"], shape), "host": np.broadcast_to(comps["host"], shape),
                "phases": {k: np.broadcast_to(v, shape) for k, v in comps["phases"].items()}}
    keys = sorted(x)
    stacked = np.stack([np.broadcast_to(np.asarray(x[k], dtype=np.int64), np.shape(dp)) for k in keys], axis=1)
    uniq, inverse = unique_rows(stacked)
    rows = [tuple(r) for r in uniq.tolist()]
    cache = req.memory_cache
    missing = [i for i, r in enumerate(rows) if r not in cache]
    if missing:
        comps = run({k: uniq[missing, j] for j, k in enumerate(keys)})
        for n, i in enumerate(missing):
            cache[rows[i]] = (int(comps["total"][n]), int(comps["host"][n]),
                              {k: int(v[n]) for k, v in comps["phases"].items() if v[n] > 0})
    hits = [cache[r] for r in rows]
    inverse = inverse.reshape(-1)
    names = sorted({name for h in hits for name in h[2]})
    return {"total": np.array([h[0] for h in hits], dtype=np.int64)[inverse],
            "host": np.array([h[1] for h in hits], dtype=np.int64)[inverse],
            "phases": {n: np.array([h[2].get(n, 0) for h in hits], dtype=np.int64)[inverse] for n in names}}


def step_args(req: SearchRequest, c: dict[str, np.ndarray], *, dp: Any, grad_accum: Any,
              offload: Any = None, zero: Any = None, intra_only: bool = False) -> dict[str, Any]:
    """The time model's arguments for columns ``c`` (planner.perf.arguments.step_arguments), for
    the search and its best-first bound. ``offload``/``zero`` replace the columns' own (the
    bound takes none); ``intra_only`` prices every group at the in-node link."""
    x = step_arguments(
        req.rs, method=c["method"], checkpointing=c["checkpointing"],
        offload=c["offload"] if offload is None else offload, zero=c["zero"] if zero is None else zero,
        seq_len=c["seq_len"], micro_batch=c["micro_batch"], grad_accum=grad_accum, tp=c["tp"], pp=c["pp"],
        cp=c["cp"], ep=c["ep"], dp=dp, attention=c["attention"], fused=req.fused(c["stack"]),
        native_attention=req.stack_recipe("native_attention", c["stack"]), selective_op=req.selective_op(c["stack"]),
        optimizer=c["optimizer"], intra_only=intra_only, kernel_vectors=req.kernel_vectors(c["stack"]))
    if req.rs.workload.generates:  # the stack's engine phases, where the scenario leaves them to it
        for key, arg in (("generation_sleep", "gen_sleep"), ("rollout_offload", "gen_rollout_offload")):
            if req.stack_sets(key):
                x[arg] = req.stack_recipe(key, c["stack"])
        if req.stack_sets("logprob_forward"):
            x["reference_forward"] = forwards_beside_training(req.rs.workload,
                                                              req.stack_recipe("logprob_forward", c["stack"]))
    return x


def evaluate(req: SearchRequest, table: GpuTable, c: dict[str, np.ndarray], dp: np.ndarray,
             *, known_to_fit: bool = False, host_upper: np.ndarray | None = None,
             memory: bool = True) -> dict[str, np.ndarray]:
    """Every metric and constraint flag of columns (classes ``c`` at data-parallel degree ``dp``).

    ``known_to_fit``: the caller has established that every column fits in memory (the search
    starts each class at its smallest fitting degree); profiles without an array form then skip
    the per-column memory (marked −1, filled in for the few columns that become candidates) and
    take the offloaded host bytes from ``host_upper`` (their value at a smaller degree: host
    bytes per GPU never rise with dp), computing them exactly only where that bound fails the
    node's host RAM. ``memory=False`` skips memory altogether (−1; the flags say nothing fits)."""
    g = c["gpu"]
    ga = grad_accum_of(req, c["micro_batch"], dp)
    mp = c["tp"] * c["pp"] * c["cp"]
    gpus = dp * mp
    node = table.gpus_per_node[g]
    billed = billed_gpus(gpus + req.rs.layout.generation_gpus, node, table.whole_node[g])  # GRPO's served engine too
    host_exact = True
    phases = None
    if not memory:  # the caller fills memory in for the columns it keeps (planner.search.candidates)
        mem = host = np.full(np.shape(dp), -1, dtype=np.int64)
    elif known_to_fit and req.rs.profile != "seed":
        mem = np.full(np.shape(dp), -1, dtype=np.int64)
        host = np.zeros(np.shape(dp), dtype=np.int64) if host_upper is None else host_upper.copy()
        host_exact = False
        # The bound times a full node is within the node's RAM: every column passes as it is.
        over = np.flatnonzero(host * node > table.host_bytes_per_node[g])
        if len(over):
            host[over] = memory_total(req, {k: v[over] for k, v in c.items()}, dp[over], ga[over])[1]
    else:
        memory_ = memory_of(req, c, dp, ga)
        mem, host, phases = memory_["total"], memory_["host"], memory_["phases"]
    mf = model_flops(req.model)
    x = step_args(req, c, dp=dp, grad_accum=ga)
    out = {"dp": dp, "grad_accum": ga, "gpus": gpus, "billed_gpus": billed, "memory_bytes": mem,
           "host_bytes": host if host_exact else np.full(np.shape(dp), -1, dtype=np.int64)}
    sequences = x["micro_batch"]  # per micro-batch, as the time model counts them (a DPO pair: 2)
    tokens_per_step = sequences * dp * ga * c["seq_len"]
    for label, perf in (("", table.perf), ("_slow", table.perf_low), ("_fast", table.perf_high)):
        rows = perf_rows(perf, g)
        step = step_time_s(mf, rows, **x)
        out["step_s" + label] = step
        if req.tokens is not None:
            t = job_time_s(step, tokens=req.tokens, seq_len=c["seq_len"], micro_batch=sequences,
                           dp=dp, grad_accum=ga)
            out["time_s" + label] = t
            out["cost_usd" + label] = job_cost_usd(t, gpus=billed, price_usd_per_hour=rows.price_usd_per_hour)
    out["tokens_per_s"] = tokens_per_step / out["step_s"]
    out["hourly_usd"] = billed * perf_rows(table.perf, g).price_usd_per_hour
    out["fits"], out["host_ok"] = memory_flags(table, g, gpus, mem, host, phases)
    out["ga_ok"] = ga >= 1
    return out


def host_bytes_per_node(table: GpuTable, g: np.ndarray, gpus: np.ndarray, host: np.ndarray) -> np.ndarray:
    """Offloaded bytes of the GPUs a plan puts on one node (each GPU's ``host`` bytes)."""
    return host * np.minimum(gpus, table.gpus_per_node[g])


def phase_usable(table: GpuTable, phase: str) -> np.ndarray:
    """What ``phase`` may hold on each GPU type: a step phase while a colocated engine sleeps the
    card without the engine's share, any other the card less it (the same for every phase
    without generation)."""
    return phase_limit(phase, table.usable_bytes, table.asleep_usable_bytes)


def within_card(table: GpuTable, g: np.ndarray, phases: dict[str, np.ndarray]) -> np.ndarray:
    """Whether every phase of each column fits its card (``phases`` from :func:`memory_of`)."""
    ok = np.ones(np.shape(g), dtype=bool)
    for name, values in phases.items():
        ok &= values <= phase_usable(table, name)[g]
    return ok


def binding_phase(table: GpuTable, g: np.ndarray, phases: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, usable bytes) of each column's phase nearest its limit, by the share of the limit it
    takes (a card whose engine cannot start, usable -1, binds before any)."""
    best_ratio = np.full(np.shape(g), -np.inf)
    need = np.zeros(np.shape(g), dtype=np.int64)
    usable = np.zeros(np.shape(g), dtype=np.int64)
    for name, values in phases.items():
        limit = phase_usable(table, name)[g]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(limit > 0, values / np.maximum(limit, 1), np.inf)
        better = ratio > best_ratio
        best_ratio = np.where(better, ratio, best_ratio)
        need, usable = np.where(better, values, need), np.where(better, limit, usable)
    return need, usable


def memory_flags(table: GpuTable, g: np.ndarray, gpus: np.ndarray, mem: np.ndarray,
                 host: np.ndarray, phases: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(fits on the card, offloaded bytes of a node's GPUs fit its host RAM) of each column: every
    phase within its usable bytes where ``phases`` are given, else the total (-1 where known to fit)."""
    fits = within_card(table, g, phases) if phases is not None else mem <= table.usable_bytes[g]
    return fits, host_bytes_per_node(table, g, gpus, host) <= table.host_bytes_per_node[g]
