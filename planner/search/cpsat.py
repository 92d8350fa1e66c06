"""CP-SAT's choice among the region's plans: one Boolean per plan (a column of the table numpy
evaluated), memory as one row per phase, and the proof that the chosen plans are the top k.

What is decided where: the lattice (planner.search.lattice) generates each plan's layout and
data-parallel degree, so that its GPU count (within max_gpus and its type's fleet) and its global
batch hold by construction; numpy (planner.search.evaluate) computes every plan's memory, host
bytes, time and cost; the best-first search (planner.search.candidates) bounds the region; CP-SAT
picks among the region's plans under memory, host-RAM, budget, deadline and price rows and proves
the pick optimal. What the lattice guarantees is checked once on the tables when the model is
built (:meth:`PlanModel._check_lattice`: a plan breaking it is a bug, raised), not stated as rows
that could never bind. The answer is read from the chosen plan's index, so the model has no
variables but the plans and the GPU types.

Index sets (the tables of :class:`Space`): plans c of the region; GPU types g; shapes s (all a
plan decides but its GPU type and data-parallel degree: relaxation tier, so method and sequence
length; precision, optimizer, micro-batch, TP, PP, CP, EP, SP, ZeRO stage, offload,
checkpointing, attention, stack); degree rows k = (s, dp), memory's argument. A plan is (g, k).

Variables
    y_c ∈ {0, 1}   plan c is chosen (exactly one)
    x_g ∈ {0, 1}   GPU type g is used:  x_g = Σ_{c on g} y_c

Constraints (each in its own method, tested alone)
    (0) one plan, and x_g the one-hot sum of the plans on type g
    (1) memory:       M_p[k(c)] ≤ U[g] for every phase p of a step (device bytes per GPU from
                      the profile's phases, planner.memory.profiles; U = usable bytes of the
                      card, less a colocated generation engine's share except for the phases
                      it sleeps through), stated per GPU type: Σ_{c on g} M_p[k(c)] · y_c ≤ U_p[g]
    (2) host RAM:     per type, Σ_{c on g} H[c] · y_c ≤ R[g]  (offloaded bytes of a node's GPUs)
    (3) budget:       Σ_c cost[c] · y_c ≤ budget      (1e-4 USD, rounded up)
    (4) deadline:     Σ_c time[c] · y_c ≤ deadline    (ms, rounded up)
    (5) price known:  x_g = 0 for a type without a price, where the objective or budget needs one
    (6) no-goods:     Σ_{c ∈ G} y_c = 0 for every group G already returned (top k)
Checked on the tables, not modelled: GPUs dp[c]·mp[c] ≤ max_gpus and ≤ limit[g] (fleet);
micro_batch[c]·dp[c]·ga[c] = global batch (when given), ga[c] ≥ 1.

Stating (1) and (2) per GPU type (a knapsack row each) rather than against Σ_g U_g · x_g is
the same constraint once one plan is chosen, and lets presolve settle each plan alone (measured
in bench/bench_search.py: about 7× faster on 9,000 plans).

Objective: min Σ_c rank[c] · y_c. The rank orders plans lexicographically: relaxation tier (0 = as asked;
then Full → LoRA → QLoRA; a shorter sequence last), the objective in integer units
(:func:`objective_units`), the cheaper hour (or the faster job for a cost objective), then the
simpler plan (no offload, a lower ZeRO stage, fewer model-parallel ranks, the catalog's order).
Ranks keep the numbers small and make the optimum unique, so the answer does not depend on the
solver's path. Only integers enter CP-SAT; it runs with a fixed seed and one worker.

The plans the model holds are the search's *region*: every plan of the space (the oracle's
columns), or, with hints, every plan whose objective is no worse than the k-th best plan a
best-first search found (an objective bound: a plan outside it cannot be in the top k). Nothing
in the region is removed because it does not fit: memory, host RAM, budget and deadline are all
decided here. (Where fewer than k plans exist, the region ends at the worst the
best-first found, whose bisection showed that no layout past it fits.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from ortools.sat.python import cp_model

from planner.core.units import ceil_units_array, floor_units
from planner.memory.generation import phase_limit

#: Integer units of each objective inside CP-SAT (and in the oracle's ranking).
OBJECTIVE_SCALE = {"gpus": 1.0, "hourly": 1e4, "cost": 1e4, "time": 1e3}
#: Weight of one relaxation tier: above any objective value (1e14 = $10bn in 1e-4 USD).
TIER_WEIGHT = 10**14
SOLVER_SEED = 7


def objective_units(objective: str, cols: dict[str, np.ndarray]) -> np.ndarray:
    """The objective of each column as a non-negative integer (what CP-SAT minimises)."""
    key = {"gpus": "gpus", "hourly": "hourly_usd", "cost": "cost_usd", "time": "time_s"}[objective]
    return ceil_units_array(np.asarray(cols[key], dtype=float) * OBJECTIVE_SCALE[objective])


@dataclass
class Space:
    """The plans the model chooses among, as integer tables (see the module docstring)."""

    #: per shape s: model-parallel ranks (tp·pp·cp), micro-batch
    mp: np.ndarray
    micro_batch: np.ndarray
    #: per degree row k = (s, dp): its shape, degree, phases' device bytes
    k_shape: np.ndarray
    k_dp: np.ndarray
    k_phases: dict[str, np.ndarray]
    #: per plan c: GPU type, degree row, rank, group, gradient-accumulation steps, offloaded
    #: bytes of its GPUs on one node; cost (1e-4 USD) and time (ms) where bounded
    c_gpu: np.ndarray
    c_k: np.ndarray
    c_rank: np.ndarray
    c_group: np.ndarray
    c_grad_accum: np.ndarray
    c_host_node: np.ndarray
    c_cost: np.ndarray | None = None
    c_time: np.ndarray | None = None

    def take(self, rows: np.ndarray) -> Space:
        """The same tables over the plans ``rows`` only (shapes and degree rows kept whole)."""
        plan = {name: (None if value is None else value[rows]) for name, value in vars(self).items()
                if name.startswith("c_")}
        return Space(**{**vars(self), **plan})


@dataclass
class Limits:
    """Per GPU type (index g) and per request."""

    usable_bytes: np.ndarray
    gpu_limit: np.ndarray  # most GPUs of the type: max_gpus and the fleet
    gpus_per_node: np.ndarray
    host_bytes_per_node: np.ndarray  # -1 where unknown (unbounded)
    priced: np.ndarray  # bool
    max_gpus: int
    global_batch: int | None = None
    budget_units: int | None = None
    deadline_ms: int | None = None
    need_price: bool = False
    forbidden_groups: list[int] = field(default_factory=list)
    #: What a step's phase may hold while a colocated engine sleeps (phases named with
    #: ``planner.memory.generation.ASLEEP_SUFFIX``); ``usable_bytes`` where not given.
    asleep_usable_bytes: np.ndarray | None = None


def _ints(values) -> list[int]:
    return np.asarray(values, dtype=np.int64).ravel().tolist()


#: The widest integer CP-SAT takes in a linear constraint's bounds.
INT_BOUND = 2**62


class PlanModel:
    """CP-SAT over the decisions; see the module docstring for the mathematics.

    The rows over all plans are written into the model's protocol buffer directly (index and
    coefficient arrays): the same constraints as ``m.Add(Σ …)``, built without a Python object per
    term (183,000 plans: 4.8 s → under 1 s)."""

    def __init__(self, space: Space, limits: Limits):
        self.space, self.limits = space, limits
        self.m = cp_model.CpModel()
        self.solve_s, self.last_solve_s, self.solves = 0.0, 0.0, 0
        if len(np.unique(space.c_rank)) != len(space.c_rank):
            raise ValueError("plan ranks must be distinct (they make the optimum unique)")
        self.by_rank = {int(r): c for c, r in enumerate(space.c_rank)}
        self._add_variables()
        self._check_lattice()
        self._add_tables()
        self._add_memory()
        self._add_host_ram()
        self._add_budget()
        self._add_deadline()
        self._add_price_known()
        for group in limits.forbidden_groups:
            self.forbid_group(group)
        objective = self.m.Proto().objective
        objective.vars.extend(self.y_index.tolist())
        objective.coeffs.extend(_ints(self.space.c_rank))

    def _row(self, index: np.ndarray, coeffs, lo: int, hi: int, var=None, var_coeff: int = -1) -> None:
        """lo ≤ Σ coeffs · vars[index] (+ var_coeff · var) ≤ hi, terms with a zero coefficient left out."""
        coeffs = np.asarray(coeffs, dtype=np.int64)
        keep = coeffs != 0
        linear = self.m.Proto().constraints.add().linear
        linear.vars.extend(index[keep].tolist())
        linear.coeffs.extend(coeffs[keep].tolist())
        if var is not None:
            linear.vars.append(var.Index())
            linear.coeffs.append(var_coeff)
        linear.domain.extend([max(lo, -INT_BOUND), min(hi, INT_BOUND)])

    def _add_variables(self) -> None:
        sp = self.space
        self.y = [self.m.new_bool_var(f"plan[{c}]") for c in range(len(sp.c_gpu))]
        self.y_index = np.array([v.Index() for v in self.y], dtype=np.int64)
        self.x = [self.m.new_bool_var(f"gpu[{g}]") for g in range(len(self.limits.usable_bytes))]
        self.shape_of = sp.k_shape[sp.c_k]

    def _check_lattice(self) -> None:
        """What the lattice guarantees of every plan, checked on the tables: its GPUs within
        max_gpus and its type's limit (the fleet), and micro-batch · dp · accumulation equal to
        the global batch with at least one step of accumulation. As CP-SAT rows these could never
        bind; a plan that breaks one is a bug in the lattice, not a plan to rule out."""
        sp, lim = self.space, self.limits
        gpus = sp.k_dp[sp.c_k] * sp.mp[self.shape_of]
        broken = {"GPUs over max_gpus": gpus > lim.max_gpus,
                  "GPUs over the type's limit": gpus > np.asarray(lim.gpu_limit)[sp.c_gpu]}
        if lim.global_batch:
            sequences = sp.micro_batch[self.shape_of] * sp.k_dp[sp.c_k] * sp.c_grad_accum
            broken["micro_batch·dp·grad_accum ≠ global batch"] = (sequences != lim.global_batch) | (sp.c_grad_accum < 1)
        for what, rows in broken.items():
            if rows.any():
                raise ValueError(f"the lattice generated {int(rows.sum())} plan(s) with {what}")

    # (0)
    def _add_tables(self) -> None:
        """One plan; the GPU type is the one-hot sum of the plans on it."""
        self.m.add_exactly_one(self.y)
        self.plans_on = [np.flatnonzero(self.space.c_gpu == g) for g in range(len(self.x))]
        for var, members in zip(self.x, self.plans_on):
            self._row(self.y_index[members], np.ones(len(members)), 0, 0, var)

    def _within_each_type(self, per_plan, per_type) -> None:
        """Σ_{c on g} v_c · y_c ≤ L_g for every GPU type g: the chosen plan's value within its
        type's limit (one plan is chosen, so this is v_c ≤ L_g(c) for it)."""
        per_plan, per_type = np.asarray(per_plan), np.asarray(per_type)
        for g, members in enumerate(self.plans_on):
            if len(members):
                self._row(self.y_index[members], per_plan[members], -INT_BOUND, int(per_type[g]))

    # (1)
    def _add_memory(self) -> None:
        usable = self.limits.usable_bytes
        asleep = usable if self.limits.asleep_usable_bytes is None else self.limits.asleep_usable_bytes
        for phase, table in self.space.k_phases.items():
            self._within_each_type(table[self.space.c_k], phase_limit(phase, usable, asleep))

    # (2)
    def _add_host_ram(self) -> None:
        """Offloaded bytes of the plan's GPUs on one node within the node's host RAM."""
        ram = np.asarray(self.limits.host_bytes_per_node)
        per_node = self.space.c_host_node
        if not (ram >= 0).any() or not (per_node > 0).any():
            return
        big = int(per_node.max(initial=0))
        self._within_each_type(per_node, np.where(ram >= 0, ram, big))

    def _none_above(self, per_plan: np.ndarray, limit: int) -> None:
        """The chosen plan's value within ``limit``, as "no plan above it is chosen": one row of
        unit coefficients. (Σ v_c · y_c ≤ limit says the same under the one-hot choice, but
        thousands of plans of unknown cost, each 10^15 units, overflow CP-SAT's int64 bound.)"""
        over = np.flatnonzero(np.asarray(per_plan) > limit)
        if len(over):
            self._row(self.y_index[over], np.ones(len(over)), 0, 0)

    # (3)
    def _add_budget(self) -> None:
        if self.limits.budget_units is not None and self.space.c_cost is not None:
            self._none_above(self.space.c_cost, self.limits.budget_units)

    # (4)
    def _add_deadline(self) -> None:
        if self.limits.deadline_ms is not None and self.space.c_time is not None:
            self._none_above(self.space.c_time, self.limits.deadline_ms)

    # (5)
    def _add_price_known(self) -> None:
        if self.limits.need_price:
            for gi in np.flatnonzero(~np.asarray(self.limits.priced, dtype=bool)):
                self.m.add(self.x[int(gi)] == 0)

    # (6)
    def forbid_group(self, group: int) -> None:
        members = [self.y[c] for c in np.flatnonzero(self.space.c_group == group)]
        if members:
            self.m.add(sum(members) == 0)

    def rank_above(self, rank: int) -> None:
        """Only plans ranked after ``rank`` (valid once the optimum has rank ``rank``: no plan
        ranked before it is feasible)."""
        self._row(self.y_index, self.space.c_rank, int(rank) + 1, INT_BOUND)

    def pin(self, c: int) -> None:
        """Force plan c (the tests: a plan a constraint forbids, pinned, must be infeasible)."""
        self.m.add(self.y[int(c)] == 1)

    def hint(self, c: int) -> None:
        """Start the search from plan c (a hint: it never changes what is feasible)."""
        self.m.clear_hints()
        self.m.add_hint(self.y[int(c)], True)  # a partial hint: the rest follows from it

    def solve(self, time_limit_s: float) -> tuple[str, int | None]:
        if not self.y:
            return "infeasible", None
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.01, time_limit_s)
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = SOLVER_SEED
        # The model is one-hot over plans with per-type knapsack rows: presolve settles it in
        # one pass; probing and symmetry detection only cost time here (measured: bench/).
        solver.parameters.cp_model_probing_level = 0
        solver.parameters.max_presolve_iterations = 1
        solver.parameters.symmetry_level = 0
        status = solver.Solve(self.m)
        self.last_solve_s = solver.WallTime()
        self.solve_s += self.last_solve_s
        self.solves += 1
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            picked = int(self.by_rank[round(solver.ObjectiveValue())])  # ranks are distinct
            return ("optimal" if status == cp_model.OPTIMAL else "feasible"), picked
        if status == cp_model.INFEASIBLE:
            return "infeasible", None
        return "unknown", None


