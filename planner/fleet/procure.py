"""``planner procure``: the fleet to buy or rent for a portfolio of jobs, and when each job runs.

One time limit covers the whole answer:

1. Each job's candidates (planner.fleet.job_options; every job's: planner.fleet.generation): per
   GPU type that has a price and per GPU count, the fastest plan. Generation gets
   :data:`GENERATION_SHARE` of the limit: jobs not started by then get only their coarse
   candidates (powers of two; always built); what is built is kept.
2. Prices (planner.catalog.prices): the catalog's, then the dated costs of owning
   (planner.fleet.ownership: whole servers, hosts for PCIe cards, street prices), then the
   portfolio's price files; purchase, on-demand and spot kept apart; stale ones flagged; each GPU
   type's offer to own or rent (planner.fleet.offers), and the model's instance
   (planner.fleet.problem).
3. Two baselines, always: the naive answer (each job's cheapest setup bought separately) and
   renting everything; and a greedy fleet (planner.fleet.answer.greedy_solution). Then one
   CP-SAT model over every run of every job (planner.fleet.cpsat), started from the best of
   them, with the rest of the limit.
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

import time
from pathlib import Path
from typing import Any

from planner.core.errors import InputError
from planner.fleet.answer import MIN_SOLVER_S, solve_instance
from planner.fleet.cpsat import SolveLimit
from planner.fleet.generation import generate_options
from planner.fleet.offers import build_offers, load_tables, priced_types
from planner.fleet.portfolio import load_portfolio
from planner.fleet.problem import build_problem, unplaceable
from planner.fleet.result import ProcureResult

#: Share of the time limit that candidate generation may use before the solver starts (measured
#: from the call's start; every job's coarse candidates are built even past it).
GENERATION_SHARE = 0.5
#: Seconds kept back from the solver for trimming, checking and the report: a second, plus the
#: report's plans at about 7 ms a run (1.1 s for bench/portfolio_80.py's 160 runs, measured);
#: at most :data:`RESERVE_SHARE` of the limit, so that a short limit leaves the solver something.
RESERVE_S = 1.0
RESERVE_S_PER_RUN = 0.01
RESERVE_SHARE = 0.2


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

