"""Procurement: the fleet model's constraints alone, a brute-force oracle, the checker, the naive
answer, portfolio validation, and the shipped portfolio end to end."""

from __future__ import annotations

import itertools
import random

import pytest
from conftest import ROOT, one_line
from typer.testing import CliRunner

from planner.cli.main import app
from planner.core.errors import InputError
from planner.fleet.cpsat import (
    Choice,
    FleetInstance,
    FleetModel,
    FleetSolution,
    OwnOption,
    RentOption,
    Run,
    SolveLimit,
    check,
    objective_of,
)
from planner.fleet.job_options import gpu_counts
from planner.fleet.portfolio import load_portfolio

SHIPPED = ROOT / "scenarios" / "portfolios" / "team-h1-procurement.yaml"
#: Solver limits in CP-SAT's deterministic time on one worker: the same result on any machine under
#: any load (a wall-clock limit would make the tests depend on how busy the machine is).
DET = SolveLimit(deterministic=10.0, workers=1)


def own(option, t=0, gpus=1, duration=2, cost=10):
    return OwnOption(option, t, gpus, duration, cost)


def inst(runs, unit_gpus=(1,), unit_cost=(100,), horizon=10):
    return FleetInstance(horizon, list(unit_gpus), list(unit_cost), runs)


# ---------------------------------------------------------------------------------------------
# Each constraint on a tiny instance: feasible; a forbidden assignment pinned is infeasible.

def test_one_run_buys_one_unit_or_rents_whichever_is_cheaper():
    cheap_rent = inst([Run(0, 0, 0, 10, [own(0)], RentOption(1, "on_demand", 2, 50))])
    sol = FleetModel(cheap_rent).solve(DET)
    assert sol.status == "optimal" and sol.units == [0] and sol.choices[0].rent is not None
    dear_rent = inst([Run(0, 0, 0, 10, [own(0)], RentOption(1, "on_demand", 2, 500))])
    sol = FleetModel(dear_rent).solve(DET)
    assert sol.units == [1] and sol.objective_cents == 110


def test_fleet_runs_share_one_unit_over_time_when_windows_allow():
    runs = [Run(0, k, 0, 4, [own(0)], None) for k in range(2)]  # 2 + 2 fits in [0, 4]
    sol = FleetModel(inst(runs)).solve(DET)
    assert sol.units == [1] and sorted(c.start for c in sol.choices) == [0, 2]
    assert check(inst(runs), sol) == []


def test_fleet_needs_two_units_when_runs_must_overlap():
    runs = [Run(0, k, 0, 3, [own(0)], None) for k in range(2)]  # both must run within [0, 3)
    sol = FleetModel(inst(runs)).solve(DET)
    assert sol.units == [2]
    model = FleetModel(inst(runs))
    model.m.Add(model.b[0] == 1)  # forbidden: one unit cannot hold both
    assert model.solve(DET).status == "infeasible"


def test_window_forbids_a_late_start():
    runs = [Run(0, 0, 2, 6, [own(0, duration=3)], None)]
    model = FleetModel(inst(runs))
    model.m.Add(model.s[0] == 4)  # 4 + 3 > 6
    assert model.solve(DET).status == "infeasible"
    model = FleetModel(inst(runs))
    model.m.Add(model.s[0] == 3)
    assert model.solve(DET).status == "optimal"


def test_whole_units_are_bought():
    runs = [Run(0, 0, 0, 10, [own(0, gpus=3)], None)]
    sol = FleetModel(inst(runs, unit_gpus=(8,), unit_cost=(800,))).solve(DET)
    assert sol.units == [1]  # 3 GPUs need one 8-GPU node


def test_symmetry_orders_the_runs_of_one_job():
    runs = [Run(0, k, 0, 10, [own(0)], None) for k in range(3)]
    sol = FleetModel(inst(runs)).solve(DET)
    starts = [c.start for c in sol.choices]
    assert starts == sorted(starts)


# ---------------------------------------------------------------------------------------------
# Oracle: brute force over choices and starts on random tiny instances.

