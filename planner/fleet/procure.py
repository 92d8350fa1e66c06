"""``planner procure``: the fleet to buy or rent for a portfolio of jobs, and when each job runs.

One time limit covers the whole answer:

1. Each job's candidates (planner.fleet.job_options): per GPU type that has a price and per GPU
   count, the fastest plan. Generation gets :data:`GENERATION_SHARE` of the limit: jobs not started
   by then get only their coarse candidates (powers of two; always built); what is built is kept.
2. Prices (planner.catalog.prices): the catalog's, then the dated costs of owning
   (planner.fleet.ownership: whole servers, hosts for PCIe cards, street prices), then the
   portfolio's price files; purchase, on-demand and spot kept apart; stale ones flagged.
3. Two baselines, always: the naive answer (each job's cheapest setup bought separately) and
   renting everything. Then one CP-SAT model over every run of every job (planner.fleet.cpsat),
   started from the better baseline, with the rest of the limit.
4. The answer is the cheapest of the solver's solution (its fleet trimmed to what the schedule
   uses) and the baselines that passes the independent checker (planner.fleet.cpsat.check): never
   dearer than either baseline. Status:

   ``optimal``     proven (the solver's bound, or the simple bound, meets the answer)
   ``feasible``    the solver's solution beats both baselines; ``gap`` says how far from proven
   ``timeout``     the solver found nothing better in time: the better baseline is returned (gap
                   stated against the bound)
   ``infeasible``  proven: some job cannot run at all (which job, and why)

Costs over the horizon H: a bought unit (a whole server for baseboard GPUs, a card for PCIe ones,
plus a host server per ``gpus_per_node`` cards) costs its price × H / lifetime (linear
amortisation) plus hosting × H; power is paid while a run computes; a rented run costs price ×
billed GPUs × time.
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
    Choice, FleetInstance, FleetModel, FleetSolution, OwnOption, RentOption, Run, SolveLimit, check,
    lower_bound_cents, objective_of, trim,
)
from planner.fleet.job_options import JobOptions, coarse_counts, job_options
from planner.fleet.ownership import Ownership, load_ownership
from planner.fleet.portfolio import (
    DEFAULT_HOSTING_USD_PER_GPU_HOUR, DEFAULT_POWER_USD_PER_GPU_HOUR, HOURS_PER_MONTH, JobRun, Portfolio,
    load_portfolio, per_gpu,
)
from planner.catalog.prices import Price, PriceTable, load_price_table, read_prices

#: Share of the time limit that candidate generation may use before the solver starts (measured
#: from the call's start; every job's coarse candidates are built even past it).
GENERATION_SHARE = 0.5
#: Seconds the solver always gets, even when generation used up the limit.
MIN_SOLVER_S = 1.0
#: Seconds kept back from the solver for building the model, checking and the report.
RESERVE_S = 1.0


@dataclass(frozen=True)
class Offer:
    """What one GPU type costs to own or rent."""

    gpu: str
    unit_gpus: int  # GPUs per purchase unit: a whole server (baseboard) or one card
    purchase: Price | None  # per card (None: cannot be bought)
    unit_usd: float | None  # one purchase unit
    unit_note: str  # how unit_usd was made, with dates and sources
    unit_date: dt.date | None
    units_per_host: int  # 0: the unit is a whole server
    host_usd: float
    host_note: str
    rent: dict[str, Price]
    power_usd_per_gpu_hour: float
    hosting_usd_per_gpu_hour: float

    def unit_owned_usd(self, horizon_hours: float, lifetime_hours: float) -> float:
        """Owning one unit over the horizon: amortised price plus hosting of its GPUs."""
        return (self.unit_usd * min(1.0, horizon_hours / lifetime_hours)
                + self.hosting_usd_per_gpu_hour * self.unit_gpus * horizon_hours)

    def host_owned_usd(self, horizon_hours: float, lifetime_hours: float) -> float:
        return self.host_usd * min(1.0, horizon_hours / lifetime_hours)


def purchase_unit(gpu_id: str, p: Portfolio) -> int:
    """GPUs per purchase: the portfolio's figure, else a whole node for cards that come on an
    NVLink baseboard (SXM/OAM: HGX and MI300X platforms ship 8 at a time), else one card."""
    for name, n in p.purchase_unit_gpus.items():
        if catalog.get_gpu(name).id == gpu_id:
            return n
    g = catalog.get_gpu(gpu_id)
    return g.gpus_per_node if (g.whole_node_only or g.nvlink_domain > 1) else 1


def _unit_price(gid: str, unit: int, card: Price, from_user: bool, own: Ownership) -> tuple[float, str, dt.date | None]:
    """A purchase unit's price: a whole server for baseboard GPUs, else one card."""
    if unit == 1:
        return card.usd, f"card: {card.source}", card.date
    host = own.baseboard_host
    server = own.servers.get(gid)
    if server is not None and server.gpus == unit and not from_user:
        if server.usd is not None:
            return float(server.usd), f"whole server ({server.date}): {server.source}", server.date
        if server.baseboard_usd is not None:
            return (float(server.baseboard_usd) + host.usd,
                    f"baseboard ({server.date}): {server.source}; + host ${host.usd:,.0f} ({host.date}): {host.source}",
                    server.date)
    return (unit * card.usd + host.usd,
            f"{unit} × card ({card.date}): {card.source}; + host ${host.usd:,.0f} ({host.date}): {host.source}",
            card.date)


