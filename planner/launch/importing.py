"""``--config``: read the configs a user has into a scenario, and say what they leave out.

Order of precedence: the scenario file, then the configs, then command-line flags. A field that
changes the memory and that none of them sets is an error naming the flag that gives it. Every
key of every config is read, passed over with a note, or warned about (``readers.account``).
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from planner import catalog
from planner.catalog.store import UnknownName
from planner.core.errors import InputError
from planner.core.specs import Layout, Workload
from planner.core.textfiles import is_file, parse_json, parse_yaml, read_text_bounded
from planner.launch.readers import (
    ACC_IGNORED,
    ACC_TUNING,
    DS_IGNORED,
    DS_TUNING,
    HF_IGNORED,
    HF_OPTIM,
    HF_TUNING,
    LF_IGNORED,
    TRL_IGNORED,
    Found,
    Tracked,
    _is_int,
    _precision,
    _targets,
    _true,
    account,
    bad_optimizer,
    config_path,
    count,
    eight_bit,
    read_accelerate,
    read_attention,
    read_bnb,
    read_deepspeed,
    read_hf_fsdp,
    read_lora,
    read_model_dtype,
    read_model_kwargs,
    read_peft_extras,
    read_training_args,
    set_hf_optimizer,
    torchtune_model_name,
    whole,
)
from planner.scenario.files import FLAG_SECTIONS, deep_merge

CONFIG_HELP = ("A config you have: DeepSpeed JSON, accelerate YAML, TrainingArguments JSON/YAML, TRL or "
               "alignment-handbook recipe, LLaMA-Factory YAML, PEFT LoraConfig, BitsAndBytesConfig, "
               "model kwargs, axolotl or torchtune YAML (repeatable).")
#: What the memory depends on: each must come from the scenario, a config or a flag.
#: The longest text a config's value may hold: configs carry chat templates and prompts inline
#: (axolotl's ``chat_template_jinja``, tens of KiB at most), far longer than a scenario's names.
CONFIG_TEXT_CHARS = 256 << 10
REQUIRED_ESTIMATE = ("model", "method", "precision", "optimizer", "seq_len", "micro_batch",
                     "checkpointing", "attention", "zero")
REQUIRED_PLAN = ("model", "method", "precision", "optimizer", "seq_len")
#: What a plan keeps from a config: what is trained. The layout is the search's to choose.
PLAN_KEYS = ("model", "method", "precision", "optimizer", "seq_len", "global_batch", "lora_rank",
             "lora_alpha", "lora_targets", "quant_bits", "double_quant", "lora_dropout", "quant_type",
             "loss", "optimizer_paged", "compile", "kernels", "fp8")
TT_OPTIM = {"AdamW": "adamw", "Adam": "adamw", "AdamW8bit": "adam8bit", "PagedAdamW8bit": "paged_adamw8bit",
            "SGD": "sgd", "PagedAdamW": "adamw", "PagedAdamW32bit": "adamw"}
#: torchtune's losses: the chunked cross-entropy over whole logits, and the one that runs the head per
#: chunk of tokens (memory/activations.py: ``chunked_head``).
TT_LOSS = {"CEWithChunkedOutputLoss": "chunked", "LinearCrossEntropyLoss": "chunked_head",
           "CrossEntropyLoss": "standard"}

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
    "lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel", "liger_rope",
    "liger_glu_activation", "liger_layer_norm", "liger_swiglu", "fsdp_config.*backward_prefetch",
    "fsdp_config.*forward_prefetch", "fsdp_config.*use_orig_params", "fsdp_config.*limit_all_gathers",
    "fsdp_config.*cpu_offload_pin_memory", "embeddings_skip_upcast", "lora_on_cpu", "flash_attn_rms_norm",
    "flash_attn_fuse_qkv", "flash_attn_fuse_mlp", "flash_attn_cross_entropy", "torch_empty_cache_steps",
    "fsdp_config.*mixed_precision_policy", "unsloth_*", "sdpa_varlen", "fp32_norms", "fp32_norm_classes",
    "experts_implementation", "use_kernels", "cut_cross_entropy_*",
)
#: torchtune keys that leave memory per GPU alone, and tuning the planner does not model.
TT_IGNORED = (
    "output_dir", "checkpointer", "resume_from_checkpoint", "save_adapter_weights_only", "dataset",
    "dataset_val", "run_val_every_n_steps", "batch_size_val", "seed", "shuffle", "epochs",
    "max_steps_per_epoch", "clip_grad_norm", "metric_logger", "log_every_n_steps", "log_peak_memory_stats",
    "log_level", "profiler", "lr_scheduler", "device", "optimizer.lr", "optimizer.weight_decay",
    "optimizer.betas", "optimizer.eps", "optimizer.momentum", "optimizer.amsgrad", "optimizer.optimizer_kwargs",
    "tokenizer._component_", "tokenizer.path", "tokenizer.merges_file", "tokenizer.prompt_template",
    "tokenizer.special_tokens_path", "tokenizer.truncation_type", "tokenizer.image_size", "tokenizer.max_num_tiles",
    "tokenizer.patch_size", "tokenizer.tile_size", "loss.num_output_chunks", "collate_fn", "inference",
    "tensor_parallel_plan", "data_parallel_shard_dim", "save_every_n_steps", "keep_last_n_checkpoints",
    "quantizer.groupsize", "tokenizer.vocab_path", "tokenizer.tokenizer_json_path",
    "tokenizer.merges_path", "tokenizer.vocab_file", "model.image_size", "tokenizer.max_image_tokens",
    "model.tile_size", "model.patch_size", "model.max_num_tiles", "model.decoder_trainable",
    "model.encoder_trainable", "model.fusion_trainable", "low_cpu_ram",
)
TT_TUNING = (
    "custom_sharded_layers", "optimizer.fused", "optimizer.foreach", "activation_offloading_use_streams",
    "loss.ignore_index", "loss.tp_enabled", "fsdp.fsdp_sharding_strategy",
)
#: TRL's preference and RL trainers (DPO, ORPO, KTO, GRPO…): keys that only they have. Any of the
#: first set means a reference or reward model and paired or generated sequences.
TRL_RL_CORE = ("beta", "max_prompt_length", "max_completion_length", "rpo_alpha", "num_generations",
               "reward_funcs", "precompute_ref_log_probs", "cpo_alpha", "simpo_gamma", "reference_free")
TRL_RL_KEYS = TRL_RL_CORE + ("ref_model_*", "ref_adapter_name", "sync_ref_model", "use_vllm", "vllm_*",
                             "temperature", "top_p", "top_k", "log_completions", "ds3_gather_for_generation",
                             "num_iterations", "epsilon*", "scale_rewards", "reward_weights", "loss_type",
                             "generation_batch_size", "label_smoothing", "f_divergence_type",
                             "use_weighting", "ld_alpha", "mask_truncated_completions", "importance_sampling_level")


def _extra_fields() -> set[str]:
    return set(Workload.model_fields) | set(Layout.model_fields)


def sniff(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    keys = set(data)
    if isinstance(data.get("model"), dict) and "_component_" in data["model"]:
        return "torchtune"
    if keys & {"base_model", "sequence_len", "micro_batch_size", "lora_target_linear"}:
        return "axolotl"
    if keys & {"finetuning_type", "cutoff_len", "lora_target", "quantization_bit"} or \
            {"stage", "template"} <= keys:
        return "llamafactory"
    if keys & {"distributed_type", "compute_environment", "num_machines"}:
        return "accelerate"
    if keys & {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"}:
        return "deepspeed"
    if keys & {"model_name_or_path", "dataset_name", "dataset_mixture", "dataset_mixer", "use_peft",
               "dataset_text_field", "model_init_kwargs", "use_bnb_nested_quant"}:
        return "trl"
    if keys & {"per_device_train_batch_size", "optim", "output_dir", "gradient_checkpointing",
               "activation_checkpointing"}:
        return "training_args"
    if "r" in keys and keys & {"target_modules", "peft_type", "lora_alpha"}:
        return "lora"
    if keys & {"load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type"}:
        return "bnb"
    if keys & {"attn_implementation", "pretrained_model_name_or_path", "torch_dtype", "dtype"}:
        return "model_kwargs"
    return None


def load_config(path: Path, f: Found, expect: str | None = None) -> None:
    """Read one config file into ``f`` (a DeepSpeed JSON named by another config too)."""
    where = path.name
    if not is_file(path):
        hint = (f" (a relative path is read from the working directory, {Path.cwd()}, as the "
                "training tool reads it)" if expect and not path.is_absolute() else "")
        f.problems.append(f"{path}: no such file{hint}")
        return
    try:
        text = read_text_bounded(path)
        data = parse_json(text, str(path)) if path.suffix == ".json" else \
            parse_yaml(text, str(path), max_text_chars=CONFIG_TEXT_CHARS)
    except InputError as exc:
        f.problems.extend(exc.problems)
        return
    kind = expect or sniff(data)
    if kind is None or not isinstance(data, dict):
        f.problems.append(f"{path}: not a DeepSpeed, accelerate, TrainingArguments, TRL, LLaMA-Factory, "
                          "PEFT, BitsAndBytes, axolotl or torchtune config")
        return
    f.facts.setdefault("kinds", []).append(kind)
    base = path.parent
    used: set[str] = set()
    cfg = Tracked(data, used)
    try:
        ignored, tuning = _read_kind(kind, cfg, f, where, base, text, path)
    except (AttributeError, TypeError, ValueError, KeyError, IndexError, OverflowError):
        # A value of a kind the tool never takes (a list where it takes a mapping, text where it
        # takes a number) where a reader looked for its usual form: named, not a crash.
        f.problems.append(f"{where}: {cfg.wrong_kind()}")
        return
    account(data, used, where, f, ignored, tuning)


def _read_kind(kind: str, cfg: Tracked, f: Found, where: str, base: Path, text: str,
               path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Read ``cfg`` as a config of ``kind``; the keys that kind ignores and those it only tunes."""
    ignored: tuple[str, ...] = ()
    tuning: tuple[str, ...] = ()
    if kind == "deepspeed":
        read_deepspeed(cfg, f, where)
        ignored, tuning = DS_IGNORED, DS_TUNING
    elif kind == "accelerate":
        read_accelerate(cfg, f, where, base, load_config)
        ignored, tuning = ACC_IGNORED + ("deepspeed_config.gradient_clipping",), ACC_TUNING
    elif kind == "training_args":
        read_training_args(cfg, f, where, base, load_config)
        read_model_side(cfg, f, where, "TrainingArguments")
        ignored, tuning = HF_IGNORED + TRL_IGNORED, HF_TUNING
    elif kind == "trl":
        read_trl(cfg, f, where, base)
        ignored, tuning = HF_IGNORED + TRL_IGNORED, HF_TUNING
    elif kind == "llamafactory":
        read_llamafactory(cfg, f, where, base)
        ignored, tuning = HF_IGNORED + LF_IGNORED, HF_TUNING + ("use_reentrant_gc", "upcast_*")
    elif kind == "lora":
        read_lora(cfg, f, where, _extra_fields())
    elif kind == "bnb":
        read_bnb(cfg, f, where)
    elif kind == "model_kwargs":
        read_model_kwargs(cfg, f, where)
    elif kind == "axolotl":
        read_axolotl(cfg, f, where, base)
        ignored, tuning = AX_IGNORED, AX_TUNING
    else:
        read_torchtune(cfg, f, where, text, path.stem)
        ignored, tuning = TT_IGNORED, TT_TUNING
    return ignored, tuning


