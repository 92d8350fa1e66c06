"""What every memory profile shares: the breakdown it returns and the codes of the choices.

The search passes layouts to a profile as arrays of codes (index into the tuples below);
:func:`codes` turns one scenario into those codes, and each component is rounded up to whole
bytes by :func:`ceil_components`, so components always add up to the total exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.core.specs import Layout, Workload


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU device bytes by component; ``host_bytes`` is what offload keeps in CPU memory."""

    components: dict[str, int]
    host_bytes: int = 0
    assumptions: tuple[str, ...] = field(default=())
    #: Profiles that model the allocator: allocated_bytes, reserved_bytes, device_bytes.
    predicted: dict[str, int] | None = None
    #: Relative error that validation measured for this kind of run (e.g. 0.12 = ±12 %).
    error_band: float | None = None

    @property
    def total_bytes(self) -> int:
        return sum(self.components.values())


#: Codes of the categorical choices, for the array form of the formulas (index = code).
METHODS = ("full", "lora", "qlora", "inference")
PRECISIONS = ("mixed", "fp16", "bf16", "fp32")
OPTIMIZERS = ("adamw", "adam8bit", "paged_adamw8bit", "sgd")
CHECKPOINTING = ("none", "selective", "full")
ATTENTION = ("eager", "flash")
OFFLOADS = ("none", "optimizer", "optimizer+params")


def codes(workload: Workload, layout: Layout, *, dp: int, grad_accum: int | None) -> dict[str, Any]:
    """The scalar arguments of :func:`seed_components` for one scenario."""
    return {
        "method": METHODS.index(workload.method),
        "precision": PRECISIONS.index(workload.precision),
        "optimizer": OPTIMIZERS.index(workload.optimizer),
        "checkpointing": CHECKPOINTING.index(layout.checkpointing),
        "attention": ATTENTION.index(layout.attention),
        "offload": OFFLOADS.index(layout.offload),
        "seq_len": workload.seq_len,
        "micro_batch": workload.micro_batch,
        "lora_rank": workload.lora_rank,
        "tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep, "sp": int(layout.sp),
        "zero": layout.zero, "dp": dp, "grad_accum": grad_accum or 0,
    }


def ceil_components(raw: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """Round each named component up to whole bytes (arrays stay arrays)."""
    return {k: np.ceil(np.asarray(raw[k], dtype=float) - 1e-6).astype(np.int64) for k in names}
