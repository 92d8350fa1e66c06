"""``planner procure``: the fleet to buy or rent for a portfolio of jobs, and when each job runs.

One time limit covers the whole answer:

1. Each job's candidates (planner.fleet.job_options): per GPU type that has a price and per GPU
   count, the fastest plan. Generation gets :data:`GENERATION_SHARE` of the limit: jobs not started
   by then get only their coarse candidates (powers of two; always built); what is built is kept.
2. Prices (planner.catalog.prices): the catalog's, then the dated costs of owning
   (planner.fleet.ownership: whole servers, hosts for PCIe cards, street prices), then the
   portfolio's price files; purchase, on-demand and spot kept apart; stale ones flagged.
3. Two baselines, always: the naive answer (each job's cheapest setup bought separately) and
   renting everything; and a greedy fleet (:func:`greedy_solution`). Then one CP-SAT model over
   every run of every job (planner.fleet.cpsat), started from the best of them, with the rest of
   the limit.
4. The answer is the cheapest of the solver's solution (its fleet trimmed to what the schedule
   uses) and the baselines that passes the independent checker (planner.fleet.cpsat.check): never
   dearer than either baseline. Status:

   ``optimal``     proven (the solver's bound, or the simple bound, meets the answer)
   ``feasible``    the solver's (or the greedy fleet's) answer beats both baselines; ``gap`` says
                   how far it may be from the optimum
   ``timeout``     nothing better than the better baseline was found in time: that baseline is
                   returned (gap stated against the bound)
   ``infeasible``  proven: some job cannot run at all (which job, and why)

Costs over the horizon H: a bought unit (a whole server for baseboard GPUs, a card for PCIe ones,
plus a host server per ``gpus_per_node`` cards) costs its price × H / lifetime (linear
amortisation) plus hosting × H; power is paid while a run computes; a rented run costs price ×
billed GPUs × time.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner import catalog
from planner.catalog.prices import Price, PriceTable, load_price_table, read_prices
from planner.core.errors import InputError
from planner.core.units import ceil_units, floor_units
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
    lower_bound_cents,
    objective_of,
    trim,
)
from planner.fleet.job_options import (
    JobOptions,
    coarse_counts,
    job_options,
    job_request,
    options_like,
    same_search,
    token_free_key,
)
from planner.fleet.ownership import Ownership, load_ownership
from planner.fleet.portfolio import (
    DEFAULT_HOSTING_USD_PER_GPU_HOUR,
    DEFAULT_POWER_USD_PER_GPU_HOUR,
    HOURS_PER_MONTH,
    JobRun,
    Portfolio,
    load_portfolio,
    per_gpu,
)

#: Share of the time limit that candidate generation may use before the solver starts (measured
#: from the call's start; every job's coarse candidates are built even past it).
GENERATION_SHARE = 0.5
#: Seconds the solver always gets, even when generation used up the limit. Small: the solver
#: starts from the best of the greedy fleet and the baselines, which stand as the answer (status
#: ``timeout``) when it finds nothing better in time, so a short limit is honoured, not floored.
MIN_SOLVER_S = 0.1
#: Seconds kept back from the solver for trimming, checking and the report: a second, plus the
#: report's plans at about 7 ms a run (1.1 s for bench/portfolio_80.py's 160 runs, measured);
#: at most :data:`RESERVE_SHARE` of the limit, so that a short limit leaves the solver something.
RESERVE_S = 1.0
RESERVE_S_PER_RUN = 0.01
RESERVE_SHARE = 0.2


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


#: A run's own-hardware options of one type are kept when their GPU-time (GPUs × duration) is
#: within this factor of the type's least for the run (all of them fit the run's window). More
#: GPU-time costs more power and more of the fleet: such an option only helps a schedule by being
#: shorter, and the kept ones already span short to long. A model-size guess: on
#: bench/portfolio_80.py it keeps about a third of the options. "optimal" means optimal over the
#: options kept (as it always meant over the GPU counts built).
AREA_SLACK = 1.5


def prune_own(own: list[OwnOption]) -> list[OwnOption]:
    """The options of each type whose GPU-time is within :data:`AREA_SLACK` of the least."""
    least: dict[int, int] = {}
    for o in own:
        least[o.gpu_type] = min(least.get(o.gpu_type, o.gpus * o.duration), o.gpus * o.duration)
    return [o for o in own if o.gpus * o.duration <= AREA_SLACK * least[o.gpu_type]]


def _cents(usd: float) -> int:
    return ceil_units(usd * 100)


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
        release = ceil_units(job.release_hours / unit_h)
        deadline = floor_units(job.deadline_hours / unit_h)
        own, rent = [], None
        for j in range(len(opts)):
            gid, time_h = opts.gpu_id[j], float(opts.time_s[j]) / 3600.0
            dur = max(1, ceil_units(time_h / unit_h))
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
        own = prune_own(own)
        fleet_runs += [Run(i, k, release, deadline, own, rent) for k in range(job.count)]
    inst = FleetInstance(
        horizon=floor_units(horizon_h / unit_h),
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


def _earliest_start(free: np.ndarray, release: int, deadline: int, gpus: int, duration: int) -> int | None:
    """The earliest start in [release, deadline − duration] with ``gpus`` free all along, or None."""
    if deadline - release < duration:
        return None
    bad = np.concatenate([[0], np.cumsum(free[release:deadline] < gpus)])
    ok = np.flatnonzero(bad[duration:] == bad[:-duration])
    return None if len(ok) == 0 else release + int(ok[0])


def greedy_solution(inst: FleetInstance, naive: FleetSolution, *, deadline: float | None = None) -> FleetSolution:
    """A fleet built a unit at a time, for the solver to start from (and an answer in its own right).

    Runs that cannot be rented keep their naive placement. Then, round after round, for each type
    and each number k of extra units, the rented runs are packed onto the type's free capacity
    (most saving per GPU-hour first, each at its earliest start, with its cheapest option that fits)
    and the (type, k) that saves most is bought; until nothing saves or ``deadline``
    (``time.perf_counter()``) passes."""
    usage, choices, units = _unrentable_as_naive(inst, naive)
    rented = {i for i, r in enumerate(inst.runs) if r.rent is not None}
    while rented and (deadline is None or time.perf_counter() < deadline):
        best = None  # (net saving, t, k, placed, use)
        for t in range(len(inst.unit_gpus)):
            best = _best_extra_units(inst, t, rented, units, usage, best, deadline)
        if best is None or best[0] <= 0:
            break
        _, t, k, placed, use = best
        units[t] += k
        usage[t] = use
        choices.update(placed)
        rented -= set(placed)
    for i in rented:
        choices[i] = Choice(i, inst.runs[i].release, None, inst.runs[i].rent)
    sol = FleetSolution("feasible", None, None, units, [choices[i] for i in range(len(inst.runs))], 0.0)
    return trim(inst, sol)


def _unrentable_as_naive(inst: FleetInstance,
                         naive: FleetSolution) -> tuple[np.ndarray, dict[int, Choice], list[int]]:
    """The runs that cannot be rented, placed as the naive answer placed them: the GPUs they use
    per type and time unit, their choices, and the units of each type they need."""
    H = max(1, inst.horizon)
    n_types = len(inst.unit_gpus)
    usage = np.zeros((n_types, H + 1), dtype=np.int64)
    choices: dict[int, Choice] = {}
    units = [0] * n_types
    for c in naive.choices:  # runs without a rental stay as the naive answer placed them
        if inst.runs[c.run].rent is None:
            choices[c.run] = c
            if c.own is not None:
                usage[c.own.gpu_type, c.start:c.start + c.own.duration] += c.own.gpus
    for t in range(n_types):
        units[t] = -(-int(usage[t].max()) // inst.unit_gpus[t])
    return usage, choices, units


def _units_cost(inst: FleetInstance, t: int, n: int) -> int:
    """``n`` units of type ``t`` with their hosts, in cents."""
    return n * inst.unit_cost_cents[t] + inst.host_cost_cents[t] * inst.hosts_for(t, n)


def _pack(inst: FleetInstance, used: np.ndarray, t: int, cap: int,
          order: list[int]) -> tuple[int, dict[int, Choice], np.ndarray]:
    """The runs of ``order`` placed in turn on type ``t``'s ``cap`` GPUs (``used`` already taken),
    each at its earliest start with its cheapest option that fits and saves against renting: the
    saving, the placements, and the GPUs in use afterwards."""
    use = used.copy()
    placed: dict[int, Choice] = {}
    saving = 0
    for i in order:
        r = inst.runs[i]
        best = None
        for o in r.own:
            if o.gpu_type != t or o.cost_cents >= r.rent.cost_cents or o.gpus > cap:
                continue
            if best is not None and o.cost_cents >= best[0].cost_cents:
                continue
            s = _earliest_start(cap - use, r.release, r.deadline, o.gpus, o.duration)
            if s is not None:
                best = (o, s)
        if best is not None:
            o, s = best
            use[s:s + o.duration] += o.gpus
            placed[i] = Choice(i, s, o, None)
            saving += inst.runs[i].rent.cost_cents - o.cost_cents
    return saving, placed, use


def _by_saving_density(inst: FleetInstance, t: int, cands: list[int]) -> list[int]:
    """The runs, most saving per GPU-hour on type ``t`` first."""
    def density(i: int) -> float:
        r = inst.runs[i]
        return max((r.rent.cost_cents - o.cost_cents) / (o.gpus * o.duration)
                   for o in r.own if o.gpu_type == t)

    return sorted(cands, key=lambda i: (-density(i), i))


def _best_extra_units(inst: FleetInstance, t: int, rented: set[int], units: list[int], usage: np.ndarray,
                      best: tuple | None, deadline: float | None) -> tuple | None:
    """``best`` (net saving, t, k, placed, use) of the round so far, or k more units of type ``t``
    where they save more: k grows while it places more runs, until two in a row save no more than
    the best."""
    cands = [i for i in rented if any(o.gpu_type == t for o in inst.runs[i].own)]
    if not cands:
        return best
    order = _by_saving_density(inst, t, cands)
    worse = 0
    k = 1
    last_placed = -1
    while k <= inst.max_units[t] - units[t] and worse < 2:
        saving, placed, use = _pack(inst, usage[t], t, (units[t] + k) * inst.unit_gpus[t], order)
        net = saving - (_units_cost(inst, t, units[t] + k) - _units_cost(inst, t, units[t]))
        if best is None or net > best[0]:
            best = (net, t, k, placed, use)
            worse = 0
        else:
            worse += 1
        if len(placed) == len(cands) or len(placed) == last_placed:
            break
        last_placed = len(placed)
        k += 1
        if deadline is not None and time.perf_counter() >= deadline:
            break
    return best


# ---------------------------------------------------------------------------------------------
# The answer

@dataclass
class Answer:
    status: str  # optimal | feasible | timeout | infeasible
    solution: FleetSolution  # what is returned (trimmed, checked)
    source: str  # solver | greedy | naive | rent-all
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


#: Share of the solver's wall-clock limit the greedy fleet may use before the solver starts.
GREEDY_SHARE = 0.2


def solve_instance(inst: FleetInstance, names: list[str], limit: SolveLimit) -> Answer:
    """Baselines, a greedy fleet, the solver started from the best of them, and the cheapest
    answer that passes the checker.

    Every candidate answer is trimmed to the fleet its schedule's peak uses (so no bought unit is
    idle) and checked; the naive baseline as reported keeps each job's own units (its definition)."""
    t0 = time.perf_counter()
    naive, notes = naive_solution(inst, names)
    renting = rent_all_solution(inst)
    findings: list[str] = []
    for name, sol in (("naive", naive), ("rent-all", renting)):
        if sol is not None:
            findings += [f"{name} baseline: {m}" for m in check(inst, sol, idle=False)]
    baselines = [("naive", trim(inst, naive))] + ([("rent-all", renting)] if renting is not None else [])
    greedy_until = None if limit.wall_s is None else t0 + GREEDY_SHARE * limit.wall_s
    greedy = ("greedy", greedy_solution(inst, naive, deadline=greedy_until))
    start = min(baselines + [greedy], key=lambda b: b[1].objective_cents)
    model = FleetModel(inst)
    model.hint(start[1])
    if limit.wall_s is not None:  # the solver gets what is left
        limit = dataclasses.replace(limit, wall_s=max(MIN_SOLVER_S, limit.wall_s - (time.perf_counter() - t0)))
    raw = model.solve(limit)
    if raw.status == "infeasible":
        raise CheckFailed("the fleet model is infeasible although every run has an option (a bug)")
    candidates: list[tuple[str, FleetSolution]] = []
    for name, sol in ([("solver", trim(inst, raw))] if raw.choices else []) + [greedy] + baselines:
        problems = check(inst, sol)
        findings += [f"{name} answer: {m}" for m in problems]
        if not problems:
            candidates.append((name, sol))
    if not candidates:
        raise CheckFailed("no answer passed the check: " + "; ".join(findings))
    # The cheapest; on a tie a baseline (what was found is then no better than it).
    rank = {"naive": 0, "rent-all": 1, "solver": 2, "greedy": 3}
    source, answer = min(candidates, key=lambda c: (c[1].objective_cents, rank[c[0]]))
    bound = lower_bound_cents(inst)
    if raw.bound_cents is not None:
        bound = max(bound, math.ceil(raw.bound_cents - 1e-6))
    bound = min(bound, answer.objective_cents)
    base_best = min(sol.objective_cents for name, sol in candidates if name in ("naive", "rent-all"))
    if bound >= answer.objective_cents:  # the solver's proof (its bound), or the simple bound
        status = "optimal"
    elif source in ("solver", "greedy") and answer.objective_cents < base_best:
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


