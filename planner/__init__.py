"""planner: what hardware and which training configuration an LLM job needs, and the cheapest way.

Python API::

    import planner
    est = planner.estimate("scenarios/case-b-7b-full-zero3.yaml")
    est = planner.estimate(model="llama-3.1-8b", method="qlora", gpu="rtx-4090", seq_len=2048)
    est.total_bytes, est.fits, est.components
    plans = planner.plan(model="llama-3.1-8b", method="lora", tokens=1e8, tp=[1, 2]).to_frame()
    fleet = planner.procure("scenarios/portfolios/team-h1-procurement.yaml").to_frame()
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.core.errors import InputError
from planner.core.specs import Scenario
from planner.memory.estimate import Estimate, estimate_resolved
from planner.scenario.files import deep_merge, read_scenario_file, scenario_from_flags
from planner.scenario.resolve import resolve

if TYPE_CHECKING:
    from planner.fleet.result import ProcureResult
    from planner.search.results import Plan, PlanResult

__all__ = ["Estimate", "InputError", "Plan", "PlanResult", "ProcureResult", "Scenario", "batch", "estimate", "plan",
           "procure"]
__version__ = "0.1.0"

#: Names imported on first use: the search and its solver load only when a plan is asked for.
_LAZY = {"Plan": "planner.search.results", "PlanResult": "planner.search.results",
         "ProcureResult": "planner.fleet.result"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")


def estimate(scenario: str | Path | dict[str, Any] | Scenario | None = None, **options: Any) -> Estimate:
    """Per-GPU memory of one scenario: a file path, a mapping, a :class:`Scenario`, or options.

    Options are the flat names of the scenario keys (``method``, ``gpu``, ``zero``, ``reserve``…)
    and override the scenario's values. Raises :class:`InputError` (with one line per problem)
    for invalid input, and for a file that holds more than one scenario.
    """
    flags = scenario_from_flags(**options)
    if isinstance(scenario, (str, Path)):
        raws = read_scenario_file(scenario)
        if len(raws) != 1:
            raise InputError([f"{scenario}: holds {len(raws)} scenarios; estimate takes one"])
        merged = deep_merge(raws[0], flags)
        return estimate_resolved(resolve(merged, source=str(scenario), base_dir=Path(scenario).parent))
    if isinstance(scenario, Scenario):
        scenario = scenario.model_dump(exclude_unset=True)
    raw = deep_merge(scenario or {}, flags)
    return estimate_resolved(resolve(raw))


#: Options of :func:`plan` that list what the search may choose (the scenario's ``search:`` keys,
#: the CLI's ``--tp 1,2``…), not a pinned layout.
SEARCH_LISTS = frozenset({"micro_batch", "offload", "zero", "tp", "pp", "checkpointing", "attention", "stacks"})


def _raw_of(scenario: str | Path | dict[str, Any] | Scenario | None, options: dict[str, Any]):
    """(raw mapping, source, base_dir) of a single scenario, options merged over it."""
    flags = scenario_from_flags(**options)
    if isinstance(scenario, (str, Path)):
        raws = read_scenario_file(scenario)
        if len(raws) != 1:
            raise InputError([f"{scenario}: holds {len(raws)} scenarios; give one"])
        return deep_merge(raws[0], flags), str(scenario), Path(scenario).parent
    if isinstance(scenario, Scenario):
        scenario = scenario.model_dump(exclude_unset=True)
    return deep_merge(scenario or {}, flags), None, None


def plan(scenario: str | Path | dict[str, Any] | Scenario | None = None, *, pareto: bool = False,
         **options: Any) -> PlanResult:
    """Ranked feasible plans for a scenario (file, mapping or options), or why none exists.

    Options are the flat scenario keys (``model``, ``method``, ``tokens``, ``objective``,
    ``gpu_types``, ``max_gpus``, ``budget_usd``, ``deadline_hours``, ``fleet``…); the layout
    keys the search chooses (:data:`SEARCH_LISTS`: ``tp=[1, 2]``, ``zero=3``…) are what it may
    choose from, as ``planner plan --tp 1,2`` and a scenario's ``search:`` take them.
    """
    from planner.search.answer import plan_raw

    search = {k: (list(v) if isinstance(v, (list, tuple)) else [v])
              for k, v in options.items() if k in SEARCH_LISTS and v is not None}
    raw, source, base_dir = _raw_of(scenario, {k: v for k, v in options.items() if k not in SEARCH_LISTS})
    if search:
        raw = deep_merge(raw, {"search": search})
    return plan_raw(raw, source=source, base_dir=base_dir, pareto=pareto)


def batch(*paths: str | Path, top: int = 1, workers: int | None = None, prices: list[str | Path] = (),
          price_date: str | None = None, out: str | Path | None = None):
    """Plan every scenario in the files and folders given: a pandas DataFrame, one row per plan
    (the best ``top`` of each scenario) or per invalid/infeasible scenario, with its error.
    ``out`` also writes it (.csv, .json, .parquet, .md, .html), atomically."""
    from planner.bulk.batch import PriceOptions, run_batch

    run = run_batch(paths, top=top, workers=workers,
                    prices=PriceOptions(tuple(str(p) for p in prices), price_date))
    if out is not None:
        from planner.report.files import write_frame

        write_frame(run.frame, out)
    return run.frame


def procure(portfolio: str | Path, *, time_limit_s: float | None = None,
            workers: int | None = None) -> ProcureResult:
    """The fleet to buy or rent for a portfolio file, when each job runs, and the costs: a
    :class:`ProcureResult` (``status``, ``total_usd``, ``fleet``, ``schedule``, ``costs``,
    ``buy_vs_rent``; ``to_frame()``: one row per scheduled run). The tables ``planner procure``
    prints are ``planner.report.procurement.tables(result)``."""
    from planner.fleet.procure import procure as run

    return run(portfolio, time_limit_s=time_limit_s, workers=workers)