def read_model_side(cfg: dict, f: Found, where: str, tool: str) -> None:
    """The model-loading keys TRL's ModelConfig and alignment-handbook put beside the Trainer's."""
    if cfg.get("model_name_or_path"):
        f.set("model", cfg["model_name_or_path"], where + ".model_name_or_path")
    read_attention(cfg, f, where)
    read_model_dtype(cfg, f, where)
    mik = cfg.get("model_init_kwargs")
    if isinstance(mik, dict):
        read_attention(mik, f, where + ".model_init_kwargs")
        read_model_dtype(mik, f, where + ".model_init_kwargs")
        if isinstance(mik.get("quantization_config"), dict):
            read_bnb(mik["quantization_config"], f, where + ".model_init_kwargs.quantization_config")


def read_trl(cfg: dict, f: Found, where: str, base: Path) -> None:
    """A TRL script's config (SFTConfig/DPOConfig + ModelConfig + ScriptArguments in one YAML), as
    TRL's CLI and alignment-handbook recipes write it."""
    read_training_args(cfg, f, where, base, load_config, tool="TRL")
    read_model_side(cfg, f, where, "TRL")
    if "seq_len" not in f.values:
        f.default("seq_len", 1024, where + ".max_length", "TRL")
        f.where["seq_len"] = where + ".max_length (default)"
    if _true(cfg.get("use_peft")):
        _read_trl_peft(cfg, f, where)
    else:
        _read_trl_no_peft(cfg, f, where)
    _read_trl_preference(cfg, f, where)
    cfg.get("loss_type")


