"""A portfolio as the fleet model's instance (:class:`Problem`): each run's own-hardware options
(those within :data:`AREA_SLACK` of the least GPU-time) and its cheapest rental, in whole time
units and cents; and the jobs no candidate can run inside their window, with why.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from planner.catalog.prices import PriceTable
from planner.core.units import ceil_units, floor_units
from planner.fleet.cpsat import FleetInstance, OwnOption, RentOption, Run
from planner.fleet.job_options import JobOptions
from planner.fleet.offers import Offer, build_offers
from planner.fleet.portfolio import HOURS_PER_MONTH, JobRun, Portfolio

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


def as_date(problem: Problem, hours: float) -> str | None:
    start = problem.portfolio.start_date
    return None if start is None else (start + dt.timedelta(hours=hours)).isoformat()
