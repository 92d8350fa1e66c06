"""What every memory profile shares: the breakdown it returns and the codes of the choices.

The search passes layouts to a profile as arrays of codes (index into the tuples below);
:func:`codes` turns one scenario into those codes, and each component is rounded up to whole
bytes by :func:`ceil_components`, so components always add up to the total exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.core.codes import (  # the one home of the code tables, re-exported here
    ATTENTION,
    CHECKPOINTING,
    GRAD_DTYPES,
    KERNELS,
    LOSSES,
    METHODS,
    OFFLOADS,
    OPTIMIZER_STEPS,
    OPTIMIZERS,
    PRECISIONS,
    SELECTIVE,
    ZERO_IMPLS,
)
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
    #: Profiles that model the phases of a step: the bytes each phase must fit (the largest is
    #: the total); the search states one memory constraint per phase.
    phase_bytes: dict[str, int] | None = None

    @property
    def total_bytes(self) -> int:
        return sum(self.components.values())


#: Array keys whose values are codes into one of the tuples above.
CODES: dict[str, tuple[str, ...]] = {"method": METHODS, "precision": PRECISIONS, "optimizer": OPTIMIZERS,
                                     "checkpointing": CHECKPOINTING, "attention": ATTENTION, "offload": OFFLOADS,
                                     "zero_impl": ZERO_IMPLS, "loss": LOSSES, "kernels": KERNELS,
                                     "selective": SELECTIVE, "optimizer_step": OPTIMIZER_STEPS,
                                     "grad_dtype": GRAD_DTYPES}


#: A stack's recipe where memory depends on it (``StackRecipe`` fields that set ``Recipe`` keys
#: of the same name): how its FSDP frees gathers, who implements its ZeRO stages, whether its
#: training loop accumulates gradients unsharded under FSDP, how its optimizer steps (one tensor
#: at a time, or all at once with an intermediate), its gradients' dtype, the loss's implementation, the
#: norm/activation kernels, torch.compile, and whether a colocated GRPO engine sleeps while the
#: step trains and the trainer's states leave the card while it generates (and, for the time model
#: only, whether each step scores its completions with one more forward), and whether its
#: optimizer offload leaves the gradients on the card.
STACK_RECIPE: tuple[str, ...] = ("fsdp_version", "zero_impl", "unsharded_grad_accumulation",
                                 "optimizer_step", "grad_dtype", "loss", "kernels", "selective", "compile", "generation_sleep", "rollout_offload",
                                 "logprob_forward", "reference_offload", "offload_keeps_grads")
#: Of those, the ones a stack sets for GRPO plans only (left out of other workloads' rows and
#: pins): its colocated engine's phases, its old-log-prob forward, and where its reference model
#: is kept (a scenario's own ``recipe.reference_offload`` holds for DPO too).
GENERATION_RECIPE: tuple[str, ...] = ("generation_sleep", "rollout_offload", "logprob_forward", "reference_offload")
#: Recipe keys a search decides per GPU type where the scenario leaves them unset (memory that
#: depends on the card): whether FP8 weights keep a transposed copy (``GpuSpec.keeps_fp8_transpose``).
CARD_RECIPE: tuple[str, ...] = ("fp8_transpose_cache",)
#: Array keys whose values are flags.
FLAGS = frozenset({"sp", "unsharded_grad_accumulation", "compile", "generation_sleep", "rollout_offload",
                   "logprob_forward", "reference_offload", "fp8_transpose_cache", "offload_keeps_grads"})


def decode(key: str, value: Any) -> Any:
    """An array value back to the scenario's value: a name for coded keys, a bool for flags
    (``sp``, ``unsharded_grad_accumulation``), an int otherwise (the one decoder of codes)."""
    if key in CODES:
        return CODES[key][int(value)]
    if key in FLAGS:
        return bool(value)
    return int(value)


#: The layout and workload keys a search class carries (besides its GPU and tier indices).
CLASS_FIELDS = ("tp", "pp", "cp", "ep", "sp", "zero", "offload", "micro_batch", "seq_len", "method",
                "precision", "optimizer", "attention", "checkpointing")


def decode_class(codes: dict[str, Any]) -> dict[str, Any]:
    """A search class's codes as the scenario's values, for :data:`CLASS_FIELDS`."""
    return {k: decode(k, codes[k]) for k in CLASS_FIELDS if k in codes}


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
        **({"etp": layout.etp} if layout.etp is not None else {}),
        **dpo_codes(workload),
    }


def dpo_codes(workload: Workload) -> dict[str, int]:
    """DPO's and GRPO's arguments of :func:`seed_components` (none for supervised training):
    ``sequences`` per example (a pair: 2; a completion: 1) and ``reference`` (1: a reference model
    runs; its copy is kept only beside a fully trained policy)."""
    if workload.algorithm not in ("dpo", "grpo"):
        return {}
    return {"sequences": workload.sequences_per_sample, "reference": int(workload.reference_forward)}


#: The most bytes one component is counted at: 2^58 B ≈ 288 PB, far beyond any GPU, so a sum of
#: up to 32 components stays inside int64 (2^63) however absurd the inputs (a micro-batch of a
#: million 16M-token sequences). A demand this large never fits, which is all that matters.
COMPONENT_CEILING = 2**58


def ceil_components(raw: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """Round each named component up to whole bytes (arrays stay arrays), capped at
    :data:`COMPONENT_CEILING` (NaN, which no valid input produces, counts as the cap too)."""
    out = {}
    for k in names:
        x = np.ceil(np.asarray(raw[k], dtype=float) - 1e-6)
        x = np.where(np.isnan(x), COMPONENT_CEILING, np.clip(x, 0, COMPONENT_CEILING))
        out[k] = x.astype(np.int64)
    return out
