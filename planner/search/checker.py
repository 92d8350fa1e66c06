"""The plan checker: recomputes a plan from scratch and lists every rule it breaks.

Independent of the search: it never looks at candidate tables or the solver. It rebuilds the
plan as a scenario, estimates its memory with ``planner estimate``, recomputes time and cost with
the throughput model, and checks every constraint of the scenario. An empty list means valid.
"""

from __future__ import annotations

import math
from typing import Any

from planner import catalog
from planner.catalog.stacks import get_stack, stacks
from planner.core.errors import InputError
from planner.core.specs import DEFAULT_MAX_GPUS, Scenario
from planner.memory.breakdown import ATTENTION, CHECKPOINTING, METHODS, OFFLOADS
from planner.memory.estimate import estimate_resolved
from planner.perf.flops import model_flops
from planner.perf.hardware import GpuPerf
from planner.perf.timing import billed_gpus, job_cost_usd, job_time_s, step_time_s
from planner.scenario.legality import pp_gpu_fault, stack_runs, tp_gpu_fault
from planner.scenario.resolve import resolve
from planner.search.cpsat import budget_units, cost_units, deadline_ms, time_ms
from planner.search.results import Plan, plan_scenario
from planner.search.space import METHOD_LADDER, adapter_traffic_of, build_tiers, n_lora_of, saved_modules_of

#: Relative tolerance when comparing a plan's reported time and cost with the recomputation.
REL_TOL = 1e-9


def check_plan(raw: dict[str, Any], plan: Plan | dict[str, Any]) -> list[str]:
    """Every rule the plan breaks, recomputed from scratch; an empty list means valid."""
    p = plan.model_dump() if isinstance(plan, Plan) else dict(plan)
    sc = Scenario.model_validate(raw)
    try:
        rs = resolve(plan_scenario(raw, p))
    except InputError as exc:
        return [f"plan is not a valid layout: {line}" for line in exc.problems]
    est = estimate_resolved(rs)
    rs_user = resolve(raw)
    return [*_layout_problems(sc, rs, est, p), *_choice_problems(sc, rs, est, p),
            *_workload_problems(sc, rs_user, p), *_time_cost_problems(sc, rs, rs_user, p)]


def _layout_problems(sc: Scenario, rs, est, p: dict[str, Any]) -> list[str]:
    """Memory (exactly the estimate of the plan), the layout's arithmetic and the card's limits."""
    gpu, problems = rs.gpu, []
    if not est.within_usable:
        problems.append(f"memory: needs {est.total_bytes} bytes, usable {est.usable_bytes}")
    if p["memory"]["total_bytes"] != est.total_bytes:
        problems.append(f"memory: plan says {p['memory']['total_bytes']}, estimate says {est.total_bytes}")
    if p["gpus"] != p["dp"] * p["tp"] * p["pp"] * p["cp"]:
        problems.append("gpus ≠ dp·tp·pp·cp")
    pcie = sc.constraints.pcie_model_parallel
    for key, fault in (("tp", tp_gpu_fault(gpu, p["tp"], pcie_model_parallel=pcie)),
                       ("pp", pp_gpu_fault(gpu, p["pp"], pcie_model_parallel=pcie))):
        if fault:
            problems.append(f"{key} {p[key]} {fault}")
    if p["precision"] == "bf16" and not gpu.supports_bf16:
        problems.append(f"bf16 on {gpu.id}, which has no BF16")
    if est.host_bytes and est.host_bytes * min(p["gpus"], gpu.gpus_per_node) > gpu.host_ram_budget_bytes:
        problems.append("offloaded states exceed the node's host RAM")
    return problems


def _choice_problems(sc: Scenario, rs, est, p: dict[str, Any]) -> list[str]:
    """Pinned layout keys, allowed GPU types, the GPU limit, the fleet and the global batch."""
    gpu, problems = rs.gpu, []
    for key in sorted(sc.layout.model_fields_set & set(p)):
        want = getattr(sc.layout, key)
        if key == "gpu":
            want = catalog.get_gpu(want).id
        if want is not None and p[key] != want:
            problems.append(f"layout.{key} is pinned to {want!r}, the plan has {p[key]!r}")
    s, cons = sc.search, sc.constraints
    allowed = s.gpu_types or ([sc.layout.gpu] if sc.layout.gpu else None)
    if allowed and gpu.id not in {catalog.get_gpu(n).id for n in allowed}:
        problems.append(f"gpu {gpu.id} is not among the allowed types")
    max_gpus = s.max_gpus or DEFAULT_MAX_GPUS
    if p["gpus"] > max_gpus:
        problems.append(f"gpus {p['gpus']} > max_gpus {max_gpus}")
    if cons.fleet is not None:
        have = {catalog.get_gpu(k).id: v for k, v in cons.fleet.items()}.get(gpu.id, 0)
        if p["gpus"] > have:
            problems.append(f"fleet has {have} × {gpu.id}, plan uses {p['gpus']}")
    gb = rs.workload.global_batch
    if gb and p["micro_batch"] * p["dp"] * p["grad_accum"] != gb:
        problems.append("micro_batch·dp·grad_accum ≠ global_batch")
    return [*problems, *_stack_problems(sc, rs, p)]


