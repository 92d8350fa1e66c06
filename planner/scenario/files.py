"""Scenario files and options in, raw scenario mappings out.

A file holds one scenario (a mapping), a list of scenarios, or a mapping with ``scenarios:``
(a list) and ``defaults:`` (a mapping deep-merged under each scenario); flat options (CLI flags,
keyword arguments) become the nested mapping they name. The YAML is read by the hardened loader
(planner.core.textfiles.load_yaml); planner.scenario.resolve validates and resolves what comes out.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from planner.core.errors import InputError, clip, excerpt
from planner.core.textfiles import load_yaml

#: Flat option names (CLI flags, keyword arguments) -> the scenario section that holds them.
FLAG_SECTIONS: dict[str, str] = {
    **{k: "workload" for k in (
        "method", "optimizer", "precision", "seq_len", "micro_batch", "grad_accum",
        "global_batch", "tokens", "lora_rank", "lora_alpha", "lora_targets", "quant_bits",
        "double_quant", "allow_relax", "algorithm", "reference", "num_generations", "completion_len")},
    **{k: "layout" for k in (
        "gpu", "gpus", "dp", "tp", "pp", "cp", "ep", "etp", "sp", "zero", "offload", "checkpointing",
        "attention", "uneven_pp", "generation_gpus", "generation_memory_fraction", "generation_tp")},
    **{k: "recipe" for k in ("generation_sleep", "rollout_offload")},
    **{k: "overrides" for k in (
        "activation_bytes", "k_factor", "lora_params", "lora_bytes_per_param",
        "base_bytes_per_param", "reserve")},
    **{k: "search" for k in ("gpu_types", "max_gpus", "distinct", "utilization")},
    **{k: "constraints" for k in ("budget_usd", "deadline_hours", "fleet", "pcie_model_parallel")},
    **{k: "" for k in ("name", "profile", "model", "objective", "top", "time_limit_s")},
}



def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``; nested mappings merge, everything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def scenario_from_flags(**flags: Any) -> dict[str, Any]:
    """Flat options (``method="lora", gpu="rtx-4090"``) -> a nested scenario mapping."""
    out: dict[str, Any] = {}
    problems = []
    for key, value in flags.items():
        if value is None:
            continue
        section = FLAG_SECTIONS.get(key)
        if section is None:
            problems.append(f"{key}: unknown option")
        elif section:
            out.setdefault(section, {})[key] = value
        else:
            out[key] = value
    if problems:
        raise InputError(problems)
    return out


def read_scenario_file(path: str | Path) -> list[dict[str, Any]]:
    """The raw scenario mappings of a file, ``defaults:`` merged in."""
    return scenarios_from_data(load_yaml(path), path)


def scenarios_from_data(data: Any, path: str | Path) -> list[dict[str, Any]]:
    """The raw scenario mappings of a file's content (:func:`load_yaml`), ``defaults:`` merged in."""
    path = Path(path)
    defaults: dict[str, Any] = {}
    if isinstance(data, dict) and "scenarios" in data:
        extra = sorted(set(data) - {"scenarios", "defaults"}, key=str)  # keys may be numbers, dates…
        if extra:
            raise InputError([f"{path}: {clip(str(k))}: unknown key beside scenarios/defaults" for k in extra])
        defaults = data.get("defaults") or {}
        data = data["scenarios"]
        if not isinstance(defaults, dict):
            raise InputError([f"{path}: defaults: must be a mapping"])
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise InputError([f"{path}: expected a scenario mapping or a list of them"])
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise InputError([f"{path}: [{i}]: a scenario must be a mapping"])
        merged = deep_merge(defaults, item)
        merged.setdefault("name", path.stem if len(data) == 1 else f"{path.stem}[{i}]")
        problem = model_name_problem(merged.get("model"))
        if problem:
            raise InputError([f"{path}: " + (f"[{i}]: " if len(data) > 1 else "") + problem])
        out.append(merged)
    return out


#: The longest file name (one part of a path) file systems take, in bytes (POSIX NAME_MAX).
MAX_FILE_NAME_BYTES = 255


def model_name_problem(model: Any) -> str | None:
    """Why a model given as text can be neither a catalog name nor a path, or None.

    A part longer than a file name may be is checked here, before anything looks the path up
    (the file system would answer with an error, not with "no such file")."""
    if not isinstance(model, str):
        return None
    longest = max((len(part.encode("utf-8", "surrogatepass")) for part in model.split("/")), default=0)
    if longest > MAX_FILE_NAME_BYTES:
        return (f"model: {excerpt(model)} is no catalog name, nor a path (a part of {longest:,} bytes; "
                f"file names take at most {MAX_FILE_NAME_BYTES})")
    if "\x00" in model:
        return f"model: {excerpt(model)} is no catalog name, nor a path (it holds a NUL character)"
    return None
