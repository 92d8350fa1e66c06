"""An axolotl YAML: adapter and quantized base, batch, precision, checkpointing, optimizer,
attention, loss and kernels, parallel sizes, and its sharding (a DeepSpeed config it names, or FSDP)."""

from __future__ import annotations

from pathlib import Path

from planner.launch.importers.common import (
    bad_optimizer,
    comma_list,
    config_path,
    count,
    is_int,
    is_true,
    read_precision,
    scenario_fields,
    whole,
)
from planner.launch.importers.found import Found
from planner.launch.importers.hf_model import eight_bit, read_attention
from planner.launch.importers.hf_trainer import HF_OPTIM, read_hf_fsdp, set_hf_optimizer
from planner.launch.importers.peft import read_lora, read_peft_extras, read_targets

#: axolotl keys that leave memory per GPU alone, and tuning the planner does not model.
AX_IGNORED = (
    "base_model_config", "model_type", "tokenizer_type", "tokenizer_*", "trust_remote_code", "is_*_derived_model",
    "strict", "datasets", "test_datasets", "dataset_*", "val_set_size", "output_dir", "wandb_*", "hub_*",
    "mlflow_*", "comet_*", "use_wandb", "use_mlflow", "use_comet", "use_tensorboard", "logging_steps",
    "num_epochs", "max_steps", "learning_rate", "lr_scheduler*", "cosine_*", "warmup_*", "evals_per_epoch",
    "eval_*", "saves_per_epoch", "save_*", "weight_decay", "special_tokens", "tokens", "added_tokens_overrides",
    "chat_template*", "train_on_inputs", "group_by_length", "sample_packing*", "pad_to_sequence_len",
    "pad_to_multiple_of", "load_best_model_at_end", "early_stopping_patience", "resume_from_checkpoint",
    "auto_resume_from_checkpoints", "local_rank", "debug", "seed", "max_grad_norm", "shuffle_*",
    "lora_model_dir", "lora_fan_in_fan_out", "loraplus_*", "peft_use_rslora", "merge_lora", "gc_steps",
    "adam_*", "optim_args", "profiler_steps*", "include_tokens_per_second", "include_tkps", "dataloader_*",
    "remove_unused_columns", "ddp_*", "loss_watchdog_*", "default_system_message", "eot_tokens",
    "fix_untrained_tokens", "tf32", "use_ray", "ray_*", "gradio_*", "trackio_*", "use_trackio",
    "low_cpu_mem_usage", "device_map", "max_memory", "gpu_memory_limit", "qlora_sharded_model_loading",
    "fsdp_config.*state_dict_type", "fsdp_config.*sync_module_states", "fsdp_config.*cpu_ram_efficient_loading",
    "fsdp_config.*auto_wrap_policy", "fsdp_config.*transformer_layer_cls_to_wrap", "fsdp_config.*min_num_params",
    "fsdp_final_state_dict_type", "plugins", "neftune_noise_alpha", "embedding_lr*", "lr_groups",
    "lr_div_factor", "lr_quadratic_warmup", "total_num_tokens", "total_supervised_tokens", "seed",
    "model_config_type", "processor_type", "skip_prepare_dataset", "push_dataset_to_hub", "hf_use_auth_token",
    "peft_init_lora_weights", "bnb_config_kwargs.llm_int8_*", "bnb_config_kwargs.bnb_4bit_quant_storage",
    "bnb_config_kwargs.bnb_4bit_compute_dtype", "gptq_disable_exllama", "gradient_checkpointing_kwargs.use_reentrant",
    "pretraining_dataset", "do_bench_eval", "bench_*", "do_causal_lm_eval", "metric_for_best_model",
    "greater_is_better", "mean_resizing_embeddings", "shrink_embeddings", "resize_token_embeddings_to_32x",
    "generate_samples", "num_generation_samples", "generation_*", "multipack_real_batches", "batch_flattening",
    "curriculum_sampling", "excess_length_strategy", "min_sample_len", "micro_batch_size_eval",
    "eval_batch_size", "torch_compile_backend", "torch_compile_mode", "torchdistx_path",
    "experimental_skip_move_to_device",
)
AX_TUNING = (
    "lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel",
    "liger_layer_norm", "fsdp_config.*backward_prefetch",
    "fsdp_config.*forward_prefetch", "fsdp_config.*use_orig_params", "fsdp_config.*limit_all_gathers",
    "fsdp_config.*cpu_offload_pin_memory", "embeddings_skip_upcast", "lora_on_cpu", "flash_attn_rms_norm",
    "flash_attn_fuse_qkv", "flash_attn_fuse_mlp", "flash_attn_cross_entropy", "torch_empty_cache_steps",
    "fsdp_config.*mixed_precision_policy", "unsloth_*", "sdpa_varlen", "fp32_norms", "fp32_norm_classes",
    "experts_implementation", "use_kernels", "cut_cross_entropy_*",
)


