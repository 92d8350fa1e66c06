"""Plans as results: the search's chosen columns become full, checkable plans.

A plan's ``memory`` is ``planner estimate`` run on the plan itself (the scenario with every
decision pinned), so what a plan reports is exactly what the estimator says of it.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from planner.catalog.stacks import get_stack
from planner.core.units import nodes_for
from planner.memory.breakdown import GENERATION_RECIPE, STACK_RECIPE, decode_class
from planner.memory.estimate import Estimate, estimate_resolved
from planner.scenario.files import deep_merge
from planner.scenario.resolve import ResolvedScenario, resolve
from planner.search.candidates import SearchOutcome
from planner.search.request import SearchRequest


class Band(BaseModel):
    """Low–high range implied by the catalog's utilisation priors (high utilisation = low time)."""

    low: float | None
    high: float | None


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)

    rank: int
    #: The training stack that runs this plan (catalogs/stacks.yaml), the first that runs all of it.
    stack: str
    gpu: str
    gpus: int
    nodes: int
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    #: The experts' own tensor parallelism (Megatron-Core's MoE parallel folding), as the scenario
    #: pins it; None: the experts split like the dense layers.
    etp: int | None = None
    sp: bool
    zero: int
    offload: str
    micro_batch: int
    grad_accum: int
    global_batch: int
    seq_len: int
    method: str
    optimizer: str
    precision: str
    attention: str
    checkpointing: str
    lora_rank: int | None
    #: ``planner estimate`` of the plan itself (its pinned scenario).
    memory: Estimate
    hourly_usd: float | None
    time_s: float | None
    cost_usd: float | None
    time_s_band: Band
    cost_usd_band: Band
    tokens_per_s: float
    relaxations: list[str]
    #: The recipe the plan was estimated and timed with: the loss's implementation, the kernels
    #: and torch.compile, from the scenario where it sets them, else from the stack.
    recipe: dict[str, Any] = {}
    #: GRPO: where its completions are generated, in words (None for other algorithms), and the
    #: GPUs (of the plan's type, billed with it) an engine served apart takes beside ``gpus``.
    generation: str | None = None
    generation_gpus: int = 0
    #: The scenario with this plan's decisions pinned (what `planner export` turns into configs).
    pinned_scenario: dict[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        """The plan as one flat row: its decisions, memory per GPU, time and cost."""
        return {"rank": self.rank, "stack": self.stack, "gpu": self.gpu, "gpus": self.gpus, "nodes": self.nodes,
                **{k: getattr(self, k) for k in ROW_FIELDS},
                "memory_bytes": self.memory.total_bytes, "usable_bytes": self.memory.usable_bytes,
                "headroom_bytes": self.memory.headroom_bytes, "verdict": self.memory.verdict,
                "relaxations": "; ".join(self.relaxations)}


#: The plan's own fields of :meth:`Plan.row` (and of ``planner batch``'s records).
ROW_FIELDS = ("generation_gpus", "dp", "tp", "pp", "cp", "sp", "zero", "offload", "micro_batch", "grad_accum",
              "global_batch", "seq_len", "method", "precision", "checkpointing", "attention", "time_s", "cost_usd", "hourly_usd",
              "tokens_per_s")


class PlanResult(BaseModel):
    status: str  # optimal | feasible | infeasible
    scenario: str
    objective: str
    plans: list[Plan]
    explanation: dict[str, Any] | None = None
    stats: dict[str, float] = {}
    #: Problems the independent checker found in plans the search returned; such plans are dropped.
    checker_rejected: list[str] = []
    #: What ``--config`` read (key, value, the config key it came from) and what it warned about.
    read_from_configs: list[dict[str, Any]] | None = None
    config_warnings: list[str] = []

    def to_frame(self):
        """The plans as a pandas DataFrame, one row per plan (:meth:`Plan.row`); empty when none."""
        import pandas as pd

        return pd.DataFrame([p.row() for p in self.plans])


def _num(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


#: Scenario keys that ask for a search; a plan (or any single layout) is estimated without them.
PLAN_ONLY_KEYS = ("search", "constraints", "objective", "top", "time_limit_s")
#: The layout decisions a plan fixes.
PINNED_LAYOUT_KEYS = ("gpu", "gpus", "dp", "tp", "pp", "cp", "ep", "etp", "sp", "zero", "offload",
                      "checkpointing", "attention")
#: The recipe a plan reports (:attr:`Plan.recipe`): the loss's implementation, the kernels,
#: torch.compile, what selective checkpointing reruns, the gradients' dtype and how the optimizer
#: steps. A seed plan's pinned scenario does not
#: take them from the stack (the seed profile models none of them); the stack's sharding keys are
#: pinned under either profile.
PLAN_RECIPE = ("loss", "kernels", "compile", "selective", "grad_dtype", "optimizer_step")
#: Transformer Engine's FP8 storage keys a plan reports where its scenario turns them on.
FP8_RECIPE = ("fp8_params", "fp8_attention", "fp8_activation_store")


def stack_recipe_pins(raw: dict[str, Any], stack: str) -> dict[str, Any]:
    """The recipe keys a plan on ``stack`` pins: the stack's, where the scenario's ``recipe:`` does
    not set the key (under the seed profile its sharding keys only; GRPO's keys for GRPO only)."""
    generates = raw.get("workload", {}).get("algorithm") == "grpo"
    return {key: getattr(get_stack(stack).recipe, key) for key in STACK_RECIPE
            if key not in raw.get("recipe", {})
            and (key not in PLAN_RECIPE + GENERATION_RECIPE or raw.get("profile") != "seed")
            and (key not in GENERATION_RECIPE or generates)}


def with_stack_recipe(raw: dict[str, Any], stack: str) -> dict[str, Any]:
    """``raw`` estimated as ``stack`` runs it: its recipe pinned where the scenario's ``recipe:``
    leaves a key unset, as a plan naming that stack pins it (:func:`stack_recipe_pins`)."""
    from planner.catalog.store import UnknownName
    from planner.core.errors import InputError

    try:
        st = get_stack(stack)
    except UnknownName as exc:
        raise InputError([f"stack: {exc.args[0]}"]) from None
    pins = stack_recipe_pins(raw, st.id)
    return deep_merge(raw, {"recipe": pins}) if pins else raw


def pinned_layout(fields: dict[str, Any]) -> dict[str, Any]:
    """The layout keys a plan (or a layout the search found) pins, those it sets (an expert TP of
    the experts' own only where the scenario gives one)."""
    return {k: fields[k] for k in PINNED_LAYOUT_KEYS if fields.get(k) is not None}


def plan_scenario(raw: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """The user's scenario with every decision of a plan pinned: what `estimate` checks."""
    out = copy.deepcopy(raw)
    for key in PLAN_ONLY_KEYS:
        out.pop(key, None)
    wl = {k: fields[k] for k in ("method", "precision", "optimizer", "seq_len", "micro_batch", "grad_accum")}
    if raw.get("workload", {}).get("global_batch") is None:
        wl["global_batch"] = None
    lay = pinned_layout(fields)
    rec = stack_recipe_pins(raw, fields["stack"]) if "stack" in fields else {}
    out = deep_merge(out, {"workload": wl, "layout": lay, **({"recipe": rec} if rec else {})})
    if out["workload"].get("global_batch") is None:
        out["workload"].pop("global_batch", None)
    allow = out["workload"].get("allow_relax")
    if allow is not None:
        out["workload"]["allow_relax"] = []
    return out


def generation_text(rs: ResolvedScenario) -> str | None:
    """Where a GRPO plan generates: ``vLLM colocated (tp 1, 30 % of each GPU)``; None otherwise."""
    wl, lay = rs.workload, rs.layout
    if not wl.generates:
        return None
    where = "colocated" if not lay.generation_gpus else f"on {lay.generation_gpus} GPUs of its own"
    turns = ""
    if not lay.generation_gpus and rs.recipe.generation_sleep:
        turns = ", asleep while the step trains" + (
            ", trainer's states in host memory while it generates" if rs.recipe.rollout_offload else "")
    return (f"vLLM {where} (tp {lay.generation_tp}, {lay.engine_memory_fraction:.0%} of each GPU{turns}); "
            f"{wl.num_generations} × {wl.completion_len}-token completions per prompt")


def recipe_text(recipe: dict[str, Any], checkpointing: str | None = None) -> str:
    """What a plan's recipe changes from the plain one (standard loss and kernels, no compile,
    op-level selective checkpointing, 16-bit storage, the parameters' gradient dtype, a
    multi-tensor optimizer step): ``compiled loss, fused_rmsnorm``; empty
    when nothing. What selective checkpointing reruns is said for a selective plan only."""
    parts = []
    if recipe.get("loss", "standard") != "standard":
        parts.append(f"{recipe['loss']} loss")
    if recipe.get("kernels", "standard") != "standard":
        parts.append(str(recipe["kernels"]))
    if recipe.get("compile"):
        parts.append("compile")
    if checkpointing == "selective" and recipe.get("selective", "op") != "op":
        parts.append(f"{recipe['selective']} recompute")
    if recipe.get("grad_dtype") == "fp32":
        parts.append("FP32 gradients")
    if recipe.get("optimizer_step") == "for_loop":
        parts.append("one-tensor optimizer step")
    parts += [key.replace("_", " ") for key in FP8_RECIPE if recipe.get(key)]
    return ", ".join(parts)


def assemble(req: SearchRequest, raw: dict[str, Any], outcome: SearchOutcome) -> list[Plan]:
    cls, e = outcome.cls, outcome.evaluated
    plans = []
    for rank, j in enumerate(outcome.picked, start=1):
        i = int(e.cls_index[j])
        a = {k: int(v[i]) for k, v in cls.a.items()}
        ev = {k: v[j] for k, v in e.ev.items()}
        gpu = req.gpus[a["gpu"]]
        tier = req.tiers[a["tier"]]
        fields = {"stack": req.stacks[a["stack"]].id, "gpu": gpu.id, "gpus": int(ev["gpus"]), "dp": int(ev["dp"]),
                  "grad_accum": int(ev["grad_accum"]), "etp": req.rs.layout.etp, **decode_class(a)}
        pinned = plan_scenario(raw, fields)
        rs_plan = resolve(pinned)
        est = estimate_resolved(rs_plan)
        if est.total_bytes != int(ev["memory_bytes"]):
            raise AssertionError(
                f"search memory {int(ev['memory_bytes'])} ≠ estimate {est.total_bytes} for plan {fields}")
        has_time = "time_s" in ev
        plans.append(Plan(
            rank=rank, nodes=nodes_for(fields["gpus"], gpu.gpus_per_node),
            global_batch=fields["micro_batch"] * fields["dp"] * fields["grad_accum"],
            lora_rank=req.rs.workload.lora_rank if fields["method"] != "full" else None,
            memory=est,
            hourly_usd=_num(ev["hourly_usd"]),
            time_s=_num(ev["time_s"]) if has_time else None,
            cost_usd=_num(ev["cost_usd"]) if has_time else None,
            time_s_band=Band(low=_num(ev["time_s_fast"]), high=_num(ev["time_s_slow"])) if has_time
            else Band(low=None, high=None),
            cost_usd_band=Band(low=_num(ev["cost_usd_fast"]), high=_num(ev["cost_usd_slow"])) if has_time
            else Band(low=None, high=None),
            tokens_per_s=float(ev["tokens_per_s"]),
            relaxations=list(tier.relaxations),
            generation=generation_text(rs_plan), generation_gpus=rs_plan.layout.generation_gpus,
            recipe={**{k: getattr(rs_plan.recipe, k) for k in PLAN_RECIPE},
                    **{k: True for k in FP8_RECIPE if rs_plan.workload.fp8 and getattr(rs_plan.recipe, k)}},
            pinned_scenario=pinned,
            **fields,
        ))
    return plans
