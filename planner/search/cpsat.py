"""The CP-SAT model that picks plans among candidate columns.

Sets
    J   candidate plans (columns); each is a complete layout with its metrics, computed by the
        same formulas as ``planner estimate`` (planner.search.space.evaluate)
    G   GPU types; g(j) is the type of column j; K(j) its distinctness group

Variables
    y_j ∈ {0, 1}   column j is the plan
    x_g ∈ {0, 1}   GPU type g is used

Constraints (each in its own method, tested alone)
    (1) one plan:   Σ_j y_j = 1,  x_g = Σ_{j: g(j) = g} y_j
    (2) memory:     Σ_j mem_j · y_j ≤ Σ_g U_g · x_g        (exact bytes: U_g = usable capacity)
    (3) GPU count:  Σ_j gpus_j · y_j ≤ max_gpus
    (4) fleet:      Σ_j gpus_j · y_j ≤ Σ_g F_g · x_g       (F_g = GPUs of type g we have)
    (5) budget:     Σ_j cost_j · y_j ≤ budget              (cost in 1e-4 USD, rounded up)
    (6) deadline:   Σ_j time_j · y_j ≤ deadline            (ms, rounded up)
    (7) host RAM:   Σ_j host_j · y_j ≤ Σ_g H_g · x_g       (offloaded bytes per node)
    (8) no-goods:   Σ_{j ∈ K} y_j = 0 for every group K already returned (top-k)

Objective (lexicographic, as one integer): min Σ_j (tier_j · W + obj_j) · y_j, where tier is the
relaxation rank (0 = as asked; then Full → LoRA → QLoRA; a shorter sequence last) and obj the
chosen objective in integer units (:func:`objective_units`). The search hands CP-SAT the same
order as ranks (tier, objective, then the simpler plan among equals), which keeps the numbers
small. Only integers enter CP-SAT; the solver runs with a fixed seed and one worker, so the same
input gives the same output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

#: Integer units of each objective inside CP-SAT (and in the oracle's ranking).
OBJECTIVE_SCALE = {"gpus": 1.0, "hourly": 1e4, "cost": 1e4, "time": 1e3}
#: Weight of one relaxation tier: above any objective value (1e14 = $10bn in 1e-4 USD).
TIER_WEIGHT = 10**14
SOLVER_SEED = 7


def objective_units(objective: str, cols: dict[str, np.ndarray]) -> np.ndarray:
    """The objective of each column as a non-negative integer (what CP-SAT minimises)."""
    key = {"gpus": "gpus", "hourly": "hourly_usd", "cost": "cost_usd", "time": "time_s"}[objective]
    value = np.asarray(cols[key], dtype=float) * OBJECTIVE_SCALE[objective]
    return np.where(np.isfinite(value), np.ceil(value - 1e-9), np.inf)


@dataclass
class Columns:
    """What the model needs of each candidate column (integer arrays of equal length)."""

    gpu: np.ndarray
    group: np.ndarray
    tier: np.ndarray
    objective: np.ndarray
    memory_bytes: np.ndarray
    gpus: np.ndarray
    cost_units: np.ndarray | None = None  # 1e-4 USD
    time_ms: np.ndarray | None = None
    host_bytes: np.ndarray | None = None  # offloaded host memory per node


@dataclass
class Limits:
    usable_bytes: dict[int, int]
    max_gpus: int | None = None
    fleet: dict[int, int] | None = None
    budget_units: int | None = None
    deadline_ms: int | None = None
    host_bytes: dict[int, int] = field(default_factory=dict)


class PlanModel:
    """CP-SAT over candidate columns; see the module docstring for the mathematics."""

    def __init__(self, cols: Columns, limits: Limits):
        self.cols, self.limits = cols, limits
        self.m = cp_model.CpModel()
        n = len(cols.gpu)
        self.y = [self.m.NewBoolVar(f"y[{j}]") for j in range(n)]
        self.gpu_ids = sorted({int(g) for g in cols.gpu} | set(limits.usable_bytes))
        self.x = {g: self.m.NewBoolVar(f"x[{g}]") for g in self.gpu_ids}
        self._add_one_plan()
        self._add_memory()
        self._add_gpu_count()
        self._add_fleet()
        self._add_budget()
        self._add_deadline()
        self._add_host_ram()
        self._set_objective()

    # (1)
    def _add_one_plan(self) -> None:
        self.m.AddExactlyOne(self.y)
        for g, xg in self.x.items():
            members = [self.y[j] for j in np.flatnonzero(self.cols.gpu == g)]
            self.m.Add(xg == sum(members))

    def _chosen(self, values: np.ndarray) -> cp_model.LinearExpr:
        return cp_model.LinearExpr.WeightedSum(self.y, [int(v) for v in values])

    def _by_gpu(self, per_gpu: dict[int, int], default: int) -> cp_model.LinearExpr:
        return cp_model.LinearExpr.WeightedSum(
            list(self.x.values()), [int(per_gpu.get(g, default)) for g in self.x])

    # (2)
    def _add_memory(self) -> None:
        self.m.Add(self._chosen(self.cols.memory_bytes) <= self._by_gpu(self.limits.usable_bytes, 0))

    # (3)
    def _add_gpu_count(self) -> None:
        if self.limits.max_gpus is not None:
            self.m.Add(self._chosen(self.cols.gpus) <= self.limits.max_gpus)

    # (4)
    def _add_fleet(self) -> None:
        if self.limits.fleet is not None:
            self.m.Add(self._chosen(self.cols.gpus) <= self._by_gpu(self.limits.fleet, 0))

    # (5)
    def _add_budget(self) -> None:
        if self.limits.budget_units is not None and self.cols.cost_units is not None:
            self.m.Add(self._chosen(self.cols.cost_units) <= self.limits.budget_units)

    # (6)
    def _add_deadline(self) -> None:
        if self.limits.deadline_ms is not None and self.cols.time_ms is not None:
            self.m.Add(self._chosen(self.cols.time_ms) <= self.limits.deadline_ms)

    # (7)
    def _add_host_ram(self) -> None:
        if self.limits.host_bytes and self.cols.host_bytes is not None:
            big = int(self.cols.host_bytes.max(initial=0))
            self.m.Add(self._chosen(self.cols.host_bytes) <= self._by_gpu(self.limits.host_bytes, big))

    def _set_objective(self) -> None:
        weights = self.cols.tier.astype(np.int64) * TIER_WEIGHT + self.cols.objective.astype(np.int64)
        self.m.Minimize(self._chosen(weights))

    # (8)
    def forbid_group(self, group: int) -> None:
        members = [self.y[j] for j in np.flatnonzero(self.cols.group == group)]
        self.m.Add(sum(members) == 0)

    def pin(self, j: int) -> None:
        """Force column j (used by the tests: a pinned forbidden column must be infeasible)."""
        self.m.Add(self.y[j] == 1)

    def solve(self, time_limit_s: float) -> tuple[str, int | None]:
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.01, time_limit_s)
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = SOLVER_SEED
        status = solver.Solve(self.m)
        if status == cp_model.OPTIMAL:
            return "optimal", self._picked(solver)
        if status == cp_model.FEASIBLE:
            return "feasible", self._picked(solver)
        if status == cp_model.INFEASIBLE:
            return "infeasible", None
        return "unknown", None

    def _picked(self, solver: cp_model.CpSolver) -> int:
        return next(j for j, yj in enumerate(self.y) if solver.Value(yj))


def top_k(cols: Columns, limits: Limits, k: int, time_limit_s: float) -> tuple[str, list[int]]:
    """Solve, forbid the found plan's group, solve again, k times. Returns (status, columns)."""
    import time

    if len(cols.gpu) == 0:
        return "infeasible", []
    model = PlanModel(cols, limits)
    deadline = time.monotonic() + time_limit_s
    picked: list[int] = []
    overall = "optimal"
    for _ in range(k):
        left = deadline - time.monotonic()
        if left <= 0:
            overall = "feasible" if picked else "unknown"
            break
        status, j = model.solve(left)
        if j is None:
            if status == "unknown":
                overall = "feasible" if picked else "unknown"
            break
        if status == "feasible":
            overall = "feasible"
        picked.append(j)
        model.forbid_group(int(cols.group[j]))
    if not picked:
        return ("infeasible" if overall == "optimal" else overall), []
    return overall, picked


def budget_units(usd: float) -> int:
    """A budget in integer units, rounded down (a plan within it is within the real budget)."""
    return int(math.floor(usd * OBJECTIVE_SCALE["cost"] + 1e-9))


def deadline_ms(seconds: float) -> int:
    return int(math.floor(seconds * 1e3 + 1e-9))


def cost_units(cost_usd: np.ndarray) -> np.ndarray:
    """Costs in integer units, rounded up: a demand is never understated."""
    v = np.asarray(cost_usd, dtype=float) * OBJECTIVE_SCALE["cost"]
    return np.where(np.isfinite(v), np.ceil(v - 1e-9), np.inf)


def time_ms(time_s: np.ndarray) -> np.ndarray:
    v = np.asarray(time_s, dtype=float) * 1e3
    return np.where(np.isfinite(v), np.ceil(v - 1e-9), np.inf)
