"""transformers' TrainingArguments (v4 and v5 names), which TRL's and LLaMA-Factory's files build on:
batch, evaluation, precision, checkpointing, the Trainer's optimizer names, and its sharding (a
DeepSpeed config, inline or named, or the ``fsdp`` options and ``fsdp_config``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.core.codes import FSDP_HYBRID, FSDP_STRATEGY_STAGE
from planner.launch.importers.common import bad_optimizer, config_path, is_int, is_true, read_precision
from planner.launch.importers.deepspeed import read_deepspeed
from planner.launch.importers.found import Found

HF_OPTIM = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "adamw_apex_fused": "adamw",
    "adamw_torch_xla": "adamw", "adamw_torch_npu_fused": "adamw", "adamw": "adamw", "adam": "adamw",
    "adamw_bnb_8bit": "adam8bit", "adamw_8bit": "adam8bit",
    "adam8bit": "adam8bit", "paged_adamw_8bit": "paged_adamw8bit", "paged_adam_8bit": "paged_adamw8bit",
    "sgd": "sgd", "paged_adamw_32bit": "adamw", "paged_adamw": "adamw", "adafactor": "adafactor",
    "lion_32bit": "lion", "paged_lion_32bit": "lion",
}
#: bitsandbytes' 32-bit paged AdamW: FP32 states in CUDA unified memory (Recipe.optimizer_paged).
HF_PAGED_32 = {"paged_adamw_32bit", "paged_adamw", "paged_lion_32bit"}
#: How the Trainer's optimizers step where it is not torch's foreach (Recipe.optimizer_step):
#: the fused kernels hold no list-wide copy; transformers' own AdamW steps one tensor at a time.
HF_OPTIM_STEP = {"adamw_torch_fused": "fused", "adamw_apex_fused": "fused",
                 "adamw_torch_npu_fused": "fused", "adamw_hf": "for_loop"}
#: transformers TrainingArguments (v4 and v5 names).
HF_IGNORED = (
    "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict", "eval_strategy",
    "evaluation_strategy", "prediction_loss_only", "per_device_eval_batch_size", "per_gpu_eval_batch_size",
    "eval_accumulation_steps", "eval_delay", "eval_steps", "eval_on_start", "eval_do_concat_batches",
    "eval_use_gather_object", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
    "max_grad_norm", "num_train_epochs", "max_steps", "lr_scheduler_type", "lr_scheduler_kwargs",
    "warmup_ratio", "warmup_steps", "log_level", "log_level_replica", "log_on_each_node", "logging_*",
    "save_*", "seed", "data_seed", "local_rank", "ddp_*", "dataloader_*", "run_name", "disable_tqdm",
    "remove_unused_columns", "label_names", "load_best_model_at_end", "metric_for_best_model",
    "greater_is_better", "ignore_data_skip", "report_to", "push_to_hub", "hub_*", "resume_from_checkpoint",
    "include_*", "group_by_length", "length_column_name", "label_smoothing_factor", "neftune_noise_alpha",
    "tf32", "full_determinism", "optim_args", "project", "trackio_*", "skip_memory_metrics",
    "average_tokens_across_devices", "batch_eval_metrics", "bf16_full_eval", "fp16_full_eval", "debug",
    "accelerator_config", "restore_callback_states_from_checkpoint", "train_sampling_strategy",
    "enable_jit_checkpoint", "fp16_opt_level", "fp16_backend", "half_precision_backend", "use_cpu",
    "no_cuda", "use_mps_device", "past_index", "tpu_*", "push_to_hub_*", "mp_parameters", "jit_mode_eval", "use_ipex", "ray_scope", "gradient_checkpointing_kwargs.use_reentrant",
    "activation_checkpointing_kwargs.use_reentrant", "hub_model_revision", "use_legacy_prediction_loop",
    "torchdynamo", "split_batches", "dispatch_batches", "sortish_sampler", "predict_with_generate",
    "generation_max_length", "generation_num_beams", "generation_config", "label_smoothing",
    "fsdp_config.min_num_params", "fsdp_config.transformer_layer_cls_to_wrap", "fsdp_config.sync_module_states",
    "fsdp_config.cpu_ram_efficient_loading", "fsdp_config.state_dict_type", "fsdp_config.xla*",
    "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params", "optim_target_modules", "use_cache",
    "dataloader_num_workers", "wandb_*", "callbacks", "benchmarks", "system_prompt", "chat_template*",
)
HF_TUNING = (
    "torch_empty_cache_steps", "torch_compile_backend", "torch_compile_mode",
    "fsdp_config.backward_prefetch", "fsdp_config.forward_prefetch", "fsdp_config.limit_all_gathers",
    "fsdp_config.use_orig_params", "fsdp_config.activation_cpu_offload", "fsdp_config.offload_params_pin_memory",
)


def read_training_args(cfg: dict, f: Found, where: str, base: Path, load, *,
                       tool: str = "TrainingArguments") -> None:
    """transformers' TrainingArguments, and the TRL and LLaMA-Factory files built on them
    (``tool`` picks the defaults: TRL checkpoints and uses BF16 unless told otherwise)."""
    trl = tool == "TRL"
    f.take(cfg, "per_device_train_batch_size", "micro_batch", 8, where, tool)
    f.take(cfg, "gradient_accumulation_steps", "grad_accum", 1, where, tool)
    _read_hf_eval(cfg, f, where, tool)
    read_precision(f, cfg.get("bf16"), cfg.get("fp16"), where, tool, default="mixed" if trl else "fp32")
    if tool != "LLaMA-Factory":
        read_hf_checkpointing(cfg, f, where, tool, default=trl)
    optim = str(cfg.get("optim", "adamw_torch_fused"))
    if optim not in HF_OPTIM:
        bad_optimizer(f, where + ".optim", optim, "one of " + ", ".join(sorted(set(HF_OPTIM))))
    elif "optim" in cfg:
        set_hf_optimizer(f, optim, where + ".optim")
    else:
        f.default("optimizer", "adamw", where + ".optim", tool)
    for key in ("max_seq_length", "max_length", "model_max_length"):
        if is_int(cfg.get(key)):
            f.set("seq_len", cfg[key], f"{where}.{key}")
    if is_int(cfg.get("tp_size")) and cfg["tp_size"] > 1:
        f.set("tp", cfg["tp_size"], where + ".tp_size")
    if is_true(cfg.get("adafactor")):
        bad_optimizer(f, where + ".adafactor", "adafactor", "AdamW, 8-bit AdamW, paged 8-bit AdamW or SGD")
    if is_true(cfg.get("auto_find_batch_size")):
        f.warn(where + ".auto_find_batch_size", "the Trainer halves the batch at run time until it "
               "fits; the estimate is for the batch as written")
    if is_true(cfg.get("torch_compile")):
        f.set("compile", True, where + ".torch_compile")
    if is_true(cfg.get("use_liger_kernel")):
        liger = cfg.get("liger_kernel_config") or {}
        fused = liger.get("fused_linear_cross_entropy", True)
        f.set("loss", "fused" if is_true(fused) else "standard", where + ".use_liger_kernel")
        # apply_liger_kernel_to_* patches the RMSNorm, rotary and SwiGLU (GeGLU for Gemma) unless
        # the config says no
        if all(is_true(liger.get(k, True)) for k in ("rms_norm", "rope", "swiglu", "geglu")):
            f.set("kernels", "liger", where + ".use_liger_kernel")
        elif is_true(liger.get("rms_norm", True)):
            f.set("kernels", "fused_rmsnorm", where + ".use_liger_kernel")
    if is_true(cfg.get("activation_offloading")):
        f.set("activation_offload", True, where + ".activation_offloading")
    ds = cfg.get("deepspeed")
    fsdp = cfg.get("fsdp")
    if isinstance(ds, dict):
        read_deepspeed(ds, f, where + ".deepspeed")
    elif isinstance(ds, str) and ds:
        load(config_path(ds, base, f, where + ".deepspeed"), f, "deepspeed")
    elif fsdp:
        read_hf_fsdp(fsdp, cfg.get("fsdp_config") or {}, f, where)
    else:
        f.set("zero", 0, where + " (no deepspeed or fsdp)")
        f.set("offload", "none", where + " (no deepspeed or fsdp)")


def read_hf_checkpointing(cfg: dict, f: Found, where: str, tool: str, default: bool) -> None:
    """``activation_checkpointing`` (transformers 5) or its deprecated alias ``gradient_checkpointing``,
    with their ``*_kwargs`` (``every_n_layers``, ``offload``)."""
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        if cfg.get(name) is not None:
            f.set("checkpointing", "full" if is_true(cfg[name]) else "none", f"{where}.{name}")
            break
    else:
        f.default("checkpointing", "full" if default else "none", where + ".gradient_checkpointing", tool)
    for name in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
        kw = cfg.get(name)
        if not isinstance(kw, dict):
            continue
        every = kw.get("every_n_layers")
        if is_int(every) and every > 1 and f.values.get("checkpointing") == "full":
            f.warn(f"{where}.{name}.every_n_layers", f"{every}: checkpointing one layer in {every} is "
                   "not modelled; read as every layer checkpointed (errs low)")
        if is_true(kw.get("offload")):
            f.set("activation_offload", True, f"{where}.{name}.offload")


def _read_hf_eval(cfg: dict, f: Found, where: str, tool: str) -> None:
    """Evaluation during training (``eval_strategy``, v4's ``evaluation_strategy``, ``do_eval``;
    LLaMA-Factory's ``val_size`` or ``eval_dataset``) at ``per_device_eval_batch_size``, the
    Trainer's 8 unless set: the workload's ``eval_micro_batch``."""
    strategy = cfg.get("eval_strategy", cfg.get("evaluation_strategy"))
    evaluates = strategy is not None and str(strategy).lower().rsplit(".", 1)[-1] != "no"
    evaluates |= is_true(cfg.get("do_eval"))
    if tool == "LLaMA-Factory":
        val = cfg.get("val_size")
        evaluates |= (isinstance(val, (int, float)) and val > 0) or bool(cfg.get("eval_dataset"))
    if evaluates:
        f.take(cfg, "per_device_eval_batch_size", "eval_micro_batch", 8, where, tool)


def set_hf_optimizer(f: Found, optim: str, where: str) -> None:
    """What a Trainer optimizer name (``HF_OPTIM``) selects: the optimizer, whether its states
    are paged, and how it steps where that is not torch's foreach."""
    f.set("optimizer", HF_OPTIM[optim], where)
    if optim in HF_PAGED_32:
        f.set("optimizer_paged", True, where)
    if optim in HF_OPTIM_STEP:
        f.set("optimizer_step", HF_OPTIM_STEP[optim], where)


def read_hf_fsdp(fsdp: Any, fc: dict, f: Found, where: str, version: Any = None) -> None:
    """The Trainer's ``fsdp`` options (``full_shard auto_wrap offload``) and its ``fsdp_config``
    (keys with or without the ``fsdp_`` prefix, as transformers and axolotl accept them)."""
    f.facts["fsdp"] = where

    def get(name: str, default: Any = None) -> Any:
        for key in (name, "fsdp_" + name):
            if dict.__contains__(fc, key):
                return fc.get(key)
        return default

    opts = fsdp.split() if isinstance(fsdp, str) else (["full_shard"] if fsdp is True else list(fsdp))
    stage = 3 if "full_shard" in opts or "hybrid_shard" in opts else (2 if "shard_grad_op" in opts else 0)
    strategy = get("sharding_strategy")
    if strategy is not None and str(strategy).upper() in FSDP_STRATEGY_STAGE:
        stage = FSDP_STRATEGY_STAGE[str(strategy).upper()]
        if str(strategy).upper() in FSDP_HYBRID:
            opts = [*opts, "hybrid_shard"]
    version = get("version", 1) if version is None else version
    if str(version) == "2":
        f.set("fsdp_version", 2, where + ".fsdp_config.fsdp_version")
        reshard = get("reshard_after_forward")
        if reshard is not None:
            stage = 3 if is_true(reshard) else 2
    f.set("zero", stage, where + ".fsdp")
    off = "offload" in opts or is_true(get("offload_params")) or is_true(get("cpu_offload"))
    f.set("offload", ("optimizer+params" if stage == 3 else "optimizer") if off else "none", where + ".fsdp")
    if "hybrid_shard" in opts:
        f.warn(where + ".fsdp", "hybrid_shard shards within a node only; the planner shards over all "
               "data-parallel GPUs (errs low)")
    if is_true(get("activation_checkpointing")):
        f.set("checkpointing", "full", where + ".fsdp_config.activation_checkpointing")
