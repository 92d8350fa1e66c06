"""The ZeRO stage a data file's sharding words mean (``zero_or_fsdp`` cells of the memory files,
``zero_fsdp`` of the throughput files): one reading for every file."""

from __future__ import annotations

from planner.core.codes import FSDP_STRATEGY_STAGE


def _squeezed(text: str) -> str:
    return text.lower().replace(" ", "").replace("-", "").replace("_", "")


#: FSDP's strategy names as they appear squeezed in a cell (planner.core.codes), with their stage.
STRATEGY_WORDS = {_squeezed(name): stage for name, stage in FSDP_STRATEGY_STAGE.items() if not name.isdigit()}


def zero_stage_of(text: str) -> int:
    """0 plain data parallel (DDP, FSDP ``NO_SHARD``, Megatron-Bridge's "FSDP=0"); 1 ZeRO-1 and
    Megatron's distributed optimizer; 2 ZeRO-2 and FSDP ``SHARD_GRAD_OP``; 3 ZeRO-3, FSDP full or
    hybrid shard, FSDP2 and Megatron FSDP. Case, spaces, hyphens and underscores do not matter."""
    t = _squeezed(text)
    t = t.replace("fsdp=0", "")  # Megatron-Bridge: "DDP + distributed optimizer (FSDP=0)"
    for name in sorted(STRATEGY_WORDS, key=len, reverse=True):  # FSDP's strategy names, longest first
        if name in t:
            return STRATEGY_WORDS[name]
    if "zero2" in t or "stage2" in t:
        return 2
    if "fsdp" in t or "zero3" in t or "stage3" in t:
        return 3
    if "zero1" in t or "stage1" in t or "distributedoptimizer" in t or "distopt" in t:
        return 1
    return 0
