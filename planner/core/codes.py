"""Codes of the scenario's categorical choices for the array form of the formulas (index = code):
the schema's own value lists, once, so that a code and a name can never disagree."""

from __future__ import annotations

from typing import get_args

from planner.core.specs import (
                                Attention,
                                Checkpointing,
                                Kernels,
                                Loss,
                                Method,
                                Offload,
                                Optimizer,
                                Precision,
                                ZeroImpl,
)

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

#: FSDP sharding strategies -> the ZeRO stage whose states they shard: torch's ShardingStrategy
#: names, and the numbers accelerate's config writes for them (1 FULL_SHARD, 2 SHARD_GRAD_OP,
#: 3 NO_SHARD, 4 HYBRID_SHARD, 5 _HYBRID_SHARD_ZERO2). The one table of these names.
FSDP_STRATEGY_STAGE = {"FULL_SHARD": 3, "HYBRID_SHARD": 3, "SHARD_GRAD_OP": 2, "_HYBRID_SHARD_ZERO2": 2,
                       "NO_SHARD": 0, "1": 3, "2": 2, "3": 0, "4": 3, "5": 2}
#: The hybrid strategies (shard inside a node, replicate across nodes).
FSDP_HYBRID = frozenset({"HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "4", "5"})
#: The strategy an exported FSDP config names for a ZeRO stage.
FSDP_STRATEGY_OF_STAGE = {2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}

#: PEFT module names of the targets planner counts (Llama naming, as the catalog's models use).
PEFT_MODULES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
                "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