def brute_force(i: FleetInstance) -> int:
    best = None
    per_run = []
    for r in i.runs:
        opts = [(o, None, s) for o in r.own for s in range(r.release, r.deadline - o.duration + 1)]
        if r.rent:
            opts.append((None, r.rent, r.release))
        per_run.append(opts)
    for combo in itertools.product(*per_run):
        units = []
        for t, u in enumerate(i.unit_gpus):
            peak = max((sum(o.gpus for o, _, s in combo if o and o.gpu_type == t and s <= x < s + o.duration)
                        for x in range(i.horizon)), default=0)
            units.append(-(-peak // u))
        cost = sum(c * n for c, n in zip(i.unit_cost_cents, units))
        cost += sum(o.cost_cents if o else rent.cost_cents for o, rent, _ in combo)
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(8))
def test_cp_sat_matches_brute_force(seed):
    rng = random.Random(seed)
    runs = []
    for job, copies in enumerate((2, 1)):  # runs of one job are identical (the symmetry rule's premise)
        release = rng.randint(0, 2)
        deadline = rng.randint(release + 3, 7)
        opts = [own(j, t=rng.randint(0, 1), gpus=rng.choice([1, 2, 4]), duration=rng.randint(1, 3),
                    cost=rng.randint(1, 30)) for j in range(rng.randint(1, 3))]
        rent = RentOption(9, "spot", 1, rng.randint(20, 400)) if rng.random() < 0.7 else None
        runs += [Run(job, k, release, deadline, opts, rent) for k in range(copies)]
    i = inst(runs, unit_gpus=(2, 4), unit_cost=(rng.randint(10, 200), rng.randint(10, 200)), horizon=7)
    sol = FleetModel(i).solve(DET)
    assert sol.status == "optimal"
    assert check(i, sol) == []
    assert sol.objective_cents == objective_of(i, sol) == brute_force(i)


def test_checker_finds_overuse_and_window_violations():
    runs = [Run(0, k, 0, 4, [own(0, duration=2)], None) for k in range(2)]
    i = inst(runs)
    o = runs[0].own[0]
    overlap = FleetSolution("feasible", None, None, [1], [Choice(0, 0, o, None), Choice(1, 1, o, None)], 0)
    assert any("in use" in m for m in check(i, overlap))
    late = FleetSolution("feasible", None, None, [2], [Choice(0, 0, o, None), Choice(1, 3, o, None)], 0)
    assert any("outside window" in m for m in check(i, late))


def test_gpu_counts_grid():
    assert gpu_counts(1024)[:12] == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32]
    assert gpu_counts(1024)[-2:] == [768, 1024] and gpu_counts(20) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]


# ---------------------------------------------------------------------------------------------
# Portfolio files: bad input names the field.

def write(tmp_path, text):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def test_portfolio_problems_one_line_each(tmp_path):
    path = write(tmp_path, """\
horizon_days: 10
jobs:
  - name: a
    scenario: {model: llama-3.1-8b, workload: {method: lora, tokens: 1e8}}
    deadline_date: 2027-01-05
  - name: b
    scenario: {model: llama-3.1-8b}
    deadline_hours: 500
    earliest_start_hours: 600
""")
    with pytest.raises(InputError) as exc:
        load_portfolio(path)
    text = "\n".join(exc.value.problems)
    assert "jobs[0].deadline: a date needs the portfolio's start_date" in text
    assert "jobs[1].deadline: 500 h is past the horizon (240 h)" in text
    assert "jobs[1]: earliest start 600 h is not before the deadline" in text


def test_portfolio_schema_errors_and_cli_exit_2(tmp_path):
    path = write(tmp_path, "horizon_days: 10\nlifetime_month: 36\njobs: []\n")
    result = CliRunner().invoke(app, ["procure", str(path)])
    assert result.exit_code == 2
    assert "lifetime_month: unknown key; did you mean 'lifetime_months'?" in result.output
    assert "jobs" in result.output and "Traceback" not in result.output


def test_job_without_tokens_is_invalid(tmp_path):
    path = write(tmp_path, """\
horizon_hours: 100
gpu_types: [rtx-4090]
jobs: [{name: a, scenario: {profile: seed, model: llama-3.1-8b, workload: {method: qlora}}}]
""")
    result = CliRunner().invoke(app, ["procure", str(path), "--workers", "1"])
    assert result.exit_code == 2 and "workload.tokens: required" in result.output


def test_a_job_that_cannot_finish_in_its_window_is_exit_1(tmp_path):
    path = write(tmp_path, """\
horizon_hours: 5
gpu_types: [rtx-4090]
max_gpus_per_job: 8
jobs: [{name: slow, scenario: {profile: seed, model: llama-3.1-8b, workload: {method: qlora, tokens: 1e10}}}]
""")
    result = CliRunner().invoke(app, ["procure", str(path), "--workers", "1"])
    assert result.exit_code == 1 and "slow: fastest plan takes" in result.output


# ---------------------------------------------------------------------------------------------
# The shipped portfolio, end to end.

@pytest.fixture(scope="module")
def shipped():
    from planner.fleet.procure import procure
    from planner.report.procurement import tables

    # Every candidate built (no time budget) and a deterministic solver limit: repeatable anywhere.
    result = procure(SHIPPED, deterministic_time=20.0)
    return result, tables(result)


