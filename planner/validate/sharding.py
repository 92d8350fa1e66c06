"""The ZeRO stage a data file's sharding words mean (``zero_or_fsdp`` cells of the memory files,
``zero_fsdp`` of the throughput files): one reading for every file."""

from __future__ import annotations

import re

from planner.core.codes import DS_ZERO_STAGE_WORDS, FSDP_STRATEGY_STAGE


def _squeezed(text: str) -> str:
    return text.lower().replace(" ", "").replace("-", "").replace("_", "")


#: FSDP's strategy names as they appear squeezed in a cell (planner.core.codes), with their stage.
STRATEGY_WORDS = {_squeezed(name): stage for name, stage in FSDP_STRATEGY_STAGE.items() if not name.isdigit()}


#: Squeezed phrases that name FSDP only to say it is off: "no FSDP (column)", "without FSDP",
#: "presets do not set use_megatron_fsdp", "use_megatron_fsdp=False", "FSDP off" (not "FSDP
#: offload"), "FSDP=0", a table's FSDP column holding "/" (no entry).
NEGATED_FSDP = re.compile(r"(?:no|without|not|donotset)(?:use)?(?:megatron)?fsdp(?:column)?"
                          r"|(?:use)?(?:megatron)?fsdp(?:=0|=false|off(?!load))"
                          r'|fsdpcolumn"*/"*')


def _names_stage(squeezed: str, stage: int) -> bool:
    """The squeezed text names DeepSpeed's ZeRO ``stage`` (planner.core.codes)."""
    return any(word in squeezed for word in DS_ZERO_STAGE_WORDS[stage])


def zero_stage_of(text: str) -> int:
    """0 plain data parallel (DDP, FSDP ``NO_SHARD``, Megatron-Bridge's "FSDP=0"); 1 ZeRO-1 and
    Megatron's distributed optimizer; 2 ZeRO-2 and FSDP ``SHARD_GRAD_OP``; 3 ZeRO-3, FSDP full or
    hybrid shard, FSDP2 and Megatron FSDP. Case, spaces, hyphens and underscores do not matter."""
    t = _squeezed(text)
    t = NEGATED_FSDP.sub("", t)  # FSDP named only as off: "DDP + distributed optimizer (FSDP=0)"
    for name in sorted(STRATEGY_WORDS, key=len, reverse=True):  # FSDP's strategy names, longest first
        if name in t:
            return STRATEGY_WORDS[name]
    if _names_stage(t, 2):
        return 2
    if "fsdp" in t or _names_stage(t, 3):
        return 3
    if _names_stage(t, 1) or "distributedoptimizer" in t or "distopt" in t:
        return 1
    return 0


def names_deepspeed_stage(text: str, *stages: int) -> bool:
    """The text names DeepSpeed's ZeRO stage (any of ``stages``, default every one): ``zero3``,
    ``ZeRO-3``, ``stage 3`` (planner.core.codes' words; case, spaces, hyphens, underscores aside)."""
    squeezed = _squeezed(text)
    return any(_names_stage(squeezed, stage) for stage in (stages or tuple(DS_ZERO_STAGE_WORDS)))
