"""The checker catches a planted wrong plan of each kind: it re-derives counts, the batch
identity, legality, the allowed choices and price × time on its own, so a plan that is wrong in
any one of them is flagged, and the same plan unchanged is not."""

from __future__ import annotations

import copy

import pytest

from planner.search.answer import plan_raw
from planner.search.checker import check_plan

RAW = {"model": "llama-3.1-8b", "workload": {"method": "lora", "seq_len": 2048, "global_batch": 16, "tokens": 1e8},
       "search": {"gpu_types": ["h100"], "max_gpus": 8, "optimizer": ["adamw"]}, "top": 1}


@pytest.fixture(scope="module")
def good() -> dict:
    result = plan_raw(copy.deepcopy(RAW))
    assert result.plans, result.explanation
    return result.plans[0].model_dump()


def test_the_plan_as_returned_passes(good):
    assert check_plan(RAW, good) == []


def _scaled(key, factor):
    return lambda p: {key: p[key] * factor}


#: (what is planted, the change, a word the checker's message must hold)
PLANTED = [
    ("GPU count", lambda p: {"gpus": p["gpus"] + 1}, "gpus"),
    ("node count", lambda p: {"nodes": p["nodes"] + 1}, "nodes"),
    ("batch identity", lambda p: {"grad_accum": p["grad_accum"] * 2}, "global_batch"),
    ("plan's own batch", lambda p: {"global_batch": p["global_batch"] * 2}, "global_batch"),
    ("TP dividing no heads", lambda p: {"tp": 3, "gpus": 3 * p["dp"] * p["pp"] * p["cp"]}, "tp"),
    ("offload without ZeRO", lambda p: {"zero": 0, "offload": "optimizer"}, "offload"),
    ("memory figure", lambda p: {"memory": {**p["memory"], "total_bytes": p["memory"]["total_bytes"] - 1}}, "memory"),
    ("time", _scaled("time_s", 1.01), "time"),
    ("cost", _scaled("cost_usd", 0.99), "cost"),
    ("price of the hour", _scaled("hourly_usd", 2), "hourly"),
    ("relaxation reported", lambda p: {"relaxations": ["seq_len: 4096 → 2048"]}, "relaxations"),
    ("method not allowed", lambda p: {"method": "qlora", "relaxations": ["method: lora → qlora"]}, "method"),
    ("sequence not allowed", lambda p: {"seq_len": 1024, "relaxations": ["seq_len: 2048 → 1024"]}, "seq_len"),
    ("optimizer not allowed", lambda p: {"optimizer": "sgd"}, "optimizer"),
    ("stack unknown", lambda p: {"stack": "no-such-stack"}, "stack"),
    ("GPU type not allowed", lambda p: {"gpu": "a100-80gb"}, "allowed types"),
    ("BF16 on a card without it", lambda p: {"gpu": "v100-32gb", "precision": "bf16"}, "bf16"),
    ("over max_gpus", lambda p: {"dp": 16, "gpus": 16 * p["tp"] * p["pp"] * p["cp"], "micro_batch": 1,
                                 "grad_accum": 1}, "max_gpus"),
]


@pytest.mark.parametrize("what,change,word", PLANTED, ids=[x[0] for x in PLANTED])
def test_a_planted_wrong_plan_is_flagged(good, what, change, word):
    bad = {**good, **change(good)}
    problems = check_plan(RAW, bad)
    assert problems, f"{what}: not flagged"
    assert any(word in line for line in problems), problems


@pytest.mark.parametrize("limit,word", [({"budget_usd": 0.01}, "budget"), ({"deadline_hours": 0.01}, "deadline"),
                                        ({"fleet": {"a100-80gb": 8}}, "fleet")])
def test_a_plan_outside_the_scenario_constraints_is_flagged(good, limit, word):
    """The same plan checked against a scenario whose budget, deadline or fleet it breaks."""
    raw = {**RAW, "constraints": limit}
    assert any(word in line for line in check_plan(raw, good))


def test_a_stack_the_scenario_does_not_allow_is_flagged(good):
    from planner.catalog.stacks import stacks

    other = next(st.id for st in stacks() if st.id != good["stack"])
    raw = {**RAW, "search": {**RAW["search"], "stacks": [good["stack"]]}}
    assert check_plan(raw, good) == []
    assert any("allowed stacks" in line for line in check_plan(raw, {**good, "stack": other}))


def test_the_budget_is_checked_in_the_units_the_search_decides_it(good):
    """Budget and cost in 1e-4 USD, the cost rounded up and the budget down, as the search states
    the constraint: a budget the plan meets to the unit passes, one unit less is flagged."""
    import math

    units = math.ceil(good["cost_usd"] * 1e4)
    assert check_plan({**RAW, "constraints": {"budget_usd": units / 1e4}}, good) == []
    assert any("budget" in line for line in check_plan({**RAW, "constraints": {"budget_usd": (units - 1) / 1e4}}, good))


def test_an_empty_fleet_is_no_fleet_for_the_search_and_the_checker():
    result = plan_raw({**copy.deepcopy(RAW), "constraints": {"fleet": {}}})
    assert result.plans and result.checker_rejected == []
