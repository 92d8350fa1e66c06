"""planner: what hardware and which training configuration an LLM job needs, and the cheapest way.

Python API::

    import planner
    est = planner.estimate("scenarios/case-b-7b-full-zero3.yaml")
    est = planner.estimate(model="llama-3.1-8b", method="qlora", gpu="rtx-4090", seq_len=2048)
    est.total_bytes, est.fits, est.components
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.estimate import Estimate, estimate_resolved
from planner.scenario import deep_merge, read_scenario_file, resolve, scenario_from_flags
from planner.specs import Scenario

__all__ = ["Estimate", "InputError", "Scenario", "estimate"]
__version__ = "0.1.0"


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
