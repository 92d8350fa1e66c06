"""Readers of the configs people already have: each fills a :class:`Found` with flat scenario keys.

A value the config sets is read as set. A value the consuming tool defaults when it is absent is
read as that default, with a note saying so. A value the tool does not hold at all (DeepSpeed has
no sequence length) is left out, so that the caller can report it as missing.

Every key of a config is accounted for: read into the scenario, passed over with a note (the
keys that leave memory per GPU alone: learning rates, data, logging; and the tuning knobs the
planner does not model), or warned about (a key the planner does not know, or one it knows and
cannot represent, such as ``modules_to_save``). Nothing is dropped silently.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from planner.core.codes import FSDP_HYBRID, FSDP_STRATEGY_STAGE
from planner.core.errors import clip
from planner.core.textfiles import is_file
from planner.launch.common import PEFT_MODULES

#: Why a key was passed over, by category (the words of the note).
PASSED_OVER = {
    "ignored": "not read, no bearing on memory per GPU",
    "tuning": "not read, tuning whose effect on memory the planner does not model",
}


@dataclass
class Found:
    """Flat scenario keys read from configs, where each came from, notes, warnings and problems."""

    values: dict[str, Any] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: What the planner cannot represent or does not know, each naming the key.
    warnings: list[str] = field(default_factory=list)
    #: Raw facts the checks need (the config's own words: bf16 asked, FA2 asked, TP…).
    facts: dict[str, Any] = field(default_factory=dict)
    #: Per config file: its keys (dotted paths) by what became of them: read, ignored, tuning,
    #: unknown (see :func:`account`).
    keys: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def set(self, key: str, value: Any, where: str) -> None:
        self.values[key] = value
        self.where[key] = where

    def default(self, key: str, value: Any, where: str, tool: str) -> None:
        if key not in self.values:
            self.set(key, value, where)
            self.notes.append(f"{where}: not set; {tool}'s default {value!r} applies")

    def take(self, cfg: dict, cfg_key: str, key: str, default: Any, where: str, tool: str) -> None:
        """``cfg[cfg_key]`` as ``key``; the tool's ``default`` (noted) when the config leaves it out."""
        if cfg.get(cfg_key) is not None:
            self.set(key, cfg[cfg_key], f"{where}.{cfg_key}")
        else:
            self.default(key, default, f"{where}.{cfg_key}", tool)

    def warn(self, where: str, message: str) -> None:
        line = f"{where}: {message}"
        if line not in self.warnings:
            self.warnings.append(line)

    def read(self) -> list[dict[str, Any]]:
        """What was read, key by key, with the config key it came from (for reports)."""
        return [{"key": k, "value": v, "from": self.where.get(k, "")} for k, v in self.values.items()]


class Tracked(dict):
    """A config mapping that records which of its keys a reader consulted (dotted paths)."""

    def __init__(self, data: dict, used: set[str], prefix: str = "", last: list | None = None) -> None:
        super().__init__(data)
        self._used = used
        self._prefix = prefix
        #: the last key read and its value, shared by the whole config: where a reader fails on a
        #: value of the wrong kind (a list where the tool takes a mapping), that is the key to name
        self.last: list = [None, None] if last is None else last

    def _wrap(self, key: Any, value: Any) -> Any:
        self.last[:] = [f"{self._prefix}{key}", value]
        if isinstance(value, dict) and not isinstance(value, Tracked):
            return Tracked(value, self._used, f"{self._prefix}{key}.", self.last)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        self._used.add(f"{self._prefix}{key}")
        return self._wrap(key, super().__getitem__(key)) if dict.__contains__(self, key) else default

    def __getitem__(self, key: Any) -> Any:
        self._used.add(f"{self._prefix}{key}")
        return self._wrap(key, super().__getitem__(key))

    def wrong_kind(self) -> str:
        """The last key read, with the kind of value it held (for a reader that failed on it)."""
        key, value = self.last
        kind = {dict: "a mapping", list: "a list", str: "text", bool: "true/false", int: "a number",
                float: "a number", type(None): "empty"}.get(type(value), type(value).__name__)
        return f"{key}: {kind} ({clip(repr(value), 60)}) is not what the tool takes here" if key \
            else "the top level is not what the tool takes"

    def __contains__(self, key: object) -> bool:
        self._used.add(f"{self._prefix}{key}")
        return super().__contains__(key)

    def whole(self, key: str) -> Any:
        """``key`` and everything under it, read as one value."""
        self._used.add(f"{self._prefix}{key}")
        self._used.add(f"{self._prefix}{key}.*")
        return dict.get(self, key)