def _read_trl_peft(cfg: dict, f: Found, where: str) -> None:
    """``use_peft``: LoRA from ModelConfig's ``lora_*`` keys (TRL's defaults noted), and a 4- or
    8-bit bitsandbytes base from ``load_in_*bit``."""
    f.set("method", "lora", where + ".use_peft")
    f.set("lora_rank", cfg.get("lora_r", 16), where + ".lora_r")
    f.set("lora_alpha", cfg.get("lora_alpha", 32), where + ".lora_alpha")
    f.set("lora_dropout", cfg.get("lora_dropout", 0.05), where + ".lora_dropout")
    for key, value in (("lora_r", 16), ("lora_alpha", 32), ("lora_dropout", 0.05)):
        if cfg.get(key) is None:
            f.notes.append(f"{where}.{key}: not set; TRL's default {value!r} applies")
    targets = cfg.get("lora_target_modules")
    if targets is None:
        f.set("lora_targets", ["q", "v"], where + ".lora_target_modules")
        f.notes.append(f"{where}.lora_target_modules: not set; PEFT's default for Llama-like models "
                       "(q_proj, v_proj) applies")
    else:
        _targets(targets, f, where + ".lora_target_modules")
    read_peft_extras(cfg, f, where, {"modules_to_save": "lora_modules_to_save", "use_dora": "use_dora",
                                     "target_parameters": "lora_target_parameters", "use_rslora": "use_rslora"})
    b4, b8 = _true(cfg.get("load_in_4bit")), _true(cfg.get("load_in_8bit"))
    if b4 or b8:
        f.set("method", "qlora", where + (".load_in_4bit" if b4 else ".load_in_8bit"))
        f.set("quant_bits", 4 if b4 else 8, where + ".load_in_*bit")
        if b4:
            f.set("double_quant", _true(cfg.get("use_bnb_nested_quant")), where + ".use_bnb_nested_quant")
        else:
            eight_bit(f, where + ".load_in_8bit")
    cfg.get("bnb_4bit_quant_type")
    cfg.get("bnb_4bit_quant_storage")


def _read_trl_no_peft(cfg: dict, f: Found, where: str) -> None:
    """No ``use_peft``: TRL trains the whole model; the adapter and quantization keys set are noted
    as not applying."""
    lora_keys = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_modules_to_save",
                 "lora_target_parameters", "use_dora", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type",
                 "use_bnb_nested_quant", "bnb_4bit_quant_storage")
    present = [k for k in lora_keys if dict.get(cfg, k) not in (None, False)]
    for key in present:
        cfg.get(key)
    if present:
        f.notes.append(f"{where}: use_peft is not set: {', '.join(present)} do not apply (TRL "
                       "trains the whole model)")
    if "method" not in f.values:
        f.default("method", "full", where + ".use_peft", "TRL")


def _read_trl_preference(cfg: dict, f: Found, where: str) -> None:
    """TRL's preference and RL trainers' keys: warned about as not modelled, and their prompt and
    completion lengths read as the sequence length when the Trainer's is TRL's default."""
    core = [k for k in TRL_RL_CORE if dict.get(cfg, k) is not None]
    if not core:
        return
    for key in cfg:
        if any(fnmatchcase(key, pat) for pat in TRL_RL_KEYS):
            cfg.get(key)
    f.warn(f"{where}.{core[0]}", f"{', '.join(core)}: preference or RL training (a reference "
           "or reward model, chosen and rejected or generated sequences) is not modelled; the "
           "estimate is for supervised fine-tuning of the same model (errs low)")
    prompt, completion = cfg.get("max_prompt_length"), cfg.get("max_completion_length")
    if f.where.get("seq_len", "").endswith(".max_length (default)") and _is_int(prompt) and _is_int(completion):
        f.set("seq_len", prompt + completion, where + ".max_prompt_length+max_completion_length")
        f.notes.append(f"{where}: sequence length read as max_prompt_length + max_completion_length "
                       f"= {prompt + completion}")


