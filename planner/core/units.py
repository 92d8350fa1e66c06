"""Unit conversions, all in one place.

Internally every memory figure is an integer number of bytes. GPU capacities are stored in MiB
exactly as ``nvidia-smi`` prints them and converted here. Output defaults to GB = 1e9 bytes (as
the seed documents count); GiB = 2**30 bytes is offered for people comparing with nvidia-smi.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

BYTES_PER_KIB = 1024
BYTES_PER_MIB = 1024**2
BYTES_PER_GIB = 1024**3
BYTES_PER_GB = 10**9
PARAMS_PER_B = 10**9  # "7B" = 7e9 parameters

#: bytes per element of each data type (memory-model.md, "Units": b(x)).
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "nf4": 0.5,
}


def nodes_for(gpus: Any, gpus_per_node: Any) -> Any:
    """Nodes that ``gpus`` GPUs occupy: ⌈gpus / gpus per node⌉ (integers or integer arrays)."""
    return -(-gpus // gpus_per_node)


def zero_degree(dp: Any, cp: Any) -> Any:
    """Ranks that ZeRO/FSDP shards states over: the data-parallel ranks times the context-parallel
    ones (each context-parallel rank holds the same weights; Megatron's distributed optimizer and
    FSDP shard over the dp×cp group). Integers or integer arrays."""
    return dp * cp


def expert_ways(ep: Any, shard: Any, sharded: Any, *, tp: Any = 1, etp: Any = None) -> Any:
    """Ways a stage's routed-expert state is divided beyond each expert's tensor split (tp ways,
    or ``etp`` where set): ep where the state is not ZeRO-sharded; sharded, over the expert
    layers' data-parallel group too, ep·expert-dp. With the experts split within dp (``etp``
    unset) that is the ZeRO degree ``shard`` (ep divides it); under MoE parallel folding the
    stage's shard·tp GPUs regroup as etp × ep × expert-dp, so ep·expert-dp = shard·tp/etp.
    Integers or arrays."""
    folded = shard if etp is None else shard * tp / etp
    return np.where(sharded, np.maximum(folded, ep), np.maximum(ep, 1))


def mib_to_bytes(mib: int) -> int:
    return int(mib) * BYTES_PER_MIB


def bytes_to_gb(n_bytes: float) -> float:
    return n_bytes / BYTES_PER_GB


def bytes_to_gib(n_bytes: float) -> float:
    return n_bytes / BYTES_PER_GIB


#: Slack when a float that should be a whole number of units is rounded: products like
#: 0.1 · 1e4 land a hair off the integer, and rounding a demand up (or a limit down) must not
#: move it by a whole unit for that (bytes, cents, 1e-4 USD, milliseconds: one rule).
ROUNDING_SLACK = 1e-9


def ceil_units(x: float) -> int:
    """A demand in whole units, rounded up: a demand is never understated."""
    return math.ceil(x - ROUNDING_SLACK)


def floor_units(x: float) -> int:
    """A limit in whole units, rounded down: a limit is never overstated."""
    return math.floor(x + ROUNDING_SLACK)


def ceil_units_array(x: Any) -> Any:
    """:func:`ceil_units` over an array; infinities stay infinite."""
    x = np.asarray(x, dtype=float)
    return np.where(np.isfinite(x), np.ceil(x - ROUNDING_SLACK), np.inf)


def ceil_bytes(x: float) -> int:
    """Round a fractional byte demand up: a demand is never understated."""
    return ceil_units(x)


def floor_bytes(x: float) -> int:
    """Round a capacity down: a capacity is never overstated."""
    return floor_units(x)


def format_bytes(n_bytes: float, *, gib: bool = False, digits: int = 2) -> str:
    """``12.35 GB`` (1e9) by default, ``11.50 GiB`` (2**30) with ``gib=True``."""
    if gib:
        return f"{bytes_to_gib(n_bytes):,.{digits}f} GiB"
    return f"{bytes_to_gb(n_bytes):,.{digits}f} GB"