def _leaves(data: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, path + ".")
        else:
            yield path, value


def _ancestors(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _matches(path: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(p, pat) for p in _ancestors(path) for pat in patterns)


def account(data: dict, used: set[str], where: str, f: Found, ignored: Iterable[str] = (),
            tuning: Iterable[str] = ()) -> None:
    """Sort every key of ``data`` (a config as loaded) into read, ignored, tuning or unknown;
    note the passed-over ones and warn about the unknown ones, by name."""
    sorted_keys: dict[str, list[str]] = {"read": [], "ignored": [], "tuning": [], "unknown": []}
    for path, value in _leaves(data):
        if path in used or any(a + ".*" in used for a in _ancestors(path)[1:]):
            sorted_keys["read"].append(path)
        elif value is None or value == "" or value == [] or value == {}:
            sorted_keys["ignored"].append(path)  # unset: the tool's default, as if absent
        elif _matches(path, ignored):
            sorted_keys["ignored"].append(path)
        elif _matches(path, tuning):
            sorted_keys["tuning"].append(path)
        else:
            sorted_keys["unknown"].append(path)
    f.keys[where] = sorted_keys
    for kind in ("ignored", "tuning"):
        if sorted_keys[kind]:
            f.notes.append(f"{where}: {PASSED_OVER[kind]}: {_brief(sorted_keys[kind], data)}")
    if sorted_keys["unknown"]:
        f.warn(where, f"{_brief(sorted_keys['unknown'], data)}: not known to the planner and not read; "
                      "what they change in memory is not in the estimate")


def _brief(paths: list[str], data: dict) -> str:
    """The keys, a section named once (``profiler.*``) when all its keys are among them."""
    out: list[str] = []
    for path in paths:
        top = path.split(".")[0]
        section = data.get(top)
        if "." in path and isinstance(section, dict) and all(
                p in paths for p, _ in _leaves(section, top + ".")):
            if top + ".*" not in out:
                out.append(top + ".*")
        else:
            out.append(path)
    return ", ".join(out)


HF_OPTIM = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "adamw_apex_fused": "adamw",
    "adamw_torch_xla": "adamw", "adamw_torch_npu_fused": "adamw", "adamw": "adamw", "adam": "adamw",
    "adamw_bnb_8bit": "adam8bit", "adamw_8bit": "adam8bit",
    "adam8bit": "adam8bit", "paged_adamw_8bit": "paged_adamw8bit", "paged_adam_8bit": "paged_adamw8bit",
    "sgd": "sgd", "paged_adamw_32bit": "adamw", "paged_adamw": "adamw",
}
#: bitsandbytes' 32-bit paged AdamW: FP32 states in CUDA unified memory (Workload.optimizer_paged).
HF_PAGED_32 = {"paged_adamw_32bit", "paged_adamw"}
#: How the Trainer's optimizers step where it is not torch's foreach (Workload.optimizer_step):
#: the fused kernels hold no list-wide copy; transformers' own AdamW steps one tensor at a time.
HF_OPTIM_STEP = {"adamw_torch_fused": "fused", "adamw_apex_fused": "fused",
                 "adamw_torch_npu_fused": "fused", "adamw_hf": "for_loop"}
