"""The mistakes people make in the configs they bring, checked against what the estimate found."""

from __future__ import annotations

from planner import catalog
from planner.core.units import BYTES_PER_GIB as GIB
from planner.launch.importers.found import Found
from planner.memory.estimate import Estimate


def config_warnings(f: Found, est: Estimate) -> list[str]:
    lay = est.layout
    gpu = catalog.get_gpu(est.gpu) if est.gpu else None
    out: list[str] = []
    mb, ga, dp = lay["micro_batch"], lay["grad_accum"], lay["dp"]
    if "grad_accum" in f.values and ga is not None and f.values["grad_accum"] != ga:
        cfg_ga = f.values["grad_accum"]
        out.append(f"{f.where['grad_accum']}: {cfg_ga} gives micro-batch {mb} × dp {dp} × {cfg_ga} = "
                   f"{mb * dp * cfg_ga} sequences per step, not the global batch {mb * dp * ga}: "
                   f"set it to {ga}")
    if "train_batch_size" in f.facts and ga is not None:
        tb, where = f.facts["train_batch_size"]
        if tb != mb * dp * ga:
            out.append(f"{where}: {tb} ≠ micro-batch {mb} × gradient accumulation {ga} × dp {dp} = "
                       f"{mb * ga * dp}: DeepSpeed will refuse to start")
    if gpu is None:
        return out
    if "asks_bf16" in f.facts and not gpu.supports_bf16:
        out.append(f"{f.facts['asks_bf16']}: bf16 on {gpu.name}, which has no BF16: it will fail or "
                   "run emulated and slow; use fp16 with loss scaling")
    if "asks_fa2" in f.facts and not gpu.supports_flash_attn2:
        out.append(f"{f.facts['asks_fa2']}: FlashAttention-2 does not run on {gpu.name} (it needs "
                   "Ampere or newer); use sdpa")
    if "tp" in f.where and lay["tp"] > gpu.nvlink_domain:
        out.append(f"{f.where['tp']}: TP {lay['tp']} is larger than the NVLink domain of {gpu.name} "
                   f"({gpu.nvlink_domain}): its all-reduces run over PCIe, slowly")
    if est.host_bytes:
        per_node = min(est.gpus, gpu.gpus_per_node)
        need = est.host_bytes * per_node
        what = "ZeRO-3 CPU offload" if lay["zero"] == 3 else "CPU offload"
        if gpu.host_ram_per_node_gib is None:
            out.append(f"{what} keeps {need / GIB:.0f} GiB in host memory on each node; the host RAM "
                       f"of a {gpu.name} node is not known: check it")
        elif need > gpu.host_ram_budget_bytes:
            out.append(f"{what} keeps {need / GIB:.0f} GiB in host memory on each node, more than a "
                       f"{gpu.name} node's {gpu.host_ram_per_node_gib:.0f} GiB can spare: it will swap "
                       "or be killed")
    return out


def annotate(est: Estimate, f: Found) -> Estimate:
    """The estimate with the configs' defaults among its assumptions and their mistakes as warnings."""
    return est.model_copy(update={"assumptions": [*est.assumptions, *f.notes],
                                  "warnings": [*est.warnings, *f.warnings, *config_warnings(f, est)],
                                  "read_from_configs": f.read()})
