"""A TRL script's config (SFTConfig/DPOConfig + ModelConfig + ScriptArguments in one YAML), as
TRL's CLI and alignment-handbook recipes write it: the Trainer's arguments, ``use_peft``'s LoRA and
quantized base, and the preference and RL trainers' keys."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

from planner.launch.importers.common import is_int, is_true
from planner.launch.importers.found import Found
from planner.launch.importers.hf_model import eight_bit, read_model_side
from planner.launch.importers.hf_trainer import read_training_args
from planner.launch.importers.peft import read_peft_extras, read_targets

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
#: TRL's preference and RL trainers (DPO, ORPO, KTO, GRPO…): keys that only they have. Any of the
#: first set means a reference or reward model and paired or generated sequences.
TRL_RL_CORE = ("beta", "max_prompt_length", "max_completion_length", "rpo_alpha", "num_generations",
               "reward_funcs", "precompute_ref_log_probs", "cpo_alpha", "simpo_gamma", "reference_free")
TRL_RL_KEYS = TRL_RL_CORE + ("ref_model_*", "ref_adapter_name", "sync_ref_model", "use_vllm", "vllm_*",
                             "temperature", "top_p", "top_k", "log_completions", "ds3_gather_for_generation",
                             "num_iterations", "epsilon*", "scale_rewards", "reward_weights", "loss_type",
                             "generation_batch_size", "label_smoothing", "f_divergence_type",
                             "use_weighting", "ld_alpha", "mask_truncated_completions", "importance_sampling_level")


def read_trl(cfg: dict, f: Found, where: str, base: Path, load) -> None:
    """A TRL script's config (SFTConfig/DPOConfig + ModelConfig + ScriptArguments in one YAML), as
    TRL's CLI and alignment-handbook recipes write it."""
    read_training_args(cfg, f, where, base, load, tool="TRL")
    read_model_side(cfg, f, where, "TRL")
    if "seq_len" not in f.values:
        f.default("seq_len", 1024, where + ".max_length", "TRL")
        f.where["seq_len"] = where + ".max_length (default)"
    if is_true(cfg.get("use_peft")):
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
        read_targets(targets, f, where + ".lora_target_modules")
    read_peft_extras(cfg, f, where, {"modules_to_save": "lora_modules_to_save", "use_dora": "use_dora",
                                     "target_parameters": "lora_target_parameters", "use_rslora": "use_rslora"})
    b4, b8 = is_true(cfg.get("load_in_4bit")), is_true(cfg.get("load_in_8bit"))
    if b4 or b8:
        f.set("method", "qlora", where + (".load_in_4bit" if b4 else ".load_in_8bit"))
        f.set("quant_bits", 4 if b4 else 8, where + ".load_in_*bit")
        if b4:
            f.set("double_quant", is_true(cfg.get("use_bnb_nested_quant")), where + ".use_bnb_nested_quant")
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
    if f.where.get("seq_len", "").endswith(".max_length (default)") and is_int(prompt) and is_int(completion):
        f.set("seq_len", prompt + completion, where + ".max_prompt_length+max_completion_length")
        f.notes.append(f"{where}: sequence length read as max_prompt_length + max_completion_length "
                       f"= {prompt + completion}")