def _options_group(jobs: list[JobRun], gpu_types, max_gpus, tier: str) -> list[JobOptions | list[str]]:
    """Candidates of jobs that differ only in their token budgets: one search for each distinct
    request, the others evaluated on its plans (planner.fleet.job_options.options_like). A job's
    input problems come back in its place."""
    counts = None if tier == "all" else coarse_counts(max_gpus)
    out: list[JobOptions | list[str]] = []
    searched: list[JobOptions] = []
    for job in jobs:
        try:
            req, _ = job_request(job, gpu_types, max_gpus)
            base = next((o for o in searched if same_search(o.req, req)), None)
            if base is None:
                base = job_options(job, gpu_types, max_gpus, counts)
                searched.append(base)
                out.append(base)
            else:
                out.append(options_like(base, job, gpu_types, max_gpus))
        except InputError as exc:
            out.append(list(exc.problems))
    return out


def generate_options(runs: list[JobRun], gpu_types, max_gpus: int, *, workers: int | None = None,
                     deadline: float | None = None) -> tuple[list[JobOptions], Generation]:
    """Every job's candidates; in several processes when there are several jobs. Jobs that differ
    only in their token budgets share one search.

    With a ``deadline`` (``time.perf_counter()`` seconds), jobs not started by then get only their
    coarse candidates (powers of two: always built, even past the deadline); what was built in full
    is kept. Without one: every count of every job."""
    from planner.core.pools import MIN_SCENARIOS_FOR_PROCESSES, default_workers

    t0 = time.perf_counter()
    workers = default_workers() if workers is None else workers
    groups: dict[str, list[int]] = {}
    for k, job in enumerate(runs):
        groups.setdefault(token_free_key(job), []).append(k)
    items = list(groups.values())
    results: dict[int, tuple[str, JobOptions | list[str]]] = {}

    def keep(idx: list[int], tier: str, got: list) -> None:
        for k, o in zip(idx, got):
            results[k] = (tier, o)

    if workers <= 1 or len(items) < MIN_SCENARIOS_FOR_PROCESSES:
        for idx in items:
            tier = "all" if deadline is None or time.perf_counter() < deadline else "coarse"
            keep(idx, tier, _options_group([runs[k] for k in idx], gpu_types, max_gpus, tier))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, wait

        from planner.core.pools import ignore_interrupts, stopped_on_interrupt

        # Fork where there is one: a spawned worker first re-imports the package (3-5 s on a loaded
        # 2-core machine, most of a 30 s limit); a forked one starts with the parent's modules and
        # loaded catalogs. Nothing runs threads in the parent yet (the solver starts later).
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        ctx = multiprocessing.get_context(method)
        with ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=ctx,
                                 initializer=ignore_interrupts) as pool:
            futures = {pool.submit(_options_group, [runs[k] for k in idx], gpu_types, max_gpus, "all"): (i, "all")
                       for i, idx in enumerate(items)}
            with stopped_on_interrupt(pool):
                timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
                wait(futures, timeout=timeout)
                for f, (i, _) in list(futures.items()):
                    if not f.done() and f.cancel():  # not started in time: the coarse counts only
                        del futures[f]
                        futures[pool.submit(_options_group, [runs[k] for k in items[i]], gpu_types, max_gpus,
                                            "coarse")] = (i, "coarse")
                for f, (i, tier) in futures.items():
                    keep(items[i], tier, f.result())
    problems = [m for k in range(len(runs)) if isinstance(results[k][1], list) for m in results[k][1]]
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