def read_llamafactory(cfg: dict, f: Found, where: str, base: Path) -> None:
    """A LLaMA-Factory YAML (``llamafactory-cli train``): its model, method and data arguments and
    the Seq2SeqTrainingArguments beside them."""
    tool = "LLaMA-Factory"
    read_training_args(cfg, f, where, base, load_config, tool=tool)
    if cfg.get("model_name_or_path"):
        f.set("model", cfg["model_name_or_path"], where + ".model_name_or_path")
    _read_lf_stage(cfg, f, where)
    method = _read_lf_method(cfg, f, where)
    _read_lf_quantization(cfg, f, where, method)
    f.take(cfg, "cutoff_len", "seq_len", 2048, where, tool)
    _read_lf_checkpointing(cfg, f, where, tool)
    _read_lf_kernels(cfg, f, where)
    for key, what in (("use_galore", "GaLore"), ("use_apollo", "APOLLO"), ("use_badam", "BAdam"),
                      ("use_adam_mini", "Adam-mini"), ("use_muon", "Muon"), ("use_llama_pro", "LLaMA Pro")):
        if _true(cfg.get(key)):
            f.warn(f"{where}.{key}", f"{what} changes the optimizer or which weights train; not modelled")
    if _true(cfg.get("use_unsloth")):  # Unsloth's FastLanguageModel: its LoRA kernels
        f.set("kernels", "unsloth", where + ".use_unsloth")
    if _true(cfg.get("fp8")):
        f.set("fp8", True, where + ".fp8")


def _read_lf_stage(cfg: dict, f: Found, where: str) -> None:
    """``stage``: supervised (sft, pt) is modelled; the preference and reward stages are warned about."""
    stage = str(cfg.get("stage", "sft"))
    for key in cfg:
        if re.match(r"(pref_|dpo_|kto_|simpo_|ppo_|ref_model|reward_model)", str(key)):
            cfg.get(key)  # read with the stage: they matter only for its trainer
    if stage not in ("sft", "pt"):
        f.warn(where + ".stage", f"{stage!r}: {'a value head' if stage == 'rm' else 'a reference model and paired sequences'}"
               " not modelled; the estimate is for supervised fine-tuning (errs low)")


def _read_lf_method(cfg: dict, f: Found, where: str) -> str:
    """``finetuning_type`` (LLaMA-Factory's default 'lora') and the LoRA keys; returns the method."""
    ft = str(cfg.get("finetuning_type", "lora"))
    if cfg.get("finetuning_type") is None:
        f.notes.append(f"{where}.finetuning_type: not set; LLaMA-Factory's default 'lora' applies")
    if ft == "freeze":
        f.warn(where + ".finetuning_type", "'freeze' trains a few layers only; read as a full "
               "fine-tune (errs high)")
    elif ft == "oft":
        f.warn(where + ".finetuning_type", "'oft' adapters are not modelled; read as LoRA")
    method = "full" if ft in ("full", "freeze") else "lora"
    f.set("method", method, where + ".finetuning_type")
    if method == "lora":
        rank = cfg.get("lora_rank", 8)
        f.set("lora_rank", rank, where + ".lora_rank")
        alpha = cfg.get("lora_alpha")
        f.set("lora_alpha", alpha if alpha is not None else rank * 2, where + ".lora_alpha")
        if alpha is None:
            f.notes.append(f"{where}.lora_alpha: not set; LLaMA-Factory's default (2 × rank = {rank * 2}) applies")
        f.set("lora_dropout", cfg.get("lora_dropout", 0.0), where + ".lora_dropout")
        _targets(cfg.get("lora_target", "all"), f, where + ".lora_target")
        if cfg.get("lora_rank") is None:
            f.notes.append(f"{where}.lora_rank: not set; LLaMA-Factory's default 8 applies")
        if cfg.get("lora_target") is None:
            f.notes.append(f"{where}.lora_target: not set; LLaMA-Factory's default 'all' applies")
        read_peft_extras(cfg, f, where, {"modules_to_save": "additional_target", "use_dora": "use_dora",
                                         "use_rslora": "use_rslora"})
        cfg.get("pissa_init")
    return method


def _read_lf_quantization(cfg: dict, f: Found, where: str, method: str) -> None:
    """``quantization_bit``: a 4- or 8-bit base trained with LoRA (QLoRA); other widths warned about."""
    bits = cfg.get("quantization_bit")
    if bits is None:
        return
    qm = str(cfg.get("quantization_method", "bnb"))
    if method == "full":
        f.problems.append(f"{where}.quantization_bit: a quantized model trains with LoRA only "
                          "(LLaMA-Factory refuses finetuning_type full)")
    elif bits in (4, 8):
        f.set("method", "qlora", where + ".quantization_bit")
        f.set("quant_bits", bits, where + ".quantization_bit")
        if bits == 8:
            eight_bit(f, where + ".quantization_bit")
        else:
            f.set("double_quant", _true(cfg.get("double_quantization", True)),
                  where + ".double_quantization")
        if qm != "bnb":
            f.warn(where + ".quantization_method", f"{qm!r}: read as bitsandbytes' bytes per weight")
    else:
        f.warn(where + ".quantization_bit", f"{bits}-bit ({qm}) bases are not modelled; read as "
               "a 16-bit base (errs high)")
    cfg.get("quantization_type")
    cfg.get("quantization_device_map")


