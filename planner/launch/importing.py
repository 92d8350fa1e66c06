"""``--config``: read the configs a user has into a scenario, and say what they leave out.

Order of precedence: the scenario file, then the configs, then command-line flags. A field that
changes the memory and that none of them sets is an error naming the flag that gives it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from planner import catalog
from planner.catalog.store import UnknownName
from planner.core.errors import InputError
from planner.launch.readers import (HF_OPTIM, Found, _is_int, _precision, _targets, read_accelerate,
                                    read_bnb, read_deepspeed, read_lora, read_model_kwargs,
                                    read_training_args, torchtune_model_name)
from planner.scenario.resolve import FLAG_SECTIONS, deep_merge
from planner.core.specs import Layout, Workload

CONFIG_HELP = ("A config you have: DeepSpeed JSON, accelerate YAML, TrainingArguments JSON, PEFT "
               "LoraConfig, BitsAndBytesConfig, model kwargs, axolotl or torchtune YAML (repeatable).")
#: What the memory depends on: each must come from the scenario, a config or a flag.
REQUIRED_ESTIMATE = ("model", "method", "precision", "optimizer", "seq_len", "micro_batch",
                     "checkpointing", "attention", "zero")
REQUIRED_PLAN = ("model", "method", "precision", "optimizer", "seq_len")
#: What a plan keeps from a config: what is trained. The layout is the search's to choose.
PLAN_KEYS = ("model", "method", "precision", "optimizer", "seq_len", "global_batch", "lora_rank",
             "lora_alpha", "lora_targets", "quant_bits", "double_quant", "lora_dropout")
TT_OPTIM = {"AdamW": "adamw", "Adam": "adamw", "AdamW8bit": "adam8bit", "PagedAdamW8bit": "paged_adamw8bit",
            "SGD": "sgd", "PagedAdamW": "adamw"}


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
    if keys & {"distributed_type", "compute_environment", "num_machines"}:
        return "accelerate"
    if keys & {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"}:
        return "deepspeed"
    if keys & {"per_device_train_batch_size", "optim", "output_dir", "gradient_checkpointing"}:
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
    if not path.is_file():
        f.problems.append(f"{path}: no such file")
        return
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError, UnicodeDecodeError) as exc:
        f.problems.append(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                          f"{str(exc).splitlines()[0]}")
        return
    kind = expect or sniff(data)
    if kind is None or not isinstance(data, dict):
        f.problems.append(f"{path}: not a DeepSpeed, accelerate, TrainingArguments, PEFT, "
                          "BitsAndBytes, axolotl or torchtune config")
        return
    f.facts.setdefault("kinds", []).append(kind)
    base = path.parent
    if kind == "deepspeed":
        read_deepspeed(data, f, where)
    elif kind == "accelerate":
        read_accelerate(data, f, where, base, load_config)
    elif kind == "training_args":
        read_training_args(data, f, where, base, load_config)
    elif kind == "lora":
        read_lora(data, f, where, _extra_fields())
    elif kind == "bnb":
        read_bnb(data, f, where)
    elif kind == "model_kwargs":
        read_model_kwargs(data, f, where)
    elif kind == "axolotl":
        read_axolotl(data, f, where, base)
    else:
        read_torchtune(data, f, where)


def read_axolotl(cfg: dict, f: Found, where: str, base: Path) -> None:
    if cfg.get("base_model"):
        f.set("model", cfg["base_model"], where + ".base_model")
    adapter = cfg.get("adapter")
    quant = cfg.get("load_in_4bit") or cfg.get("load_in_8bit")
    method = "full" if not adapter else ("qlora" if adapter == "qlora" or quant else "lora")
    f.set("method", method, where + ".adapter")
    if method == "qlora":
        f.set("quant_bits", 8 if cfg.get("load_in_8bit") and not cfg.get("load_in_4bit") else 4,
              where + ".load_in_*bit")
    if method != "full":
        read_lora({"r": cfg.get("lora_r"), "lora_alpha": cfg.get("lora_alpha"),
                   "lora_dropout": cfg.get("lora_dropout")}, f, where, _extra_fields())
        if cfg.get("lora_target_linear"):
            _targets("all-linear", f, where + ".lora_target_linear")
        else:
            _targets(cfg.get("lora_target_modules"), f, where + ".lora_target_modules")
    if _is_int(cfg.get("sequence_len")):
        f.set("seq_len", cfg["sequence_len"], where + ".sequence_len")
    f.take(cfg, "micro_batch_size", "micro_batch", 1, where, "axolotl")
    f.take(cfg, "gradient_accumulation_steps", "grad_accum", 1, where, "axolotl")
    _precision(f, cfg.get("bf16"), cfg.get("fp16"), where, "axolotl")
    f.set("checkpointing", "full" if cfg.get("gradient_checkpointing") else "none",
          where + ".gradient_checkpointing")
    optim = str(cfg.get("optimizer", "adamw_torch"))
    if optim in HF_OPTIM:
        f.set("optimizer", HF_OPTIM[optim], where + ".optimizer")
    else:
        f.problems.append(f"{where}.optimizer: {optim!r} has no memory rule in planner; give --optimizer")
    if cfg.get("flash_attention"):
        f.set("attention", "flash", where + ".flash_attention")
        f.facts["asks_fa2"] = where + ".flash_attention"
    elif cfg.get("sdp_attention") or cfg.get("xformers_attention") or cfg.get("flex_attention"):
        f.set("attention", "flash", where + ".sdp_attention")
    elif cfg.get("eager_attention"):
        f.set("attention", "eager", where + ".eager_attention")
    else:
        f.default("attention", "flash", where + ".flash_attention", "transformers (sdpa)")
    if cfg.get("deepspeed"):
        load_config(base / cfg["deepspeed"], f, "deepspeed")
    elif cfg.get("fsdp") or cfg.get("fsdp_config"):
        fc = cfg.get("fsdp_config") or {}
        read_training_args({"fsdp": cfg.get("fsdp") or ["full_shard"], "fsdp_config": {
            "activation_checkpointing": fc.get("fsdp_activation_checkpointing") or fc.get(
                "activation_checkpointing")}, **{k: cfg[k] for k in ("bf16", "fp16") if k in cfg},
            "optim": optim if optim in HF_OPTIM else "adamw_torch", "gradient_checkpointing":
            cfg.get("gradient_checkpointing") or fc.get("fsdp_activation_checkpointing"),
            "per_device_train_batch_size": cfg.get("micro_batch_size", 1),
            "gradient_accumulation_steps": cfg.get("gradient_accumulation_steps", 1)}, f, where, base, load_config)
        if fc.get("fsdp_offload_params") or fc.get("offload_params"):
            f.set("offload", "optimizer+params", where + ".fsdp_config.fsdp_offload_params")
    else:
        f.set("zero", 0, where + " (no deepspeed or fsdp)")
        f.set("offload", "none", where + " (no deepspeed or fsdp)")


def read_torchtune(cfg: dict, f: Found, where: str) -> None:
    model = cfg.get("model") or {}
    method, names = torchtune_model_name(str(model.get("_component_", "")))
    f.set("method", method or "full", where + ".model._component_")
    for name in names:
        try:
            f.set("model", catalog.get_model(name).id, where + ".model._component_")
            break
        except UnknownName:
            continue
    if method:
        read_lora({"r": model.get("lora_rank"), "lora_alpha": model.get("lora_alpha"),
                   "lora_dropout": model.get("lora_dropout")}, f, where + ".model", _extra_fields())
        mods = list(model.get("lora_attn_modules") or [])
        mods += ["gate_proj", "up_proj", "down_proj"] if model.get("apply_lora_to_mlp") else []
        mods += ["lm_head"] if model.get("apply_lora_to_output") and "lm_head" in str(
            Workload.model_fields["lora_targets"].annotation) else []
        _targets(mods, f, where + ".model.lora_attn_modules")
    f.take(cfg, "batch_size", "micro_batch", 1, where, "torchtune")
    f.take(cfg, "gradient_accumulation_steps", "grad_accum", 1, where, "torchtune")
    dtype = cfg.get("dtype", "bf16")
    f.set("precision", "fp32" if dtype == "fp32" else "bf16", where + ".dtype")
    if dtype != "fp32":
        f.facts["asks_bf16"] = where + ".dtype"
    f.set("checkpointing", "full" if cfg.get("enable_activation_checkpointing") else "none",
          where + ".enable_activation_checkpointing")
    f.set("attention", "flash", where + " (torchtune uses SDPA)")
    opt = str((cfg.get("optimizer") or {}).get("_component_", "")).rsplit(".", 1)[-1]
    if opt in TT_OPTIM:
        f.set("optimizer", TT_OPTIM[opt], where + ".optimizer._component_")
    seq = (cfg.get("tokenizer") or {}).get("max_seq_len")
    if _is_int(seq):
        f.set("seq_len", seq, where + ".tokenizer.max_seq_len")
    sharded = any(k in cfg for k in ("fsdp_cpu_offload", "fsdp_sharding_strategy", "tensor_parallel_dim"))
    f.set("zero", 3 if sharded else 0, where + (".fsdp_*" if sharded else " (single-device recipe)"))
    f.set("offload", "optimizer+params" if cfg.get("fsdp_cpu_offload") else "none", where + ".fsdp_cpu_offload")
    if _is_int(cfg.get("tensor_parallel_dim")) and cfg["tensor_parallel_dim"] > 1:
        f.set("tp", cfg["tensor_parallel_dim"], where + ".tensor_parallel_dim")
    if cfg.get("enable_activation_offloading") and "activation_offload" in _extra_fields():
        f.set("activation_offload", True, where + ".enable_activation_offloading")


def read_configs(paths: list[Path]) -> Found:
    f = Found()
    for path in paths:
        load_config(Path(path), f)
    if f.facts.get("model_dtype") == "bfloat16" and f.values.get("precision") == "mixed" \
            and f.values.get("method", "full") == "full":
        f.set("precision", "bf16", "model dtype bfloat16 with bf16 (no FP32 master)")
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
                values["global_batch"] = values["micro_batch"] * values.get("grad_accum", 1) * world
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
        raise InputError([f"{k}: not set by the {kinds} config(s) given; give --{k.replace('_', '-')}"
                          for k in missing])
    return merged, f
