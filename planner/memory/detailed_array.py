"""The ``detailed`` profile over many layouts at once, for the search.

The search hands the memory model broadcastable arrays of layout choices (codes into
``planner.memory.seed``'s tuples); the detailed profile is evaluated once per distinct combination and
scattered back, so a plan is checked with exactly the numbers ``planner estimate`` prints.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.core.arrays import unique_rows
from planner.core.entries import ModelSpec
from planner.core.specs import Layout, Overrides, Recipe, Workload
from planner.memory.breakdown import CARD_RECIPE, STACK_RECIPE, decode
from planner.memory.detailed import detailed_memory

#: The most bytes a total is stored at in the int64 arrays (2^62: beyond any GPU, inside int64).
TOTAL_CEILING = 2**62

#: Array keys that belong to the workload / the layout (the recipe's: :data:`STACK_RECIPE`);
#: their codes decode with :func:`~planner.memory.breakdown.decode`.
_WORKLOAD_KEYS = ("method", "precision", "optimizer", "seq_len", "micro_batch", "lora_rank")
_LAYOUT_KEYS = ("tp", "pp", "cp", "ep", "etp", "sp", "zero", "offload", "checkpointing", "attention")


def detailed_components(model: ModelSpec, overrides: Overrides, *, workload: Workload,
                        layout: Layout, recipe: Recipe, **x: Any) -> dict[str, np.ndarray]:
    """``total`` (the bytes a plan must fit, as an estimate's ``total_bytes``), ``host`` and
    ``phases`` (those of each phase of the step, 0 where a layout has no such phase) for every element of
    the broadcast arrays ``x`` (the keys of :func:`planner.memory.seed.seed_components`); the scenario's
    other details come from ``workload``, ``layout`` and ``recipe``."""
    keys = sorted(x)
    arrays = np.broadcast_arrays(*(np.asarray(x[k]) for k in keys))
    shape = arrays[0].shape
    stacked = np.stack([a.ravel().astype(np.float64) for a in arrays], axis=1)
    uniq, inverse = unique_rows(stacked)
    totals = np.empty(len(uniq), dtype=np.int64)
    hosts = np.empty(len(uniq), dtype=np.int64)
    phases: dict[str, np.ndarray] = {}
    for i, row in enumerate(uniq):
        v = dict(zip(keys, row))
        wl = workload.model_copy(update={k: decode(k, v[k]) for k in _WORKLOAD_KEYS if k in v})
        lay = layout.model_copy(update={k: decode(k, v[k]) for k in _LAYOUT_KEYS if k in v})
        rec = recipe.model_copy(update={k: decode(k, v[k]) for k in STACK_RECIPE + CARD_RECIPE if k in v})
        ga = int(v.get("grad_accum", 0)) or None
        mem = detailed_memory(model, wl, lay, overrides, recipe=rec, dp=int(v.get("dp", 1)), grad_accum=ga)
        # Python ints are exact; the arrays are int64: cap (never fits anyway) before storing.
        totals[i] = min(mem.total_bytes, TOTAL_CEILING)
        hosts[i] = min(mem.host_bytes, TOTAL_CEILING)
        for name, value in (mem.phase_bytes or {"step": mem.total_bytes}).items():
            phases.setdefault(name, np.zeros(len(uniq), dtype=np.int64))[i] = min(value, TOTAL_CEILING)
    inverse = inverse.reshape(-1)
    return {"total": totals[inverse].reshape(shape), "host": hosts[inverse].reshape(shape),
            "phases": {k: v[inverse].reshape(shape) for k, v in phases.items()}}