DS_OPTIM = {"adam": "adamw", "adamw": "adamw", "fusedadam": "adamw", "cpuadam": "adamw", "sgd": "sgd"}
PEFT_TARGETS = {v: k for k, v in PEFT_MODULES.items()} | {"output_proj": "o", "lm_head": "lm_head"}
#: Fused projections some architectures have (Phi-3): one name, several of the planner's targets.
PEFT_FUSED = {"qkv_proj": ("q", "k", "v"), "gate_up_proj": ("gate", "up")}
TARGET_ORDER = ["q", "k", "v", "o", "gate", "up", "down", "lm_head"]

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
    "zero_optimization.reduce_bucket_size", "zero_optimization.allgather_bucket_size",
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
#: TRL's own arguments (SFT/DPO configs, ModelConfig, ScriptArguments) and alignment-handbook's.
TRL_IGNORED = (
    "model_revision", "trust_remote_code", "dataset_*", "chat_template_path", "eos_token", "pad_token",
    "packing", "packing_strategy", "padding_free", "pad_to_multiple_of", "completion_only_loss",
    "assistant_only_loss", "shuffle_dataset", "truncation_mode", "eval_packing", "lora_task_type",
    "use_rslora", "router_aux_loss_coef", "preprocessing_num_workers", "auto_insert_empty_system_msg",
    "push_to_hub_revision", "disable_dropout", "model_init_kwargs.trust_remote_code",
    "model_init_kwargs.revision", "model_init_kwargs.use_cache", "model_init_kwargs.device_map",
    "generate_during_eval", "tokenizer_name_or_path", "ignore_bias_buffers", "use_fast_tokenizer",
)
#: LLaMA-Factory's own arguments.
LF_IGNORED = (
    "template", "dataset", "eval_dataset", "dataset_dir", "max_samples", "overwrite_cache",
    "preprocessing_num_workers", "preprocessing_batch_size", "plot_loss", "val_size", "trust_remote_code",
    "tokenized_path", "streaming", "buffer_size", "mix_strategy", "interleave_probs", "train_on_prompt",
    "mask_history", "ignore_pad_token_for_loss", "tool_format", "default_system", "enable_thinking",
    "media_dir", "image_*", "video_*", "audio_*", "loraplus_lr_ratio", "loraplus_lr_embedding",
    "use_rslora", "resize_vocab", "use_fast_tokenizer", "cache_dir", "*_hub_token", "export_*",
    "infer_backend", "vllm_*", "sglang_*", "swanlab_*", "use_swanlab", "print_param_status",
    "include_effective_tokens_per_second", "compute_accuracy", "packing", "neat_packing",
    "overwrite_output_dir", "low_cpu_mem_usage", "model_revision", "split_special_tokens",
    "add_tokens", "add_special_tokens", "new_special_tokens_config", "init_special_tokens",
    "eval_num_beams", "eval_on_each_dataset", "data_shared_file_system", "disable_shuffling",
    "early_stopping_steps", "ray_*", "master_addr", "master_port", "create_new_adapter",
    "adapter_name_or_path", "adapter_folder", "pissa_iter", "pissa_convert", "preserve_thinking",
    "freeze_vision_tower", "freeze_multi_modal_projector", "freeze_language_model", "rope_scaling",
    "do_sample", "temperature", "top_p", "top_k", "max_new_tokens", "repetition_penalty",
    "length_penalty", "skip_special_tokens", "enable_torch_profiler", "profiler_*", "kt_*",
)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def whole(v: Any) -> int | None:
    """A count as the tools read it: an int, a float with no fraction (``4096.0``, ``1e9``) or a
    string of one (``"4096"``, YAML's ``1e9``, which PyYAML reads as a string); else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            return None
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def count(cfg: dict, key: str, f: Found, where: str, *, auto: bool = False) -> int | None:
    """``cfg[key]`` as a count (:func:`whole`); None when absent (or ``"auto"`` where the tool
    fills it in); a present value that is no whole number is a problem naming the key, never
    "not set"."""
    value = cfg.get(key)
    if value is None or (auto and str(value).lower() == "auto"):
        return None
    n = whole(value)
    if n is None:
        f.problems.append(f"{where}.{key}: {str(value)[:40]!r} is not a whole number")
    return n


def _true(v: Any) -> bool:
    return v is True or str(v).lower() == "true"


def _precision(f: Found, bf16: Any, fp16: Any, where: str, tool: str, *,
               default: str = "fp32") -> None:
    if bf16 in (True, "auto") or str(bf16).lower() == "true":
        f.set("precision", "mixed", where + ".bf16")
        f.facts["asks_bf16"] = where + ".bf16"
        if bf16 == "auto":
            f.notes.append(f"{where}.bf16: 'auto' read as BF16 mixed precision")
    elif fp16 in (True, "auto") or str(fp16).lower() == "true":
        f.set("precision", "fp16", where + ".fp16")
    elif bf16 is None and fp16 is None:
        f.default("precision", default, where + ".bf16/fp16", tool)
        if default == "mixed":
            f.facts["asks_bf16"] = where + ".bf16"
    else:
        f.set("precision", "fp32", where + ".bf16/fp16")


def config_path(name: str, base: Path, f: Found, where: str) -> Path:
    """A file another config names (``deepspeed: ds.json``): a relative path is read from the
    working directory, as the training tool (run from there) reads it; if it is only found beside
    the naming config, that one is read and the difference said."""
    path = Path(name).expanduser()
    if path.is_absolute() or is_file(path):
        return path
    beside = base / path
    if is_file(beside):
        f.warn(where, f"{name} is not in the working directory ({Path.cwd()}), where the training "
                      f"tool looks for it; read {beside} beside the config instead")
        return beside
    return path


def bad_optimizer(f: Found, where: str, name: Any, choices: str) -> None:
    """An optimizer without a memory rule: an error only if no ``--optimizer`` replaces it."""
    f.facts["optimizer_unread"] = f"{where}: {name!r} has no memory rule in planner ({choices})"
    f.warn(where, f"{name!r} has no memory rule in planner ({choices}); give --optimizer")


def read_deepspeed(cfg: dict, f: Found, where: str) -> None:
    f.facts["deepspeed"] = where
    _read_ds_batch(cfg, f, where)
    _read_ds_precision(cfg, f, where)
    zero = cfg.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if _is_int(stage):
        f.set("zero", stage, where + ".zero_optimization.stage")
        if stage in (1, 2, 3):
            f.set("zero_impl", "deepspeed", where + ".zero_optimization.stage")
        if "stage" not in zero:
            f.notes.append(f"{where}.zero_optimization.stage: not set; DeepSpeed's default 0 applies")
    _read_ds_offload(zero, stage, f, where)
    opt = (cfg.get("optimizer") or {}).get("type")
    if opt is not None:
        name = DS_OPTIM.get(str(opt).lower())
        if name is None:
            bad_optimizer(f, where + ".optimizer.type", opt, "AdamW, Adam or SGD")
        else:
            f.set("optimizer", name, where + ".optimizer.type")
    autotp = (cfg.get("tensor_parallel") or {}).get("autotp_size")
    if _is_int(autotp) and autotp > 1:
        f.set("tp", autotp, where + ".tensor_parallel.autotp_size")
    if _is_int(cfg.get("sequence_parallel_size")) and cfg["sequence_parallel_size"] > 1:
        f.set("cp", cfg["sequence_parallel_size"], where + ".sequence_parallel_size")


def _read_ds_batch(cfg: dict, f: Found, where: str) -> None:
    """Micro batch and gradient accumulation; the world size ``train_batch_size`` implies with them."""
    mb, ga, tb = (count(cfg, k, f, where, auto=True) for k in ("train_micro_batch_size_per_gpu",
                                                             "gradient_accumulation_steps", "train_batch_size"))
    if _is_int(mb):
        f.set("micro_batch", mb, where + ".train_micro_batch_size_per_gpu")
    if _is_int(ga):
        f.set("grad_accum", ga, where + ".gradient_accumulation_steps")
    if _is_int(tb):
        f.facts["train_batch_size"] = (tb, where + ".train_batch_size")
        if _is_int(mb) and _is_int(ga) and tb % (mb * ga) == 0:
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
            _precision(f, bf16 or None, fp16 or None, where, "DeepSpeed")
    if bf16_block.get("bf16_master_weights_and_grads"):
        bf16_block.get("bf16_optimizer_states")
        f.set("precision", "bf16", where + ".bf16.bf16_master_weights_and_grads")


def _read_ds_offload(zero: dict, stage: Any, f: Found, where: str) -> None:
    """ZeRO's optimizer and parameter offload (CPU or NVMe) as one of the planner's offload modes."""
    dev_opt = str((zero.get("offload_optimizer") or {}).get("device", "none")).lower()
    dev_par = str((zero.get("offload_param") or {}).get("device", "none")).lower()
    off_opt, off_par = dev_opt in ("cpu", "nvme"), dev_par in ("cpu", "nvme")
    if off_par and stage != 3:
        f.notes.append(f"{where}.zero_optimization.offload_param: applies to ZeRO-3 only; stage "
                       f"{stage} keeps the parameters on the GPU")
        off_par = False
    if off_opt and off_par:
        offload = "optimizer+params"
    elif off_opt:
        offload = "optimizer"
    else:
        offload = "none"
        if off_par:
            f.warn(where + ".zero_optimization.offload_param", "parameters offloaded with the optimizer "
                   "states left on the GPU: the planner has no parameter-only offload; read as no "
                   "offload (its figure counts the parameter shard on the GPU, so errs high)")
    f.set("offload", offload, where + ".zero_optimization.offload_*")
    if "nvme" in (dev_opt, dev_par) and offload != "none":
        f.notes.append(f"{where}.zero_optimization: NVMe offload read as host offload (off the GPU "
                       "either way; host RAM figures overstate it)")
    ratio = (zero.get("offload_optimizer") or {}).get("ratio")
    if ratio is not None and ratio != 1:
        f.warn(where + ".zero_optimization.offload_optimizer.ratio", f"{ratio}: partial optimizer "
               "offload (ZeRO-Offload++) is not modelled; read as full offload (errs low)")


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
            read_deepspeed({"zero_optimization": {
                "stage": dc.get("zero_stage", 0),
                "offload_optimizer": {"device": dc.get("offload_optimizer_device", "none")},
                "offload_param": {"device": dc.get("offload_param_device", "none")}},
                "gradient_accumulation_steps": dc.get("gradient_accumulation_steps"),
                "bf16": {"enabled": mp == "bf16"}, "fp16": {"enabled": mp == "fp16"}}, f, where + ".deepspeed_config")
    else:
        f.set("zero", 0, where + ".distributed_type")
        f.set("offload", "none", where + ".distributed_type")


def _read_acc_parallelism(par: dict, f: Found, where: str) -> None:
    """``parallelism_config``: tensor, context and (Ulysses) sequence parallel sizes, the attention of
    sequence parallelism, and HSDP's replicas (warned about)."""
    for key, name in (("parallelism_config_tp_size", "tp"), ("parallelism_config_cp_size", "cp")):
        if _is_int(par.get(key)) and par[key] > 1:
            f.set(name, par[key], f"{where}.parallelism_config.{key}")
    if _is_int(par.get("parallelism_config_sp_size")) and par["parallelism_config_sp_size"] > 1:
        f.set("cp", par["parallelism_config_sp_size"], where + ".parallelism_config.parallelism_config_sp_size")
        f.notes.append(f"{where}.parallelism_config.parallelism_config_sp_size: Ulysses sequence "
                       "parallelism read as the planner's context parallelism (the sequence split over GPUs)")
    if isinstance(par, dict) and dict.__contains__(par, "parallelism_config_sp_attn_implementation"):
        read_attention(par, f, where + ".parallelism_config", "parallelism_config_sp_attn_implementation")
    for key in ("parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size"):
        if _is_int(par.get(key)) and par[key] > 1 and key.endswith("replicate_size"):
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
    off = _true(fc.get("fsdp_offload_params", False))
    f.set("offload", ("optimizer+params" if stage == 3 else "optimizer") if off else "none",
          where + ".fsdp_config.fsdp_offload_params")
    f.set("checkpointing", "full" if _true(fc.get("fsdp_activation_checkpointing")) else "none",
          where + ".fsdp_config.fsdp_activation_checkpointing")


