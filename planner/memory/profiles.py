"""The memory profiles, in one registry: the only place that chooses between them.

Each profile gives one layout's breakdown (what ``planner estimate`` prints) and the same numbers
for many layouts at once (what the search evaluates); the search, the estimate and the checker all
come through here, so a plan is always judged by the formula its estimate shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.core.entries import ModelSpec
from planner.core.specs import Layout, Overrides, Recipe, Workload
from planner.memory.breakdown import MemoryBreakdown, dpo_codes
from planner.memory.detailed import detailed_memory
from planner.memory.detailed_array import detailed_components
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
    return seed_array_memory(model, overrides, **x, **dpo_codes(workload))


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
    """One layout's per-GPU memory under profile ``name``."""
    return profile(name).one(model, workload, layout, overrides, recipe=recipe, dp=dp, grad_accum=grad_accum)


def memory_components(name: str, model: ModelSpec, overrides: Overrides, *,
                      base: tuple[Workload, Layout, Recipe] | None = None, **x: Any) -> dict[str, Any]:
    """Per-GPU memory of many layouts at once (arrays broadcast): ``total`` (the bytes a plan
    must fit), ``host`` (offloaded bytes) and ``phases`` (those of each phase of a step; the
    largest is ``total``). ``base`` (the scenario's workload, layout and recipe) supplies the
    details the arrays lack."""
    workload, layout, recipe = base if base is not None else (Workload(), Layout(), Recipe())
    return profile(name).many(model, overrides, workload=workload, layout=layout, recipe=recipe, **x)
