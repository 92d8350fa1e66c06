"""accelerate's config YAML: mixed precision, processes, compile, its parallelism sizes, and the
sharding back-end it launches (FSDP's strategy or FSDP2's reshard, or the DeepSpeed config it names
or holds inline)."""

from __future__ import annotations

from pathlib import Path

from planner.core.codes import DS_NO_OFFLOAD, DS_OFFLOAD_BLOCKS, FSDP_HYBRID, FSDP_STRATEGY_STAGE
from planner.launch.importers.common import config_path, count, is_int, is_true
from planner.launch.importers.deepspeed import read_deepspeed
from planner.launch.importers.found import Found
from planner.launch.importers.hf_model import read_attention

#: accelerate config YAML.
ACC_IGNORED = (
    "compute_environment", "debug", "machine_rank", "main_training_function", "rdzv_backend",
    "same_network", "tpu_*", "use_cpu", "downcast_bf16", "enable_cpu_affinity", "gpu_ids",
    "main_process_ip", "main_process_port", "num_machines", "deepspeed_config.deepspeed_multinode_launcher",
    "deepspeed_config.zero3_save_16bit_model", "deepspeed_config.deepspeed_hostfile",
    "deepspeed_config.deepspeed_exclusion_filter", "deepspeed_config.deepspeed_inclusion_filter",
    "fsdp_config.fsdp_state_dict_type", "fsdp_config.fsdp_sync_module_states",
    "fsdp_config.fsdp_cpu_ram_efficient_loading", "fsdp_config.fsdp_auto_wrap_policy",
    "fsdp_config.fsdp_transformer_layer_cls_to_wrap", "fsdp_config.fsdp_min_num_params",
    "megatron_lm_config", "ipex_config", "mpirun_config", "fp8_config.*_format", "fp8_config.amax_*",
    "fp8_config.fp8_format", "fp8_config.margin", "fp8_config.interval", "fp8_config.override_linear_precision",
    "fp8_config.use_autocast_during_eval", "fp8_config.backend",
    "deepspeed_config.seq_parallel_communication_data_type", "parallelism_config.parallelism_config_sp_backend",
    "parallelism_config.parallelism_config_sp_seq_length_is_variable",
)
ACC_TUNING = (
    "deepspeed_config.zero3_init_flag", "fsdp_config.fsdp_backward_prefetch*", "fsdp_config.fsdp_forward_prefetch",
    "fsdp_config.fsdp_use_orig_params", "fsdp_config.fsdp_offload_params_pin_memory", "dynamo_config.*",
)


def read_accelerate(cfg: dict, f: Found, where: str, base: Path, load) -> None:
    mp = str(cfg.get("mixed_precision", "no"))
    precision = {"bf16": "mixed", "fp16": "fp16", "fp8": "mixed"}.get(mp, "fp32")
    if cfg.get("mixed_precision") is None:  # the Trainer's bf16/fp16 decide when accelerate's is unset
        f.default("precision", precision, where + ".mixed_precision", "accelerate")
    else:
        f.set("precision", precision, where + ".mixed_precision")
    if mp in ("bf16", "fp8"):
        f.facts["asks_bf16"] = where + ".mixed_precision"
    if mp == "fp8":
        f.set("fp8", True, where + ".mixed_precision")
    processes = count(cfg, "num_processes", f, where)
    if processes is not None:
        f.set("gpus", processes, where + ".num_processes")
    if str(cfg.get("dynamo_config", {}).get("dynamo_backend", "NO")).upper() not in ("NO", "NONE"):
        f.set("compile", True, where + ".dynamo_config.dynamo_backend")
    _read_acc_parallelism(cfg.get("parallelism_config") or {}, f, where)
    kind = str(cfg.get("distributed_type", "NO")).upper()
    if kind == "FSDP":
        _read_acc_fsdp(cfg, f, where)
    elif kind == "DEEPSPEED":
        dc = cfg.get("deepspeed_config") or {}
        if dc.get("deepspeed_config_file"):
            load(config_path(dc["deepspeed_config_file"], base, f, where + ".deepspeed_config"), f, "deepspeed")
        else:
            # accelerate names each offload block's device <block>_device
            read_deepspeed({"zero_optimization": {
                "stage": dc.get("zero_stage", 0),
                **{block: {"device": dc.get(f"{block}_device", DS_NO_OFFLOAD)} for block in DS_OFFLOAD_BLOCKS}},
                "gradient_accumulation_steps": dc.get("gradient_accumulation_steps"),
                "bf16": {"enabled": mp == "bf16"}, "fp16": {"enabled": mp == "fp16"}}, f, where + ".deepspeed_config")
    else:
        f.set("zero", 0, where + ".distributed_type")
        f.set("offload", "none", where + ".distributed_type")


