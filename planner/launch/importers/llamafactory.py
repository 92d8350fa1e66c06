"""A LLaMA-Factory YAML (``llamafactory-cli train``): its stage, fine-tuning type, LoRA and
quantization keys, cut-off length, checkpointing and kernels, over the Trainer's arguments."""

from __future__ import annotations

import re
from pathlib import Path

from planner.launch.importers.common import is_true
from planner.launch.importers.found import Found
from planner.launch.importers.hf_model import eight_bit
from planner.launch.importers.hf_trainer import read_training_args
from planner.launch.importers.peft import read_peft_extras, read_targets

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


def read_llamafactory(cfg: dict, f: Found, where: str, base: Path, load) -> None:
    """A LLaMA-Factory YAML (``llamafactory-cli train``): its model, method and data arguments and
    the Seq2SeqTrainingArguments beside them."""
    tool = "LLaMA-Factory"
    read_training_args(cfg, f, where, base, load, tool=tool)
    if cfg.get("model_name_or_path"):
        f.set("model", cfg["model_name_or_path"], where + ".model_name_or_path")
    _read_lf_stage(cfg, f, where)
    method = _read_lf_method(cfg, f, where)
    _read_lf_quantization(cfg, f, where, method)
    f.take(cfg, "cutoff_len", "seq_len", 2048, where, tool)
    _read_lf_checkpointing(cfg, f, where, tool)
    _read_lf_kernels(cfg, f, where)
    for key, what in (("use_galore", "GaLore"), ("use_apollo", "APOLLO"), ("use_badam", "BAdam"),
                      ("use_adam_mini", "Adam-mini"), ("use_llama_pro", "LLaMA Pro")):
        if is_true(cfg.get(key)):
            f.warn(f"{where}.{key}", f"{what} changes the optimizer or which weights train; not modelled")
    if is_true(cfg.get("use_muon")):  # Muon on the 2-D weights, AdamW on the rest
        f.set("optimizer", "muon", where + ".use_muon")
    if is_true(cfg.get("use_unsloth")):  # Unsloth's FastLanguageModel: its LoRA kernels
        f.set("kernels", "unsloth", where + ".use_unsloth")
    if is_true(cfg.get("fp8")):
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
        read_targets(cfg.get("lora_target", "all"), f, where + ".lora_target")
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
            f.set("double_quant", is_true(cfg.get("double_quantization", True)),
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
        off = is_true(cfg.get("disable_gradient_checkpointing"))
        f.set("checkpointing", "none" if off else "full", where + ".disable_gradient_checkpointing")
    else:
        f.default("checkpointing", "full", where + ".disable_gradient_checkpointing", tool)
    if is_true(cfg.get("use_unsloth_gc")):
        f.set("checkpointing", "full", where + ".use_unsloth_gc")
        f.set("activation_offload", True, where + ".use_unsloth_gc")


def _read_lf_kernels(cfg: dict, f: Found, where: str) -> None:
    """The attention kernel, Liger's fused loss, and pure BF16 weights."""
    attn = str(cfg.get("flash_attn", "auto"))
    f.set("attention", "eager" if attn == "disabled" else "flash", where + ".flash_attn")
    if attn == "fa2":
        f.facts["asks_fa2"] = where + ".flash_attn"
    if is_true(cfg.get("enable_liger_kernel")):
        f.set("loss", "fused", where + ".enable_liger_kernel")
        if not is_true(cfg.get("use_unsloth")):  # Liger's RMSNorm, rotary and SwiGLU
            f.set("kernels", "liger", where + ".enable_liger_kernel")
    if is_true(cfg.get("pure_bf16")):
        f.set("precision", "bf16", where + ".pure_bf16")