def read_hf_checkpointing(cfg: dict, f: Found, where: str, tool: str, default: bool) -> None:
    """``activation_checkpointing`` (transformers 5) or its deprecated alias ``gradient_checkpointing``,
    with their ``*_kwargs`` (``every_n_layers``, ``offload``)."""
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        if cfg.get(name) is not None:
            f.set("checkpointing", "full" if _true(cfg[name]) else "none", f"{where}.{name}")
            break
    else:
        f.default("checkpointing", "full" if default else "none", where + ".gradient_checkpointing", tool)
    for name in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
        kw = cfg.get(name)
        if not isinstance(kw, dict):
            continue
        every = kw.get("every_n_layers")
        if _is_int(every) and every > 1 and f.values.get("checkpointing") == "full":
            f.warn(f"{where}.{name}.every_n_layers", f"{every}: checkpointing one layer in {every} is "
                   "not modelled; read as every layer checkpointed (errs low)")
        if _true(kw.get("offload")):
            f.set("activation_offload", True, f"{where}.{name}.offload")


def _read_hf_eval(cfg: dict, f: Found, where: str, tool: str) -> None:
    """Evaluation during training (``eval_strategy``, v4's ``evaluation_strategy``, ``do_eval``;
    LLaMA-Factory's ``val_size`` or ``eval_dataset``) at ``per_device_eval_batch_size``, the
    Trainer's 8 unless set: the workload's ``eval_micro_batch``."""
    strategy = cfg.get("eval_strategy", cfg.get("evaluation_strategy"))
    evaluates = strategy is not None and str(strategy).lower().rsplit(".", 1)[-1] != "no"
    evaluates |= _true(cfg.get("do_eval"))
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


