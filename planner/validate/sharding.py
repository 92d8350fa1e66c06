"""The ZeRO stage a data file's sharding words mean (``zero_or_fsdp`` cells of the memory files,
``zero_fsdp`` of the throughput files): one reading for every file."""

from __future__ import annotations


def zero_stage_of(text: str) -> int:
    """0 plain data parallel (DDP, FSDP ``NO_SHARD``, Megatron-Bridge's "FSDP=0"); 1 ZeRO-1 and
    Megatron's distributed optimizer; 2 ZeRO-2 and FSDP ``SHARD_GRAD_OP``; 3 ZeRO-3, FSDP full or
    hybrid shard, FSDP2 and Megatron FSDP. Case, spaces, hyphens and underscores do not matter."""
    t = text.lower().replace(" ", "").replace("-", "").replace("_", "")
    t = t.replace("fsdp=0", "")  # Megatron-Bridge: "DDP + distributed optimizer (FSDP=0)"
    if "noshard" in t:
        return 0
    if "shardgradop" in t or "zero2" in t or "stage2" in t:
        return 2
    if "fullshard" in t or "hybridshard" in t or "fsdp" in t or "zero3" in t or "stage3" in t:
        return 3
    if "zero1" in t or "stage1" in t or "distributedoptimizer" in t or "distopt" in t:
        return 1
    return 0
