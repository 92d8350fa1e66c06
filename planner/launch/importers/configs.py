"""``--config``: read the configs a user has into a scenario, and say what they leave out.

Each file is loaded, its tool told from its keys (:func:`sniff`), and read by that tool's reader.
Order of precedence: the scenario file, then the configs, then command-line flags. A field that
changes the memory and that none of them sets is an error naming the flag that gives it. Every
key of every config is read, passed over with a note, or warned about (``found.account``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.core.errors import InputError
from planner.core.specs import Recipe, Workload
from planner.core.textfiles import is_file, parse_json, parse_yaml, read_text_bounded
from planner.launch.importers.accelerate import ACC_IGNORED, ACC_TUNING, read_accelerate
from planner.launch.importers.axolotl import AX_IGNORED, AX_TUNING, read_axolotl
from planner.launch.importers.common import scenario_fields
from planner.launch.importers.deepspeed import DS_IGNORED, DS_TUNING, read_deepspeed
from planner.launch.importers.found import Found, Tracked, account
from planner.launch.importers.hf_model import read_bnb, read_model_kwargs, read_model_side
from planner.launch.importers.hf_trainer import HF_IGNORED, HF_TUNING, read_training_args
from planner.launch.importers.llamafactory import LF_IGNORED, read_llamafactory
from planner.launch.importers.peft import read_lora
from planner.launch.importers.torchtune import TT_IGNORED, TT_TUNING, read_torchtune
from planner.launch.importers.trl import TRL_IGNORED, read_trl
from planner.scenario.files import FLAG_SECTIONS, deep_merge

CONFIG_HELP = ("A config you have: DeepSpeed JSON, accelerate YAML, TrainingArguments JSON/YAML, TRL or "
               "alignment-handbook recipe, LLaMA-Factory YAML, PEFT LoraConfig, BitsAndBytesConfig, "
               "model kwargs, axolotl or torchtune YAML (repeatable).")
#: What the memory depends on: each must come from the scenario, a config or a flag.
REQUIRED_ESTIMATE = ("model", "method", "precision", "optimizer", "seq_len", "micro_batch",
                     "checkpointing", "attention", "zero")
REQUIRED_PLAN = ("model", "method", "precision", "optimizer", "seq_len")
#: What a plan keeps from a config: what is trained. The layout is the search's to choose.
PLAN_KEYS = ("model", "method", "precision", "optimizer", "seq_len", "global_batch", "lora_rank",
             "lora_alpha", "lora_targets", "quant_bits", "double_quant", "lora_dropout", "quant_type",
             "loss", "optimizer_paged", "compile", "kernels", "fp8")
#: The longest text a config's value may hold: configs carry chat templates and prompts inline
#: (axolotl's ``chat_template_jinja``, tens of KiB at most), far longer than a scenario's names.
CONFIG_TEXT_CHARS = 256 << 10


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
        read_trl(cfg, f, where, base, load_config)
        ignored, tuning = HF_IGNORED + TRL_IGNORED, HF_TUNING
    elif kind == "llamafactory":
        read_llamafactory(cfg, f, where, base, load_config)
        ignored, tuning = HF_IGNORED + LF_IGNORED, HF_TUNING + ("use_reentrant_gc", "upcast_*")
    elif kind == "lora":
        read_lora(cfg, f, where, scenario_fields())
    elif kind == "bnb":
        read_bnb(cfg, f, where)
    elif kind == "model_kwargs":
        read_model_kwargs(cfg, f, where)
    elif kind == "axolotl":
        read_axolotl(cfg, f, where, base, load_config)
        ignored, tuning = AX_IGNORED, AX_TUNING
    else:
        read_torchtune(cfg, f, where, text, path.stem)
        ignored, tuning = TT_IGNORED, TT_TUNING
    return ignored, tuning


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
    for section in ("workload", "layout", "recipe"):
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
        where = FLAG_SECTIONS.get(key, "workload" if key in Workload.model_fields
                                  else "recipe" if key in Recipe.model_fields else "layout")
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