def build_offers(p: Portfolio, table: PriceTable, user_purchase: frozenset[str] = frozenset(),
                 own: Ownership | None = None) -> dict[str, Offer]:
    own = own or load_ownership()
    ids = [catalog.get_gpu(n).id for n in p.gpu_types] if p.gpu_types else [g.id for g in catalog.gpus()]
    offers = {}
    slot = own.pcie_host_per_slot
    for gid in ids:
        rent = {k: table.get(gid, k) for k in p.rent if table.get(gid, k) is not None}
        card = table.get(gid, "purchase") if p.buy else None
        unit = purchase_unit(gid, p)
        unit_usd = note = date = None
        per_host, host_usd, host_note = 0, 0.0, ""
        if card is not None:
            unit_usd, note, date = _unit_price(gid, unit, card, gid in user_purchase, own)
            if unit == 1:
                per_host = catalog.get_gpu(gid).gpus_per_node
                host_usd = per_host * slot.usd
                host_note = f"host for {per_host} cards at ${slot.usd:,.2f} a slot ({slot.date}): {slot.source}"
        offers[gid] = Offer(gid, unit, card, unit_usd, note or "", date, per_host, host_usd, host_note, rent,
                            per_gpu(p.power_usd_per_gpu_hour, gid, DEFAULT_POWER_USD_PER_GPU_HOUR),
                            per_gpu(p.hosting_usd_per_gpu_hour, gid, DEFAULT_HOSTING_USD_PER_GPU_HOUR))
    return offers


def priced_types(p: Portfolio, table: PriceTable) -> list[str]:
    """The portfolio's GPU types that can be bought or rented at some price (others cannot be used)."""
    ids = [catalog.get_gpu(n).id for n in p.gpu_types] if p.gpu_types else [g.id for g in catalog.gpus()]
    kinds = list(p.rent) + (["purchase"] if p.buy else [])
    return [g for g in ids if any(table.get(g, k) is not None for k in kinds)]


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

    @property
    def names(self) -> list[str]:
        return [j.name for j in self.runs]


def build_problem(p: Portfolio, runs: list[JobRun], options: list[JobOptions], table: PriceTable,
                  offers: dict[str, Offer] | None = None) -> Problem:
    offers = offers if offers is not None else build_offers(p, table)
    unit_h = p.time_unit_hours
    horizon_h = p.horizon_h
    lifetime_h = p.lifetime_months * HOURS_PER_MONTH
    buyable = [g for g, o in offers.items() if o.unit_usd is not None]
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
        unit_cost_cents=[_cents(offers[g].unit_owned_usd(horizon_h, lifetime_h)) for g in buyable],
        runs=fleet_runs,
        units_per_host=[offers[g].units_per_host for g in buyable],
        host_cost_cents=[_cents(offers[g].host_owned_usd(horizon_h, lifetime_h)) for g in buyable],
    )
    return Problem(p, runs, options, offers, buyable, inst, table)