def _read_lf_checkpointing(cfg: dict, f: Found, where: str, tool: str) -> None:
    """Gradient checkpointing (on unless disabled) and Unsloth's, which offloads the activations."""
    if cfg.get("disable_gradient_checkpointing") is not None or cfg.get("gradient_checkpointing") is not None:
        off = _true(cfg.get("disable_gradient_checkpointing"))
        f.set("checkpointing", "none" if off else "full", where + ".disable_gradient_checkpointing")
    else:
        f.default("checkpointing", "full", where + ".disable_gradient_checkpointing", tool)
    if _true(cfg.get("use_unsloth_gc")):
        f.set("checkpointing", "full", where + ".use_unsloth_gc")
        f.set("activation_offload", True, where + ".use_unsloth_gc")


def _read_lf_kernels(cfg: dict, f: Found, where: str) -> None:
    """The attention kernel, Liger's fused loss, and pure BF16 weights."""
    attn = str(cfg.get("flash_attn", "auto"))
    f.set("attention", "eager" if attn == "disabled" else "flash", where + ".flash_attn")
    if attn == "fa2":
        f.facts["asks_fa2"] = where + ".flash_attn"
    if _true(cfg.get("enable_liger_kernel")):
        f.set("loss", "fused", where + ".enable_liger_kernel")
        if not _true(cfg.get("use_unsloth")):  # Liger's RMSNorm (its SwiGLU is not counted)
            f.set("kernels", "fused_rmsnorm", where + ".enable_liger_kernel")
    if _true(cfg.get("pure_bf16")):
        f.set("precision", "bf16", where + ".pure_bf16")


