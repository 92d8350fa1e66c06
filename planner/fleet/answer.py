"""The answer to a fleet instance: the naive baseline (each job's cheapest setup bought
separately), renting everything, a greedy fleet built a unit at a time, and the solver started
from the best of them; the cheapest that passes the independent checker
(planner.fleet.cpsat.check) is returned, with its status (planner.fleet.procure says what each
status means).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import numpy as np

from planner.fleet.cpsat import (
    Choice,
    FleetInstance,
    FleetModel,
    FleetSolution,
    SolveLimit,
    check,
    lower_bound_cents,
    objective_of,
    trim,
)
from planner.fleet.problem import Problem

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
#: Seconds the solver always gets, even when generation used up the limit. Small: the solver
#: starts from the best of the greedy fleet and the baselines, which stand as the answer (status
#: ``timeout``) when it finds nothing better in time, so a short limit is honoured, not floored.
MIN_SOLVER_S = 0.1


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
