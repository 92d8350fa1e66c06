"""The CP-SAT model of procurement: which GPUs to buy, which runs to rent, and when each runs.

Sets
    T       GPU types that can be bought; u_t GPUs per purchase unit (a whole server where the type
            comes on a baseboard, else one card), c_t the cost of owning one unit over the horizon
            (amortised purchase plus hosting), integer cents; cards that go into a host server
            (PCIe, consumer) also need hosts: k_t units per host, g_t the cost of owning one host
    I       runs (a job with count k is k runs); window [r_i, d_i] in time units
    O_i     run i's own-hardware options: type t(o), GPUs n_o, duration p_o (time units, rounded
            up), running cost e_o (power while it runs, cents)
    R_i     run i's rental option (at most one: renting has no capacity limit, so only the
            cheapest rental that fits the window can be chosen): duration p_i, cost f_i

Variables
    b_t ∈ ℕ         units of type t bought;   h_t ∈ ℕ  hosts for them (types with k_t > 0)
    z_o ∈ {0, 1}    run i uses own option o ∈ O_i;   w_i ∈ {0, 1}  run i is rented
    s_i ∈ [r_i, d_i − min p]   start of run i (one start shared by its options)

Constraints (each in its own method, tested alone)
    (1) one choice:  Σ_{o ∈ O_i} z_o + w_i = 1
    (2) window:      s_i + p_o ≤ d_i  if z_o;   s_i + p_i ≤ d_i  if w_i
    (3) fleet:       cumulative over time of the optional intervals [s_i, s_i + p_o) of type t,
                     demand n_o, capacity u_t · b_t
    (4) energy:      Σ n_o p_o z_o ≤ u_t · b_t · H for each t (implied by (3); tightens the bound)
    (5) symmetry:    s_i ≤ s_{i'} for consecutive runs i, i' of one job (runs are identical)
    (6) no idle purchase: u_t b_t ≤ Σ n_o z_o + u_t − 1 (a unit no run could use is never bought:
                     the peak use is at most the sum of demands); hosts: b_t ≤ k_t h_t ≤ b_t + k_t − 1

Objective: min Σ_t (c_t b_t + g_t h_t) + Σ_o e_o z_o + Σ_i f_i w_i  (cents).

:func:`trim` then cuts any solution's fleet to what its schedule's peak needs, and :func:`check`
verifies a solution without the solver (choices, windows, capacity over time, no idle unit).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from planner.core.units import floor_units

SOLVER_SEED = 7
#: Parallel workers of the solver: one per CPU available, at least 2 and at most 8. On 2 loaded
#: cores (load average 7-10), with presolve probing off and a greedy start, 2 workers improved on
#: the start within 20-25 s where 8 did not (bench/portfolio_20.py: $146,027 vs no improvement on
#: $149,473; bench/portfolio_80.py: $905,441 vs $921,371; measured once each). Runs that must
#: repeat (tests) use one worker and a deterministic limit instead (:class:`SolveLimit`).
WORKERS = max(2, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)))


@dataclass(frozen=True)
class SolveLimit:
    """When the solver stops: after ``wall_s`` seconds (production), or after ``deterministic``
    units of CP-SAT's deterministic time (about a second each on a typical core, but the same on
    any machine and under any load: results repeat). ``workers`` None: :data:`WORKERS`, or one
    when the limit is deterministic."""

    wall_s: float | None = None
    deterministic: float | None = None
    workers: int | None = None

    @property
    def repeatable(self) -> bool:
        return self.deterministic is not None


@dataclass(frozen=True)
class OwnOption:
    option: int  # index into the job's candidates
    gpu_type: int  # index into FleetInstance.unit_gpus
    gpus: int
    duration: int  # time units
    cost_cents: int


@dataclass(frozen=True)
class RentOption:
    option: int
    kind: str
    duration: int
    cost_cents: int


@dataclass
class Run:
    job: int
    copy: int
    release: int
    deadline: int
    own: list[OwnOption]
    rent: RentOption | None


@dataclass
class FleetInstance:
    """Integers only: what the model needs."""

    horizon: int
    unit_gpus: list[int]
    unit_cost_cents: list[int]
    runs: list[Run]
    max_units: list[int] = field(default_factory=list)
    units_per_host: list[int] = field(default_factory=list)  # 0: the unit is a whole server
    host_cost_cents: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.max_units:
            self.max_units = []
            for t, u in enumerate(self.unit_gpus):
                need = sum(max((o.gpus for o in r.own if o.gpu_type == t), default=0) for r in self.runs)
                self.max_units.append(-(-need // u))
        if not self.units_per_host:
            self.units_per_host = [0] * len(self.unit_gpus)
        if not self.host_cost_cents:
            self.host_cost_cents = [0] * len(self.unit_gpus)

    def hosts_for(self, t: int, units: int) -> int:
        k = self.units_per_host[t]
        return -(-units // k) if k > 0 else 0


@dataclass
class Choice:
    run: int
    start: int
    own: OwnOption | None
    rent: RentOption | None


@dataclass
class FleetSolution:
    status: str  # optimal | feasible | infeasible | unknown
    objective_cents: int | None
    bound_cents: float | None
    units: list[int]
    choices: list[Choice]
    wall_s: float
    deterministic_time: float = 0.0

    @property
    def gap(self) -> float | None:
        if self.objective_cents is None or self.bound_cents is None or self.objective_cents <= 0:
            return None
        return max(0.0, (self.objective_cents - self.bound_cents) / self.objective_cents)


class FleetModel:
    def __init__(self, inst: FleetInstance):
        self.inst = inst
        m = self.m = cp_model.CpModel()
        self.b = [m.NewIntVar(0, mu, f"b[{t}]") for t, mu in enumerate(inst.max_units)]
        self.h = [m.NewIntVar(0, inst.hosts_for(t, mu), f"h[{t}]") if inst.units_per_host[t] > 0 else None
                  for t, mu in enumerate(inst.max_units)]
        self.z: list[list[cp_model.IntVar]] = []
        self.w: list[cp_model.IntVar | None] = []
        self.s: list[cp_model.IntVar] = []
        for i, r in enumerate(inst.runs):
            durations = [o.duration for o in r.own] + ([r.rent.duration] if r.rent else [])
            latest = max(r.release, r.deadline - min(durations, default=0))
            self.s.append(m.NewIntVar(r.release, latest, f"s[{i}]"))
            self.z.append([m.NewBoolVar(f"z[{i},{k}]") for k in range(len(r.own))])
            self.w.append(m.NewBoolVar(f"w[{i}]") if r.rent else None)
        self._add_one_choice()
        self._add_windows()
        self._add_fleet()
        self._add_energy()
        self._add_symmetry()
        self._add_no_idle_purchase()
        self._set_objective()

    # (1)
    def _add_one_choice(self) -> None:
        for i in range(len(self.inst.runs)):
            lits = list(self.z[i]) + ([self.w[i]] if self.w[i] is not None else [])
            self.m.AddExactlyOne(lits)

    # (2)
    def _add_windows(self) -> None:
        for i, r in enumerate(self.inst.runs):
            for o, zo in zip(r.own, self.z[i]):
                self.m.Add(self.s[i] + o.duration <= r.deadline).OnlyEnforceIf(zo)
            if r.rent is not None:
                self.m.Add(self.s[i] + r.rent.duration <= r.deadline).OnlyEnforceIf(self.w[i])

    def _own_by_type(self, t: int):
        for i, r in enumerate(self.inst.runs):
            for o, zo in zip(r.own, self.z[i]):
                if o.gpu_type == t:
                    yield i, o, zo

    # (3)
    def _add_fleet(self) -> None:
        for t, u in enumerate(self.inst.unit_gpus):
            intervals, demands = [], []
            for i, o, zo in self._own_by_type(t):
                intervals.append(self.m.NewOptionalFixedSizeIntervalVar(self.s[i], o.duration, zo, f"x[{i},{o.option}]"))
                demands.append(o.gpus)
            if intervals:
                self.m.AddCumulative(intervals, demands, self.b[t] * u)

    # (4)
    def _add_energy(self) -> None:
        for t, u in enumerate(self.inst.unit_gpus):
            terms = [(zo, o.gpus * o.duration) for _, o, zo in self._own_by_type(t)]
            if terms:
                self.m.Add(sum(c * zo for zo, c in terms) <= self.b[t] * (u * self.inst.horizon))

    # (5)
    def _add_symmetry(self) -> None:
        runs = self.inst.runs
        for i in range(1, len(runs)):
            if runs[i].job == runs[i - 1].job:
                self.m.Add(self.s[i - 1] <= self.s[i])

    # (6)
    def _add_no_idle_purchase(self) -> None:
        for t, u in enumerate(self.inst.unit_gpus):
            terms = [(zo, o.gpus) for _, o, zo in self._own_by_type(t)]
            self.m.Add(self.b[t] * u <= sum(n * zo for zo, n in terms) + (u - 1))
            k = self.inst.units_per_host[t]
            if self.h[t] is not None:
                self.m.Add(self.b[t] <= self.h[t] * k)
                self.m.Add(self.h[t] * k <= self.b[t] + (k - 1))

    def _set_objective(self) -> None:
        terms = [c * b for c, b in zip(self.inst.unit_cost_cents, self.b)]
        terms += [g * h for g, h in zip(self.inst.host_cost_cents, self.h) if h is not None]
        for i, r in enumerate(self.inst.runs):
            terms += [o.cost_cents * zo for o, zo in zip(r.own, self.z[i])]
            if r.rent is not None:
                terms.append(r.rent.cost_cents * self.w[i])
        self.m.Minimize(sum(terms))

    def hint(self, sol: FleetSolution) -> None:
        """Start the search from a known solution (e.g. the naive one)."""
        for t, n in enumerate(sol.units):
            self.m.AddHint(self.b[t], min(n, self.inst.max_units[t]))
            if self.h[t] is not None:
                self.m.AddHint(self.h[t], self.inst.hosts_for(t, min(n, self.inst.max_units[t])))
        for c in sol.choices:
            self.m.AddHint(self.s[c.run], c.start)
            r = self.inst.runs[c.run]
            for o, zo in zip(r.own, self.z[c.run]):
                self.m.AddHint(zo, int(c.own == o))
            if self.w[c.run] is not None:
                self.m.AddHint(self.w[c.run], int(c.rent is not None))

    def solve(self, limit: SolveLimit | float) -> FleetSolution:
        """Solve under ``limit`` (a :class:`SolveLimit`, or wall-clock seconds)."""
        if not isinstance(limit, SolveLimit):
            limit = SolveLimit(wall_s=float(limit))
        solver = cp_model.CpSolver()
        prm = solver.parameters
        prm.random_seed = SOLVER_SEED
        if limit.wall_s is not None:
            prm.max_time_in_seconds = max(0.05, limit.wall_s)
        if limit.deterministic is not None:
            prm.max_deterministic_time = max(0.01, limit.deterministic)
        prm.num_workers = limit.workers or (1 if limit.repeatable else WORKERS)
        # Presolve's probing took 19 of 20 s on bench/portfolio_80.py's 8,700 optional intervals
        # (2 loaded cores) and found nothing a solution needed; without it the search starts at 5 s.
        prm.cp_model_probing_level = 0
        if prm.num_workers == 1:
            prm.interleave_search = False
        code = solver.Solve(self.m)
        status = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
                  cp_model.INFEASIBLE: "infeasible"}.get(code, "unknown")
        if status not in ("optimal", "feasible"):
            return FleetSolution(status, None, None, [], [], solver.WallTime(), solver.deterministic_time)
        choices = []
        for i, r in enumerate(self.inst.runs):
            own = next((o for o, zo in zip(r.own, self.z[i]) if solver.Value(zo)), None)
            choices.append(Choice(i, solver.Value(self.s[i]), own, None if own else r.rent))
        return FleetSolution(status, round(solver.ObjectiveValue()), solver.BestObjectiveBound(),
                             [solver.Value(b) for b in self.b], choices, solver.WallTime(),
                             solver.deterministic_time)


def peak_use(inst: FleetInstance, sol: FleetSolution) -> dict[int, int]:
    """Most GPUs of each type in use at once by the solution's owned runs."""
    events: dict[int, list[tuple[int, int]]] = {}
    for c in sol.choices:
        if c.own is not None:
            events.setdefault(c.own.gpu_type, []).extend(
                [(c.start, c.own.gpus), (c.start + c.own.duration, -c.own.gpus)])
    peak = {}
    for t, ev in events.items():
        level = best = 0
        for _, delta in sorted(ev):  # ends (negative) before starts at one time
            level += delta
            best = max(best, level)
        peak[t] = best
    return peak


