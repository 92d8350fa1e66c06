"""DeepSpeed's JSON config: micro batch and accumulation, precision, the ZeRO stage and its CPU/NVMe
offload, the optimizer, AutoTP and Ulysses sizes."""

from __future__ import annotations

from typing import Any

from planner.core.codes import (
    DS_NO_OFFLOAD,
    DS_OFFLOAD_BLOCKS,
    DS_OFFLOAD_DEVICES,
    DS_OFFLOAD_MODE_OF,
    DS_OFFLOAD_NVME,
    DS_ZERO_STAGE_WORDS,
)
from planner.launch.importers.common import bad_optimizer, count, is_int, read_precision
from planner.launch.importers.found import Found

DS_OPTIM = {"adam": "adamw", "adamw": "adamw", "fusedadam": "adamw", "cpuadam": "adamw", "sgd": "sgd"}

#: DeepSpeed JSON: keys that leave memory per GPU alone, and tuning the planner does not model.
DS_IGNORED = (
    "gradient_clipping", "steps_per_print", "wall_clock_breakdown", "scheduler", "optimizer.params",
    "fp16.loss_scale", "fp16.initial_scale_power", "fp16.loss_scale_window", "fp16.hysteresis",
    "fp16.min_loss_scale", "fp16.consecutive_hysteresis", "fp16.auto_cast", "prescale_gradients",
    "gradient_predivide_factor", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger", "dump_state",
    "memory_breakdown", "checkpoint", "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.gather_16bit_weights_on_model_save", "zero_optimization.elastic_checkpoint",
    "zero_optimization.ignore_unused_parameters", "zero_optimization.load_from_fp32_weights",
    "zero_optimization.round_robin_gradients", "communication_data_type", "seq_parallel_communication_data_type",
    "train_batch_size", "elasticity", "autotuning", "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_param.pin_memory", "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.offload_param.nvme_path", "zero_optimization.offload_optimizer.fast_init",
)
DS_TUNING = (
    "zero_optimization.overlap_comm", "zero_optimization.contiguous_gradients",
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.allgather_partitions", "zero_optimization.reduce_scatter",
    "zero_optimization.sub_group_size", "zero_optimization.stage3_*", "zero_optimization.cpu_offload",
    "zero_optimization.max_live_parameters", "zero_optimization.max_reuse_distance",
    "zero_optimization.prefetch_bucket_size", "zero_optimization.param_persistence_threshold",
    "zero_optimization.offload_optimizer.buffer_count", "zero_optimization.offload_param.buffer_count",
    "zero_optimization.offload_param.buffer_size", "zero_optimization.offload_param.max_in_cpu",
    "zero_optimization.zero_hpz_partition_size", "zero_optimization.zero_quantized_weights",
    "zero_optimization.zero_quantized_gradients", "zero_optimization.mics_*", "aio", "activation_checkpointing",
    "bf16.immediate_grad_update", "bf16.check_grad_overflow", "data_efficiency", "compression_training",
)


def read_deepspeed(cfg: dict, f: Found, where: str) -> None:
    f.facts["deepspeed"] = where
    _read_ds_batch(cfg, f, where)
    _read_ds_precision(cfg, f, where)
    zero = cfg.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if is_int(stage):
        f.set("zero", stage, where + ".zero_optimization.stage")
        if stage in DS_ZERO_STAGE_WORDS:
            f.set("zero_impl", "deepspeed", where + ".zero_optimization.stage")
        if "stage" not in zero:
            f.notes.append(f"{where}.zero_optimization.stage: not set; DeepSpeed's default 0 applies")
    _read_ds_offload(zero, stage, f, where)
    if is_int(stage) and stage > 0:
        _read_ds_bucket(zero, stage, f, where)
    opt = (cfg.get("optimizer") or {}).get("type")
    if opt is not None:
        name = DS_OPTIM.get(str(opt).lower())
        if name is None:
            bad_optimizer(f, where + ".optimizer.type", opt, "AdamW, Adam or SGD")
        else:
            f.set("optimizer", name, where + ".optimizer.type")
    autotp = (cfg.get("tensor_parallel") or {}).get("autotp_size")
    if is_int(autotp) and autotp > 1:
        f.set("tp", autotp, where + ".tensor_parallel.autotp_size")
    if is_int(cfg.get("sequence_parallel_size")) and cfg["sequence_parallel_size"] > 1:
        f.set("cp", cfg["sequence_parallel_size"], where + ".sequence_parallel_size")


#: DeepSpeed's ``reduce_bucket_size`` where the config names none (elements).
DS_DEFAULT_REDUCE_BUCKET = 500_000_000


