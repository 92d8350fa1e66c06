"""Estimate one scenario: memory per GPU against the card's usable capacity."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from planner.core.arch import total_params
from planner.memory.profiles import memory_breakdown
from planner.memory.breakdown import MemoryBreakdown
from planner.scenario.resolve import ResolvedScenario
from planner.core.units import floor_bytes

#: The order components are shown in (those a profile does not model are absent).
COMPONENT_ORDER = (
    "weights", "gradients", "optimizer_states", "master_weights", "adapter_states",
    "activations", "logits", "kv_cache", "buffers", "overhead",
)


class Estimate(BaseModel):
    """The result of ``planner estimate``: what ``--json`` prints, field for field."""

    model_config = ConfigDict(frozen=True)

    scenario: str
    profile: str
    model: str
    params: int
    method: str
    gpu: str | None
    gpus: int
    layout: dict[str, Any]
    components: dict[str, int]
    total_bytes: int
    capacity_bytes: int | None
    reserve: float
    usable_bytes: int | None
    headroom_bytes: int | None
    fits: bool | None
    host_bytes: int
    assumptions: list[str]
    warnings: list[str]
    #: allocated_bytes, reserved_bytes, device_bytes (profiles that model the allocator).
    predicted: dict[str, int] | None = None
    #: The relative error validation measured for this method; tight: headroom inside it.
    error_band: float | None = None
    tight: bool | None = None


def memory_of(rs: ResolvedScenario) -> MemoryBreakdown:
    """The memory breakdown of a resolved scenario under its profile."""
    return memory_breakdown(rs.profile, rs.model, rs.workload, rs.layout, rs.overrides,
                            dp=rs.layout.dp, grad_accum=rs.grad_accum)


def usable_bytes(capacity_bytes: int, reserve: float) -> int:
    """Capacity after the workspace reserve, rounded down: a plan fits when total ≤ this."""
    return floor_bytes(capacity_bytes * (1.0 - reserve))


def estimate_resolved(rs: ResolvedScenario) -> Estimate:
    mem = memory_of(rs)
    components = {k: mem.components[k] for k in COMPONENT_ORDER if k in mem.components}
    total = mem.total_bytes
    reserve = rs.overrides.reserve
    capacity = usable = headroom = None
    fits = tight = None
    if rs.gpu is not None:
        capacity = rs.gpu.memory_bytes
        usable = usable_bytes(capacity, reserve)
        headroom = usable - total
        fits = total <= usable
        if mem.error_band is not None:
            tight = fits and headroom < mem.error_band * total
    lay = rs.layout
    return Estimate(
        scenario=rs.name,
        profile=rs.profile,
        model=rs.model.id,
        params=total_params(rs.model),
        method=rs.workload.method,
        gpu=rs.gpu.id if rs.gpu else None,
        gpus=lay.gpus,
        layout={
            "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "sp": lay.sp,
            "zero": lay.zero, "offload": lay.offload, "checkpointing": lay.checkpointing,
            "attention": lay.attention, "micro_batch": rs.workload.micro_batch,
            "grad_accum": rs.grad_accum, "seq_len": rs.workload.seq_len,
        },
        components=components,
        total_bytes=total,
        capacity_bytes=capacity,
        reserve=reserve,
        usable_bytes=usable,
        headroom_bytes=headroom,
        fits=fits,
        host_bytes=mem.host_bytes,
        assumptions=list(mem.assumptions),
        warnings=list(rs.warnings),
        predicted=mem.predicted,
        error_band=mem.error_band,
        tight=tight,
    )
