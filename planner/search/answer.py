"""``planner plan``: a scenario in, ranked plans (or an explanation) out."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from planner.scenario.resolve import resolve
from planner.search.candidates import search
from planner.search.checker import check_plan
from planner.search.columns import concat_evaluated, evaluate_windows
from planner.search.evaluate import gpu_table
from planner.search.explain import document_steps, explain
from planner.search.lattice import build_lattice, fitting_windows
from planner.search.request import SearchRequest, build_request
from planner.search.results import Plan, PlanResult, assemble
from planner.search.space import build_classes

#: Most points a Pareto front reports (evenly spread along it when it is longer).
MAX_PARETO_POINTS = 50


def plan_raw(
    raw: dict[str, Any], *, source: str | None = None, base_dir: Path | None = None,
    pareto: bool = False, explain_infeasible: bool = True,
) -> PlanResult:
    started = time.perf_counter()  # the time limit counts reading the scenario too
    if base_dir is not None:
        raw = absolute_model_path(raw, base_dir)  # plans are re-checked from elsewhere
    rs = resolve(raw, source=source, base_dir=base_dir, search=True)
    req = build_request(rs)
    if rs.workload.generates and "generation_gpus" not in rs.scenario.layout.model_fields_set:
        return _best_placement(raw, req, source=source, base_dir=base_dir, explain_infeasible=explain_infeasible,
                               pareto=pareto)
    if pareto:
        if rs.scenario.objective is not None and rs.scenario.objective not in ("cost", "time"):
            from planner.core.errors import InputError

            raise InputError([(f"objective: --pareto trades time against cost; {rs.scenario.objective!r} is "
                              "neither (leave the objective out, or give cost or time)")])
        return pareto_front(req, raw)
    outcome = search(req, time_limit_s=rs.scenario.time_limit_s, started=started)
    plans, rejected = checked(raw, assemble(req, raw, outcome))
    explanation = None
    status = outcome.status if plans else ("infeasible" if outcome.status == "optimal" else outcome.status)
    if status == "infeasible" and explain_infeasible:
        explanation = explain(req, raw, outcome,
                              research=lambda r: plan_raw(r, base_dir=base_dir, explain_infeasible=False))
    elif plans and plans[0].relaxations:
        explanation = {"steps": document_steps(req, raw, plans[0].model_dump())}
    return PlanResult(status=status, scenario=rs.name, objective=req.objective, plans=plans,
                      explanation=explanation, stats=outcome.stats, checker_rejected=rejected)


#: GPUs a GRPO search tries for an engine served apart, beside colocating it on the training GPUs
#: (those that ``generation_tp`` divides and that leave at least one GPU to train on).
GENERATION_GPU_CHOICES = (1, 2, 4, 8, 16)

#: How a plan's objective ranks it across engine placements (smaller first).
_OBJECTIVE_KEY = {
    "cost": lambda p: p.cost_usd, "time": lambda p: p.time_s, "hourly": lambda p: p.hourly_usd,
    "gpus": lambda p: p.gpus + p.generation_gpus,
}


def _best_placement(raw: dict[str, Any], req: SearchRequest, *, source: str | None, base_dir: Path | None,
                    explain_infeasible: bool, pareto: bool = False) -> PlanResult:
    """GRPO with the engine's placement left open: the search solved once per placement (colocated,
    then each count of GPUs of its own), every answer checked, and the plans of all ranked together
    by the objective (or, for ``pareto``, the fronts merged into one). Each placement's search is
    exact, so the best of them is."""
    lay = req.rs.layout
    placements = [0, *(k for k in GENERATION_GPU_CHOICES if k % lay.generation_tp == 0 and k < req.max_gpus)]
    results = []
    for k in placements:
        variant = {**raw, "layout": {**(raw.get("layout") or {}), "generation_gpus": k}}
        results.append(plan_raw(variant, source=source, base_dir=base_dir, pareto=pareto,
                                explain_infeasible=explain_infeasible and k == 0))
    first = results[0]
    if pareto:
        return _merged_front(results, len(placements))
    key = _OBJECTIVE_KEY.get(first.objective)
    ranked = [p for r in results for p in r.plans]
    if key is not None:
        ranked.sort(key=lambda p: (np.inf if key(p) is None else key(p)))
    top = req.rs.scenario.top
    plans = [p.model_copy(update={"rank": i}) for i, p in enumerate(ranked[:top], start=1)]
    statuses = {r.status for r in results if r.plans}
    # the weakest proof among the placements that found plans ("feasible" where a limit stopped one)
    status = ("optimal" if statuses == {"optimal"} else min(statuses - {"optimal"})) if plans else first.status
    stats = {**(first.stats or {}), "placements": float(len(placements))}
    return PlanResult(status=status, scenario=first.scenario, objective=first.objective, plans=plans,
                      explanation=first.explanation if not plans else None, stats=stats,
                      checker_rejected=[line for r in results for line in r.checker_rejected])


def _merged_front(results: list[PlanResult], placements: int) -> PlanResult:
    """The time–cost fronts of several placements as one: the plans no other beats on both."""
    timed = [(p.time_s, p.cost_usd, p) for r in results for p in r.plans
             if p.time_s is not None and p.cost_usd is not None]  # a front needs both (a token budget)
    front: list[Plan] = []
    best = np.inf
    for _, cost, p in sorted(timed, key=lambda t: (t[0], t[1])):
        if cost < best:
            front.append(p)
            best = cost
    if len(front) > MAX_PARETO_POINTS:
        front = [front[i] for i in np.linspace(0, len(front) - 1, MAX_PARETO_POINTS).round().astype(int)]
    plans = [p.model_copy(update={"rank": i}) for i, p in enumerate(front, start=1)]
    return PlanResult(status="optimal" if plans else "infeasible", scenario=results[0].scenario,
                      objective="pareto", plans=plans, stats={"front": float(len(plans)), "placements": float(placements)},
                      checker_rejected=[line for r in results for line in r.checker_rejected])


def checked(raw: dict[str, Any], plans: list[Plan]) -> tuple[list[Plan], list[str]]:
    """Every plan re-checked by the independent checker before anyone sees it: those it rejects
    are dropped (and their problems reported), so a plan shown is a plan that holds."""
    kept: list[Plan] = []
    rejected: list[str] = []
    for plan in plans:
        problems = check_plan(raw, plan)
        if problems:
            rejected.extend(f"{plan.gpu} × {plan.gpus}: {line}" for line in problems)
        else:
            kept.append(plan)
    return kept, rejected


def absolute_model_path(raw: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """A model given as a path relative to its scenario file, made absolute."""
    model = raw.get("model")
    try:
        if isinstance(model, str) and not Path(model).is_absolute() and (Path(base_dir) / model).exists():
            return {**raw, "model": str((Path(base_dir) / model).resolve())}
    except (OSError, ValueError):  # no file system takes it as a path (too long, a NUL byte): a name
        pass
    return raw


def pareto_front(req: SearchRequest, raw: dict[str, Any]) -> PlanResult:
    """Every plan that no other plan beats on both time and cost (each at its best)."""
    if req.tokens is None:
        from planner.core.errors import InputError

        raise InputError(["workload.tokens: required for --pareto (time and cost need a token budget)"])
    cls = build_classes(req)
    table = gpu_table(req)
    lat = build_lattice(req, table, cls)
    wc, ws, we, _ = fitting_windows(req, table, cls, lat)
    keep = ws < we
    wc, ws, we = wc[keep], ws[keep], we[keep]
    parts = []
    step = 5_000
    for b in range(0, len(wc), step):
        part = evaluate_windows(req, table, cls, lat, wc[b:b + step], ws[b:b + step], we[b:b + step])
        parts.append(_front(part))
    e = _front(concat_evaluated(parts)) if parts else concat_evaluated([])
    order = np.lexsort((e.ev["cost_usd"], e.ev["time_s"])) if len(e.key) else np.zeros(0, dtype=np.int64)
    if len(order) > MAX_PARETO_POINTS:
        order = order[np.linspace(0, len(order) - 1, MAX_PARETO_POINTS).round().astype(int)]
    from planner.search.candidates import SearchOutcome

    outcome = SearchOutcome("optimal", cls, e, [int(j) for j in order], {"front": float(len(e.key))})
    plans, rejected = checked(raw, assemble(req, raw, outcome))
    return PlanResult(status="optimal" if plans else "infeasible", scenario=req.rs.name,
                      objective="pareto", plans=plans, stats=outcome.stats, checker_rejected=rejected)


def _front(e):
    """Keep the columns on the time–cost Pareto front (ties keep one)."""
    if len(e.key) == 0:
        return e
    t, c = e.ev["time_s"], e.ev["cost_usd"]
    order = np.lexsort((c, t))
    best_so_far = np.minimum.accumulate(c[order])
    prev = np.concatenate([[np.inf], best_so_far[:-1]])
    on = order[c[order] < prev]
    from planner.search.columns import Evaluated

    return Evaluated(e.cls_index[on], {k: v[on] for k, v in e.ev.items()}, e.key[on], e.group[on], e.rejected)