def read_axolotl(cfg: dict, f: Found, where: str, base: Path, load) -> None:
    tool = "axolotl"
    if cfg.get("base_model"):
        f.set("model", cfg["base_model"], where + ".base_model")
    method = _read_ax_method(cfg, f, where)
    if method == "qlora":
        _read_ax_quantization(cfg, f, where)
    if method != "full":
        _read_ax_lora(cfg, f, where)
    unfrozen = cfg.get("unfrozen_parameters")
    if unfrozen:
        f.warn(where + ".unfrozen_parameters", f"{comma_list(unfrozen)}: only these parameters train; the "
               f"planner {'trains every weight' if method == 'full' else 'does not count them'} "
               f"({'errs high' if method == 'full' else 'errs low'})")
    _read_ax_batch(cfg, f, where, tool)
    _read_ax_precision(cfg, f, where, tool)
    _read_ax_checkpointing(cfg, f, where, tool)
    _read_ax_optimizer(cfg, f, where)
    _read_ax_attention(cfg, f, where)
    _read_ax_loss(cfg, f, where)
    tc = cfg.get("torch_compile")
    if tc is True or str(tc).lower() in ("true", "auto"):
        f.set("compile", True, where + ".torch_compile")
    if is_true(cfg.get("fp8")):
        f.set("fp8", True, where + ".fp8")
    if is_true(cfg.get("tiled_mlp")):
        f.warn(where + ".tiled_mlp", "tiled MLP activations are not modelled (errs high)")
    _read_ax_parallelism(cfg, f, where)
    rl = cfg.get("rl")
    if rl:
        f.warn(where + ".rl", f"{rl!r}: preference or RL training (a reference model, paired sequences) "
               "is not modelled; the estimate is for supervised fine-tuning (errs low)")
        for key in ("rl_beta", "dpo_beta", "orpo_alpha", "trl"):
            cfg.get(key)
    _read_ax_sharding(cfg, f, where, base, load)


def _read_ax_method(cfg: dict, f: Found, where: str) -> str:
    """``adapter``: none is a full fine-tune; LoRA on a quantized base (4- or 8-bit, GPTQ) is QLoRA."""
    adapter = cfg.get("adapter")
    b4, b8 = is_true(cfg.get("load_in_4bit")), is_true(cfg.get("load_in_8bit"))
    gptq = is_true(cfg.get("gptq"))
    if not adapter:
        method = "full"
        f.set("method", "full", where + ".adapter (none)")
    elif adapter in ("lora", "qlora"):
        quantized = adapter == "qlora" or b4 or b8 or gptq
        method = "qlora" if quantized else "lora"
        f.set("method", method, where + ".adapter")
    else:
        method = "lora"
        f.set("method", "lora", where + ".adapter")
        f.warn(where + ".adapter", f"{adapter!r} adapters are not modelled; read as LoRA")
    return method


