"""PEFT's LoraConfig, and the LoRA keys of the tools that rename them: rank, alpha, dropout, the
target modules the planner counts, and what else an adapter config trains or leaves out."""

from __future__ import annotations

import re
from typing import Any

from planner.core.codes import PEFT_MODULES
from planner.launch.importers.common import comma_list, count, is_true
from planner.launch.importers.found import Found

PEFT_TARGETS = {v: k for k, v in PEFT_MODULES.items()} | {"output_proj": "o", "lm_head": "lm_head"}
#: Fused projections some architectures have (Phi-3): one name, several of the planner's targets.
PEFT_FUSED = {"qkv_proj": ("q", "k", "v"), "gate_up_proj": ("gate", "up")}
TARGET_ORDER = ["q", "k", "v", "o", "gate", "up", "down", "lm_head"]


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
        read_targets(targets, f, where + ".target_modules")
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
    if is_true(get("use_dora")):
        f.warn(f"{where}.{n['use_dora']}", "DoRA's magnitude vectors and its extra activations are not "
               "modelled; read as LoRA (errs low)")
    if get("target_parameters"):
        f.warn(f"{where}.{n['target_parameters']}", f"{comma_list(get('target_parameters'))}: adapters on "
               "parameters (MoE experts) are not counted (errs low)")
    if get("trainable_token_indices"):
        f.warn(f"{where}.{n['trainable_token_indices']}", "trainable token embeddings are not counted")
    if get("layer_replication"):
        f.warn(f"{where}.{n['layer_replication']}", "replicated layers are not modelled")
    if get("exclude_modules"):
        f.warn(f"{where}.{n['exclude_modules']}", f"{comma_list(get('exclude_modules'))}: excluded modules "
               "are still counted as adapted (errs high)")
    bias = get("bias")
    if bias not in (None, "none", False):
        f.warn(f"{where}.{n['bias']}", f"{bias!r}: trained biases are not counted")
    if is_true(get("lora_bias")):
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


LAYER_INDEX = re.compile(r"(^|\.)(layers?|h|blocks?)\.(\d+)\.|\\?\.\(?\d+[|)]|\[\d")


def read_targets(modules: Any, f: Found, where: str) -> None:
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