def test_shipped_portfolio_is_never_dearer_than_either_baseline(shipped):
    result, t = shipped
    assert result.problems == []
    assert result.status in ("optimal", "feasible", "timeout")
    s = t.summary
    inst = result.problem.inst
    answer = result.solution.objective_cents
    assert answer <= result.naive.objective_cents and answer <= result.rent_all_cents
    assert answer < result.naive.objective_cents  # sharing one fleet over time pays on this portfolio
    slack = 0.01 * (len(inst.runs) + 2 * len(inst.unit_gpus))  # cents rounded up per item in the model
    assert s["total_usd"] <= min(s["naive_usd"], s["rent_all_usd"]) + slack
    # The model's objective and the independent USD recomputation agree (within cent rounding).
    assert s["total_usd"] == pytest.approx(answer / 100, abs=slack)
    # Every candidate answer passed the checker in production; the returned one passes it here.
    assert result.answer.findings == []
    assert check(inst, result.solution) == []


def test_shipped_portfolio_schedule_respects_windows_and_fleet(shipped):
    result, t = shipped
    assert len(t.schedule) == sum(j.count for j in result.problem.runs)
    windows = {j.name: (j.release_hours, j.deadline_hours) for j in result.problem.runs}
    for row in t.schedule.itertuples():
        lo, hi = windows[row.job]
        assert lo <= row.start_hours and row.end_hours <= hi + 1e-6
    for row in t.fleet.itertuples():  # bought GPUs in use never exceed what was bought
        events = sorted([(r.start_hours, r.gpus) for r in t.schedule.itertuples() if r.gpu == row.gpu
                         and r.mode == "buy"] + [(r.end_hours, -r.gpus) for r in t.schedule.itertuples()
                                                 if r.gpu == row.gpu and r.mode == "buy"], key=lambda e: (e[0], e[1]))
        level = 0
        for _, d in events:
            level += d
            assert level <= row.gpus
    costs = dict(zip(t.costs["item"], t.costs["usd"]))
    parts = costs["amortised_purchase_usd"] + costs["hosting_usd"] + costs["power_usd"] + costs["rent_usd"]
    assert parts == pytest.approx(costs["total_usd"])


def test_shipped_portfolio_plans_fit_in_memory(shipped):
    _, t = shipped
    for plan in t.plans:
        assert plan.memory["fits"] is True and plan.memory["total_bytes"] <= plan.memory["usable_bytes"]


@pytest.mark.parametrize("edit, field", [
    (("horizon_days: 120", "horizon_days: 1e300"), "horizon_days: at most"),
    (("horizon_days: 120", "horizon_days: 120\ntime_unit_hours: 1e-9"), "time_unit_hours"),
    (("lifetime_months: 36", "lifetime_months: 36\nhosting_usd_per_gpu_hour: .inf"), "hosting_usd_per_gpu_hour"),
    (("lifetime_months: 36", "lifetime_months: 36\npurchase_unit_gpus: {rtx-4090: 1e30}"), "purchase_unit_gpus"),
    (("    count: 3", "    count: 100000"), "runs in all"),
])
def test_portfolio_sizes_are_bounded_before_any_work(tmp_path, edit, field):
    """A horizon of 1e300 days, a time unit of 1e-9 h, an infinite hosting price, a purchase unit
    of 1e30 GPUs or 100,000 runs of a job ended in exit 3 (MemoryError, overflow) or ran for a
    minute; each is now one line naming its field, exit 2, before the solve."""
    from typer.testing import CliRunner

    from planner.cli.main import app

    text = (ROOT / "scenarios" / "portfolios" / "team-h1-procurement.yaml").read_text()
    assert edit[0] in text
    path = tmp_path / "p.yaml"
    path.write_text(text.replace(edit[0], edit[1], 1))
    out = CliRunner().invoke(app, ["procure", str(path), "--time-limit", "5"])
    assert out.exit_code == 2, out.output
    assert field in one_line(out.output), out.output


def test_an_unwritable_report_target_is_refused_before_the_solve(tmp_path):
    """``procure --out`` under a file was raised after the solve (exit 3, the answer lost)."""
    taken = tmp_path / "taken"
    taken.write_text("x")
    out = CliRunner().invoke(app, ["procure", str(ROOT / "scenarios" / "portfolios" / "team-h1-procurement.yaml"),
                                   "--format", "md", "--out", str(taken / "r.md"), "--time-limit", "60"])
    assert out.exit_code == 2 and "--out:" in out.output, out.output