def read_axolotl(cfg: dict, f: Found, where: str, base: Path) -> None:
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
        f.warn(where + ".unfrozen_parameters", f"{_names(unfrozen)}: only these parameters train; the "
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
    if _true(cfg.get("fp8")):
        f.set("fp8", True, where + ".fp8")
    if _true(cfg.get("tiled_mlp")):
        f.warn(where + ".tiled_mlp", "tiled MLP activations are not modelled (errs high)")
    _read_ax_parallelism(cfg, f, where)
    rl = cfg.get("rl")
    if rl:
        f.warn(where + ".rl", f"{rl!r}: preference or RL training (a reference model, paired sequences) "
               "is not modelled; the estimate is for supervised fine-tuning (errs low)")
        for key in ("rl_beta", "dpo_beta", "orpo_alpha", "trl"):
            cfg.get(key)
    _read_ax_sharding(cfg, f, where, base)


def _read_ax_method(cfg: dict, f: Found, where: str) -> str:
    """``adapter``: none is a full fine-tune; LoRA on a quantized base (4- or 8-bit, GPTQ) is QLoRA."""
    adapter = cfg.get("adapter")
    b4, b8 = _true(cfg.get("load_in_4bit")), _true(cfg.get("load_in_8bit"))
    gptq = _true(cfg.get("gptq"))
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
    b4, b8 = _true(cfg.get("load_in_4bit")), _true(cfg.get("load_in_8bit"))
    if _true(cfg.get("gptq")):
        f.set("quant_type", "gptq", where + ".gptq")
        f.set("quant_bits", 4, where + ".gptq")
    elif b8 and not b4:
        f.set("quant_bits", 8, where + ".load_in_8bit")
        eight_bit(f, where + ".load_in_8bit")
    else:
        f.set("quant_bits", 4, where + (".load_in_4bit" if b4 else ".adapter"))
        bnb = cfg.get("bnb_config_kwargs") or {}
        f.set("double_quant", _true(bnb.get("bnb_4bit_use_double_quant", True)),
              where + ".bnb_config_kwargs.bnb_4bit_use_double_quant")
        bnb.get("bnb_4bit_quant_type")


def _read_ax_lora(cfg: dict, f: Found, where: str) -> None:
    """The adapter's rank, alpha, dropout and target modules, and PEFT's other keys (``peft_*``)."""
    read_lora({"r": cfg.get("lora_r"), "lora_alpha": cfg.get("lora_alpha"), "target_modules": [],
               "lora_dropout": cfg.get("lora_dropout")}, f, where, _extra_fields())
    if "lora_rank" in f.values:
        f.where["lora_rank"] = where + ".lora_r"
    linear, modules = _true(cfg.get("lora_target_linear")), cfg.get("lora_target_modules")
    if linear or modules == "all-linear":
        _targets("all-linear", f, where + ".lora_target_linear")
    elif modules is not None:
        _targets(modules, f, where + ".lora_target_modules")
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
        elif _is_int(f.values.get("micro_batch")):
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
    b4, b8 = _true(cfg.get("load_in_4bit")), _true(cfg.get("load_in_8bit"))
    _precision(f, cfg.get("bf16"), cfg.get("fp16"), where, tool)
    if _true(cfg.get("bfloat16")):
        f.set("precision", "bf16", where + ".bfloat16")
        f.facts["asks_bf16"] = where + ".bfloat16"
    elif _true(cfg.get("float16")):
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
        if _true(cfg.get("flash_attention")):
            f.set("attention", "flash", where + ".flash_attention")
            f.facts["asks_fa2"] = where + ".flash_attention"
        elif _true(cfg.get("sdp_attention")) or _true(cfg.get("xformers_attention")) \
                or _true(cfg.get("flex_attention")) or _true(cfg.get("sage_attention")):
            f.set("attention", "flash", where + ".sdp_attention")
        elif _true(cfg.get("eager_attention")):
            f.set("attention", "eager", where + ".eager_attention")
        else:
            f.default("attention", "flash", where + ".flash_attention", "transformers (sdpa)")
    else:
        for key in ("flash_attention", "sdp_attention", "xformers_attention", "flex_attention", "eager_attention"):
            cfg.get(key)


def _read_ax_loss(cfg: dict, f: Found, where: str) -> None:
    """The loss: Liger's or Cut Cross-Entropy's fused one, or the chunked one; Liger's RMSNorm."""
    plugins = " ".join(map(str, cfg.get("plugins") or []))
    if _true(cfg.get("liger_rms_norm")):
        f.set("kernels", "fused_rmsnorm", where + ".liger_rms_norm")
    if _true(cfg.get("liger_fused_linear_cross_entropy")):
        f.set("loss", "fused", where + ".liger_fused_linear_cross_entropy")
        if "liger" not in plugins.lower():
            f.warn(where + ".liger_fused_linear_cross_entropy", "set without the Liger plugin in "
                   "plugins: axolotl will not apply it")
    elif _true(cfg.get("cut_cross_entropy")) or ("CutCrossEntropyPlugin" in plugins
                                                and cfg.get("cut_cross_entropy") is not False):
        # the plugin's cut_cross_entropy defaults to True
        f.set("loss", "cce", where + (".cut_cross_entropy" if cfg.get("cut_cross_entropy") else ".plugins"))
    elif _true(cfg.get("chunked_cross_entropy")):
        f.set("loss", "chunked", where + ".chunked_cross_entropy")
        cfg.get("chunked_cross_entropy_num_chunks")
    if _true(cfg.get("liger_cross_entropy")):
        f.warn(where + ".liger_cross_entropy", "Liger's cross-entropy (logits kept, gradient in place) "
               "is not modelled; read as the standard loss (errs high)")


def _read_ax_parallelism(cfg: dict, f: Found, where: str) -> None:
    """Tensor and context (sequence) parallel sizes, and HSDP's replicas (warned about)."""
    for key, name in (("tensor_parallel_size", "tp"), ("context_parallel_size", "cp"),
                      ("sequence_parallel_degree", "cp")):
        if _is_int(cfg.get(key)) and cfg[key] > 1:
            f.set(name, cfg[key], f"{where}.{key}")
    if _is_int(cfg.get("dp_replicate_size")) and cfg["dp_replicate_size"] > 1:
        f.warn(where + ".dp_replicate_size", "HSDP (replicas of a sharded group): the planner shards "
               "over all data-parallel GPUs (errs low)")
    cfg.get("dp_shard_size")


def _read_ax_sharding(cfg: dict, f: Found, where: str, base: Path) -> None:
    """The DeepSpeed config it names, else its FSDP settings, else no sharding and no offload."""
    if cfg.get("deepspeed"):
        load_config(config_path(str(cfg["deepspeed"]), base, f, where + ".deepspeed"), f, "deepspeed")
        if cfg.get("fsdp") or cfg.get("fsdp_config"):
            f.warn(where + ".fsdp", "both deepspeed and fsdp are set; read DeepSpeed")
    elif cfg.get("fsdp") or cfg.get("fsdp_config"):
        fc = cfg.get("fsdp_config") or {}
        read_hf_fsdp(cfg.get("fsdp") or ["full_shard"], fc, f, where, version=cfg.get("fsdp_version"))
    else:
        f.set("zero", 0, where + " (no deepspeed or fsdp)")
        f.set("offload", "none", where + " (no deepspeed or fsdp)")


def _names(v: Any) -> str:
    return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


TUNE_RECIPE = re.compile(r"\b([a-z0-9_]+_(?:distributed|single_device))(?:\.py)?\b")


def torchtune_launch(text: str, stem: str) -> tuple[str | None, int | None, str]:
    """The recipe a torchtune config's header comment names (``tune run --nproc_per_node 4
    full_finetune_distributed --config …``): distributed or single-device, and its process count."""
    header = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    recipes = TUNE_RECIPE.findall(header)
    kind = None
    if recipes:
        kind = "distributed" if any(r.endswith("distributed") for r in recipes) else "single_device"
    elif stem.endswith("single_device"):
        kind = "single_device"
    nproc = re.search(r"--nproc[_-]per[_-]node[ =](\d+)", header)
    nnodes = re.search(r"--nnodes[ =](\d+)", header)
    gpus = int(nproc.group(1)) * (int(nnodes.group(1)) if nnodes else 1) if nproc else None
    return kind, gpus, (recipes[0] if recipes else stem)


def read_torchtune(cfg: dict, f: Found, where: str, text: str = "", stem: str = "") -> None:
    model = cfg.get("model") or {}
    method = _read_tt_model(model, f, where)
    if method:
        _read_tt_lora(model, f, where)
    f.take(cfg, "batch_size", "micro_batch", 1, where, "torchtune")
    f.take(cfg, "gradient_accumulation_steps", "grad_accum", 1, where, "torchtune")
    dtype = str(cfg.get("dtype", "bf16"))
    f.set("precision", "fp32" if dtype == "fp32" else "bf16", where + ".dtype")
    if dtype != "fp32":
        f.facts["asks_bf16"] = where + ".dtype"
    f.set("checkpointing", "full" if _true(cfg.get("enable_activation_checkpointing")) else "none",
          where + ".enable_activation_checkpointing")
    if _true(cfg.get("enable_activation_offloading")):
        f.set("activation_offload", True, where + ".enable_activation_offloading")
    f.set("attention", "flash", where + " (torchtune uses SDPA)")
    _read_tt_optimizer(cfg, f, where)
    if _true(cfg.get("compile")):
        f.set("compile", True, where + ".compile")
    _read_tt_loss(cfg, f, where)
    tokenizer = cfg.get("tokenizer")
    seq = count(tokenizer, "max_seq_len", f, where + ".tokenizer") if isinstance(tokenizer, dict) else None
    if seq is not None:
        f.set("seq_len", seq, where + ".tokenizer.max_seq_len")
    for key in ("teacher_model", "ref_policy_model", "reward_and_value_model", "ref_model", "quantizer"):
        if cfg.get(key):
            f.warn(f"{where}.{key}", "a second model or a quantizer beside the one trained is not "
                   "modelled (errs low)" if key != "quantizer" else
                   "quantization-aware training's fake-quantized weights and activations are not modelled")
    _read_tt_sharding(cfg, f, where, text, stem)


def _read_tt_model(model: dict, f: Found, where: str) -> str | None:
    """The model builder (``model._component_``): the method, the catalog's model, a QLoRA base.
    Returns the adapter method (None for a full fine-tune)."""
    method, names = torchtune_model_name(str(model.get("_component_", "")))
    if method and _true(model.get("quantize_base")):
        method = "qlora"
    f.set("method", method or "full", where + ".model._component_")
    for name in names:
        try:
            f.set("model", catalog.get_model(name).id, where + ".model._component_")
            break
        except UnknownName:
            continue
    else:
        f.notes.append(f"{where}.model._component_: {model.get('_component_')!r} is not a model the "
                       "planner knows; give --model")
    if method == "qlora":
        f.set("quant_type", "torchao-nf4", where + ".model._component_")
        f.set("quant_bits", 4, where + ".model._component_")
    return method


def _read_tt_lora(model: dict, f: Found, where: str) -> None:
    """A LoRA builder's rank, alpha, dropout and the modules it adapts (attention, MLP, output)."""
    read_lora({"r": model.get("lora_rank"), "lora_alpha": model.get("lora_alpha"), "target_modules": [],
               "lora_dropout": model.get("lora_dropout")}, f, where + ".model", _extra_fields())
    f.where["lora_rank"] = where + ".model.lora_rank"
    mods = list(model.get("lora_attn_modules") or [])
    mods += ["gate_proj", "up_proj", "down_proj"] if _true(model.get("apply_lora_to_mlp")) else []
    mods += ["lm_head"] if _true(model.get("apply_lora_to_output")) else []
    _targets(mods, f, where + ".model.lora_attn_modules")
    if _true(model.get("use_dora")):
        f.warn(where + ".model.use_dora", "DoRA's magnitude vectors and its extra activations are not "
               "modelled; read as LoRA (errs low)")


def _read_tt_optimizer(cfg: dict, f: Found, where: str) -> None:
    """``optimizer._component_`` (paged or not), and the optimizer stepped in backward."""
    opt = cfg.get("optimizer") or {}
    comp = str(opt.get("_component_", "")).rsplit(".", 1)[-1]
    if comp in TT_OPTIM:
        f.set("optimizer", TT_OPTIM[comp], where + ".optimizer._component_")
        if comp in ("PagedAdamW", "PagedAdamW32bit"):
            f.set("optimizer_paged", True, where + ".optimizer._component_")
    elif opt:
        bad_optimizer(f, where + ".optimizer._component_", opt.get("_component_"), "AdamW, 8-bit or paged AdamW, SGD")
    if _true(cfg.get("optimizer_in_bwd")):
        f.set("optimizer_step", "in_backward", where + ".optimizer_in_bwd")


def _read_tt_loss(cfg: dict, f: Found, where: str) -> None:
    """``loss._component_``: the standard, chunked or fused cross-entropy; any other is warned about."""
    loss = cfg.get("loss") or {}
    lname = str(loss.get("_component_", "")).rsplit(".", 1)[-1]
    if lname in TT_LOSS:
        f.set("loss", TT_LOSS[lname], where + ".loss._component_")
    elif lname:
        cfg.whole("loss")
        f.warn(where + ".loss._component_", f"{lname}: a loss the planner does not model"
               + ("; preference training (a reference model, chosen and rejected sequences) is read as "
                  "supervised fine-tuning (errs low)" if "rlhf" in str(loss.get("_component_")) else ""))


def _read_tt_sharding(cfg: dict, f: Found, where: str, text: str, stem: str) -> None:
    """FSDP sharding and CPU offload, tensor parallelism and the GPU count of a distributed recipe;
    none on a single device."""
    # one GPU or many: the recipe the header names, else the distributed-only keys
    kind, header_gpus, recipe = torchtune_launch(text, stem)
    nested = cfg.get("fsdp") if isinstance(cfg.get("fsdp"), dict) else {}
    dist_keys = [k for k in ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "tensor_parallel_dim",
                             "data_parallel_shard_dim", "data_parallel_replicate_dim",
                             "custom_sharded_layers", "fsdp") if dict.__contains__(cfg, k)]
    if kind is None:
        kind = "distributed" if dist_keys else "single_device"
        why = f"{where}.{dist_keys[0]}" if dist_keys else f"{where} (no recipe named, no FSDP key)"
    else:
        why = f"{where} (header: {recipe})"
    offload = _true(cfg.get("fsdp_cpu_offload")) or _true(nested.get("cpu_offload"))
    if _true(nested.get("cpu_offload")) and not _true(cfg.get("fsdp_cpu_offload")):
        f.notes.append(f"{where}.fsdp.cpu_offload: the key of torchtune's FSDP2 dev recipes (before "
                       "September 2024); today's recipes read fsdp_cpu_offload")
    if kind == "distributed":
        _read_tt_distributed(cfg, f, where, why, offload, nested, header_gpus)
    else:
        f.set("zero", 0, why)
        f.set("offload", "none", why)
        if offload:
            f.warn(where + ".fsdp_cpu_offload", "set on a single-device recipe, which does not read it")


