"""Which layouts can run at all: one rule each, for a pinned layout (a scenario) and for the
search's arrays of candidates alike. Each returns what is wrong, or None.

Messages read after the field and its value: ``layout.tp: 3`` + ``does not divide …``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.core.codes import CHECKPOINTING, METHODS, OFFLOADS
from planner.core.specs import GpuSpec, ModelSpec, StackSpec

#: Offload codes: the schema's values in order (none, optimizer, optimizer+params).
OFFLOAD_CODES, METHOD_CODES, CHECKPOINT_CODES = OFFLOADS, METHODS, CHECKPOINTING  # planner.core.codes
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)


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


def pp_gpu_fault(gpu: GpuSpec, pp: int, *, pcie_model_parallel: bool = True) -> str | None:
    """Pipeline stages on a card with no NVLink (``nvlink_domain`` 1) pass activations over PCIe:
    only where the scenario allows model parallelism over PCIe."""
    if pp > 1 and gpu.nvlink_domain == 1 and not pcie_model_parallel:
        return "runs over PCIe, which constraints.pcie_model_parallel: false forbids"
    return None


def pp_divides(model: ModelSpec, pp: Any) -> Any:
    """Equal pipeline stages: pp divides the layers (arrays broadcast)."""
    return np.asarray(model.layers) % np.maximum(pp, 1) == 0


def pp_legal(model: ModelSpec, pp: Any, *, uneven: bool = False) -> Any:
    """Every stage holds a layer, and the stages are equal unless ``uneven`` (stages of unequal
    layer counts, as torchtitan and Megatron's ``--decoder-first/last-pipeline-num-layers`` run
    them) is allowed (arrays broadcast)."""
    pp = np.asarray(pp)
    return (pp <= model.layers) & (pp_divides(model, pp) | uneven)


def pp_fault(model: ModelSpec, pp: int, *, uneven: bool = False) -> str | None:
    """What is wrong with ``pp`` pipeline stages of this model, or None (:func:`pp_legal`)."""
    if pp > model.layers:
        return f"exceeds the model's {model.layers} layers"
    if not uneven and model.layers % pp:
        return f"does not divide the model's {model.layers} layers"
    return None


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


def stack_runs(stack: StackSpec, *, vendor: str, quant_type: str, method: Any, tp: Any, pp: Any, cp: Any,
               ep: Any, sp: Any, zero: Any, offload: Any, checkpointing: Any,
               saved_modules: bool = False) -> Any:
    """Whether ``stack`` runs each layout (arrays broadcast; categorical values as codes into the
    schema's value lists, or names). The one rule of the search, the checker and the estimate.
    ``saved_modules``: the workload trains whole modules beside LoRA (``modules_to_save``)."""
    def code(values: tuple[str, ...], x: Any) -> Any:
        return values.index(x) if isinstance(x, str) else np.asarray(x)

    def among(values: tuple, x: Any, allowed: list) -> Any:
        table = np.zeros(len(values), dtype=bool)  # a lookup, not np.isin: the search calls this
        table[[values.index(v) for v in allowed]] = True  # on grids of 10^5 layouts per stack
        return table[code(values, x)]

    m = code(METHOD_CODES, method)
    qlora = m == METHOD_CODES.index("qlora")
    ok = among(METHOD_CODES, m, stack.methods) & np.asarray(vendor in stack.vendors)
    ok &= ~qlora | (np.asarray(quant_type in stack.quant_types and vendor in stack.qlora_vendors)
                    & among(ZERO_STAGES, zero, stack.zero_with_qlora))
    ok &= among(ZERO_STAGES, zero, stack.zero) & among(OFFLOAD_CODES, offload, stack.offload)
    ok &= among(CHECKPOINT_CODES, checkpointing, stack.checkpointing)
    ok &= (np.asarray(tp) == 1) | among(METHOD_CODES, m, stack.tp_methods)
    ok &= (np.asarray(pp) == 1) | (among(METHOD_CODES, m, stack.pp_methods)
                                   & among(ZERO_STAGES, zero, stack.zero_with_pp))
    ok &= (np.asarray(cp) == 1) | stack.cp
    ok &= (np.asarray(ep) == 1) | stack.ep
    ok &= ~np.asarray(sp, dtype=bool) | stack.sp
    lora_like = m != METHOD_CODES.index("full")
    ok &= ~(lora_like & bool(saved_modules)) | stack.modules_to_save
    return ok
