"""The plan checker: recomputes a plan from scratch and lists every rule it breaks.

Independent of the search: it never looks at candidate tables, the solver or the search's
builders. From the plan and the catalog alone it re-derives, with its own small formulas, the
GPU and node counts, the batch identity, the pinned choices and allowed relaxations, the price
of the hour and the cost (billed GPUs × price × time), and applies every layout rule
(planner.scenario.legality, the rules' one home). It calls the estimators only for what they
alone define: memory (``planner estimate`` of the plan's pinned scenario) and the step time
(planner.perf.timing's model, with planner.perf.arguments's arguments). An empty list means valid.
"""

from __future__ import annotations

import math
from typing import Any

from planner import catalog
from planner.catalog.stacks import get_stack, stacks
from planner.catalog.store import UnknownName
from planner.core.codes import ATTENTION, CHECKPOINTING, METHODS, OFFLOADS
from planner.core.entries import GpuSpec
from planner.core.errors import InputError
from planner.core.specs import Scenario
from planner.core.values import DEFAULT_MAX_GPUS
from planner.memory.estimate import estimate_resolved
from planner.memory.generation import engine_fits
from planner.perf.arguments import selective_is_op, step_arguments
from planner.perf.flops import model_flops
from planner.perf.hardware import GpuPerf
from planner.perf.timing import job_time_s, step_time_s
from planner.scenario import legality
from planner.scenario.resolve import resolve, uneven_pp_allowed
from planner.search.cpsat import budget_units, cost_units, deadline_ms, time_ms
from planner.search.request import METHOD_LADDER, MIN_RELAXED_SEQ_LEN
from planner.search.results import Plan, plan_scenario

#: Relative tolerance when comparing a plan's reported time and cost with the recomputation.
REL_TOL = 1e-9


def check_plan(raw: dict[str, Any], plan: Plan | dict[str, Any]) -> list[str]:
    """Every rule the plan breaks, recomputed from scratch; an empty list means valid."""
    p = plan.model_dump() if isinstance(plan, Plan) else dict(plan)
    sc = Scenario.model_validate(raw)
    try:
        get_stack(str(p.get("stack")))
    except UnknownName:
        return [f"stack {p.get('stack')!r} is not in the catalog"]
    try:
        rs = resolve(plan_scenario(raw, p))
    except InputError as exc:
        return [f"plan is not a valid layout: {line}" for line in exc.problems]
    est, gpu = estimate_resolved(rs), rs.gpu
    assert gpu is not None  # a plan names its GPU type, so its pinned scenario resolves one
    engine = ([] if engine_fits(rs.model, rs.workload, rs.layout, gpu.memory_bytes) else
              ["generation: the engine's share cannot hold its weights and one sequence's KV cache"])
    return [*_memory_problems(gpu, est, p), *engine, *_count_problems(gpu, p), *_layout_problems(sc, rs, p),
            *_choice_problems(sc, gpu, p), *_workload_problems(sc, p), *_time_cost_problems(sc, rs, p)]


def _memory_problems(gpu: GpuSpec, est, p: dict[str, Any]) -> list[str]:
    """Memory is exactly the estimate of the plan, within the card; offload within host RAM."""
    problems = []
    if not est.within_usable:
        problems.append(f"memory: needs {est.total_bytes} bytes, usable {est.usable_bytes}")
    if p["memory"]["total_bytes"] != est.total_bytes:
        problems.append(f"memory: plan says {p['memory']['total_bytes']}, estimate says {est.total_bytes}")
    if est.host_bytes and est.host_bytes * min(p["gpus"], gpu.gpus_per_node) > gpu.host_ram_budget_bytes:
        problems.append("offloaded states exceed the node's host RAM")
    return problems


