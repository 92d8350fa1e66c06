"""The CP-SAT model of procurement: which GPUs to buy, which runs to rent, and when each runs.

Sets
    T       GPU types that can be bought; u_t GPUs per purchase unit (a node where the type comes
            on a baseboard), c_t the cost of owning one unit over the horizon (amortised purchase
            plus hosting), integer cents
    I       runs (a job with count k is k runs); window [r_i, d_i] in time units
    O_i     run i's own-hardware options: type t(o), GPUs n_o, duration p_o (time units, rounded
            up), running cost e_o (power while it runs, cents)
    R_i     run i's rental option (at most one: renting has no capacity limit, so only the
            cheapest rental that fits the window can be chosen): duration p_i, cost f_i

Variables
    b_t ∈ ℕ         units of type t bought
    z_o ∈ {0, 1}    run i uses own option o ∈ O_i;   w_i ∈ {0, 1}  run i is rented
    s_i ∈ [r_i, d_i − min p]   start of run i (one start shared by its options)

Constraints (each in its own method, tested alone)
    (1) one choice:  Σ_{o ∈ O_i} z_o + w_i = 1
    (2) window:      s_i + p_o ≤ d_i  if z_o;   s_i + p_i ≤ d_i  if w_i
    (3) fleet:       cumulative over time of the optional intervals [s_i, s_i + p_o) of type t,
                     demand n_o, capacity u_t · b_t
    (4) energy:      Σ n_o p_o z_o ≤ u_t · b_t · H for each t (implied by (3); tightens the bound)
    (5) symmetry:    s_i ≤ s_{i'} for consecutive runs i, i' of one job (runs are identical)

Objective: min Σ_t c_t b_t + Σ_o e_o z_o + Σ_i f_i w_i  (cents).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortools.sat.python import cp_model

SOLVER_SEED = 7
#: Parallel workers of the solver. CP-SAT's portfolio (LNS, core-based bounds, LP) needs about
#: eight; even on 2 cores, 8 time-shared workers halved the gap of bench/portfolio_20.py after 30 s
#: against 2 (10.8 % vs 19.5 %, measured once each).
WORKERS = 8


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

    def __post_init__(self) -> None:
        if not self.max_units:
            self.max_units = []
            for t, u in enumerate(self.unit_gpus):
                need = sum(max((o.gpus for o in r.own if o.gpu_type == t), default=0) for r in self.runs)
                self.max_units.append(-(-need // u))


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

    def _set_objective(self) -> None:
        terms = [c * b for c, b in zip(self.inst.unit_cost_cents, self.b)]
        for i, r in enumerate(self.inst.runs):
            terms += [o.cost_cents * zo for o, zo in zip(r.own, self.z[i])]
            if r.rent is not None:
                terms.append(r.rent.cost_cents * self.w[i])
        self.m.Minimize(sum(terms))

    def hint(self, sol: FleetSolution) -> None:
        """Start the search from a known solution (e.g. the naive one)."""
        for t, n in enumerate(sol.units):
            self.m.AddHint(self.b[t], min(n, self.inst.max_units[t]))
        for c in sol.choices:
            self.m.AddHint(self.s[c.run], c.start)
            r = self.inst.runs[c.run]
            for o, zo in zip(r.own, self.z[c.run]):
                self.m.AddHint(zo, int(c.own == o))
            if self.w[c.run] is not None:
                self.m.AddHint(self.w[c.run], int(c.rent is not None))

    def solve(self, time_limit_s: float, workers: int | None = None) -> FleetSolution:
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.05, time_limit_s)
        solver.parameters.num_workers = workers or WORKERS
        solver.parameters.random_seed = SOLVER_SEED
        code = solver.Solve(self.m)
        status = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
                  cp_model.INFEASIBLE: "infeasible"}.get(code, "unknown")
        if status not in ("optimal", "feasible"):
            return FleetSolution(status, None, None, [], [], solver.WallTime())
        choices = []
        for i, r in enumerate(self.inst.runs):
            own = next((o for o, zo in zip(r.own, self.z[i]) if solver.Value(zo)), None)
            choices.append(Choice(i, solver.Value(self.s[i]), own, None if own else r.rent))
        return FleetSolution(status, int(round(solver.ObjectiveValue())), solver.BestObjectiveBound(),
                             [solver.Value(b) for b in self.b], choices, solver.WallTime())


def check(inst: FleetInstance, sol: FleetSolution) -> list[str]:
    """Solver-independent check: one choice per run, windows, the fleet's capacity over time."""
    problems = []
    usage: dict[int, list[tuple[int, int]]] = {}
    for c in sol.choices:
        r = inst.runs[c.run]
        if (c.own is None) == (c.rent is None):
            problems.append(f"run {c.run}: needs exactly one of own or rent")
            continue
        dur = c.own.duration if c.own else c.rent.duration
        if c.start < r.release or c.start + dur > r.deadline:
            problems.append(f"run {c.run}: [{c.start}, {c.start + dur}) outside window [{r.release}, {r.deadline}]")
        if c.own:
            usage.setdefault(c.own.gpu_type, []).extend([(c.start, c.own.gpus), (c.start + dur, -c.own.gpus)])
    for t, events in usage.items():
        level = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at one time
            level += delta
            if level > sol.units[t] * inst.unit_gpus[t]:
                problems.append(f"type {t}: {level} GPUs in use, {sol.units[t] * inst.unit_gpus[t]} owned")
                break
    return problems


def objective_of(inst: FleetInstance, sol: FleetSolution) -> int:
    """The objective recomputed from the choices (cents)."""
    total = sum(c * n for c, n in zip(inst.unit_cost_cents, sol.units))
    for c in sol.choices:
        total += c.own.cost_cents if c.own else c.rent.cost_cents
    return total
