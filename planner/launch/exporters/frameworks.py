"""Launchers and sharding back-ends: DeepSpeed JSON, accelerate config, torchrun, SkyPilot task."""

from __future__ import annotations

import json
import shlex

import yaml

from planner.core.codes import DS_OFFLOAD_BLOCKS, DS_OFFLOAD_CPU, DS_OFFLOAD_MODES, FSDP_STRATEGY_OF_STAGE
from planner.launch.exporters.common import Bundle, Ctx
from planner.memory.buffers import deepspeed_bucket_elements

#: planner GPU id -> SkyPilot accelerator name (only names SkyPilot's catalog uses).
SKYPILOT_ACCELERATORS = {
    "h100-sxm-80gb": "H100", "h100-pcie-80gb": "H100", "h200-sxm-141gb": "H200", "b200": "B200",
    "a100-sxm-40gb": "A100", "a100-sxm-80gb": "A100-80GB", "l40s": "L40S", "l4": "L4", "l40": "L40",
    "a10g": "A10G", "a10": "A10", "rtx-a6000": "RTXA6000", "rtx-3090": "RTX3090",
    "rtx-4090": "RTX4090", "t4": "T4", "v100-16gb": "V100", "v100-32gb": "V100-32GB",
    "mi300x": "MI300X", "rtx-6000-ada": "RTX6000-Ada", "gh200-96gb": "GH200",
}