def _read_ax_quantization(cfg: dict, f: Found, where: str) -> None:
    """A QLoRA base: GPTQ, 8-bit, or bitsandbytes 4-bit (double quantization on by default)."""
    b4, b8 = is_true(cfg.get("load_in_4bit")), is_true(cfg.get("load_in_8bit"))
    if is_true(cfg.get("gptq")):
        f.set("quant_type", "gptq", where + ".gptq")
        f.set("quant_bits", 4, where + ".gptq")
    elif b8 and not b4:
        f.set("quant_bits", 8, where + ".load_in_8bit")
        eight_bit(f, where + ".load_in_8bit")
    else:
        f.set("quant_bits", 4, where + (".load_in_4bit" if b4 else ".adapter"))
        bnb = cfg.get("bnb_config_kwargs") or {}
        f.set("double_quant", is_true(bnb.get("bnb_4bit_use_double_quant", True)),
              where + ".bnb_config_kwargs.bnb_4bit_use_double_quant")
        bnb.get("bnb_4bit_quant_type")


def _read_ax_lora(cfg: dict, f: Found, where: str) -> None:
    """The adapter's rank, alpha, dropout and target modules, and PEFT's other keys (``peft_*``)."""
    read_lora({"r": cfg.get("lora_r"), "lora_alpha": cfg.get("lora_alpha"), "target_modules": [],
               "lora_dropout": cfg.get("lora_dropout")}, f, where, scenario_fields())
    if "lora_rank" in f.values:
        f.where["lora_rank"] = where + ".lora_r"
    linear, modules = is_true(cfg.get("lora_target_linear")), cfg.get("lora_target_modules")
    if linear or modules == "all-linear":
        read_targets("all-linear", f, where + ".lora_target_linear")
    elif modules is not None:
        read_targets(modules, f, where + ".lora_target_modules")
    else:
        f.set("lora_targets", ["q", "v"], where + ".lora_target_modules")
        f.notes.append(f"{where}.lora_target_modules: not set; PEFT's default for Llama-like models "
                       "(q_proj, v_proj) applies")
    read_peft_extras(cfg, f, where, {
        "modules_to_save": "lora_modules_to_save", "layers_to_transform": "peft_layers_to_transform",
        "layers_pattern": "peft_layers_pattern", "rank_pattern": "lora_rank_pattern",
        "alpha_pattern": "lora_alpha_pattern", "use_dora": "peft_use_dora",
        "target_parameters": "lora_target_parameters", "trainable_token_indices": "peft_trainable_token_indices",
        "layer_replication": "peft_layer_replication", "loftq_config": "loftq_config",
        "use_rslora": "peft_use_rslora", "init_lora_weights": "peft_init_lora_weights",
        "fan_in_fan_out": "lora_fan_in_fan_out"})
    if cfg.get("peft_autocast_adapter_dtype") is False:
        f.set("adapter_dtype", "compute", where + ".peft_autocast_adapter_dtype")