def _read_tt_distributed(cfg: dict, f: Found, where: str, why: str, offload: bool, nested: dict,
                         header_gpus: int | None) -> None:
    """A distributed recipe: FSDP2 (resharded after forward unless told not to: ZeRO-3, else 2),
    its CPU offload, the header's GPU count, tensor parallelism, and HSDP replicas (warned about)."""
    reshard = cfg.get("fsdp_reshard_after_forward", True)
    stage = 3 if _true(reshard) else 2
    f.set("zero", stage, why)
    f.set("offload", ("optimizer+params" if stage == 3 else "optimizer") if offload else "none",
          where + (".fsdp.cpu_offload" if _true(nested.get("cpu_offload")) else ".fsdp_cpu_offload"))
    f.set("fsdp_version", 2, why)
    if header_gpus:
        f.set("gpus", header_gpus, where + " (header: --nproc_per_node)")
        f.notes.append(f"{where}: {header_gpus} GPUs from the launch command in its header comment")
    tp = cfg.get("tensor_parallel_dim")
    if _is_int(tp) and tp > 1:
        f.set("tp", tp, where + ".tensor_parallel_dim")
    rep = cfg.get("data_parallel_replicate_dim")
    if _is_int(rep) and rep > 1:
        f.warn(where + ".data_parallel_replicate_dim", f"{rep}: HSDP (replicas of a sharded group): "
               "the planner shards over all data-parallel GPUs (errs low)")


