"""Readers of the configs people already have: each fills a :class:`Found` with flat scenario keys.

A value the config sets is read as set. A value the consuming tool defaults when it is absent is
read as that default, with a note saying so. A value the tool does not hold at all (DeepSpeed has
no sequence length) is left out, so that the caller can report it as missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.launch.common import PEFT_MODULES


@dataclass
class Found:
    """Flat scenario keys read from configs, where each came from, notes and problems."""

    values: dict[str, Any] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Raw facts the checks need (the config's own words: bf16 asked, FA2 asked, TP…).
    facts: dict[str, Any] = field(default_factory=dict)

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


HF_OPTIM = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "adamw_apex_fused": "adamw",
    "adamw_torch_xla": "adamw", "adamw_torch_npu_fused": "adamw", "adamw": "adamw", "adam": "adamw",
    "paged_adamw_32bit": "adamw", "adamw_bnb_8bit": "adam8bit", "adamw_8bit": "adam8bit",
    "adam8bit": "adam8bit", "paged_adamw_8bit": "paged_adamw8bit", "paged_adam_8bit": "paged_adamw8bit",
    "sgd": "sgd",
}
DS_OPTIM = {"adam": "adamw", "adamw": "adamw", "fusedadam": "adamw", "cpuadam": "adamw", "sgd": "sgd"}
PEFT_TARGETS = {v: k for k, v in PEFT_MODULES.items()} | {"output_proj": "o", "lm_head": "lm_head"}
FSDP_STAGE = {"FULL_SHARD": 3, "HYBRID_SHARD": 3, "SHARD_GRAD_OP": 2, "_HYBRID_SHARD_ZERO2": 2,
              "NO_SHARD": 0, "1": 3, "2": 2, "3": 0, "4": 3, "5": 2}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _precision(f: Found, bf16: Any, fp16: Any, where: str, tool: str) -> None:
    if bf16 in (True, "auto") or str(bf16).lower() == "true":
        f.set("precision", "mixed", where + ".bf16")
        f.facts["asks_bf16"] = where + ".bf16"
        if bf16 == "auto":
            f.notes.append(f"{where}.bf16: 'auto' read as BF16 mixed precision")
    elif fp16 in (True, "auto") or str(fp16).lower() == "true":
        f.set("precision", "fp16", where + ".fp16")
    elif bf16 is None and fp16 is None:
        f.default("precision", "fp32", where + ".bf16/fp16", tool)
    else:
        f.set("precision", "fp32", where + ".bf16/fp16")


def read_deepspeed(cfg: dict, f: Found, where: str) -> None:
    mb, ga, tb = (cfg.get(k) for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                       "train_batch_size"))
    if _is_int(mb):
        f.set("micro_batch", mb, where + ".train_micro_batch_size_per_gpu")
    if _is_int(ga):
        f.set("grad_accum", ga, where + ".gradient_accumulation_steps")
    if _is_int(tb):
        f.facts["train_batch_size"] = (tb, where + ".train_batch_size")
        if _is_int(mb) and _is_int(ga) and tb % (mb * ga) == 0:
            f.facts["ds_world"] = tb // (mb * ga)
    bf16 = (cfg.get("bf16") or cfg.get("bfloat16") or {}).get("enabled")
    fp16 = (cfg.get("fp16") or {}).get("enabled")
    if "precision" not in f.values or bf16 is not None or fp16 is not None:
        if bf16 == "auto" or fp16 == "auto":
            f.notes.append(f"{where}: bf16/fp16 'auto' follows the Trainer's arguments")
        else:
            _precision(f, bf16 or None, fp16 or None, where, "DeepSpeed")
    if (cfg.get("bf16") or {}).get("bf16_master_weights_and_grads"):
        f.set("precision", "bf16", where + ".bf16.bf16_master_weights_and_grads")
    zero = cfg.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if _is_int(stage):
        f.set("zero", stage, where + ".zero_optimization.stage")
        if "stage" not in zero:
            f.notes.append(f"{where}.zero_optimization.stage: not set; DeepSpeed's default 0 applies")
    dev_opt = (zero.get("offload_optimizer") or {}).get("device", "none")
    dev_par = (zero.get("offload_param") or {}).get("device", "none")
    offload = "optimizer+params" if dev_par in ("cpu", "nvme") else (
        "optimizer" if dev_opt in ("cpu", "nvme") else "none")
    f.set("offload", offload, where + ".zero_optimization.offload_*")
    opt = (cfg.get("optimizer") or {}).get("type")
    if opt is not None:
        name = DS_OPTIM.get(str(opt).lower())
        if name is None:
            f.problems.append(f"{where}.optimizer.type: {opt!r} has no memory rule in planner "
                              "(AdamW, Adam or SGD; or give --optimizer)")
        else:
            f.set("optimizer", name, where + ".optimizer.type")
    autotp = (cfg.get("tensor_parallel") or {}).get("autotp_size")
    if _is_int(autotp) and autotp > 1:
        f.set("tp", autotp, where + ".tensor_parallel.autotp_size")
    if _is_int(cfg.get("sequence_parallel_size")) and cfg["sequence_parallel_size"] > 1:
        f.set("cp", cfg["sequence_parallel_size"], where + ".sequence_parallel_size")


def read_accelerate(cfg: dict, f: Found, where: str, base: Path, load) -> None:
    mp = cfg.get("mixed_precision", "no")
    f.set("precision", {"bf16": "mixed", "fp16": "fp16", "fp8": "mixed"}.get(str(mp), "fp32"),
          where + ".mixed_precision")
    if mp == "bf16":
        f.facts["asks_bf16"] = where + ".mixed_precision"
    if _is_int(cfg.get("num_processes")):
        f.set("gpus", cfg["num_processes"], where + ".num_processes")
    kind = str(cfg.get("distributed_type", "NO")).upper()
    if kind == "FSDP":
        fc = cfg.get("fsdp_config") or {}
        if str(fc.get("fsdp_version", 1)) == "2":
            stage = 3 if fc.get("fsdp_reshard_after_forward", True) in (True, "FULL_SHARD") else 2
        else:
            stage = FSDP_STAGE.get(str(fc.get("fsdp_sharding_strategy", "FULL_SHARD")).upper(), 3)
        f.set("zero", stage, where + ".fsdp_config.fsdp_sharding_strategy")
        off = bool(fc.get("fsdp_offload_params", False))
        f.set("offload", ("optimizer+params" if stage == 3 else "optimizer") if off else "none",
              where + ".fsdp_config.fsdp_offload_params")
        f.set("checkpointing", "full" if fc.get("fsdp_activation_checkpointing") else "none",
              where + ".fsdp_config.fsdp_activation_checkpointing")
    elif kind == "DEEPSPEED":
        dc = cfg.get("deepspeed_config") or {}
        if dc.get("deepspeed_config_file"):
            load(base / dc["deepspeed_config_file"], f, "deepspeed")
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


def read_training_args(cfg: dict, f: Found, where: str, base: Path, load) -> None:
    f.take(cfg, "per_device_train_batch_size", "micro_batch", 8, where, "TrainingArguments")
    f.take(cfg, "gradient_accumulation_steps", "grad_accum", 1, where, "TrainingArguments")
    _precision(f, cfg.get("bf16"), cfg.get("fp16"), where, "TrainingArguments")
    if cfg.get("gradient_checkpointing") is None:
        f.default("checkpointing", "none", where + ".gradient_checkpointing", "TrainingArguments")
    else:
        f.set("checkpointing", "full" if cfg["gradient_checkpointing"] else "none",
              where + ".gradient_checkpointing")
    optim = str(cfg.get("optim", "adamw_torch"))
    if optim not in HF_OPTIM:
        f.problems.append(f"{where}.optim: {optim!r} has no memory rule in planner "
                          f"(one of {', '.join(sorted(set(HF_OPTIM)))}; or give --optimizer)")
    elif "optim" in cfg:
        f.set("optimizer", HF_OPTIM[optim], where + ".optim")
    else:
        f.default("optimizer", "adamw", where + ".optim", "TrainingArguments")
    for key in ("max_seq_length", "max_length", "model_max_length"):
        if _is_int(cfg.get(key)):
            f.set("seq_len", cfg[key], f"{where}.{key}")
    ds = cfg.get("deepspeed")
    fsdp = cfg.get("fsdp")
    if isinstance(ds, dict):
        read_deepspeed(ds, f, where + ".deepspeed")
    elif isinstance(ds, str) and ds:
        load(base / ds, f, "deepspeed")
    elif fsdp:
        opts = fsdp.split() if isinstance(fsdp, str) else list(fsdp)
        stage = 3 if "full_shard" in opts or "hybrid_shard" in opts else (2 if "shard_grad_op" in opts else 0)
        f.set("zero", stage, where + ".fsdp")
        f.set("offload", ("optimizer+params" if stage == 3 else "optimizer") if "offload" in opts else "none",
              where + ".fsdp")
        if (cfg.get("fsdp_config") or {}).get("activation_checkpointing"):
            f.set("checkpointing", "full", where + ".fsdp_config.activation_checkpointing")
    else:
        f.set("zero", 0, where + " (no deepspeed or fsdp)")
        f.set("offload", "none", where + " (no deepspeed or fsdp)")


def read_lora(cfg: dict, f: Found, where: str, workload_fields) -> None:
    if "method" not in f.values:
        f.set("method", "lora", where)
    if _is_int(cfg.get("r")):
        f.set("lora_rank", cfg["r"], where + ".r")
    if cfg.get("lora_alpha") is not None:
        f.set("lora_alpha", cfg["lora_alpha"], where + ".lora_alpha")
    _targets(cfg.get("target_modules"), f, where + ".target_modules")
    if "lora_dropout" in workload_fields and cfg.get("lora_dropout") is not None:
        f.set("lora_dropout", cfg["lora_dropout"], where + ".lora_dropout")


def _targets(modules: Any, f: Found, where: str) -> None:
    if modules is None:
        return
    if modules in ("all-linear", "all_linear") or modules is True:
        f.set("lora_targets", ["all"], where)
        return
    names = [modules] if isinstance(modules, str) else list(modules)
    picked, unknown = [], []
    for name in names:
        short = PEFT_TARGETS.get(str(name).split(".")[-1])
        (picked if short else unknown).append(short or str(name))
    if unknown:
        f.notes.append(f"{where}: {', '.join(unknown)} not counted (planner counts "
                       f"{', '.join(PEFT_TARGETS)})")
    if picked:
        f.set("lora_targets", sorted(set(picked), key=list(PEFT_TARGETS.values()).index), where)


def read_bnb(cfg: dict, f: Found, where: str) -> None:
    if cfg.get("load_in_4bit") or cfg.get("load_in_8bit"):
        f.set("method", "qlora", where)
        f.set("quant_bits", 4 if cfg.get("load_in_4bit") else 8, where + ".load_in_*bit")
        if cfg.get("load_in_4bit"):
            f.set("double_quant", bool(cfg.get("bnb_4bit_use_double_quant", False)),
                  where + ".bnb_4bit_use_double_quant")
            if cfg.get("bnb_4bit_compute_dtype") == "bfloat16":
                f.facts["asks_bf16"] = where + ".bnb_4bit_compute_dtype"


def read_model_kwargs(cfg: dict, f: Found, where: str) -> None:
    if cfg.get("pretrained_model_name_or_path"):
        f.set("model", cfg["pretrained_model_name_or_path"], where + ".pretrained_model_name_or_path")
    attn = cfg.get("attn_implementation")
    if attn is not None:
        f.set("attention", "eager" if attn == "eager" else "flash", where + ".attn_implementation")
        if attn == "flash_attention_2":
            f.facts["asks_fa2"] = where + ".attn_implementation"
    dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "")
    f.facts["model_dtype"] = dtype.replace("torch.", "")
    if isinstance(cfg.get("quantization_config"), dict):
        read_bnb(cfg["quantization_config"], f, where + ".quantization_config")


def torchtune_model_name(component: str) -> tuple[str | None, list[str]]:
    """``torchtune.models.llama3_1.qlora_llama3_1_8b`` -> (``qlora``, name candidates)."""
    builder = component.rsplit(".", 1)[-1]
    method = None
    for prefix in ("qlora_", "lora_"):
        if builder.startswith(prefix):
            method, builder = prefix[:-1], builder[len(prefix):]
    return method, [re.sub(r"(\d)_(\d)", r"\1.\2", builder), builder]