#: Without a bound from the hints, a smaller model is built for the next solve when fewer than
#: this share of the plans remain: building costs about as much as one solve of the same size
#: (bench/bench_search.py; 405B full fine-tuning, hourly objective: 183,398 plans, 1.2 s to
#: build, 1.1 s per solve).
REBUILD_SHARE = 0.8


def top_k(space: Space, limits: Limits, k: int, time_limit_s: float,
          hints: list[int] | None = None, stats: dict | None = None) -> tuple[str, list[int]]:
    """Solve, forbid the found plan's group, solve again, k times. Returns (status, plans);
    ``stats`` receives the seconds spent building models and inside the solver.

    Once a solve is optimal every plan ranked before its answer is proven infeasible (or taken),
    so the next solve needs only the plans ranked after it. Hints (feasible plans of distinct
    groups: the best-first's) bound it from above too: the i-th answer ranks no later than the
    i-th best hint (of i feasible groups at least one is not yet taken). Each solve runs on the
    plans between those bounds — the same problem, smaller. Should a hint not be feasible after
    all, its window comes back empty and that solve runs again without the bound."""
    stats = {} if stats is None else stats
    stats.update(cpsat_build_s=0.0, cpsat_solve_s=0.0, cpsat_solves=0)
    hints = sorted(hints or [], key=lambda c: space.c_rank[c])
    deadline = time.monotonic() + time_limit_s
    picked: list[int] = []
    overall, last, forbidden = "optimal", -1, set[int]()
    sub: _Submodel | None = None
    for i in range(k):
        left = deadline - time.monotonic()
        if left <= 0:
            overall = "feasible" if picked else "unknown"
            break
        upper = int(space.c_rank[hints[i]]) if i < len(hints) else None
        sub = _next_model(space, limits, sub, last, upper, forbidden, stats)
        status, c = sub.solve(left, hints[i] if i < len(hints) else None, stats)
        if c is None and upper is not None:  # the hint was not a feasible plan: no bound then
            sub = _next_model(space, limits, None, last, None, forbidden, stats)
            status, c = sub.solve(max(0.01, deadline - time.monotonic()), None, stats)
        if c is None:
            if status == "unknown":
                overall = "feasible" if picked else "unknown"
            break
        picked.append(c)
        forbidden.add(int(space.c_group[c]))
        if status == "optimal":
            last = int(space.c_rank[c])
        else:  # not proven: plans ranked before it stay in play
            overall = "feasible"
    if not picked:
        return ("infeasible" if overall == "optimal" else overall), []
    return overall, picked


