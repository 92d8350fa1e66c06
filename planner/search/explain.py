"""Why a request does not fit as asked, and the smallest change that would make it fit.

- ``rejected``: every candidate that was dropped, counted by the rule that dropped it.
- ``closest``: the layout that comes nearest to fitting in memory, and by how much it misses.
- ``steps``: the documents' optimization order (000_… §六) walked on that layout, with the
  memory after each step: FlashAttention and checkpointing; micro-batch 1 with gradient
  accumulation; a cheaper method (Full → LoRA → QLoRA); last, a shorter sequence.
- ``suggestions``: what would make it feasible — more GPUs, another card, an allowed relaxation,
  a larger budget or a later deadline — each found by searching again with that change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from planner.core.errors import InputError
from planner.core.units import format_bytes
from planner.memory.breakdown import decode_class
from planner.memory.estimate import estimate_resolved
from planner.scenario.files import deep_merge
from planner.scenario.resolve import resolve
from planner.search.candidates import SearchOutcome
from planner.search.evaluate import binding_phase, gpu_table, grad_accum_of, memory_of
from planner.search.lattice import build_lattice
from planner.search.request import METHOD_LADDER, MIN_RELAXED_SEQ_LEN, SearchRequest
from planner.search.results import PLAN_ONLY_KEYS, pinned_layout, stack_recipe_pins
from planner.search.space import build_classes


def closest_layout(req: SearchRequest) -> dict[str, Any] | None:
    """The as-asked class that misses memory by the least, at its most sharded GPU count."""
    cls = build_classes(req)
    keep = cls.a["tier"] == 0
    if not keep.any():
        return None
    cls = cls.take(np.flatnonzero(keep))
    table = gpu_table(req)
    lat = build_lattice(req, table, cls)
    ok = lat.count > 0
    if not ok.any():
        return None
    cls = cls.take(np.flatnonzero(ok))
    lat = build_lattice(req, table, cls)
    idx = np.arange(len(cls))
    dp = lat.value(idx, lat.count - 1)
    ga = np.maximum(grad_accum_of(req, cls.a["micro_batch"], dp), 1)
    # each layout's phase nearest its card's limit (a sleeping GRPO engine's two peaks apart)
    mem, usable = binding_phase(table, cls.a["gpu"], memory_of(req, cls.a, dp, ga)["phases"])
    with np.errstate(divide="ignore"):
        ratio = np.where(usable > 0, mem / np.maximum(usable, 1), np.inf)
    best = int(np.lexsort((-cls.a["attention"], mem, ratio))[0])
    a = {k: int(v[best]) for k, v in cls.a.items()}
    gpu = req.gpus[a["gpu"]]
    fields = {k: v for k, v in decode_class(a).items() if k != "optimizer"}
    return {"gpu": gpu.id, "dp": int(dp[best]), "gpus": int(dp[best]) * a["tp"] * a["pp"] * a["cp"], **fields,
            "stack": req.stacks[a["stack"]].id, "memory_bytes": int(mem[best]), "usable_bytes": int(usable[best])}


def _walk_estimate(raw: dict[str, Any], layout: dict[str, Any], change: dict[str, Any]) -> Any:
    """The estimate of ``layout`` (the closest one, with its stack's recipe) after ``change``."""
    scenario = {k: v for k, v in raw.items() if k not in PLAN_ONLY_KEYS}
    pins = stack_recipe_pins(raw, layout["stack"]) if "stack" in layout else {}
    scenario = deep_merge(scenario, {"layout": pinned_layout(layout),
                                     **({"recipe": pins} if pins else {})})
    scenario["workload"] = {k: v for k, v in scenario.get("workload", {}).items()
                            if k not in ("global_batch", "grad_accum", "allow_relax")}
    scenario = deep_merge(scenario, change)
    return estimate_resolved(resolve(scenario))


def document_steps(req: SearchRequest, raw: dict[str, Any], layout: dict[str, Any]) -> list[dict[str, Any]]:
    """000_… §六's order, applied one step after another on ``layout``."""
    wl = req.rs.workload
    gpu = next(g for g in req.gpus if g.id == layout["gpu"])
    user_layout = req.rs.scenario.layout
    state = {
        "layout": {"checkpointing": user_layout.checkpointing if "checkpointing" in user_layout.model_fields_set
                   else "none",
                   "attention": user_layout.attention if "attention" in user_layout.model_fields_set
                   else "eager"},
        "workload": {"micro_batch": wl.micro_batch, "method": wl.method, "seq_len": wl.seq_len},
    }
    plan: list[tuple[str, dict[str, Any]]] = [("as asked", {})]
    plan.append(("1. FlashAttention and activation checkpointing",
                 {"layout": {"attention": "flash" if gpu.supports_flash_attn2 else "eager",
                             "checkpointing": "full"}}))
    plan.append(("2. micro-batch 1, gradient accumulation keeps the global batch",
                 {"workload": {"micro_batch": 1}}))
    if wl.method in METHOD_LADDER:
        for m in METHOD_LADDER[METHOD_LADDER.index(wl.method) + 1:]:
            plan.append((f"3. cheaper method: {m}", {"workload": {"method": m}}))
    seq = wl.seq_len // 2
    while seq >= MIN_RELAXED_SEQ_LEN:
        plan.append((f"4. shorter sequence: {seq}", {"workload": {"seq_len": seq}}))
        seq //= 2
    steps = []
    for label, change in plan:
        state = deep_merge(state, change)
        try:
            est = _walk_estimate(raw, layout, state)
        except InputError:
            continue
        allowed = not label.startswith(("3.", "4.")) or (
            ("method" if label.startswith("3.") else "seq_len") in wl.allow_relax)
        need, usable = _binding(est)
        steps.append({"step": label, "memory_bytes": need, "usable_bytes": usable,
                      "fits": bool(est.within_usable), "allowed": allowed})
        if est.within_usable:
            break
    return steps


def _binding(est: Any) -> tuple[int, int]:
    """(bytes, usable bytes) of the estimate's check nearest its limit: the step's, or the trainer's
    states beside a waking GRPO engine."""
    if est.generation_bytes is None or est.generation_usable_bytes is None:
        return est.total_bytes, est.usable_bytes
    step = est.total_bytes / max(est.usable_bytes, 1)
    if est.generation_bytes / max(est.generation_usable_bytes, 1) > step:
        return est.generation_bytes, est.generation_usable_bytes
    return est.total_bytes, est.usable_bytes


def memory_binding(closest: dict[str, Any], *, gib: bool = False) -> str:
    """Why memory binds, on the closest layout, in GB (or GiB): one unit per message."""
    short = closest["memory_bytes"] - closest["usable_bytes"]
    return (f"memory: the closest layout ({closest['gpus']}× {closest['gpu']}, tp {closest['tp']}, "
            f"pp {closest['pp']}, zero {closest['zero']}, offload {closest['offload']}) needs "
            f"{format_bytes(closest['memory_bytes'], gib=gib)} per GPU, has "
            f"{format_bytes(closest['usable_bytes'], gib=gib)} usable "
            f"(short by {format_bytes(short, gib=gib)})")


def explain(
    req: SearchRequest, raw: dict[str, Any], outcome: SearchOutcome,
    research: Callable[[dict[str, Any]], Any],
) -> dict[str, Any]:
    """Everything known about why nothing fits; ``research`` plans a changed scenario."""
    rejected = dict(outcome.cls.rejected)
    for k, v in outcome.evaluated.rejected.items():
        if v:
            rejected[f"violates {k}"] = rejected.get(f"violates {k}", 0) + v
    out: dict[str, Any] = {"rejected": {k: v for k, v in rejected.items() if v}}
    closest = closest_layout(req)
    if closest is not None:
        short = closest["memory_bytes"] - closest["usable_bytes"]
        out["closest"] = closest
        if short > 0:
            out["peak_note"] = _eval_binds(req, raw, closest)
            out["binding"] = memory_binding(closest) + out["peak_note"]
            out["steps"] = document_steps(req, raw, closest)
        else:
            out["binding"] = ("memory fits on some layouts; a constraint rules them out: "
                              + ", ".join(k for k in rejected if k.startswith("violates")))
    out["suggestions"] = suggestions(req, raw, research)
    return out


def _eval_binds(req: SearchRequest, raw: dict[str, Any], closest: dict[str, Any]) -> str:
    """Where the closest layout's peak is the evaluation pass, say so."""
    n = req.rs.workload.eval_micro_batch
    if not n:
        return ""
    try:
        est = _walk_estimate(raw, closest, {})
    except InputError:
        return ""
    if "peak phase: evaluation" not in est.assumptions:
        return ""
    return f"; its peak is the evaluation pass at workload.eval_micro_batch {n}"


def suggestions(req: SearchRequest, raw: dict[str, Any], research: Callable) -> list[str]:
    sc = req.rs.scenario
    found: list[str] = []

    def attempt(label: str, change: dict[str, Any], drop: tuple[str, ...] = ()) -> None:
        trial = deep_merge(raw, change)
        for path in drop:
            section, key = path.split(".")
            trial.get(section, {}).pop(key, None)
        trial = deep_merge(trial, {"top": 1})
        result = research(trial)
        if result.plans:
            p = result.plans[0]
            extra = f", {'; '.join(p.relaxations)}" if p.relaxations else ""
            if p.cost_usd is not None and p.time_s is not None:
                extra += f"; ${p.cost_usd:,.2f} in {p.time_s / 3600:,.1f} h"
            found.append(f"{label}: {p.gpus}× {p.gpu} (tp {p.tp}, pp {p.pp}, zero {p.zero}, "
                         f"offload {p.offload}{extra})")

    if sc.search.max_gpus or sc.constraints.fleet or "gpus" in sc.layout.model_fields_set:
        attempt("more GPUs", {"objective": "gpus"}, drop=("search.max_gpus", "constraints.fleet", "layout.gpus",
                                                          "layout.dp"))
    if sc.search.gpu_types or "gpu" in sc.layout.model_fields_set or sc.constraints.fleet:
        attempt("another card", {"objective": "gpus"}, drop=("search.gpu_types", "layout.gpu",
                                                             "constraints.fleet"))
    n_eval = req.rs.workload.eval_micro_batch
    if n_eval and n_eval > 1:
        attempt(f"evaluation at batch 1 (workload.eval_micro_batch, now {n_eval})",
                {"workload": {"eval_micro_batch": 1}})
    missing = [r for r in ("method", "seq_len") if r not in req.rs.workload.allow_relax]
    if missing:
        attempt(f"allow_relax {missing}", {"workload": {"allow_relax": ["method", "seq_len"]}})
    if sc.constraints.budget_usd is not None:
        attempt("a larger budget", {}, drop=("constraints.budget_usd",))
    if sc.constraints.deadline_hours is not None:
        attempt("a later deadline", {}, drop=("constraints.deadline_hours",))
    return found