def read_training_args(cfg: dict, f: Found, where: str, base: Path, load, *,
                       tool: str = "TrainingArguments") -> None:
    """transformers' TrainingArguments, and the TRL and LLaMA-Factory files built on them
    (``tool`` picks the defaults: TRL checkpoints and uses BF16 unless told otherwise)."""
    trl = tool == "TRL"
    f.take(cfg, "per_device_train_batch_size", "micro_batch", 8, where, tool)
    f.take(cfg, "gradient_accumulation_steps", "grad_accum", 1, where, tool)
    _read_hf_eval(cfg, f, where, tool)
    _precision(f, cfg.get("bf16"), cfg.get("fp16"), where, tool, default="mixed" if trl else "fp32")
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
        if _is_int(cfg.get(key)):
            f.set("seq_len", cfg[key], f"{where}.{key}")
    if _is_int(cfg.get("tp_size")) and cfg["tp_size"] > 1:
        f.set("tp", cfg["tp_size"], where + ".tp_size")
    if _true(cfg.get("adafactor")):
        bad_optimizer(f, where + ".adafactor", "adafactor", "AdamW, 8-bit AdamW, paged 8-bit AdamW or SGD")
    if _true(cfg.get("auto_find_batch_size")):
        f.warn(where + ".auto_find_batch_size", "the Trainer halves the batch at run time until it "
               "fits; the estimate is for the batch as written")
    if _true(cfg.get("torch_compile")):
        f.set("compile", True, where + ".torch_compile")
    if _true(cfg.get("use_liger_kernel")):
        liger = cfg.get("liger_kernel_config") or {}
        fused = liger.get("fused_linear_cross_entropy", True)
        f.set("loss", "fused" if _true(fused) else "standard", where + ".use_liger_kernel")
    if _true(cfg.get("activation_offloading")):
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
            stage = 3 if _true(reshard) else 2
    f.set("zero", stage, where + ".fsdp")
    off = "offload" in opts or _true(get("offload_params")) or _true(get("cpu_offload"))
    f.set("offload", ("optimizer+params" if stage == 3 else "optimizer") if off else "none", where + ".fsdp")
    if "hybrid_shard" in opts:
        f.warn(where + ".fsdp", "hybrid_shard shards within a node only; the planner shards over all "
               "data-parallel GPUs (errs low)")
    if _true(get("activation_checkpointing")):
        f.set("checkpointing", "full", where + ".fsdp_config.activation_checkpointing")


