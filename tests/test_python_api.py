"""The Python API as a user imports it: every name of ``__all__``, and ``plan``'s search lists
read as the CLI and a scenario's ``search:`` read them."""

from __future__ import annotations

import planner
from planner.search.answer import plan_raw

BASE = {"model": "llama-3.1-8b", "workload": {"method": "lora", "tokens": 1e8}, "top": 5,
        "search": {"gpu_types": ["h100"], "max_gpus": 8}}


def test_every_exported_name_imports():
    namespace: dict = {}
    exec("from planner import *", namespace)  # noqa: S102  (what a user's star import does)
    assert set(planner.__all__) <= set(namespace)
    for name in ("Plan", "PlanResult", "Estimate", "Scenario", "InputError"):
        assert isinstance(getattr(planner, name), type), name


def test_search_lists_are_lists_to_choose_from():
    """``plan(tp=[1, 2])`` is what ``--tp 1,2`` and ``search: {tp: [1, 2]}`` are: the search's
    choices, not a pinned layout; a scalar is a list of one."""
    listed = planner.plan(model="llama-3.1-8b", method="lora", tokens=1e8, gpu_types=["h100"], max_gpus=8,
                          tp=[1, 2], zero=3, top=5)
    scenario = plan_raw({**BASE, "search": {**BASE["search"], "tp": [1, 2], "zero": [3]}})
    assert [(p.gpu, p.gpus, p.tp, p.zero, p.cost_usd) for p in listed.plans] == \
        [(p.gpu, p.gpus, p.tp, p.zero, p.cost_usd) for p in scenario.plans]
    assert listed.plans and {p.zero for p in listed.plans} == {3} and {p.tp for p in listed.plans} <= {1, 2}
    pinned = planner.plan(model="llama-3.1-8b", method="lora", tokens=1e8, gpu_types=["h100"], max_gpus=8, tp=2)
    assert pinned.plans and {p.tp for p in pinned.plans} == {2}


def test_plan_memory_is_an_estimate_and_plans_a_frame():
    """A plan's ``memory`` is the Estimate of its pinned scenario (read as attributes or, as its
    JSON, by key); ``to_frame()`` is one row per plan with the plan's decisions and figures."""
    result = planner.plan(model="llama-3.1-8b", method="lora", tokens=1e8, gpu_types=["h100"], max_gpus=8, top=3)
    p = result.plans[0]
    assert isinstance(p.memory, planner.Estimate)
    assert p.memory.total_bytes == p.memory["total_bytes"] == planner.estimate(p.pinned_scenario).total_bytes
    assert p.memory.get("no-such-field", 7) == 7
    frame = result.to_frame()
    assert list(frame["rank"]) == [q.rank for q in result.plans]
    assert list(frame["memory_bytes"]) == [q.memory.total_bytes for q in result.plans]
    assert list(frame["cost_usd"]) == [q.cost_usd for q in result.plans] and frame.loc[0, "gpu"] == p.gpu
    assert planner.PlanResult.model_validate_json(result.model_dump_json()).plans[0].memory == p.memory
