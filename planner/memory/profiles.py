"""The memory profiles, in one registry: the only place that chooses between them.

Each profile gives one layout's breakdown (what ``planner estimate`` prints) and the same numbers
for many layouts at once (what the search evaluates); the search, the estimate and the checker all
come through here, so a plan is always judged by the formula its estimate shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from planner.core.entries import ModelSpec
from planner.core.specs import Layout, Overrides, Recipe, Workload
from planner.memory.breakdown import MemoryBreakdown, dpo_codes
from planner.memory.detailed import detailed_memory
from planner.memory.detailed_array import detailed_components
from planner.memory.generation import (
    ENGINE_ASLEEP_BYTES,
    GENERATION_PHASE,
    engine_phases,
    is_asleep_phase,
    is_generation_phase,
)
from planner.memory.seed import seed_array_memory, seed_memory


@dataclass(frozen=True)
class Profile:
    name: str
    #: (model, workload, layout, overrides, recipe=, dp=, grad_accum=) -> MemoryBreakdown
    one: Callable[..., MemoryBreakdown]
    #: (model, overrides, workload=, layout=, recipe=, **arrays) -> {"total", "host", "phases"} arrays
    many: Callable[..., dict[str, Any]]


def _seed_one(model: ModelSpec, workload: Workload, layout: Layout, overrides: Overrides, *,
              recipe: Recipe, dp: int, grad_accum: int | None) -> MemoryBreakdown:
    """The seed profile: the documents' rules, which no stack's recipe changes."""
    return seed_memory(model, workload, layout, overrides, dp=dp, grad_accum=grad_accum)


def _seed_many(model: ModelSpec, overrides: Overrides, *, workload: Workload, layout: Layout,
               recipe: Recipe, **x: Any) -> dict[str, Any]:
    return seed_array_memory(model, overrides, **x, **dpo_codes(workload),
                             at_rest=workload.generates and not layout.generation_gpus)


PROFILES: dict[str, Profile] = {
    "seed": Profile("seed", _seed_one, _seed_many),
    "detailed": Profile("detailed", detailed_memory, detailed_components),
}


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"profile {name!r}: must be one of {', '.join(PROFILES)}") from None


def memory_breakdown(name: str, model: ModelSpec, workload: Workload, layout: Layout,
                     overrides: Overrides, *, recipe: Recipe, dp: int,
                     grad_accum: int | None) -> MemoryBreakdown:
    """One layout's per-GPU memory under profile ``name``, its phases as the card holds them beside
    a colocated generation engine (:func:`~planner.memory.generation.engine_phases`; what a
    sleeping engine keeps is the component ``engine_asleep``)."""
    mem = profile(name).one(model, workload, layout, overrides, recipe=recipe, dp=dp, grad_accum=grad_accum)
    phases = engine_phases(mem.phase_bytes or {"step": mem.total_bytes}, workload, layout,
                           sleep=recipe.generation_sleep, offload=recipe.rollout_offload)
    if not mem.phase_bytes and phases == {"step": mem.total_bytes}:
        return mem
    components, predicted = dict(mem.components), mem.predicted
    if any(is_asleep_phase(k) for k in phases):
        components["engine_asleep"] = ENGINE_ASLEEP_BYTES
        if predicted:  # the card holds it beside the trainer's memory, as nvidia-smi shows it
            predicted = {**predicted, **{k: predicted[k] + ENGINE_ASLEEP_BYTES
                                         for k in ("device_bytes", "needed_bytes") if k in predicted}}
    return replace(mem, components=components, phase_bytes=phases, predicted=predicted)


def memory_components(name: str, model: ModelSpec, overrides: Overrides, *,
                      base: tuple[Workload, Layout, Recipe] | None = None, **x: Any) -> dict[str, Any]:
    """Per-GPU memory of many layouts at once (arrays broadcast): ``total`` (the bytes a plan
    must fit), ``host`` (offloaded bytes) and ``phases`` (those of each phase of a step; the
    largest is ``total``). ``base`` (the scenario's workload, layout and recipe) supplies the
    details the arrays lack."""
    workload, layout, recipe = base if base is not None else (Workload(), Layout(), Recipe())
    out = profile(name).many(model, overrides, workload=workload, layout=layout, recipe=recipe, **x)
    if not any(is_generation_phase(k) for k in out["phases"]):
        return out
    phases = engine_phases(out["phases"], workload, layout,
                           sleep=x.get("generation_sleep", recipe.generation_sleep),
                           offload=x.get("rollout_offload", recipe.rollout_offload))
    steps = [np.asarray(v, dtype=np.int64) for k, v in phases.items() if k != GENERATION_PHASE]
    shape = np.shape(out["total"])
    return {**out, "total": np.broadcast_to(np.maximum.reduce(steps), shape) if steps else out["total"],
            "phases": {k: np.broadcast_to(np.asarray(v, dtype=np.int64), shape) for k, v in phases.items()}}