def read_lora(cfg: dict, f: Found, where: str, workload_fields, *, tool: str = "PEFT") -> None:
    """A PEFT LoraConfig (or the LoRA keys of a tool, renamed to PEFT's)."""
    if "method" not in f.values:
        f.set("method", "lora", where)
    peft_type = cfg.get("peft_type")
    if peft_type is not None and str(peft_type).upper() not in ("LORA", "QLORA"):
        f.warn(where + ".peft_type", f"{peft_type}: only LoRA adapters are modelled; read as LoRA")
    rank = count(cfg, "r", f, where)
    if rank is not None:
        f.set("lora_rank", rank, where + ".r")
    if cfg.get("lora_alpha") is not None:
        f.set("lora_alpha", cfg["lora_alpha"], where + ".lora_alpha")
    targets = cfg.get("target_modules")
    if targets is None and "lora_targets" not in f.values:
        f.set("lora_targets", ["q", "v"], where + ".target_modules")
        f.notes.append(f"{where}.target_modules: not set; {tool}'s default for Llama-like models "
                       "(q_proj, v_proj) applies")
    else:
        _targets(targets, f, where + ".target_modules")
    if "lora_dropout" in workload_fields and cfg.get("lora_dropout") is not None:
        f.set("lora_dropout", cfg["lora_dropout"], where + ".lora_dropout")
    read_peft_extras(cfg, f, where)


PEFT_KEYS = ("modules_to_save", "layers_to_transform", "layers_pattern", "rank_pattern", "alpha_pattern",
             "use_dora", "target_parameters", "trainable_token_indices", "exclude_modules",
             "layer_replication", "bias", "loftq_config", "init_lora_weights", "use_rslora", "fan_in_fan_out",
             "lora_bias", "task_type", "inference_mode", "base_model_name_or_path", "revision", "auto_mapping",
             "megatron_config", "megatron_core", "corda_config", "eva_config")


