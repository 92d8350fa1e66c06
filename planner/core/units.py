"""Unit conversions, all in one place.

Internally every memory figure is an integer number of bytes. GPU capacities are stored in MiB
exactly as ``nvidia-smi`` prints them and converted here. Output defaults to GB = 1e9 bytes (as
the seed documents count); GiB = 2**30 bytes is offered for people comparing with nvidia-smi.
"""

from __future__ import annotations

import math

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


def mib_to_bytes(mib: int) -> int:
    return int(mib) * BYTES_PER_MIB


def bytes_to_gb(n_bytes: float) -> float:
    return n_bytes / BYTES_PER_GB


def bytes_to_gib(n_bytes: float) -> float:
    return n_bytes / BYTES_PER_GIB


def ceil_bytes(x: float) -> int:
    """Round a fractional byte demand up: a demand is never understated."""
    return int(math.ceil(x - 1e-9))


def floor_bytes(x: float) -> int:
    """Round a capacity down: a capacity is never overstated."""
    return int(math.floor(x + 1e-9))


def format_bytes(n_bytes: float, *, gib: bool = False, digits: int = 2) -> str:
    """``12.35 GB`` (1e9) by default, ``11.50 GiB`` (2**30) with ``gib=True``."""
    if gib:
        return f"{bytes_to_gib(n_bytes):,.{digits}f} GiB"
    return f"{bytes_to_gb(n_bytes):,.{digits}f} GB"
