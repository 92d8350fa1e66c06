"""Which layouts can run at all: one rule each, for a pinned layout (a scenario) and for the
search's arrays of candidates alike. Each returns what is wrong, or None.

Messages read after the field and its value: ``layout.tp: 3`` + ``does not divide …``.
"""

from __future__ import annotations

from typing import Any, get_args

import numpy as np

from planner.core.specs import GpuSpec, ModelSpec, Offload

#: Offload codes: the schema's values in order (none, optimizer, optimizer+params).
OFFLOAD_CODES: tuple[str, ...] = get_args(Offload)


def tp_model_fault(model: ModelSpec, tp: int) -> str | None:
    """TP splits the attention heads and the KV heads (or replicates KV heads when tp is a multiple)."""
    if model.heads is not None and model.heads % tp:
        return f"does not divide the model's {model.heads} attention heads"
    kv = model.kv_heads_eff
    if kv is not None and model.mla is None and kv % tp and tp % kv:
        return f"does not divide the model's {kv} KV heads"
    return None


def tp_gpu_fault(gpu: GpuSpec, tp: int, *, pcie_model_parallel: bool = True) -> str | None:
    """TP stays within a node, and over PCIe only where the scenario allows it."""
    if tp > gpu.gpus_per_node:
        return f"exceeds the {gpu.gpus_per_node} GPUs of a {gpu.name} node"
    if tp > 1 and tp > gpu.nvlink_domain and not pcie_model_parallel:
        return "runs over PCIe, which constraints.pcie_model_parallel: false forbids"
    return None


def pp_divides(model: ModelSpec, pp: Any) -> Any:
    """Equal pipeline stages: pp divides the layers (arrays broadcast)."""
    return np.asarray(model.layers) % np.maximum(pp, 1) == 0


def offload_illegal(zero: Any, offload: Any) -> Any:
    """Offload needs ZeRO/FSDP; offloading parameters needs them sharded (ZeRO-3). ``offload`` as a
    name or a code (arrays broadcast)."""
    code = OFFLOAD_CODES.index(offload) if isinstance(offload, str) else np.asarray(offload)
    zero = np.asarray(zero)
    return ((code >= 1) & (zero == 0)) | ((code == 2) & (zero != 3))


def offload_fault(zero: int, offload: str) -> str | None:
    if not offload_illegal(zero, offload):
        return None
    if zero == 0:
        return f"{offload!r} needs ZeRO/FSDP (layout.zero ≥ 1)"
    return f"{offload!r} needs layout.zero: 3 (parameters must be sharded)"