def unplaceable(problem: Problem) -> list[str]:
    """Jobs that no candidate can run inside their window (bought or rented), and why."""
    out = []
    seen = set()
    for r in problem.inst.runs:
        if r.own or r.rent or r.job in seen:
            continue
        seen.add(r.job)
        job, opts = problem.runs[r.job], problem.options[r.job]
        window = job.deadline_hours - job.release_hours
        if len(opts) == 0:
            out.append(f"{job.name}: no plan fits in memory on any priced GPU type considered")
            continue
        j = int(opts.time_s.argmin())
        fastest = float(opts.time_s[j]) / 3600.0
        if fastest > window:
            out.append(f"{job.name}: fastest plan takes {fastest:,.1f} h ({opts.gpu_id[j]} × {opts.gpus[j]}), "
                       f"window is {window:,.1f} h")
        else:
            fits = sorted({str(g) for g, t in zip(opts.gpu_id, opts.time_s) if t / 3600.0 <= window})
            out.append(f"{job.name}: only {', '.join(fits)} finish within the {window:,.1f} h window, and none of "
                       "them can be bought or rented at a known price")
    return out


# ---------------------------------------------------------------------------------------------
# Baselines

def naive_solution(inst: FleetInstance, names: list[str]) -> tuple[FleetSolution, list[str]]:
    """Each job's cheapest setup bought separately (its copies run back to back on it, in as
    many parallel sets as the window needs); a job nothing bought can run is rented."""
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
            n_units = sets * units_each
            cost = (n_units * inst.unit_cost_cents[o.gpu_type] + count * o.cost_cents
                    + inst.host_cost_cents[o.gpu_type] * inst.hosts_for(o.gpu_type, n_units))
            if best is None or cost < best[0]:
                best = (cost, o, sets)
        if best is None:
            notes.append(f"{names[job]}: nothing to buy fits its window; rented")
            choices += [Choice(i, inst.runs[i].release, None, inst.runs[i].rent) for i in idx]
            continue
        _, o, sets = best
        for k, i in enumerate(idx):  # run k on set k % sets, in slot k // sets: starts never decrease
            choices.append(Choice(i, r0.release + (k // sets) * o.duration, o, None))
        units[o.gpu_type] += sets * -(-o.gpus // inst.unit_gpus[o.gpu_type])
    choices.sort(key=lambda c: c.run)
    sol = FleetSolution("feasible", None, None, units, choices, 0.0)
    sol.objective_cents = objective_of(inst, sol)
    return sol, notes


def rent_all_solution(inst: FleetInstance) -> FleetSolution | None:
    """Every run rented at its cheapest price that fits its window, if all can be."""
    if any(r.rent is None for r in inst.runs):
        return None
    sol = FleetSolution("feasible", None, None, [0] * len(inst.unit_gpus),
                        [Choice(i, r.release, None, r.rent) for i, r in enumerate(inst.runs)], 0.0)
    sol.objective_cents = objective_of(inst, sol)
    return sol


def rent_all(problem: Problem) -> int | None:
    """Every run rented at its cheapest price that fits its window (cents), if all can be."""
    sol = rent_all_solution(problem.inst)
    return None if sol is None else sol.objective_cents


# ---------------------------------------------------------------------------------------------
# The answer

@dataclass
class Answer:
    status: str  # optimal | feasible | timeout | infeasible
    solution: FleetSolution  # what is returned (trimmed, checked)
    source: str  # solver | naive | rent-all
    naive: FleetSolution | None
    naive_notes: list[str]
    rent_all: FleetSolution | None
    bound_cents: int | None  # the best proven lower bound
    solver: FleetSolution | None  # the solver's own result (before trimming), for the record
    findings: list[str] = field(default_factory=list)  # candidates the checker rejected, and why

    @property
    def gap(self) -> float | None:
        obj = self.solution.objective_cents
        if obj is None or self.bound_cents is None:
            return None
        if obj <= 0:
            return 0.0
        return max(0.0, (obj - self.bound_cents) / obj)


class CheckFailed(RuntimeError):
    """No candidate answer passed the independent check (a bug: never expected)."""


def solve_instance(inst: FleetInstance, names: list[str], limit: SolveLimit) -> Answer:
    """Baselines, the solver from the better one, and the cheapest answer that passes the checker.

    Every candidate answer is trimmed to the fleet its schedule's peak uses (so no bought unit is
    idle) and checked; the naive baseline as reported keeps each job's own units (its definition)."""
    naive, notes = naive_solution(inst, names)
    renting = rent_all_solution(inst)
    findings: list[str] = []
    for name, sol in (("naive", naive), ("rent-all", renting)):
        if sol is not None:
            findings += [f"{name} baseline: {m}" for m in check(inst, sol, idle=False)]
    baselines = [("naive", trim(inst, naive))] + ([("rent-all", renting)] if renting is not None else [])
    best_base = min(baselines, key=lambda b: b[1].objective_cents)
    model = FleetModel(inst)
    model.hint(best_base[1])
    raw = model.solve(limit)
    if raw.status == "infeasible":
        raise CheckFailed("the fleet model is infeasible although every run has an option (a bug)")
    candidates: list[tuple[str, FleetSolution]] = []
    for name, sol in ([("solver", trim(inst, raw))] if raw.choices else []) + baselines:
        problems = check(inst, sol)
        findings += [f"{name} answer: {m}" for m in problems]
        if not problems:
            candidates.append((name, sol))
    if not candidates:
        raise CheckFailed("no answer passed the check: " + "; ".join(findings))
    # The cheapest; on a tie the solver's (it carries the proof), then naive, then rent-all.
    source, answer = min(candidates, key=lambda c: c[1].objective_cents)
    bound = lower_bound_cents(inst)
    if raw.bound_cents is not None:
        bound = max(bound, int(math.ceil(raw.bound_cents - 1e-6)))
    bound = min(bound, answer.objective_cents)
    base_best = min(sol.objective_cents for name, sol in candidates if name != "solver")
    if bound >= answer.objective_cents:  # the solver's proof (its bound), or the simple bound
        status = "optimal"
    elif source == "solver" and answer.objective_cents < base_best:
        status = "feasible"
    else:
        status = "timeout"
    answer.status = status
    answer.bound_cents = bound
    return Answer(status, answer, source, naive, notes, renting, bound, raw, findings)


# ---------------------------------------------------------------------------------------------
# Candidates, in time

@dataclass
class Generation:
    seconds: float
    complete: bool  # every job got its candidates at every count
    jobs_refined: int  # jobs that got every count (the others: powers of two only)


def _options_one(job: JobRun, gpu_types, max_gpus, tier: str) -> JobOptions:
    return job_options(job, gpu_types, max_gpus, None if tier == "all" else coarse_counts(max_gpus))


def generate_options(runs: list[JobRun], gpu_types, max_gpus: int, *, workers: int | None = None,
                     deadline: float | None = None) -> tuple[list[JobOptions], Generation]:
    """Every job's candidates; in several processes when there are several jobs.

    With a ``deadline`` (``time.perf_counter()`` seconds), jobs not started by then get only their
    coarse candidates (powers of two: always built, even past the deadline); what was built in full
    is kept. Without one: every count of every job."""
    from planner.search.batch import MIN_SCENARIOS_FOR_PROCESSES, default_workers

    t0 = time.perf_counter()
    workers = default_workers() if workers is None else workers
    results: dict[int, tuple[str, JobOptions]] = {}
    problems: list[str] = []

    def keep(k, tier, fn):
        try:
            results[k] = (tier, fn())
        except InputError as exc:
            problems.extend(exc.problems)

    if workers <= 1 or len(runs) < MIN_SCENARIOS_FOR_PROCESSES:
        for k, job in enumerate(runs):
            tier = "all" if deadline is None or time.perf_counter() < deadline else "coarse"
            keep(k, tier, lambda: _options_one(job, gpu_types, max_gpus, tier))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, wait

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(workers, len(runs)), mp_context=ctx) as pool:
            futures = {pool.submit(_options_one, job, gpu_types, max_gpus, "all"): (k, "all")
                       for k, job in enumerate(runs)}
            timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
            wait(futures, timeout=timeout)
            for f, (k, _) in list(futures.items()):
                if not f.done() and f.cancel():  # not started in time: the coarse counts only
                    del futures[f]
                    futures[pool.submit(_options_one, runs[k], gpu_types, max_gpus, "coarse")] = (k, "coarse")
            for f, (k, tier) in futures.items():
                keep(k, tier, f.result)
    if problems:
        raise InputError(problems)
    out = [results[k][1] for k in range(len(runs))]
    refined = sum(1 for k in range(len(runs)) if results[k][0] == "all")
    return out, Generation(time.perf_counter() - t0, refined == len(runs), refined)


def load_tables(path: str | Path, p: Portfolio) -> tuple[PriceTable, frozenset[str]]:
    """The catalog's prices, the dated costs of owning, then the portfolio's price files; and the
    GPU types whose purchase price a price file gives."""
    base = Path(path).parent
    table = load_price_table().overlay(load_ownership().card_prices())
    user: set[str] = set()
    for f in p.prices:
        extra = read_prices(base / f.path, fmt=f.format, date=f.date)
        user |= {g for (g, k) in extra.prices if k == "purchase"}
        table = table.overlay(extra)
    return table, frozenset(user)


@dataclass
class ProcureResult:
    problem: Problem
    answer: Answer | None  # None when infeasible
    generation: Generation
    limit: SolveLimit
    problems: list[str] = field(default_factory=list)  # infeasible: which job cannot run, and why

    @property
    def status(self) -> str:
        return "infeasible" if self.answer is None else self.answer.status

    @property
    def solution(self) -> FleetSolution:
        return self.answer.solution if self.answer else FleetSolution("infeasible", None, None, [], [], 0.0)

    @property
    def naive(self) -> FleetSolution:
        return self.answer.naive if self.answer else FleetSolution("infeasible", None, None, [], [], 0.0)

    @property
    def naive_notes(self) -> list[str]:
        return self.answer.naive_notes if self.answer else []

    @property
    def rent_all_cents(self) -> int | None:
        return None if not self.answer or self.answer.rent_all is None else self.answer.rent_all.objective_cents

    @property
    def generation_s(self) -> float:
        return self.generation.seconds


def procure(path: str | Path, *, time_limit_s: float | None = None, workers: int | None = None,
            deterministic_time: float | None = None, solver_workers: int | None = None) -> ProcureResult:
    """The answer for a portfolio file within ``time_limit_s`` (default: the portfolio's), wall clock
    from this call's start to the checked answer.

    ``deterministic_time``: repeatable instead — every candidate is built whatever it takes, and the
    solver stops after that much CP-SAT deterministic time on ``solver_workers`` (default one)
    worker: the same answer on any machine under any load (tests)."""
    t0 = time.perf_counter()
    p, runs = load_portfolio(path)
    table, user = load_tables(path, p)
    limit_s = time_limit_s or p.time_limit_s
    deadline = None if deterministic_time is not None else t0 + GENERATION_SHARE * limit_s
    types = priced_types(p, table)
    if not types:
        raise InputError([f"{path}: no GPU type considered has a purchase or rental price"])
    options, gen = generate_options(runs, types, p.max_gpus_per_job, workers=workers, deadline=deadline)
    problem = build_problem(p, runs, options, table, build_offers(p, table, user))
    missing = unplaceable(problem)
    if deterministic_time is not None:
        limit = SolveLimit(deterministic=deterministic_time, workers=solver_workers or 1)
    else:
        left = limit_s - (time.perf_counter() - t0) - RESERVE_S
        limit = SolveLimit(wall_s=max(MIN_SOLVER_S, left), workers=solver_workers)
    if missing:
        return ProcureResult(problem, None, gen, limit, missing)
    return ProcureResult(problem, solve_instance(problem.inst, problem.names, limit), gen, limit)


def as_date(problem: Problem, hours: float) -> str | None:
    start = problem.portfolio.start_date
    return None if start is None else (start + dt.timedelta(hours=hours)).isoformat()