def needed_units(inst: FleetInstance, sol: FleetSolution) -> list[int]:
    """Units of each type the schedule's peak needs: every one of them is in use at the peak."""
    peak = peak_use(inst, sol)
    return [-(-peak.get(t, 0) // u) for t, u in enumerate(inst.unit_gpus)]


def trim(inst: FleetInstance, sol: FleetSolution) -> FleetSolution:
    """The same schedule on the fleet its peak needs (never more than bought), objective recomputed."""
    units = needed_units(inst, sol)
    out = FleetSolution(sol.status, None, sol.bound_cents, units, list(sol.choices), sol.wall_s, sol.deterministic_time)
    out.objective_cents = objective_of(inst, out)
    return out


def check(inst: FleetInstance, sol: FleetSolution, *, idle: bool = True) -> list[str]:
    """Solver-independent check: one choice per run, windows, the fleet's capacity over time, and
    (``idle``) no unit bought that the schedule's peak does not use."""
    problems = []
    if sorted(c.run for c in sol.choices) != list(range(len(inst.runs))):
        problems.append(f"{len(sol.choices)} choices for {len(inst.runs)} runs")
    usage: dict[int, list[tuple[int, int]]] = {}
    for c in sol.choices:
        r = inst.runs[c.run]
        if (c.own is None) == (c.rent is None):
            problems.append(f"run {c.run}: needs exactly one of own or rent")
            continue
        if c.own is not None and c.own not in r.own:
            problems.append(f"run {c.run}: own option {c.own.option} is not one of the run's")
        if c.rent is not None and c.rent != r.rent:
            problems.append(f"run {c.run}: rental {c.rent.option} is not the run's")
        dur = c.own.duration if c.own else c.rent.duration
        if c.start < r.release or c.start + dur > r.deadline:
            problems.append(f"run {c.run}: [{c.start}, {c.start + dur}) outside window [{r.release}, {r.deadline}]")
        if c.own:
            usage.setdefault(c.own.gpu_type, []).extend([(c.start, c.own.gpus), (c.start + dur, -c.own.gpus)])
    units = list(sol.units) + [0] * (len(inst.unit_gpus) - len(sol.units))
    for t, events in usage.items():
        level = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at one time
            level += delta
            if level > units[t] * inst.unit_gpus[t]:
                problems.append(f"type {t}: {level} GPUs in use, {units[t] * inst.unit_gpus[t]} owned")
                break
    for t, (have, need) in enumerate(zip(units, needed_units(inst, sol))):
        if idle and have > need:
            problems.append(f"type {t}: {have} units bought, the schedule uses at most {need} at once")
    return problems


def objective_of(inst: FleetInstance, sol: FleetSolution) -> int:
    """The objective recomputed from the choices (cents); hosts are the fewest that hold the units."""
    total = sum(c * n for c, n in zip(inst.unit_cost_cents, sol.units))
    total += sum(inst.host_cost_cents[t] * inst.hosts_for(t, n) for t, n in enumerate(sol.units))
    for c in sol.choices:
        total += c.own.cost_cents if c.own else c.rent.cost_cents
    return total


def lower_bound_cents(inst: FleetInstance) -> int:
    """A bound no answer can beat: each run alone at its cheapest, owned GPUs charged only for the
    GPU-time the run occupies (the fleet's cost spread over its capacity, as constraint (4) allows)."""
    total = 0.0
    for r in inst.runs:
        best = float(r.rent.cost_cents) if r.rent else float("inf")
        for o in r.own:
            t = o.gpu_type
            k = inst.units_per_host[t]
            per_unit = inst.unit_cost_cents[t] + (inst.host_cost_cents[t] / k if k > 0 else 0.0)
            rate = per_unit / (inst.unit_gpus[t] * max(1, inst.horizon))
            best = min(best, o.cost_cents + rate * o.gpus * o.duration)
        total += best if best != float("inf") else 0.0
    return floor_units(total)