def _read_ax_batch(cfg: dict, f: Found, where: str, tool: str) -> None:
    """Sequence length, micro batch, and gradient accumulation (or ``batch_size`` over the micro batch)."""
    seq = count(cfg, "sequence_len", f, where)
    if seq is not None:
        f.set("seq_len", seq, where + ".sequence_len")
    elif cfg.get("sequence_len") is None:
        f.default("seq_len", 512, where + ".sequence_len", tool)
    f.take(cfg, "micro_batch_size", "micro_batch", 1, where, tool)
    # evaluation during training: a validation split or test datasets, at eval_batch_size
    # (axolotl's default: the micro batch)
    val = cfg.get("val_set_size")
    if (isinstance(val, (int, float)) and val > 0) or cfg.get("test_datasets"):
        eval_batch = count(cfg, "eval_batch_size", f, where)
        if eval_batch is not None:
            f.set("eval_micro_batch", eval_batch, where + ".eval_batch_size")
        elif is_int(f.values.get("micro_batch")):
            f.set("eval_micro_batch", f.values["micro_batch"], where + ".eval_batch_size")
            f.notes.append(f"{where}.eval_batch_size: not set; axolotl evaluates at the micro batch")
    batch = count(cfg, "batch_size", f, where)
    micro = whole(f.values.get("micro_batch"))
    if cfg.get("gradient_accumulation_steps") is None and batch is not None and micro:
        f.set("grad_accum", max(1, batch // micro), where + ".batch_size")
    else:
        f.take(cfg, "gradient_accumulation_steps", "grad_accum", 1, where, tool)


def _read_ax_precision(cfg: dict, f: Found, where: str, tool: str) -> None:
    """``bf16``/``fp16`` (mixed), ``bfloat16``/``float16`` (pure), and the dtype the model loads in."""
    b4, b8 = is_true(cfg.get("load_in_4bit")), is_true(cfg.get("load_in_8bit"))
    read_precision(f, cfg.get("bf16"), cfg.get("fp16"), where, tool)
    if is_true(cfg.get("bfloat16")):
        f.set("precision", "bf16", where + ".bfloat16")
        f.facts["asks_bf16"] = where + ".bfloat16"
    elif is_true(cfg.get("float16")):
        f.set("precision", "fp16", where + ".float16")
        f.warn(where + ".float16", "a pure FP16 model (no FP32 master) is read as FP16 mixed precision "
               "(errs high)")
    if f.values.get("precision") == "mixed" and not (b4 or b8):
        # axolotl loads the model in BF16 when bf16 is on (cfg.torch_dtype): with no DeepSpeed or
        # FSDP to keep FP32 masters, a full fine-tune's weights and AdamW states are BF16
        f.facts["model_dtype"] = "bfloat16"
        f.facts["model_dtype_where"] = f.where["precision"] + " (axolotl loads the model in BF16)"


def _read_ax_checkpointing(cfg: dict, f: Found, where: str, tool: str) -> None:
    """Gradient checkpointing (``offload*`` also offloads), and activation offloading."""
    gc = cfg.get("gradient_checkpointing")
    if gc is None:
        f.default("checkpointing", "none", where + ".gradient_checkpointing", tool)
    else:
        f.set("checkpointing", "none" if gc is False or str(gc).lower() == "false" else "full",
              where + ".gradient_checkpointing")
        if str(gc).startswith("offload"):
            f.set("activation_offload", True, where + ".gradient_checkpointing")
    kw = cfg.get("gradient_checkpointing_kwargs") or {}
    if isinstance(kw, dict):
        kw.get("use_reentrant")
    ao = cfg.get("activation_offloading")
    if ao not in (None, False) and str(ao).lower() != "false":
        f.set("activation_offload", True, where + ".activation_offloading")


def _read_ax_optimizer(cfg: dict, f: Found, where: str) -> None:
    """``optimizer`` (axolotl's default 'adamw_torch_fused'), by the Trainer's names."""
    optim = str(cfg.get("optimizer", "adamw_torch_fused"))
    optim = {"ao_adamw_8bit": "adamw_8bit", "adamw_torch_4bit": "", "ao_adamw_4bit": ""}.get(optim, optim)
    if optim in HF_OPTIM:
        set_hf_optimizer(f, optim, where + ".optimizer")
        if cfg.get("optimizer") is None:
            f.notes.append(f"{where}.optimizer: not set; axolotl's default 'adamw_torch_fused' applies")
    else:
        bad_optimizer(f, where + ".optimizer", cfg.get("optimizer"), "AdamW, 8-bit AdamW, paged 8-bit AdamW or SGD")


def _read_ax_attention(cfg: dict, f: Found, where: str) -> None:
    """``attn_implementation``, else axolotl's attention flags (SDPA by default)."""
    read_attention(cfg, f, where)
    if "attention" not in f.values or not f.where["attention"].startswith(where):
        if is_true(cfg.get("flash_attention")):
            f.set("attention", "flash", where + ".flash_attention")
            f.facts["asks_fa2"] = where + ".flash_attention"
        elif is_true(cfg.get("sdp_attention")) or is_true(cfg.get("xformers_attention")) \
                or is_true(cfg.get("flex_attention")) or is_true(cfg.get("sage_attention")):
            f.set("attention", "flash", where + ".sdp_attention")
        elif is_true(cfg.get("eager_attention")):
            f.set("attention", "eager", where + ".eager_attention")
        else:
            f.default("attention", "flash", where + ".flash_attention", "transformers (sdpa)")
    else:
        for key in ("flash_attention", "sdp_attention", "xformers_attention", "flex_attention", "eager_attention"):
            cfg.get(key)


def _read_ax_loss(cfg: dict, f: Found, where: str) -> None:
    """The loss: Liger's or Cut Cross-Entropy's fused one, or the chunked one; Liger's RMSNorm."""
    plugins = " ".join(map(str, cfg.get("plugins") or []))
    rope = is_true(cfg.get("liger_rope"))
    glu = is_true(cfg.get("liger_glu_activation", cfg.get("liger_swiglu")))  # liger_swiglu: its old name
    if is_true(cfg.get("liger_rms_norm")):
        # with Liger's rotary and GLU activation too, its patches as a whole
        f.set("kernels", "liger" if rope and glu else "fused_rmsnorm", where + ".liger_rms_norm")
        if "liger" not in plugins.lower():
            f.warn(where + ".liger_rms_norm", "set without the Liger plugin in plugins: axolotl will "
                   "not apply it")
    elif glu:
        f.warn(where + ".liger_glu_activation", "Liger's GLU activation without its RMSNorm is not "
               "modelled: the estimate keeps the standard activation's output (high by one "
               "MLP-wide tensor per token and layer)")
    if is_true(cfg.get("liger_fused_linear_cross_entropy")):
        f.set("loss", "fused", where + ".liger_fused_linear_cross_entropy")
        if "liger" not in plugins.lower():
            f.warn(where + ".liger_fused_linear_cross_entropy", "set without the Liger plugin in "
                   "plugins: axolotl will not apply it")
    elif is_true(cfg.get("cut_cross_entropy")) or ("CutCrossEntropyPlugin" in plugins
                                                and cfg.get("cut_cross_entropy") is not False):
        # the plugin's cut_cross_entropy defaults to True
        f.set("loss", "cce", where + (".cut_cross_entropy" if cfg.get("cut_cross_entropy") else ".plugins"))
    elif is_true(cfg.get("chunked_cross_entropy")):
        f.set("loss", "chunked", where + ".chunked_cross_entropy")
        cfg.get("chunked_cross_entropy_num_chunks")
    if is_true(cfg.get("liger_cross_entropy")):
        f.warn(where + ".liger_cross_entropy", "Liger's cross-entropy (logits kept, gradient in place) "
               "is not modelled; read as the standard loss (errs high)")


def _read_ax_parallelism(cfg: dict, f: Found, where: str) -> None:
    """Tensor and context (sequence) parallel sizes, and HSDP's replicas (warned about)."""
    for key, name in (("tensor_parallel_size", "tp"), ("context_parallel_size", "cp"),
                      ("sequence_parallel_degree", "cp")):
        if is_int(cfg.get(key)) and cfg[key] > 1:
            f.set(name, cfg[key], f"{where}.{key}")
    if is_int(cfg.get("dp_replicate_size")) and cfg["dp_replicate_size"] > 1:
        f.warn(where + ".dp_replicate_size", "HSDP (replicas of a sharded group): the planner shards "
               "over all data-parallel GPUs (errs low)")
    cfg.get("dp_shard_size")


def _read_ax_sharding(cfg: dict, f: Found, where: str, base: Path, load) -> None:
    """The DeepSpeed config it names, else its FSDP settings, else no sharding and no offload."""
    if cfg.get("deepspeed"):
        load(config_path(str(cfg["deepspeed"]), base, f, where + ".deepspeed"), f, "deepspeed")
        if cfg.get("fsdp") or cfg.get("fsdp_config"):
            f.warn(where + ".fsdp", "both deepspeed and fsdp are set; read DeepSpeed")
    elif cfg.get("fsdp") or cfg.get("fsdp_config"):
        fc = cfg.get("fsdp_config") or {}
        read_hf_fsdp(cfg.get("fsdp") or ["full_shard"], fc, f, where, version=cfg.get("fsdp_version"))
    else:
        f.set("zero", 0, where + " (no deepspeed or fsdp)")
        f.set("offload", "none", where + " (no deepspeed or fsdp)")
