"""The answer of ``planner procure`` as a typed result (:class:`ProcureResult`, what
``planner.procure`` returns): its status, the fleet to buy (:class:`FleetPurchase`), every run of
every job with its plan's GPU type and count, its time slot and its cost (:class:`ScheduledRun`),
the costs over the horizon (:class:`Costs`) and buy against rent (:class:`BuyVsRent`).
``to_frame()`` is one row per scheduled run; planner.report.procurement.tables(result) makes the
report's tables of it (what ``planner procure`` prints).

Every figure here is recomputed from the chosen fleet and schedule in USD (floats), not read
back from the solver's integer objective (SkyPilot's habit: choose, then recompute).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from planner.fleet.answer import Answer
from planner.fleet.cpsat import Choice, FleetSolution, SolveLimit
from planner.fleet.generation import Generation
from planner.fleet.job_options import option_plan
from planner.fleet.ownership import load_ownership
from planner.fleet.portfolio import HOURS_PER_MONTH, Portfolio
from planner.fleet.problem import Problem, as_date


@dataclass(frozen=True)
class Costs:
    """What an answer costs over the horizon, in USD: the amortised purchase, hosting, power and
    rent (``total_usd`` is their sum); the cash paid up front for what is bought, and what owning
    leaves at the horizon's end: the book value not yet amortised, and the resale assumption's
    value."""

    amortised_purchase_usd: float
    hosting_usd: float
    power_usd: float
    rent_usd: float
    cash_outlay_usd: float
    total_usd: float
    unamortised_at_end_usd: float
    resale_at_end_usd: float


def _run_of(pr: Problem, c: Choice) -> tuple[int, int, float, float]:
    """A scheduled run's job (its index), its candidate, its hours, and what it costs while it
    runs in USD: power on bought GPUs, or its rent."""
    run = pr.inst.runs[c.run]
    opts = pr.options[run.job]
    j = c.own.option if c.own else c.rent.option
    hours = float(opts.time_s[j]) / 3600.0
    offer = pr.offers[opts.gpu_id[j]]
    if c.own:
        return run.job, j, hours, offer.power_usd_per_gpu_hour * int(opts.gpus[j]) * hours
    return run.job, j, hours, offer.rent[c.rent.kind].usd * int(opts.billed_gpus[j]) * hours


def usd_of_solution(pr: Problem, sol: FleetSolution) -> Costs:
    """Amortised purchase, hosting, power and rent of a solution, in USD; and what owning leaves
    at the horizon's end: the book value not yet amortised, and the resale assumption's value."""
    H, life = pr.portfolio.horizon_h, pr.lifetime_hours
    resale = load_ownership().resale_fraction(H / HOURS_PER_MONTH)
    out = {"amortised_purchase_usd": 0.0, "hosting_usd": 0.0, "power_usd": 0.0, "rent_usd": 0.0,
           "cash_outlay_usd": 0.0}
    for t, n in enumerate(sol.units):
        offer = pr.offers[pr.buyable[t]]
        hosts = pr.inst.hosts_for(t, n)
        price = n * offer.unit_usd + hosts * offer.host_usd
        out["amortised_purchase_usd"] += price * min(1.0, H / life)
        out["hosting_usd"] += n * offer.unit_gpus * offer.hosting_usd_per_gpu_hour * H
        out["cash_outlay_usd"] += price
    for c in sol.choices:
        out["power_usd" if c.own else "rent_usd"] += _run_of(pr, c)[3]
    out["total_usd"] = sum(out[k] for k in ("amortised_purchase_usd", "hosting_usd", "power_usd", "rent_usd"))
    out["unamortised_at_end_usd"] = out["cash_outlay_usd"] - out["amortised_purchase_usd"]
    out["resale_at_end_usd"] = out["cash_outlay_usd"] * resale
    return Costs(**out)


@dataclass(frozen=True)
class ScheduledRun:
    """One run of a job: bought or rented, its plan's GPU type and count, its slot in hours from
    the horizon's start (dates where the portfolio has a start date), and its cost in USD:
    ``usage_usd`` (power while it computes on bought GPUs, or its rent), ``fleet_share_usd`` (its
    share, by GPU-hours, of the amortised purchase and hosting of the GPU type it runs on), and
    ``cost_usd``, their sum: the runs' costs add up to the answer's total."""

    job: str
    run: int  # the job's run, from 1 (a job with ``count: 3`` runs three times)
    mode: str  # buy | rent (on-demand) | rent (spot)
    gpu: str
    gpus: int
    billed_gpus: int  # GPUs paid for: whole nodes where the type is rented only so
    start_hours: float
    end_hours: float
    hours: float
    start_date: str | None
    end_date: str | None
    release_hours: float  # the job's window
    deadline_hours: float
    usage_usd: float
    fleet_share_usd: float
    cost_usd: float


@dataclass(frozen=True)
class FleetPurchase:
    """The units of one GPU type to buy (a whole server for baseboard GPUs, else a card) with
    their host servers, what they cost over the horizon in USD, and how busy they are."""

    gpu: str
    units: int
    gpus_per_unit: int
    gpus: int
    unit_usd: float
    hosts: int  # host servers for PCIe cards (0: the unit is a whole server)
    host_usd: float
    cash_outlay_usd: float
    amortised_usd: float
    hosting_usd: float
    unamortised_at_end_usd: float
    resale_at_end_usd: float
    busy_gpu_hours: float
    utilisation: float  # busy GPU-hours over the GPU-hours of the horizon


@dataclass(frozen=True)
class BuyVsRent:
    """This answer against the two baselines, over the horizon in USD (None: no such answer):
    the naive one (each job's cheapest setup bought separately) and renting everything (each run
    at its cheapest rental that fits its window; None where some run cannot be rented)."""

    answer_usd: float | None
    answer_cash_outlay_usd: float | None
    naive_usd: float | None
    naive_cash_outlay_usd: float | None
    rent_all_usd: float | None


@dataclass
class ProcureResult:
    """The fleet to buy or rent for a portfolio, when each job runs, and the costs.

    ``status`` (optimal | feasible | timeout | infeasible: planner.fleet.procure says what each
    means), ``total_usd``, ``costs``, ``fleet``, ``schedule``, ``buy_vs_rent``, ``gap`` and
    ``bound_usd``; ``problems`` says which job cannot run, and why, when infeasible. The solver's
    own records stay beside them: the instance (``problem``), the checked ``answer``, candidate
    generation and the solver's limit."""

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

    @property
    def portfolio(self) -> Portfolio:
        return self.problem.portfolio

    @property
    def gap(self) -> float | None:
        """How far the answer may be from the optimum, as a share of its cost (None: infeasible)."""
        return None if self.answer is None else self.answer.gap

    @property
    def bound_usd(self) -> float | None:
        """The best proven lower bound of the cost, in USD."""
        return None if self.answer is None or self.answer.bound_cents is None else self.answer.bound_cents / 100.0

    @cached_property
    def costs(self) -> Costs | None:
        """This answer's costs over the horizon (None: nothing is scheduled)."""
        return usd_of_solution(self.problem, self.solution) if self.solution.choices else None

    @property
    def total_usd(self) -> float | None:
        return None if self.costs is None else self.costs.total_usd

    @cached_property
    def buy_vs_rent(self) -> BuyVsRent:
        naive = usd_of_solution(self.problem, self.naive) if self.naive.choices else None
        rent_all = None if self.rent_all_cents is None else self.rent_all_cents / 100.0
        return BuyVsRent(self.total_usd, None if self.costs is None else self.costs.cash_outlay_usd,
                         None if naive is None else naive.total_usd,
                         None if naive is None else naive.cash_outlay_usd, rent_all)

    @cached_property
    def _runs(self) -> list[dict[str, Any]]:
        """Each scheduled run's figures, in the solution's order (before the fleet's shares)."""
        pr = self.problem
        unit_h = pr.portfolio.time_unit_hours
        out = []
        for c in self.solution.choices:
            k, j, hours, usage = _run_of(pr, c)
            job, opts = pr.runs[k], pr.options[k]
            start_h = c.start * unit_h
            out.append({
                "job": job.name, "run": pr.inst.runs[c.run].copy + 1,
                "mode": "buy" if c.own else f"rent ({c.rent.kind.replace('_', '-')})",
                "gpu": opts.gpu_id[j], "gpus": int(opts.gpus[j]), "billed_gpus": int(opts.billed_gpus[j]),
                "start_hours": start_h, "end_hours": start_h + hours, "hours": hours,
                "start_date": as_date(pr, start_h), "end_date": as_date(pr, start_h + hours),
                "release_hours": job.release_hours, "deadline_hours": job.deadline_hours, "usage_usd": usage,
                "option": (k, j),
            })
        return out

    @cached_property
    def fleet(self) -> list[FleetPurchase]:
        """The GPU types to buy, in the model's order of types."""
        pr, sol = self.problem, self.solution
        H = pr.portfolio.horizon_h
        resale = load_ownership().resale_fraction(H / HOURS_PER_MONTH)
        busy: dict[str, float] = {}
        for r in self._runs:
            if r["mode"] == "buy":
                busy[r["gpu"]] = busy.get(r["gpu"], 0.0) + r["hours"] * r["gpus"]
        out = []
        for t, n in enumerate(sol.units):
            if n == 0:
                continue
            gid = pr.buyable[t]
            offer = pr.offers[gid]
            gpus = n * offer.unit_gpus
            hosts = pr.inst.hosts_for(t, n)
            outlay = n * offer.unit_usd + hosts * offer.host_usd
            amortised = outlay * min(1.0, H / pr.lifetime_hours)
            out.append(FleetPurchase(
                gid, n, offer.unit_gpus, gpus, offer.unit_usd, hosts, offer.host_usd, outlay, amortised,
                gpus * offer.hosting_usd_per_gpu_hour * H, outlay - amortised, outlay * resale,
                busy.get(gid, 0.0), busy.get(gid, 0.0) / (gpus * H)))
        return out

    @cached_property
    def schedule(self) -> list[ScheduledRun]:
        """Every run of every job, in the answer's order (as ``planner procure`` lists them)."""
        fleet_usd = {f.gpu: (f.amortised_usd + f.hosting_usd, f.busy_gpu_hours) for f in self.fleet}
        out = []
        for r in self._runs:
            cost, busy = fleet_usd.get(r["gpu"], (0.0, 0.0)) if r["mode"] == "buy" else (0.0, 0.0)
            share = cost * r["hours"] * r["gpus"] / busy if busy else 0.0
            figures = {k: v for k, v in r.items() if k != "option"}
            out.append(ScheduledRun(**figures, fleet_share_usd=share, cost_usd=r["usage_usd"] + share))
        return out

    def plans(self) -> list[Any]:
        """The full plan of each scheduled run (memory re-estimated and checked: about 7 ms a run),
        in the order of :attr:`schedule`."""
        return [option_plan(self.problem.options[job], j) for job, j in (r["option"] for r in self._runs)]

    def to_frame(self):
        """The schedule as a pandas DataFrame, one row per scheduled run (:class:`ScheduledRun`'s
        fields); its ``cost_usd`` adds up to :attr:`total_usd`. Empty when nothing is scheduled."""
        import pandas as pd

        return pd.DataFrame([dataclasses.asdict(r) for r in self.schedule],
                            columns=[f.name for f in dataclasses.fields(ScheduledRun)])