def _read_acc_parallelism(par: dict, f: Found, where: str) -> None:
    """``parallelism_config``: tensor, context and (Ulysses) sequence parallel sizes, the attention of
    sequence parallelism, and HSDP's replicas (warned about)."""
    for key, name in (("parallelism_config_tp_size", "tp"), ("parallelism_config_cp_size", "cp")):
        if is_int(par.get(key)) and par[key] > 1:
            f.set(name, par[key], f"{where}.parallelism_config.{key}")
    if is_int(par.get("parallelism_config_sp_size")) and par["parallelism_config_sp_size"] > 1:
        f.set("cp", par["parallelism_config_sp_size"], where + ".parallelism_config.parallelism_config_sp_size")
        f.notes.append(f"{where}.parallelism_config.parallelism_config_sp_size: Ulysses sequence "
                       "parallelism read as the planner's context parallelism (the sequence split over GPUs)")
    if isinstance(par, dict) and dict.__contains__(par, "parallelism_config_sp_attn_implementation"):
        read_attention(par, f, where + ".parallelism_config", "parallelism_config_sp_attn_implementation")
    for key in ("parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size"):
        if is_int(par.get(key)) and par[key] > 1 and key.endswith("replicate_size"):
            f.warn(f"{where}.parallelism_config.{key}", "HSDP (replicas of a sharded group): the "
                   "planner shards over all data-parallel GPUs (errs low)")


def _read_acc_fsdp(cfg: dict, f: Found, where: str) -> None:
    """``fsdp_config``: the ZeRO stage its version and sharding strategy (or FSDP2's reshard) give,
    parameter offload, and activation checkpointing."""
    f.facts["fsdp"] = where
    fc = cfg.get("fsdp_config") or {}
    version = fc.get("fsdp_version", 1)
    if str(version) == "2":
        f.set("fsdp_version", 2, where + ".fsdp_config.fsdp_version")
        reshard = fc.get("fsdp_reshard_after_forward", True)
        stage = 3 if reshard in (True, "FULL_SHARD") or str(reshard).lower() == "true" else 2
        f.set("zero", stage, where + ".fsdp_config.fsdp_reshard_after_forward")
    else:
        stage = FSDP_STRATEGY_STAGE.get(str(fc.get("fsdp_sharding_strategy", "FULL_SHARD")).upper(), 3)
        f.set("zero", stage, where + ".fsdp_config.fsdp_sharding_strategy")
        if str(fc.get("fsdp_sharding_strategy", "")).upper() in FSDP_HYBRID:
            f.warn(where + ".fsdp_config.fsdp_sharding_strategy", "hybrid sharding shards within a "
                   "node only; the planner shards over all data-parallel GPUs (errs low)")
    off = is_true(fc.get("fsdp_offload_params", False))
    f.set("offload", ("optimizer+params" if stage == 3 else "optimizer") if off else "none",
          where + ".fsdp_config.fsdp_offload_params")
    f.set("checkpointing", "full" if is_true(fc.get("fsdp_activation_checkpointing")) else "none",
          where + ".fsdp_config.fsdp_activation_checkpointing")
