"""The Python API as a user imports it: every name of ``__all__``, ``plan``'s search lists
read as the CLI and a scenario's ``search:`` read them, and ``procure``'s typed result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import planner
from planner.search.answer import plan_raw

PORTFOLIO = str(Path(__file__).resolve().parents[1] / "scenarios" / "portfolios" / "team-h1-procurement.yaml")

BASE = {"model": "llama-3.1-8b", "workload": {"method": "lora", "tokens": 1e8}, "top": 5,
        "search": {"gpu_types": ["h100"], "max_gpus": 8}}


def test_every_exported_name_imports():
    namespace: dict = {}
    exec("from planner import *", namespace)  # noqa: S102  (what a user's star import does)
    assert set(planner.__all__) <= set(namespace)
    for name in ("Plan", "PlanResult", "ProcureResult", "Estimate", "Scenario", "InputError"):
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


def test_procure_returns_a_typed_result_whose_runs_add_up_to_the_total(monkeypatch):
    """``procure`` returns a :class:`planner.ProcureResult`: status, total, fleet, schedule, costs
    and buy against rent as typed fields; ``to_frame()`` has one row per scheduled run, whose costs
    add up to the total the summary states; the report's tables of it are what ``planner
    procure`` prints."""
    from planner import ProcureResult
    from planner.cli.main import app
    from planner.report.procurement import tables
    from planner.report.terminal import to_json

    result = planner.procure(PORTFOLIO)
    assert isinstance(result, ProcureResult) and result.status in ("optimal", "feasible", "timeout")
    t = tables(result)
    frame = result.to_frame()
    runs = sum(job.count for job in result.problem.runs)
    assert len(frame) == len(result.schedule) == t.summary["runs"] == len(t.schedule) == runs
    assert list(frame["job"]) == list(t.schedule["job"]) and list(frame["gpu"]) == list(t.schedule["gpu"])
    assert list(frame["gpus"]) == list(t.schedule["gpus"]) and list(frame["end_hours"]) == list(t.schedule["end_hours"])
    assert frame["cost_usd"].sum() == pytest.approx(t.summary["total_usd"], abs=0.01)
    assert (frame["cost_usd"] == frame["usage_usd"] + frame["fleet_share_usd"]).all()
    assert result.total_usd == result.costs.total_usd == t.summary["total_usd"]
    assert [(f.gpu, f.units) for f in result.fleet] == list(zip(t.fleet["gpu"], t.fleet["units"]))
    b = result.buy_vs_rent
    assert (b.answer_usd, b.naive_usd, b.rent_all_usd) == \
        (t.summary["total_usd"], t.summary["naive_usd"], t.summary["rent_all_usd"])
    # The CLI prints the tables of the result it gets
    monkeypatch.setattr("planner.fleet.procure.procure", lambda *args, **kwargs: result)
    out = CliRunner().invoke(app, ["procure", PORTFOLIO, "--format", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == json.loads(to_json(t.to_dict()))


def test_a_rent_only_answer_keeps_the_fleet_tables_columns(tmp_path):
    """A portfolio whose cheapest answer buys nothing (one short LoRA run over a 120-day horizon:
    an hour's rent against a server amortised over months) has an empty fleet, and its fleet table
    is still the table the reports show, with its columns and no rows, as the schedule has its run."""
    from planner.report.procurement import FLEET_COLUMNS, tables

    path = tmp_path / "p.yaml"
    path.write_text("""
name: tiny
start_date: 2027-01-04
horizon_days: 120
rent: [on_demand]
jobs: [{name: lora-8b, scenario: {profile: seed, model: llama-3.1-8b, workload: {method: lora, tokens: 1e7}}}]
""")
    result = planner.procure(str(path))
    t = tables(result)
    assert result.fleet == [] and result.costs.cash_outlay_usd == 0
    assert list(t.fleet.columns) == FLEET_COLUMNS and t.fleet.empty
    assert list(t.fleet["gpu"]) == [] and len(t.schedule) == len(result.schedule) == 1


def test_an_infeasible_procurement_is_a_result_with_no_runs(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("""
horizon_hours: 5
gpu_types: [rtx-4090]
max_gpus_per_job: 8
jobs: [{name: slow, scenario: {profile: seed, model: llama-3.1-8b, workload: {method: qlora, tokens: 1e10}}}]
""")
    result = planner.procure(path, workers=1)
    assert result.status == "infeasible" and result.problems and result.problems[0].startswith("slow:")
    assert result.total_usd is None and result.costs is None and result.fleet == [] and result.schedule == []
    frame = result.to_frame()
    assert frame.empty and {"job", "gpu", "gpus", "start_hours", "end_hours", "cost_usd"} <= set(frame.columns)