def read_peft_extras(cfg: dict, f: Found, where: str, names: dict[str, str] | None = None) -> None:
    """What a PEFT config trains besides the adapters the planner counts, or where it leaves them
    out: each is a warning naming the key. ``names``: a tool's names for PEFT's keys (the tool has
    no other of them); None: a PEFT LoraConfig itself."""
    n = {k: k if names is None else names.get(k, "") for k in PEFT_KEYS}

    def get(key: str) -> Any:
        return cfg.get(n[key]) if n[key] else None

    mts = get("modules_to_save")
    if mts:
        _modules_to_save(mts, f, f"{where}.{n['modules_to_save']}")
    for key in ("layers_to_transform", "layers_pattern"):
        if get(key) not in (None, [], ""):
            f.warn(f"{where}.{n[key]}", f"{get(key)!r}: adapters on some layers only; the planner puts "
                   "them on every layer (errs high)")
    for key in ("rank_pattern", "alpha_pattern"):
        if get(key):
            f.warn(f"{where}.{n[key]}", "per-module ranks are not modelled; every adapter is read at "
                   f"rank {f.values.get('lora_rank', 'r')}")
    if _true(get("use_dora")):
        f.warn(f"{where}.{n['use_dora']}", "DoRA's magnitude vectors and its extra activations are not "
               "modelled; read as LoRA (errs low)")
    if get("target_parameters"):
        f.warn(f"{where}.{n['target_parameters']}", f"{_names(get('target_parameters'))}: adapters on "
               "parameters (MoE experts) are not counted (errs low)")
    if get("trainable_token_indices"):
        f.warn(f"{where}.{n['trainable_token_indices']}", "trainable token embeddings are not counted")
    if get("layer_replication"):
        f.warn(f"{where}.{n['layer_replication']}", "replicated layers are not modelled")
    if get("exclude_modules"):
        f.warn(f"{where}.{n['exclude_modules']}", f"{_names(get('exclude_modules'))}: excluded modules "
               "are still counted as adapted (errs high)")
    bias = get("bias")
    if bias not in (None, "none", False):
        f.warn(f"{where}.{n['bias']}", f"{bias!r}: trained biases are not counted")
    if _true(get("lora_bias")):
        f.warn(f"{where}.{n['lora_bias']}", "LoRA bias terms are not counted")
    loftq = get("loftq_config")
    if loftq:
        f.warn(f"{where}.{n['loftq_config']}", "LoftQ initialisation is not modelled")
    for key in ("init_lora_weights", "use_rslora", "fan_in_fan_out", "task_type", "inference_mode",
                "base_model_name_or_path", "revision", "auto_mapping", "megatron_config",
                "megatron_core", "corda_config", "eva_config"):
        get(key)  # read: no bearing on memory per GPU


#: Module names of the input embeddings and the LM head across model families (Llama-style,
#: GPT-2 and GPT-J, BLOOM and Falcon, GPT-NeoX, ChatGLM, Qwen-1, InternLM2 and Meta's format).
SAVED_EMBEDDINGS = ("embed_tokens", "wte", "word_embeddings", "embed_in", "tok_embeddings")
SAVED_HEADS = ("lm_head", "embed_out", "output_layer", "output")


def _modules_to_save(value: Any, f: Found, where: str) -> None:
    """Whole modules trained beside the adapters: the embeddings and the LM head are counted
    (``modules_to_save``); any other (a classifier ``score``) is warned about, as is a value
    that names no modules."""
    if not isinstance(value, (str, list, tuple)):
        f.warn(where, f"{value!r}: not a list of module names; nothing counted")
        return
    items = [value] if isinstance(value, str) else list(value)
    names = [n.strip() for m in items if isinstance(m, str) for n in m.split(",") if n.strip()]
    odd = [m for m in items if not isinstance(m, str)]
    if odd:
        f.warn(where, f"{odd!r}: not module names; ignored")
    found: list[str] = []
    for name in names:
        leaf = name.rsplit(".", 1)[-1]
        kind = "embed_tokens" if leaf in SAVED_EMBEDDINGS else "lm_head" if leaf in SAVED_HEADS else None
        if kind is None:
            f.warn(where, f"{name}: trained in full beside the adapters, not counted (errs low)")
        elif kind not in found:
            found.append(kind)
    if found:
        f.set("modules_to_save", found, where)


def _names(v: Any) -> str:
    return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


LAYER_INDEX = re.compile(r"(^|\.)(layers?|h|blocks?)\.(\d+)\.|\\?\.\(?\d+[|)]|\[\d")


def _targets(modules: Any, f: Found, where: str) -> None:
    if modules is None:
        return
    if modules in ("all-linear", "all_linear", "all") or modules is True:
        f.set("lora_targets", ["all"], where)
        return
    if isinstance(modules, str) and ("," in modules and not re.search(r"[\\()|*\[]", modules)):
        modules = [m.strip() for m in modules.split(",") if m.strip()]  # LLaMA-Factory: "q_proj,v_proj"
    if isinstance(modules, str):
        # PEFT matches a string as a regular expression over the modules' full names
        found = [n for n in list(PEFT_TARGETS) + list(PEFT_FUSED) if n in modules]
        if LAYER_INDEX.search(modules):
            f.warn(where, f"{modules!r}: adapters on some layers only; the planner puts them on every "
                   "layer (errs high)")
        f.notes.append(f"{where}: {modules!r} read as a regular expression naming "
                       f"{', '.join(found) or 'no module the planner counts'}")
        names = found
    else:
        names = list(modules)
        layered = [str(n) for n in names if LAYER_INDEX.search(str(n))]
        if layered:
            f.warn(where, f"{', '.join(layered)}: adapters on some layers only; the planner puts them "
                   "on every layer (errs high)")
    picked, unknown = [], []
    for name in names:
        short = str(name).split(".")[-1]
        if short in PEFT_FUSED:
            picked += PEFT_FUSED[short]
        elif short in PEFT_TARGETS:
            picked.append(PEFT_TARGETS[short])
        else:
            unknown.append(str(name))
    if unknown:
        f.warn(where, f"{', '.join(unknown)}: not counted (the planner counts adapters on "
               f"{', '.join(list(PEFT_TARGETS) + list(PEFT_FUSED))})")
    if picked:
        f.set("lora_targets", sorted(set(picked), key=TARGET_ORDER.index), where)


