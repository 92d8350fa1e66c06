"""``planner procure``: the fleet to buy or rent for a portfolio of jobs, and when each job runs.

1. Each job's candidates (planner.fleet.job_options): per GPU type and count, the fastest plan.
2. Prices (planner.catalog.prices): the catalog's, overlaid by the portfolio's price files; purchase,
   on-demand and spot kept apart; stale ones flagged.
3. One CP-SAT model over every run of every job (planner.fleet.cpsat), started from the naive
   answer: each job's cheapest setup bought separately, which it must match or beat.
4. The chosen fleet and schedule are checked and their costs recomputed independently in USD.

Costs over the horizon H: a bought GPU costs purchase × H / lifetime (linear amortisation) plus
hosting × H; power is paid while a run computes; a rented run costs price × billed GPUs × time.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from planner import catalog
from planner.core.errors import InputError
from planner.fleet.cpsat import (
    Choice, FleetInstance, FleetModel, FleetSolution, OwnOption, RentOption, Run, check, objective_of,
)
from planner.fleet.job_options import JobOptions, job_options
from planner.fleet.portfolio import (
    DEFAULT_HOSTING_USD_PER_GPU_HOUR, DEFAULT_POWER_USD_PER_GPU_HOUR, HOURS_PER_MONTH, JobRun, Portfolio,
    load_portfolio, per_gpu,
)
from planner.catalog.prices import Price, PriceTable, load_price_table, read_prices


@dataclass(frozen=True)
class Offer:
    """What one GPU type costs to own or rent."""

    gpu: str
    unit_gpus: int
    purchase: Price | None
    rent: dict[str, Price]
    power_usd_per_gpu_hour: float
    hosting_usd_per_gpu_hour: float

    def owned_usd_per_gpu(self, horizon_hours: float, lifetime_hours: float) -> float:
        """Owning one GPU over the horizon: amortised purchase plus hosting."""
        return self.purchase.usd * horizon_hours / lifetime_hours + self.hosting_usd_per_gpu_hour * horizon_hours


def purchase_unit(gpu_id: str, p: Portfolio) -> int:
    """GPUs per purchase: the portfolio's figure, else a whole node for cards that come on an
    NVLink baseboard (SXM/OAM: HGX and MI300X platforms ship 8 at a time), else one card."""
    for name, n in p.purchase_unit_gpus.items():
        if catalog.get_gpu(name).id == gpu_id:
            return n
    g = catalog.get_gpu(gpu_id)
    return g.gpus_per_node if (g.whole_node_only or g.nvlink_domain > 1) else 1


def build_offers(p: Portfolio, table: PriceTable) -> dict[str, Offer]:
    ids = [catalog.get_gpu(n).id for n in p.gpu_types] if p.gpu_types else [g.id for g in catalog.gpus()]
    offers = {}
    for gid in ids:
        rent = {k: table.get(gid, k) for k in p.rent if table.get(gid, k) is not None}
        offers[gid] = Offer(gid, purchase_unit(gid, p), table.get(gid, "purchase") if p.buy else None, rent,
                            per_gpu(p.power_usd_per_gpu_hour, gid, DEFAULT_POWER_USD_PER_GPU_HOUR),
                            per_gpu(p.hosting_usd_per_gpu_hour, gid, DEFAULT_HOSTING_USD_PER_GPU_HOUR))
    return offers


def _cents(usd: float) -> int:
    return int(math.ceil(usd * 100 - 1e-9))


@dataclass
class Problem:
    portfolio: Portfolio
    runs: list[JobRun]
    options: list[JobOptions]
    offers: dict[str, Offer]
    buyable: list[str]  # type index of the model -> GPU id
    inst: FleetInstance
    prices: PriceTable

    @property
    def lifetime_hours(self) -> float:
        return self.portfolio.lifetime_months * HOURS_PER_MONTH


def build_problem(p: Portfolio, runs: list[JobRun], options: list[JobOptions], table: PriceTable) -> Problem:
    offers = build_offers(p, table)
    unit_h = p.time_unit_hours
    horizon_h = p.horizon_h
    lifetime_h = p.lifetime_months * HOURS_PER_MONTH
    buyable = [g for g, o in offers.items() if o.purchase is not None]
    type_of = {g: t for t, g in enumerate(buyable)}
    fleet_runs: list[Run] = []
    for i, (job, opts) in enumerate(zip(runs, options)):
        release = math.ceil(job.release_hours / unit_h - 1e-9)
        deadline = math.floor(job.deadline_hours / unit_h + 1e-9)
        own, rent = [], None
        for j in range(len(opts)):
            gid, time_h = opts.gpu_id[j], float(opts.time_s[j]) / 3600.0
            dur = max(1, math.ceil(time_h / unit_h - 1e-9))
            if dur > deadline - release or gid not in offers:
                continue
            offer = offers[gid]
            if gid in type_of:
                own.append(OwnOption(j, type_of[gid], int(opts.gpus[j]), dur,
                                     _cents(offer.power_usd_per_gpu_hour * int(opts.gpus[j]) * time_h)))
            for kind, price in offer.rent.items():
                cost = _cents(price.usd * int(opts.billed_gpus[j]) * time_h)
                if rent is None or cost < rent.cost_cents:
                    rent = RentOption(j, kind, dur, cost)
        fleet_runs += [Run(i, k, release, deadline, own, rent) for k in range(job.count)]
    inst = FleetInstance(
        horizon=math.floor(horizon_h / unit_h + 1e-9),
        unit_gpus=[offers[g].unit_gpus for g in buyable],
        unit_cost_cents=[_cents(offers[g].unit_gpus * offers[g].owned_usd_per_gpu(horizon_h, lifetime_h))
                         for g in buyable],
        runs=fleet_runs,
    )
    return Problem(p, runs, options, offers, buyable, inst, table)


def unplaceable(problem: Problem) -> list[str]:
    """Jobs that no candidate can run inside their window (bought or rented)."""
    out = []
    seen = set()
    for r in problem.inst.runs:
        if r.own or r.rent or r.job in seen:
            continue
        seen.add(r.job)
        job, opts = problem.runs[r.job], problem.options[r.job]
        window = job.deadline_hours - job.release_hours
        if len(opts) == 0:
            out.append(f"{job.name}: no plan fits in memory on any GPU type considered")
        else:
            j = int(opts.time_s.argmin())
            out.append(f"{job.name}: fastest plan takes {opts.time_s[j] / 3600:,.1f} h ({opts.gpu_id[j]} × "
                       f"{opts.gpus[j]}), window is {window:,.1f} h; or no price for the types that fit")
    return out


def naive_solution(problem: Problem) -> tuple[FleetSolution, list[str]]:
    """Each job's cheapest setup bought separately (its copies run back to back on it, in as
    many parallel sets as the window needs); a job nothing bought can run is rented."""
    inst = problem.inst
    units = [0] * len(inst.unit_gpus)
    choices: list[Choice] = []
    notes = []
    by_job: dict[int, list[int]] = {}
    for i, r in enumerate(inst.runs):
        by_job.setdefault(r.job, []).append(i)
    for job, idx in by_job.items():
        r0 = inst.runs[idx[0]]
        count, window = len(idx), r0.deadline - r0.release
        best = None
        for o in r0.own:
            per_set = window // o.duration
            sets = -(-count // per_set)
            units_each = -(-o.gpus // inst.unit_gpus[o.gpu_type])
            cost = sets * units_each * inst.unit_cost_cents[o.gpu_type] + count * o.cost_cents
            if best is None or cost < best[0]:
                best = (cost, o, per_set, sets * units_each)
        if best is None:
            notes.append(f"{problem.runs[job].name}: nothing to buy fits its window; rented")
            choices += [Choice(i, inst.runs[i].release, None, inst.runs[i].rent) for i in idx]
            continue
        _, o, per_set, n_units = best
        units[o.gpu_type] += n_units
        sets = n_units // -(-o.gpus // inst.unit_gpus[o.gpu_type])
        for k, i in enumerate(idx):  # run k on set k % sets, in slot k // sets: starts never decrease
            choices.append(Choice(i, r0.release + (k // sets) * o.duration, o, None))
    choices.sort(key=lambda c: c.run)
    sol = FleetSolution("feasible", None, None, units, choices, 0.0)
    sol.objective_cents = objective_of(inst, sol)
    return sol, notes


def rent_all(problem: Problem) -> int | None:
    """Every run rented at its cheapest price that fits its window (cents), if all can be."""
    if any(r.rent is None for r in problem.inst.runs):
        return None
    return sum(r.rent.cost_cents for r in problem.inst.runs)


@dataclass
class ProcureResult:
    problem: Problem
    solution: FleetSolution
    naive: FleetSolution
    naive_notes: list[str]
    rent_all_cents: int | None
    generation_s: float
    problems: list[str] = field(default_factory=list)  # unplaceable jobs, or checker findings


def load_problem(path: str | Path, *, workers: int | None = None) -> tuple[Problem, float]:
    p, runs = load_portfolio(path)
    base = Path(path).parent
    table = load_price_table()
    for f in p.prices:
        table = table.overlay(read_prices(base / f.path, fmt=f.format, date=f.date))
    t0 = time.perf_counter()
    options = generate_options(runs, p.gpu_types, p.max_gpus_per_job, workers=workers)
    return build_problem(p, runs, options, table), time.perf_counter() - t0


def _options_one(job: JobRun, gpu_types, max_gpus) -> JobOptions:
    return job_options(job, gpu_types, max_gpus)


def generate_options(runs: list[JobRun], gpu_types, max_gpus: int, *, workers: int | None = None) -> list[JobOptions]:
    """Every job's candidates; in several processes when there are several jobs."""
    from planner.search.batch import MIN_SCENARIOS_FOR_PROCESSES, default_workers

    workers = default_workers() if workers is None else workers
    problems, out = [], []
    if workers <= 1 or len(runs) < MIN_SCENARIOS_FOR_PROCESSES:
        for job in runs:
            try:
                out.append(_options_one(job, gpu_types, max_gpus))
            except InputError as exc:
                problems.extend(exc.problems)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(workers, len(runs)), mp_context=ctx) as pool:
            futures = [pool.submit(_options_one, job, gpu_types, max_gpus) for job in runs]
            for fut in futures:
                try:
                    out.append(fut.result())
                except InputError as exc:
                    problems.extend(exc.problems)
    if problems:
        raise InputError(problems)
    return out