def _next_model(space: Space, limits: Limits, sub: _Submodel | None, last: int, upper: int | None,
                forbidden: set[int], stats: dict) -> _Submodel:
    """The model for the next solve: plans ranked after ``last`` (and no later than ``upper``)
    outside the groups already taken; the previous model with two more rows where that is
    cheaper than a new one."""
    rank, group = space.c_rank, space.c_group
    ok = (rank > last) & ~np.isin(group, list(forbidden))
    if upper is not None:
        ok &= rank <= upper
    rows = np.flatnonzero(ok)
    if sub is None or upper is not None or len(rows) < REBUILD_SHARE * len(sub.rows):
        return _Submodel(space, limits, rows, stats, forbidden)
    for g in forbidden - sub.excluded:  # groups taken since its plans were chosen
        sub.model.forbid_group(g)
    sub.excluded |= forbidden
    sub.model.rank_above(last)
    return sub


class _Submodel:
    """A :class:`PlanModel` over some of the plans (``rows``), for :func:`top_k`."""

    def __init__(self, space: Space, limits: Limits, rows: np.ndarray, stats: dict, excluded: set[int]):
        t0 = time.perf_counter()
        self.rows = rows
        self.excluded = set(excluded)  # groups whose plans ``rows`` leaves out or the model forbids
        self.model = PlanModel(space.take(rows), limits)
        stats["cpsat_build_s"] += time.perf_counter() - t0

    def solve(self, left: float, hint: int | None, stats: dict) -> tuple[str, int | None]:
        if hint is not None:
            local = np.flatnonzero(self.rows == hint)
            if len(local):
                self.model.hint(int(local[0]))
        status, c = self.model.solve(left)
        stats["cpsat_solve_s"] += self.model.last_solve_s
        stats["cpsat_solves"] += 1
        return status, (None if c is None else int(self.rows[c]))


def budget_units(usd: float) -> int:
    """A budget in integer units, rounded down (a plan within it is within the real budget)."""
    return floor_units(usd * OBJECTIVE_SCALE["cost"])


def deadline_ms(seconds: float) -> int:
    return floor_units(seconds * 1e3)


def cost_units(cost_usd: npt.ArrayLike) -> np.ndarray:
    """Costs in integer units, rounded up: a demand is never understated."""
    return ceil_units_array(np.asarray(cost_usd, dtype=float) * OBJECTIVE_SCALE["cost"])


def time_ms(time_s: npt.ArrayLike) -> np.ndarray:
    return ceil_units_array(np.asarray(time_s, dtype=float) * 1e3)