def _read_ds_bucket(zero: dict, stage: int, f: Found, where: str) -> None:
    """The gradient reduce bucket DeepSpeed allocates with contiguous_gradients (its default):
    reduce_bucket_size elements, twice in ZeRO-1/2 backward with overlap_comm (off by default below
    stage 3); DeepSpeed's 5e8 where the config names none; "auto" is the Trainer's hidden²."""
    key = where + ".zero_optimization.reduce_bucket_size"
    if zero.get("contiguous_gradients") is False:
        return
    size = zero.get("reduce_bucket_size")
    if size == "auto":
        f.notes.append(f"{key}: 'auto' is the Trainer's hidden² elements: left out")
        return
    if size is None:
        size = DS_DEFAULT_REDUCE_BUCKET
        f.notes.append(f"{key}: not set; DeepSpeed's default {size:.0e} elements applies")
    try:
        elements = int(float(size))
    except (TypeError, ValueError):
        f.problems.append(f"{key}: {size!r} is not a number of elements")
        return
    if elements < 0:
        f.problems.append(f"{key}: {size!r} is negative")
        return
    if stage < 3 and zero.get("overlap_comm") is True:
        elements *= 2
    f.set("zero_bucket_elements", elements, key)


def _read_ds_batch(cfg: dict, f: Found, where: str) -> None:
    """Micro batch and gradient accumulation; the world size ``train_batch_size`` implies with them."""
    mb, ga, tb = (count(cfg, k, f, where, auto=True) for k in ("train_micro_batch_size_per_gpu",
                                                             "gradient_accumulation_steps", "train_batch_size"))
    if is_int(mb):
        f.set("micro_batch", mb, where + ".train_micro_batch_size_per_gpu")
    if is_int(ga):
        f.set("grad_accum", ga, where + ".gradient_accumulation_steps")
    if is_int(tb):
        f.facts["train_batch_size"] = (tb, where + ".train_batch_size")
        if is_int(mb) and is_int(ga) and tb % (mb * ga) == 0:
            f.facts["ds_world"] = tb // (mb * ga)


def _read_ds_precision(cfg: dict, f: Found, where: str) -> None:
    """``bf16``/``fp16`` blocks ('auto' follows the Trainer), and BF16 master weights."""
    bf16_block = cfg.get("bf16") or cfg.get("bfloat16") or {}
    bf16 = bf16_block.get("enabled")
    fp16 = (cfg.get("fp16") or {}).get("enabled")
    if "precision" not in f.values or bf16 is not None or fp16 is not None:
        if bf16 == "auto" or fp16 == "auto":
            f.notes.append(f"{where}: bf16/fp16 'auto' follows the Trainer's arguments")
        else:
            read_precision(f, bf16 or None, fp16 or None, where, "DeepSpeed")
    if bf16_block.get("bf16_master_weights_and_grads"):
        bf16_block.get("bf16_optimizer_states")
        f.set("precision", "bf16", where + ".bf16.bf16_master_weights_and_grads")


def _read_ds_offload(zero: dict, stage: Any, f: Found, where: str) -> None:
    """ZeRO's optimizer and parameter offload (CPU or NVMe) as one of the planner's offload modes."""
    dev_opt, dev_par = (str((zero.get(block) or {}).get("device", DS_NO_OFFLOAD)).lower()
                        for block in DS_OFFLOAD_BLOCKS)
    off_opt, off_par = dev_opt in DS_OFFLOAD_DEVICES, dev_par in DS_OFFLOAD_DEVICES
    if off_par and stage != 3:
        f.notes.append(f"{where}.zero_optimization.offload_param: applies to ZeRO-3 only; stage "
                       f"{stage} keeps the parameters on the GPU")
        off_par = False
    offload = DS_OFFLOAD_MODE_OF.get((off_opt, off_par))
    if offload is None:
        offload = "none"
        f.warn(where + ".zero_optimization.offload_param", "parameters offloaded with the optimizer "
               "states left on the GPU: the planner has no parameter-only offload; read as no "
               "offload (its figure counts the parameter shard on the GPU, so errs high)")
    f.set("offload", offload, where + ".zero_optimization.offload_*")
    if DS_OFFLOAD_NVME in (dev_opt, dev_par) and offload != "none":
        f.notes.append(f"{where}.zero_optimization: NVMe offload read as host offload (off the GPU "
                       "either way; host RAM figures overstate it)")
    ratio = (zero.get("offload_optimizer") or {}).get("ratio")
    if ratio is not None and ratio != 1:
        f.warn(where + ".zero_optimization.offload_optimizer.ratio", f"{ratio}: partial optimizer "
               "offload (ZeRO-Offload++) is not modelled; read as full offload (errs low)")