def _nodes(gpu: GpuSpec, gpus: int) -> int:
    """Nodes the GPUs take: ⌈GPUs / GPUs per node⌉."""
    return -(-gpus // gpu.gpus_per_node)


def _billed_gpus(gpu: GpuSpec, gpus: int) -> int:
    """GPUs paid for: whole nodes where the card is rented only so."""
    return _nodes(gpu, gpus) * gpu.gpus_per_node if gpu.whole_node_only else gpus


def _count_problems(gpu: GpuSpec, p: dict[str, Any]) -> list[str]:
    """GPUs = dp·tp·pp·cp (experts split within dp); nodes = ⌈GPUs / GPUs per node⌉."""
    problems = []
    if p["gpus"] != p["dp"] * p["tp"] * p["pp"] * p["cp"]:
        problems.append("gpus ≠ dp·tp·pp·cp")
    problems.extend(legality.problems([legality.ep_dp(p["dp"], p.get("ep", 1), tp=p["tp"], cp=p["cp"],
                                                       etp=p.get("etp"))], {"ep": p.get("ep", 1)},
                                      prefix="", sep=" "))
    if "nodes" in p and p["nodes"] != _nodes(gpu, p["gpus"]):
        problems.append(f"nodes {p['nodes']} ≠ ⌈{p['gpus']} / {gpu.gpus_per_node}⌉")
    return problems


def _layout_problems(sc: Scenario, rs, p: dict[str, Any]) -> list[str]:
    """Every layout rule (planner.scenario.legality) on the plan's values, and the card's BF16."""
    gpu, model, pcie = rs.gpu, rs.model, sc.constraints.pcie_model_parallel
    rules = [*legality.tp_rules(model, gpu, p["tp"], pcie_model_parallel=pcie),
             *legality.pp_rules(model, gpu, p["pp"], uneven=uneven_pp_allowed(rs.scenario),
                                pcie_model_parallel=pcie),
             legality.cp_sequence(p["seq_len"], p["cp"]),
             legality.ep_moe(model, p.get("ep", 1)), legality.ep_experts(model, p.get("ep", 1)),
             *legality.offload_rules(p["zero"], p["offload"])]
    if p.get("etp") is not None:
        rules.extend(legality.etp_rules(model, p["etp"]))
    problems = legality.problems(rules, {**p, "ep": p.get("ep", 1)}, prefix="", sep=" ")
    if p["precision"] == "bf16" and not gpu.supports_bf16:
        problems.append(f"bf16 on {gpu.id}, which has no BF16")
    return problems


def _choice_problems(sc: Scenario, gpu: GpuSpec, p: dict[str, Any]) -> list[str]:
    """Pinned layout keys, allowed GPU types, the GPU limit, the fleet and the global batch."""
    problems = []
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
    used = p["gpus"] + p.get("generation_gpus", 0)  # training, and a GRPO engine served apart
    if used > max_gpus:
        problems.append(f"gpus {used} > max_gpus {max_gpus}")
    if cons.fleet:  # an empty fleet is no fleet, as the search reads it
        have = {catalog.get_gpu(k).id: v for k, v in cons.fleet.items()}.get(gpu.id, 0)
        if used > have:
            problems.append(f"fleet has {have} × {gpu.id}, plan uses {used}")
    sequences = p["micro_batch"] * p["dp"] * p["grad_accum"]
    if p.get("global_batch") is not None and sequences != p["global_batch"]:
        problems.append("micro_batch·dp·grad_accum ≠ global_batch")
    if sc.workload.global_batch and sequences != sc.workload.global_batch:
        problems.append(f"micro_batch·dp·grad_accum = {sequences}, the scenario's global batch is "
                        f"{sc.workload.global_batch}")
    return [*problems, *_stack_problems(sc, gpu, p)]


def _stack_problems(sc: Scenario, gpu: GpuSpec, p: dict[str, Any]) -> list[str]:
    """The plan names an allowed stack, and that stack runs every part of it."""
    allowed = [get_stack(n).id for n in sc.search.stacks] if sc.search.stacks else [st.id for st in stacks()]
    if p.get("stack") not in allowed:
        return [f"stack {p.get('stack')!r} is not among the allowed stacks {allowed}"]
    runs = legality.stack_runs(get_stack(p["stack"]), vendor=gpu.vendor, quant_type=sc.workload.quant_type,
                               method=p["method"], tp=p["tp"], pp=p["pp"], cp=p["cp"], ep=p["ep"], sp=p["sp"],
                               zero=p["zero"], offload=p["offload"], checkpointing=p["checkpointing"],
                               saved_modules=bool(sc.workload.modules_to_save), algorithm=sc.workload.algorithm,
                               served=bool(p.get("generation_gpus")), etp=p.get("etp"))
    return [] if bool(runs) else [f"stack {p['stack']} does not run this plan's combination"]


def _allowed_methods(sc: Scenario) -> set[str]:
    """What may be trained: as asked, the scenario's search list, and, where relaxing is allowed,
    the cheaper methods after it (Full → LoRA → QLoRA)."""
    user = sc.workload
    out: set[str] = {user.method, *(sc.search.method or [])}
    if "method" in user.allow_relax and user.method in METHOD_LADDER:
        out |= set(METHOD_LADDER[METHOD_LADDER.index(user.method):])
    return out


def _allowed_seq_lens(sc: Scenario) -> set[int]:
    """As asked, the search list, and, where relaxing is allowed, each halving down to the floor."""
    user = sc.workload
    out = {user.seq_len, *(sc.search.seq_len or [])}
    if "seq_len" in user.allow_relax:
        out |= {user.seq_len >> k for k in range(1, 64) if user.seq_len >> k >= MIN_RELAXED_SEQ_LEN}
    return out


def _workload_problems(sc: Scenario, p: dict[str, Any]) -> list[str]:
    """What is trained: the user's choices, or only what the scenario allows, reported as such."""
    user, s, problems = sc.workload, sc.search, []
    for key, allowed_values in (("optimizer", s.optimizer), ("precision", s.precision)):
        if p[key] not in (allowed_values or [getattr(user, key)]):
            problems.append(f"{key} {p[key]!r} is neither the scenario's nor in search.{key}")
    if p["method"] not in _allowed_methods(sc) or p["seq_len"] not in _allowed_seq_lens(sc):
        problems.append(f"method {p['method']} / seq_len {p['seq_len']} is not what was asked nor an allowed relaxation")
    taken = ([f"method: {user.method} → {p['method']}"] if p["method"] != user.method else []) + \
        ([f"seq_len: {user.seq_len} → {p['seq_len']}"] if p["seq_len"] != user.seq_len else [])
    if list(p["relaxations"]) != taken:
        problems.append(f"relaxations reported {p['relaxations']}, taken {taken}")
    return problems


def _time_cost_problems(sc: Scenario, rs, p: dict[str, Any]) -> list[str]:
    """Time (the throughput model), the hour's price and the cost (billed GPUs × price × hours);
    budget and deadline."""
    user, cons, gpu = sc.workload, sc.constraints, rs.gpu
    price = gpu.price_on_demand_usd_per_hour
    billed = _billed_gpus(gpu, p["gpus"] + p.get("generation_gpus", 0))
    hourly = billed * price if price is not None else None
    problems: list[str] = []
    if p.get("hourly_usd") is not None and (hourly is None or not math.isclose(p["hourly_usd"], hourly,
                                                                                 rel_tol=REL_TOL)):
        problems.append(f"hourly: plan says {p['hourly_usd']}, {billed} × {price} = {hourly}")
    if user.tokens is None:
        return problems
    stack = get_stack(p["stack"])
    x = step_arguments(
        rs, method=METHODS.index(p["method"]), checkpointing=CHECKPOINTING.index(p["checkpointing"]),
        offload=OFFLOADS.index(p["offload"]), zero=p["zero"], seq_len=p["seq_len"],
        micro_batch=p["micro_batch"], grad_accum=p["grad_accum"], tp=p["tp"], pp=p["pp"], cp=p["cp"],
        ep=p["ep"], dp=p["dp"], attention=ATTENTION.index(p["attention"]),
        fused=int(stack.recipe.fused_kernels or rs.recipe.compile), optimizer=p["optimizer"],
        native_attention=int(stack.recipe.native_attention),
        selective_op=int(selective_is_op(sc.recipe.selective if "selective" in sc.recipe.model_fields_set
                                         else stack.recipe.selective)))
    step = step_time_s(model_flops(rs.model), GpuPerf.of(gpu, sc.search.utilization), None, **x)
    t = float(job_time_s(step, tokens=user.tokens, seq_len=p["seq_len"], micro_batch=x["micro_batch"],
                         dp=p["dp"], grad_accum=p["grad_accum"]))
    cost = t / 3600.0 * billed * price if price is not None else None
    if p["time_s"] is None or not math.isclose(p["time_s"], t, rel_tol=REL_TOL):
        problems.append(f"time: plan says {p['time_s']}, recomputed {t}")
    if cost is not None and (p["cost_usd"] is None or not math.isclose(p["cost_usd"], cost, rel_tol=REL_TOL)):
        problems.append(f"cost: plan says {p['cost_usd']}, recomputed {cost}")
    # the scenario's limits in the units every constraint is stated in (1e-4 USD, ms), rounded as
    # the search rounds them: a cost up, a budget down
    if cons.budget_usd is not None and (cost is None or cost_units(cost) > budget_units(cons.budget_usd)):
        problems.append(f"cost {cost} over the budget {cons.budget_usd}")
    if cons.deadline_hours is not None and time_ms(t) > deadline_ms(cons.deadline_hours * 3600):
        problems.append(f"time {t / 3600:.2f} h past the deadline {cons.deadline_hours} h")
    return problems
