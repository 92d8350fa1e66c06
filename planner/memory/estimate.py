"""Estimate one scenario: memory per GPU against the card's usable capacity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, computed_field

from planner.core.arch import total_params
from planner.core.entries import ModelSpec
from planner.core.specs import Layout, Workload
from planner.core.units import floor_bytes
from planner.memory.breakdown import MemoryBreakdown
from planner.memory.generation import (
    GENERATION_PHASE,
    engine_fits,
    engine_share,
    generation_notes,
    is_asleep_phase,
)
from planner.memory.profiles import memory_breakdown
from planner.scenario.resolve import ResolvedScenario

#: The order components are shown in (those a profile does not model are absent).
COMPONENT_ORDER = (
    "weights", "gradients", "optimizer_states", "master_weights", "adapter_states", "reference_weights",
    "activations", "logits", "kv_cache", "buffers", "overhead", "engine_asleep",
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
    #: The share of capacity kept free given as ``overrides.reserve``; None: the profile's rule.
    reserve: float | None
    #: What ``usable_bytes`` is the capacity less, in words.
    fit_rule: str
    usable_bytes: int | None
    headroom_bytes: int | None
    fits: bool | None
    host_bytes: int
    assumptions: list[str]
    warnings: list[str]
    #: allocated_bytes, reserved_bytes, device_bytes, needed_bytes (profiles that model the
    #: allocator).
    predicted: dict[str, int] | None = None
    #: The relative error validation measured for this method; tight: the prediction within it
    #: of the usable bytes, either side (or a fit that relies on the allocator giving back its
    #: cache: device view above capacity).
    error_band: float | None = None
    tight: bool | None = None
    #: GRPO with a colocated engine asleep while the step trains: the trainer's states at rest
    #: while the engine generates, and what the card less the engine's share leaves them.
    generation_bytes: int | None = None
    generation_usable_bytes: int | None = None

    def __getitem__(self, key: str) -> Any:
        """``est["total_bytes"]``: read like the JSON it prints (and as plans' ``memory`` once was)."""
        if key not in type(self).model_fields and key != "verdict":
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    @computed_field  # type: ignore[prop-decorator]
    @property
    def verdict(self) -> str | None:
        """``fits``, ``tight`` (within the method's error band of the usable bytes, above or below
        them, or fitting only as the allocator gives back its cache: the prediction cannot tell)
        or ``does_not_fit``; None without a GPU. ``fits`` is true for the first two; a plan
        (``planner plan``) is held to the line itself (:attr:`within_usable`)."""
        if self.fits is None:
            return None
        if not self.fits:
            return "does_not_fit"
        return "tight" if self.tight else "fits"

    @property
    def within_usable(self) -> bool | None:
        """The predicted total at most the usable bytes: the rule every plan keeps."""
        if self.usable_bytes is None:
            return None
        generation = (self.generation_bytes is None or self.generation_usable_bytes is None
                      or self.generation_bytes <= self.generation_usable_bytes)
        return self.total_bytes <= self.usable_bytes and generation

    #: What ``--config`` read: each scenario key, its value and the config key it came from.
    read_from_configs: list[dict[str, Any]] | None = None


def memory_of(rs: ResolvedScenario) -> MemoryBreakdown:
    """The memory breakdown of a resolved scenario under its profile."""
    dp = cast(int, rs.layout.dp)  # set: a resolved scenario's layout always has its dp
    return memory_breakdown(rs.profile, rs.model, rs.workload, rs.layout, rs.overrides,
                            recipe=rs.recipe, dp=dp, grad_accum=rs.grad_accum)


#: The seed profile's reserve (seed 000 §一.3): keep 10–20 % of the card free for the workspace,
#: fragmentation and what the seed formulas leave out; the documents' default is 10 %.
SEED_RESERVE = 0.10
#: The detailed profile's fit margin. Its total (the bytes a run needs at the card's limit)
#: already holds the CUDA context, NCCL buffers, the fragmentation the allocator cannot release,
#: logits and workspaces, so no flat reserve is taken on top: a plan fits when the predicted
#: bytes plus this share of them are within the card's capacity. The share is the median
#: absolute error of the profile on the measured peaks
#: of ``data/measured_calibration.csv`` (3.7 %, ``planner validate``), rounded up: a prediction
#: one typical error short of the card is still called a fit; one within the method's 90 % error
#: band is marked ``tight``.
FIT_MARGIN = 0.04


def card_left_bytes(capacity_bytes: int, engine_share: float) -> int:
    """What a colocated generation engine's share leaves the training step of a card, rounded down."""
    return floor_bytes(capacity_bytes * (1.0 - engine_share)) if engine_share else capacity_bytes


def usable_bytes(capacity_bytes: int, profile: str = "detailed", reserve: float | None = None,
                 engine_share: float = 0.0) -> int:
    """The most a GPU of ``capacity_bytes`` may hold by the profile's fit rule, rounded down: a
    plan fits when its total is at most this. A ``reserve`` given keeps that share of the card
    free; otherwise the seed profile keeps :data:`SEED_RESERVE` and the detailed profile fits
    ``total · (1 + FIT_MARGIN) ≤ capacity``. A colocated generation engine's ``engine_share``
    (:func:`planner.memory.generation.engine_share`) is taken off the card first."""
    capacity_bytes = card_left_bytes(capacity_bytes, engine_share)
    if reserve is not None:
        return floor_bytes(capacity_bytes * (1.0 - reserve))
    if profile == "seed":
        return floor_bytes(capacity_bytes * (1.0 - SEED_RESERVE))
    return floor_bytes(capacity_bytes / (1.0 + FIT_MARGIN))


def is_tight(total_bytes: int, usable: int, capacity_bytes: int, error_band: float | None,
             device_bytes: float | None = None) -> bool | None:
    """A prediction too close to the line to call: within the profile's 90 % error band for the
    method of the usable bytes, below them (headroom under ``band`` of the total) or above them
    (over by less than ``band`` of the usable bytes), or a fit only because the allocator gives
    its cache back at the card's limit (what nvidia-smi shows where memory is plentiful,
    ``device_bytes``, is more than the card). None where the profile has no band."""
    if error_band is None:
        return None
    device = total_bytes if device_bytes is None else device_bytes
    if total_bytes > usable:
        return total_bytes <= usable * (1.0 + error_band)
    return usable - total_bytes < error_band * total_bytes or device > capacity_bytes


@dataclass(frozen=True)
class Fit:
    """A prediction held to one card: the step's phases to ``usable_bytes``, and where a sleeping
    colocated engine generates between steps, the trainer's states at rest to what its share
    leaves (``generation_usable_bytes``)."""

    usable_bytes: int
    headroom_bytes: int
    fits: bool
    tight: bool | None
    #: the engine's share the step's usable bytes are less (0 while it sleeps)
    step_share: float
    generation_bytes: int | None = None
    generation_usable_bytes: int | None = None


def fit_of(mem: MemoryBreakdown, capacity_bytes: int, *, profile: str, reserve: float | None,
           wl: Workload, lay: Layout, model: ModelSpec) -> Fit:
    """The profile's fit rule on ``mem`` (its phases as the card holds them, from
    :func:`planner.memory.profiles.memory_breakdown`) for a card of ``capacity_bytes``: each
    check within its usable bytes or ``tight`` (:func:`is_tight`); no fit where a colocated
    engine cannot start. The one rule ``estimate``, plans and verdicts apply."""
    phases = mem.phase_bytes or {}
    share = engine_share(wl, lay)
    step_share = 0.0 if any(is_asleep_phase(k) for k in phases) else share
    total = mem.total_bytes
    usable = usable_bytes(capacity_bytes, profile, reserve, step_share)
    device = (mem.predicted or {}).get("device_bytes")
    tight = is_tight(total, usable, card_left_bytes(capacity_bytes, step_share), mem.error_band, device)
    fits = total <= usable or bool(tight)  # over the line by less than the error: tight
    headroom = usable - total
    gen = phases.get(GENERATION_PHASE)
    gen_usable = None
    if gen is not None:
        gen_usable = usable_bytes(capacity_bytes, profile, reserve, share)
        gen_tight = is_tight(gen, gen_usable, card_left_bytes(capacity_bytes, share), mem.error_band)
        fits = fits and (gen <= gen_usable or bool(gen_tight))
        tight = None if tight is None else bool(tight or gen_tight)
        headroom = min(headroom, gen_usable - gen)
    if not engine_fits(model, wl, lay, capacity_bytes):
        fits, tight = False, False  # the engine cannot start on this card (generation_notes says why)
    return Fit(usable, headroom, fits, tight if fits or tight is None else False, step_share, gen, gen_usable)


def fit_rule(profile: str, reserve: float | None, engine_share: float = 0.0) -> str:
    """The fit rule in words, for tables: what ``usable`` is the capacity less."""
    engine = f" less the generation engine's {engine_share:.0%}" if engine_share else ""
    if reserve is not None:
        return f"after the {reserve:.0%} reserve{engine}"
    if profile == "seed":
        return f"after the {SEED_RESERVE:.0%} reserve{engine}"
    return f"capacity{engine} / (1 + {FIT_MARGIN:.0%} fit margin)"


def dpo_notes(wl) -> list[str]:
    """What a DPO estimate assumes (none for supervised training)."""
    if wl.algorithm != "dpo":
        return []
    ref = {"model": ("a frozen copy of the weights, run forward on each pair" if wl.method == "full" else
                     "the base with the adapters disabled, run forward on each pair (no copy)"),
           "precomputed": "log-probabilities precomputed before training (no copy, no forward in the step)",
           "none": "none (reference-free: ORPO, SimPO)"}[wl.reference]
    return [(f"DPO: each of the micro-batch's {wl.micro_batch} examples is a pair, chosen and rejected "
            f"concatenated (2 sequences of up to {wl.seq_len} tokens); reference: {ref}; the reference "
            "forward's transient activations and logits are not counted (they are freed before the "
            "policy's forward)")]


def estimate_resolved(rs: ResolvedScenario) -> Estimate:
    mem = memory_of(rs)
    components = {k: mem.components[k] for k in COMPONENT_ORDER if k in mem.components}
    total = mem.total_bytes
    reserve = rs.overrides.reserve
    capacity = fit = None
    if rs.gpu is not None:
        capacity = rs.gpu.memory_bytes
        fit = fit_of(mem, capacity, profile=rs.profile, reserve=reserve, wl=rs.workload, lay=rs.layout,
                     model=rs.model)
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
            "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "etp": lay.etp, "sp": lay.sp,
            "zero": lay.zero, "offload": lay.offload, "checkpointing": lay.checkpointing,
            "attention": lay.attention, "micro_batch": rs.workload.micro_batch,
            "grad_accum": rs.grad_accum, "seq_len": rs.workload.seq_len,
        },
        components=components,
        total_bytes=total,
        capacity_bytes=capacity,
        reserve=reserve,
        fit_rule=fit_rule(rs.profile, reserve, fit.step_share if fit else 0.0),
        usable_bytes=fit.usable_bytes if fit else None,
        headroom_bytes=fit.headroom_bytes if fit else None,
        fits=fit.fits if fit else None,
        host_bytes=mem.host_bytes,
        assumptions=list(mem.assumptions) + dpo_notes(rs.workload)
        + generation_notes(rs.model, rs.workload, rs.layout, rs.recipe, capacity),
        warnings=list(rs.warnings),
        predicted=mem.predicted,
        error_band=mem.error_band,
        tight=fit.tight if fit else None,
        generation_bytes=fit.generation_bytes if fit else None,
        generation_usable_bytes=fit.generation_usable_bytes if fit else None,
    )