def procure_data(data: Any, *, time_limit_s: float | None = None, workers: int | None = None) -> ProcureResult:
    """The answer for a portfolio given as its mapping (an HTTP request's body): every job's
    scenario inline, no price file (nothing is read from disk on a request's behalf)."""
    problems = []
    if isinstance(data, dict):
        if data.get("prices"):
            problems.append("prices: price files are not read for a request; give prices in the catalog or "
                            "as purchase/rental costs in the portfolio")
        for i, job in enumerate(data.get("jobs") or []):
            if isinstance(job, dict) and isinstance(job.get("scenario"), str):
                problems.append(f"jobs[{i}].scenario: give the scenario inline (a mapping), not a file name")
    if problems:
        raise InputError(problems)
    return procure("portfolio", time_limit_s=time_limit_s, workers=workers, data=data)


def procure(path: str | Path, *, time_limit_s: float | None = None, workers: int | None = None,
            deterministic_time: float | None = None, solver_workers: int | None = None,
            data: Any = None) -> ProcureResult:
    """The answer for a portfolio file within ``time_limit_s`` (default: the portfolio's), wall clock
    from this call's start to the checked answer.

    ``deterministic_time``: repeatable instead — every candidate is built whatever it takes, and the
    solver stops after that much CP-SAT deterministic time on ``solver_workers`` (default one)
    worker: the same answer on any machine under any load (tests)."""
    t0 = time.perf_counter()
    p, runs = load_portfolio(path, data)
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
        reserve = min(RESERVE_S + RESERVE_S_PER_RUN * len(problem.inst.runs), RESERVE_SHARE * limit_s)
        left = limit_s - (time.perf_counter() - t0) - reserve
        limit = SolveLimit(wall_s=max(MIN_SOLVER_S, left), workers=solver_workers)
    if missing:
        return ProcureResult(problem, None, gen, limit, missing)
    return ProcureResult(problem, solve_instance(problem.inst, problem.names, limit), gen, limit)


def as_date(problem: Problem, hours: float) -> str | None:
    start = problem.portfolio.start_date
    return None if start is None else (start + dt.timedelta(hours=hours)).isoformat()
