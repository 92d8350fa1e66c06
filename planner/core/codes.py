"""Codes of the scenario's categorical choices for the array form of the formulas (index = code):
the schema's own value lists, once, so that a code and a name can never disagree.

And the words training tools use for those choices (FSDP's sharding strategies, DeepSpeed's ZeRO
stages and offload blocks, PEFT's module names): one table each, which the config readers and the
data-file readers read and the exporters write."""

from __future__ import annotations

from typing import get_args

from planner.core.values import (
                       Attention,
                       Checkpointing,
                       GradDtype,
                       Kernels,
                       Loss,
                       Method,
                       Offload,
                       Optimizer,
                       OptimizerStep,
                       Precision,
                       Selective,
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
SELECTIVE: tuple[str, ...] = get_args(Selective)
OPTIMIZER_STEPS: tuple[str, ...] = get_args(OptimizerStep)
GRAD_DTYPES: tuple[str, ...] = get_args(GradDtype)

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

#: DeepSpeed's ZeRO stages: ``zero_optimization.stage`` is the planner's ZeRO stage, the same number
#: (0 plain data parallel); free text names a stage by these words, squeezed (``ZeRO-3``, ``stage 3``).
#: The one table of DeepSpeed's stage words.
DS_ZERO_STAGE_WORDS = {1: ("zero1", "stage1"), 2: ("zero2", "stage2"), 3: ("zero3", "stage3")}
#: ZeRO's offload blocks in ``zero_optimization``: the optimizer states', and the parameters' (ZeRO-3
#: only). A block's ``device`` among the offload devices moves them off the GPU (an exported config
#: names the CPU); ``DS_NO_OFFLOAD``, DeepSpeed's default, keeps them on it.
DS_OFFLOAD_BLOCKS = ("offload_optimizer", "offload_param")
DS_OFFLOAD_CPU, DS_OFFLOAD_NVME = "cpu", "nvme"
DS_OFFLOAD_DEVICES = (DS_OFFLOAD_CPU, DS_OFFLOAD_NVME)
DS_NO_OFFLOAD = "none"
#: The planner's offload modes as the blocks that offload: (optimizer states, parameters).
DS_OFFLOAD_MODES = {"none": (False, False), "optimizer": (True, False), "optimizer+params": (True, True)}
#: The offload mode of the blocks that offload; parameters alone are no mode of the planner's.
DS_OFFLOAD_MODE_OF = {blocks: mode for mode, blocks in DS_OFFLOAD_MODES.items()}

#: PEFT module names of the targets planner counts (Llama naming, as the catalog's models use).
PEFT_MODULES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
                "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