#: Seconds the solver always gets, even when generating the candidates used up the time limit.
MIN_SOLVER_S = 1.0


def procure(path: str | Path, *, time_limit_s: float | None = None, workers: int | None = None) -> ProcureResult:
    problem, gen_s = load_problem(path, workers=workers)
    missing = unplaceable(problem)
    if missing:
        empty = FleetSolution("infeasible", None, None, [], [], 0.0)
        return ProcureResult(problem, empty, empty, [], None, gen_s, missing)
    naive, notes = naive_solution(problem)
    model = FleetModel(problem.inst)
    model.hint(naive)
    # The limit covers the whole answer: the solver gets what candidate generation left of it
    # (at least MIN_SOLVER_S, so that a hinted solution is always returned).
    limit = time_limit_s or problem.portfolio.time_limit_s
    sol = model.solve(max(MIN_SOLVER_S, limit - gen_s))
    findings = check(problem.inst, sol) if sol.choices else []
    if sol.choices and objective_of(problem.inst, sol) != sol.objective_cents:
        findings.append(f"objective {sol.objective_cents} ≠ recomputed {objective_of(problem.inst, sol)}")
    return ProcureResult(problem, sol, naive, notes, rent_all(problem), gen_s, findings)


def as_date(problem: Problem, hours: float) -> str | None:
    start = problem.portfolio.start_date
    return None if start is None else (start + dt.timedelta(hours=hours)).isoformat()