def _stack_problems(sc: Scenario, rs, p: dict[str, Any]) -> list[str]:
    """The plan names an allowed stack, and that stack runs every part of it."""
    allowed = [get_stack(n).id for n in sc.search.stacks] if sc.search.stacks else [st.id for st in stacks()]
    if p.get("stack") not in allowed:
        return [f"stack {p.get('stack')!r} is not among the allowed stacks {allowed}"]
    runs = stack_runs(get_stack(p["stack"]), vendor=rs.gpu.vendor, quant_type=rs.workload.quant_type,
                      method=p["method"], tp=p["tp"], pp=p["pp"], cp=p["cp"], ep=p["ep"], sp=p["sp"],
                      zero=p["zero"], offload=p["offload"], checkpointing=p["checkpointing"],
                      saved_modules=bool(rs.workload.modules_to_save))
    return [] if bool(runs) else [f"stack {p['stack']} does not run this plan's combination"]


def _workload_problems(sc: Scenario, rs_user, p: dict[str, Any]) -> list[str]:
    """What is trained: the user's choices, or only the relaxations the scenario allows."""
    user, s, problems = sc.workload, sc.search, []
    for key, allowed_values in (("optimizer", s.optimizer), ("precision", s.precision)):
        if p[key] not in (allowed_values or [getattr(user, key)]):
            problems.append(f"{key} {p[key]!r} is neither the scenario's nor in search.{key}")
    tiers = {(t.method, t.seq_len): t for t in build_tiers(rs_user)}
    tier = tiers.get((p["method"], p["seq_len"]))
    if tier is None:
        problems.append(f"method {p['method']} / seq_len {p['seq_len']} is not what was asked nor an allowed relaxation")
    elif list(tier.relaxations) != list(p["relaxations"]):
        problems.append(f"relaxations reported {p['relaxations']}, taken {list(tier.relaxations)}")
    if (user.method in METHOD_LADDER and p["method"] in METHOD_LADDER and "method" not in user.allow_relax
            and p["method"] != user.method and not (s.method and p["method"] in s.method)):
        problems.append("method changed without allow_relax: method")
    return problems


def _time_cost_problems(sc: Scenario, rs, rs_user, p: dict[str, Any]) -> list[str]:
    """Time and cost recomputed with the throughput model; budget and deadline."""
    user, cons, gpu = sc.workload, sc.constraints, rs.gpu
    problems: list[str] = []
    if user.tokens is None:
        return problems
    perf = GpuPerf.of(gpu, sc.search.utilization)
    sequences = p["micro_batch"] * user.sequences_per_sample  # a DPO pair is two sequences
    dpo = {"reference_forward": 1} if user.reference_forward else {}
    step = step_time_s(
        model_flops(rs.model), perf, None, method=METHODS.index(p["method"]),
        checkpointing=CHECKPOINTING.index(p["checkpointing"]), offload=OFFLOADS.index(p["offload"]),
        zero=p["zero"], seq_len=p["seq_len"], micro_batch=sequences, grad_accum=p["grad_accum"], **dpo,
        tp=p["tp"], pp=p["pp"], cp=p["cp"], ep=p["ep"], dp=p["dp"], n_lora=n_lora_of_plan(rs_user, p),
        **saved_modules_of(rs_user), **adapter_traffic_of(rs_user),
        attention=ATTENTION.index(p["attention"]),
        fp8=int(bool(rs.workload.fp8)), fused=int(get_stack(p["stack"]).fused_kernels or rs.workload.compile),
        vp=rs.layout.pp_virtual_stages if rs.layout.pp_schedule == "interleaved" else 1)
    t = float(job_time_s(step, tokens=user.tokens, seq_len=p["seq_len"], micro_batch=sequences,
                         dp=p["dp"], grad_accum=p["grad_accum"]))
    billed = int(billed_gpus(p["gpus"], gpu.gpus_per_node, gpu.whole_node_only))
    price = gpu.price_on_demand_usd_per_hour
    cost = float(job_cost_usd(t, gpus=billed, price_usd_per_hour=price)) if price is not None else None
    if p["time_s"] is None or not math.isclose(p["time_s"], t, rel_tol=REL_TOL):
        problems.append(f"time: plan says {p['time_s']}, recomputed {t}")
    if cost is not None and (p["cost_usd"] is None or not math.isclose(p["cost_usd"], cost, rel_tol=REL_TOL)):
        problems.append(f"cost: plan says {p['cost_usd']}, recomputed {cost}")
    if cons.budget_usd is not None and (cost is None or cost_units(cost) > budget_units(cons.budget_usd)):
        problems.append(f"cost {cost} over the budget {cons.budget_usd}")
    if cons.deadline_hours is not None and time_ms(t) > deadline_ms(cons.deadline_hours * 3600):
        problems.append(f"time {t / 3600:.2f} h past the deadline {cons.deadline_hours} h")
    return problems


def n_lora_of_plan(rs_user, p: dict[str, Any]) -> float:
    """Trainable adapter parameters of the plan (0 for full fine-tuning)."""
    return 0.0 if p["method"] == "full" else n_lora_of(rs_user)