def deepspeed_config(ctx: Ctx, out: Bundle) -> dict | None:
    """The DeepSpeed JSON, or None (with the reason in ``out.skipped``)."""
    fmt = "deepspeed"
    wl, lay = ctx.wl, ctx.lay
    if wl.method == "inference":
        out.skipped[fmt] = "an inference plan has no DeepSpeed training config"
        return None
    if lay.pp > 1:
        out.skipped[fmt] = (f"pipeline parallelism (pp={lay.pp}) is built in code with DeepSpeed's "
                            "PipelineModule, not in its JSON; use the Megatron-LM arguments")
        return None
    cfg: dict = {
        "train_batch_size": ctx.global_batch,
        "train_micro_batch_size_per_gpu": wl.micro_batch,
        "gradient_accumulation_steps": ctx.grad_accum,
    }
    if ctx.half == "bf16":
        cfg["bf16"] = {"enabled": True}
        if wl.precision == "bf16":
            if lay.zero == 0:
                out.skipped[fmt] = ("pure BF16 (no FP32 master) needs ZeRO ≥ 1 in DeepSpeed "
                                    "(bf16_master_weights_and_grads)")
                return None
            cfg["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
    elif ctx.half == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0}
        out.note(fmt, "FP16 with dynamic loss scaling (loss_scale 0)")
    zero: dict = {"stage": lay.zero}
    if lay.zero:
        # The gradient reduce bucket the plan's memory holds, written out: where the JSON names
        # none DeepSpeed's own 5e8 elements (1 GB in 16 bits) would apply instead.
        zero["reduce_bucket_size"] = deepspeed_bucket_elements(ctx.rs.model, ctx.rs.recipe)
        if lay.zero < 3:
            zero["overlap_comm"] = False  # one bucket in backward (two with overlap_comm)
    for block, offloads in zip(DS_OFFLOAD_BLOCKS, DS_OFFLOAD_MODES[lay.offload]):
        if offloads:
            zero[block] = {"device": DS_OFFLOAD_CPU, "pin_memory": True}
    cfg["zero_optimization"] = zero
    if lay.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": lay.tp}
    if lay.cp > 1:
        cfg["sequence_parallel_size"] = lay.cp
        out.note(fmt, f"context parallelism {lay.cp} as DeepSpeed-Ulysses sequence_parallel_size; "
                      "the model must use DeepSpeed's DistributedAttention")
    if wl.optimizer in ("adam8bit", "paged_adamw8bit", "adafactor", "lion"):
        cfg["zero_allow_untested_optimizer"] = True
        out.note(fmt, f"the plan's {wl.optimizer} is not a DeepSpeed optimizer: pass it to "
                      "deepspeed.initialize(optimizer=...) (no 'optimizer' block)")
    if lay.checkpointing != "none":
        cfg["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False}
        out.note(fmt, f"{lay.checkpointing} activation checkpointing: the model must checkpoint "
                      "(gradient_checkpointing in TrainingArguments, or deepspeed.checkpointing."
                      "checkpoint); the JSON section only tunes it")
    out.need(fmt, "an 'optimizer' and 'scheduler' block with your learning rate, or create them in "
                  f"your script (the plan chose {wl.optimizer}); 'gradient_clipping' if you clip")
    return cfg


def accelerate_config(ctx: Ctx, out: Bundle, ds_file: str | None = None) -> dict | None:
    """``accelerate launch``'s config: the bundle's one sharding back-end (FSDP, or DeepSpeed through
    ``ds_file``), processes and machines."""
    fmt = "accelerate"
    wl, lay = ctx.wl, ctx.lay
    if lay.tp > 1 or lay.pp > 1 or lay.cp > 1:
        out.skipped[fmt] = (f"accelerate's FSDP config has no tensor/pipeline/context parallelism "
                            f"(tp={lay.tp} pp={lay.pp} cp={lay.cp}); use the Megatron-LM arguments")
        return None
    cfg: dict = {
        "compute_environment": "LOCAL_MACHINE",
        "mixed_precision": ctx.half or "no",
        "num_machines": ctx.nodes,
        "num_processes": lay.gpus,
        "use_cpu": False,
    }
    if ctx.backend is None:
        cfg["distributed_type"] = "MULTI_GPU" if lay.gpus > 1 else "NO"
    elif ctx.backend == "deepspeed":
        if ds_file is None:
            out.skipped[fmt] = "the bundle shards with DeepSpeed, whose config was not written"
            return None
        # accelerate refuses a mixed_precision beside a DeepSpeed file: the file holds bf16/fp16
        del cfg["mixed_precision"]
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {"deepspeed_config_file": ds_file, "zero3_init_flag": lay.zero == 3}
    else:
        cfg["distributed_type"] = "FSDP"
        strategy = FSDP_STRATEGY_OF_STAGE[lay.zero]
        cfg["fsdp_config"] = {
            "fsdp_sharding_strategy": strategy,
            "fsdp_offload_params": lay.offload != "none",
            "fsdp_activation_checkpointing": lay.checkpointing == "full",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_use_orig_params": ctx.lora,
        }
        if wl.method == "qlora":
            cfg["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] = True
    if lay.checkpointing == "selective":
        out.note(fmt, "selective recomputation is not an accelerate setting: the model code decides it")
    elif lay.checkpointing == "full" and ctx.backend != "fsdp":
        out.note(fmt, "full activation checkpointing without FSDP: call "
                      "model.gradient_checkpointing_enable() (gradient_checkpointing in TrainingArguments)")
    if ctx.nodes > 1:
        cfg.update(machine_rank=0, main_process_ip=None, main_process_port=29500,
                   rdzv_backend="c10d", same_network=True)
        out.need(fmt, f"machine_rank (0…{ctx.nodes - 1}) on each node and main_process_ip")
    if wl.precision == "bf16" and ctx.backend != "deepspeed":
        out.note(fmt, "pure BF16: load the model in bfloat16 (model_kwargs.json); "
                      "mixed_precision bf16 then keeps no FP32 master copy")
    return cfg


def torchrun_command(ctx: Ctx, out: Bundle, script_args: list[str]) -> str | None:
    fmt = "torchrun"
    lay = ctx.lay
    if ctx.per_node is None:
        out.skipped[fmt] = (f"{lay.gpus} GPUs do not split evenly over {ctx.nodes} nodes; "
                            "choose a GPU count that does")
        return None
    args = ["torchrun", f"--nnodes={ctx.nodes}", f"--nproc_per_node={ctx.per_node}"]
    if ctx.nodes > 1:
        args += ["--node_rank=${NODE_RANK}", "--rdzv_backend=c10d",
                 "--rdzv_endpoint=${MASTER_ADDR}:29500"]
        out.need(fmt, f"NODE_RANK (0…{ctx.nodes - 1}) and MASTER_ADDR on each node")
    else:
        args.append("--standalone")
    args += ["${TRAIN_SCRIPT}", *script_args]
    out.need(fmt, "TRAIN_SCRIPT: your training script (it reads the files named after it)")
    return " ".join(a if a.startswith(("--node_rank", "--rdzv_endpoint", "${")) else shlex.quote(a)
                    for a in args)


def skypilot_task(ctx: Ctx, out: Bundle, run: str | None) -> dict | None:
    fmt = "skypilot"
    gpu = ctx.gpu
    name = SKYPILOT_ACCELERATORS.get(gpu.id) if gpu else None
    if name is None:
        out.skipped[fmt] = (f"no SkyPilot accelerator name is known for {gpu.name if gpu else 'no GPU'}; "
                            "write resources.accelerators yourself")
        return None
    if ctx.per_node is None:
        out.skipped[fmt] = f"{ctx.lay.gpus} GPUs do not split evenly over {ctx.nodes} nodes"
        return None
    task: dict = {
        "name": _slug(ctx.rs.name),
        "resources": {"accelerators": f"{name}:{ctx.per_node}"},
        "num_nodes": ctx.nodes,
        "workdir": ".",
    }
    if run is not None:
        task["run"] = (run.replace("${NODE_RANK}", "${SKYPILOT_NODE_RANK}")
                       .replace("${MASTER_ADDR}", "$(echo \"$SKYPILOT_NODE_IPS\" | head -n1)") + "\n")
        task["envs"] = {"TRAIN_SCRIPT": None}
    out.need(fmt, "setup (pip install of your stack), envs.TRAIN_SCRIPT, and the cloud/region if you "
                  "pin one; the host RAM and disk of the node are SkyPilot's defaults")
    return task


def _slug(text: str) -> str:
    slug = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    return slug or "planner-job"


def dump_json(obj: dict) -> str:
    return json.dumps(obj, indent=2) + "\n"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (a ``run:`` script) as YAML literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(obj: dict) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
