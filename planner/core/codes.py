"""Codes of the scenario's categorical choices for the array form of the formulas (index = code):
the schema's own value lists, once, so that a code and a name can never disagree."""

from __future__ import annotations

from typing import get_args

from planner.core.specs import (Attention, Checkpointing, Kernels, Loss, Method, Offload, Optimizer, Precision,
                                ZeroImpl)

METHODS: tuple[str, ...] = get_args(Method)
PRECISIONS: tuple[str, ...] = get_args(Precision)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
CHECKPOINTING: tuple[str, ...] = get_args(Checkpointing)
ATTENTION: tuple[str, ...] = get_args(Attention)
OFFLOADS: tuple[str, ...] = get_args(Offload)
ZERO_IMPLS: tuple[str, ...] = get_args(ZeroImpl)
LOSSES: tuple[str, ...] = get_args(Loss)
KERNELS: tuple[str, ...] = get_args(Kernels)

#: The method codes the formulas test by name.
FULL, LORA, QLORA, INFERENCE = (METHODS.index(m) for m in ("full", "lora", "qlora", "inference"))