def eight_bit(f: Found, where: str) -> None:
    """An 8-bit (LLM.int8) base under LoRA: the planner's quantized-base method, said so."""
    f.warn(where, "LoRA on an 8-bit (LLM.int8) base: the planner has no such method and reads it as "
           "its quantized-base LoRA ('qlora') with 8-bit weights (quant_bits 8); it is not QLoRA")


def read_bnb(cfg: dict, f: Found, where: str) -> None:
    b4, b8 = _true(cfg.get("load_in_4bit")), _true(cfg.get("load_in_8bit"))
    if b4 or b8:
        f.set("method", "qlora", where)
        f.set("quant_bits", 4 if b4 else 8, where + ".load_in_*bit")
        if b4:
            f.set("double_quant", bool(cfg.get("bnb_4bit_use_double_quant", False)),
                  where + ".bnb_4bit_use_double_quant")
            if cfg.get("bnb_4bit_compute_dtype") in ("bfloat16", "torch.bfloat16"):
                f.facts["asks_bf16"] = where + ".bnb_4bit_compute_dtype"
            qt = cfg.get("bnb_4bit_quant_type", "fp4")
            if qt != "nf4":
                f.notes.append(f"{where}.bnb_4bit_quant_type: {qt!r} read as NF4 (same bytes)")
        else:
            eight_bit(f, where + ".load_in_8bit")
    for key in ("bnb_4bit_quant_storage", "llm_int8_threshold", "llm_int8_has_fp16_weight",
                "llm_int8_skip_modules", "llm_int8_enable_fp32_cpu_offload", "quant_method",
                "_load_in_4bit", "_load_in_8bit"):
        cfg.get(key)  # read: the same bytes per weight


def read_model_kwargs(cfg: dict, f: Found, where: str) -> None:
    if cfg.get("pretrained_model_name_or_path"):
        f.set("model", cfg["pretrained_model_name_or_path"], where + ".pretrained_model_name_or_path")
    read_attention(cfg, f, where)
    read_model_dtype(cfg, f, where)
    if isinstance(cfg.get("quantization_config"), dict):
        read_bnb(cfg["quantization_config"], f, where + ".quantization_config")
    for key in ("trust_remote_code", "revision", "device_map", "use_cache", "low_cpu_mem_usage"):
        cfg.get(key)  # read: no bearing on training memory


def read_attention(cfg: dict, f: Found, where: str, key: str = "attn_implementation") -> None:
    attn = cfg.get(key)
    if attn is None:
        if _true(cfg.get("use_flash_attention_2")):
            f.set("attention", "flash", where + ".use_flash_attention_2")
            f.facts["asks_fa2"] = where + ".use_flash_attention_2"
        return
    f.set("attention", "eager" if str(attn) == "eager" else "flash", f"{where}.{key}")
    if attn == "flash_attention_2":
        f.facts["asks_fa2"] = f"{where}.{key}"


def read_model_dtype(cfg: dict, f: Found, where: str) -> None:
    for key in ("dtype", "torch_dtype"):
        if cfg.get(key) is not None:
            f.facts["model_dtype"] = str(cfg[key]).replace("torch.", "")
            f.facts["model_dtype_where"] = f"{where}.{key}"
            return


def torchtune_model_name(component: str) -> tuple[str | None, list[str]]:
    """``torchtune.models.llama3_1.qlora_llama3_1_8b`` -> (``qlora``, name candidates)."""
    builder = component.rsplit(".", 1)[-1]
    method = None
    for prefix in ("qlora_", "lora_"):
        if builder.startswith(prefix):
            method, builder = prefix[:-1], builder[len(prefix):]
    return method, [re.sub(r"(\d)_(\d)", r"\1.\2", builder), builder]