def read_configs(paths: list[Path]) -> Found:
    f = Found()
    for path in paths:
        load_config(Path(path), f)
    sharded = "deepspeed" in f.facts or "fsdp" in f.facts
    if f.facts.get("model_dtype") == "bfloat16" and f.values.get("precision") == "mixed" \
            and f.values.get("method", "full") == "full":
        if sharded:
            what = "DeepSpeed" if "deepspeed" in f.facts else "FSDP (accelerate upcasts trainable weights)"
            f.notes.append(f"{f.facts.get('model_dtype_where', 'model dtype')}: BF16 weights, but {what} "
                           "keeps FP32 master weights: read as mixed precision")
        else:
            f.set("precision", "bf16", f"{f.facts.get('model_dtype_where', 'model dtype bfloat16')} with "
                  "bf16 (no FP32 master)")
    if f.problems:
        raise InputError(f.problems)
    return f


def _flat(raw: dict[str, Any]) -> set[str]:
    keys = {k for k in raw if k in FLAG_SECTIONS}
    for section in ("workload", "layout"):
        keys |= set(raw.get(section) or {})
    return keys


def merge_configs(raw: dict[str, Any], overlay: dict[str, Any], paths: list[Path], *,
                  for_plan: bool = False) -> tuple[dict[str, Any], Found]:
    """The scenario ``raw`` with the configs' values under the command-line ``overlay``."""
    f = read_configs(paths)
    values = dict(f.values)
    given = _flat(raw) | _flat(overlay)
    if "gpus" not in values and "ds_world" in f.facts and "dp" not in given and "gpus" not in given:
        tp, pp, cp = (values.get(k, 1) for k in ("tp", "pp", "cp"))
        values["gpus"] = f.facts["ds_world"] * tp * pp * cp
    if for_plan:
        if "micro_batch" in values and "global_batch" not in given:
            world = f.facts.get("ds_world") or (values.get("gpus") if "gpus" in values else None)
            if world is not None:
                tp, pp, cp = (values.get(k, 1) for k in ("tp", "pp", "cp"))
                dp = world if f.facts.get("ds_world") else max(1, world // (tp * pp * cp))
                values["global_batch"] = values["micro_batch"] * values.get("grad_accum", 1) * dp
        kept = {k: v for k, v in values.items() if k in PLAN_KEYS}
        left = sorted(k for k in values if k not in PLAN_KEYS and k != "grad_accum")
        if left:
            f.notes.append("left to the search: " + ", ".join(f"{k} {values[k]}" for k in left))
        values = kept
    if "grad_accum" in values and "global_batch" in given:
        values.pop("grad_accum")  # the user's global batch decides; checks compare the two
    section: dict[str, Any] = {}
    for key, value in values.items():
        where = FLAG_SECTIONS.get(key, "workload" if key in Workload.model_fields else "layout")
        if where:
            section.setdefault(where, {})[key] = value
        else:
            section[key] = value
    merged = deep_merge(deep_merge(raw, section), overlay)
    have = given | set(values)
    required = REQUIRED_PLAN if for_plan else REQUIRED_ESTIMATE
    missing = [k for k in required if k not in have]
    if not for_plan and merged.get("layout", {}).get("zero", 0) and not have & {"gpus", "dp"}:
        missing.append("gpus")
    if missing:
        kinds = ", ".join(dict.fromkeys(f.facts.get("kinds", [])))
        why = {"optimizer": f.facts["optimizer_unread"]} if "optimizer_unread" in f.facts else {}
        raise InputError([f"{k}: not set by the {kinds} config(s) given"
                          + (f" ({why[k]})" if k in why else "") + f"; give --{k.replace('_', '-')}"
                          for k in missing])
    return merged, f
