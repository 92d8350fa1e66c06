"""Scenario files -> validated, resolved scenarios.

A file holds one scenario (a mapping), a list of scenarios, or a mapping with ``scenarios:``
(a list) and ``defaults:`` (a mapping deep-merged under each scenario). Names are resolved
against the catalogs; every problem is collected and reported at once, one line per field.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from planner import catalog
from planner.core.arch import has_full_architecture
from planner.catalog.store import UnknownName
from planner.core.errors import InputError, format_validation_error
from planner.catalog.hf_config import ConfigError
from planner.core.specs import GpuSpec, Layout, ModelSpec, Scenario

#: Flat option names (CLI flags, keyword arguments) -> the scenario section that holds them.
FLAG_SECTIONS: dict[str, str] = {
    **{k: "workload" for k in (
        "method", "optimizer", "precision", "seq_len", "micro_batch", "grad_accum",
        "global_batch", "tokens", "lora_rank", "lora_alpha", "lora_targets", "quant_bits",
        "double_quant", "allow_relax")},
    **{k: "layout" for k in (
        "gpu", "gpus", "dp", "tp", "pp", "cp", "ep", "sp", "zero", "offload", "checkpointing",
        "attention", "uneven_pp")},
    **{k: "overrides" for k in (
        "activation_bytes", "k_factor", "lora_params", "lora_bytes_per_param",
        "base_bytes_per_param", "reserve")},
    **{k: "search" for k in ("gpu_types", "max_gpus", "distinct", "utilization")},
    **{k: "constraints" for k in ("budget_usd", "deadline_hours", "fleet", "pcie_model_parallel")},
    **{k: "" for k in ("name", "profile", "model", "objective", "top", "time_limit_s")},
}


@dataclass(frozen=True)
class ResolvedScenario:
    """A scenario with names looked up and derived layout values filled in."""

    scenario: Scenario
    model: ModelSpec
    gpu: GpuSpec | None
    layout: Layout  # gpus and dp always set
    grad_accum: int | None
    warnings: tuple[str, ...] = field(default=())
    source: str | None = None

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def workload(self):
        return self.scenario.workload

    @property
    def overrides(self):
        return self.scenario.overrides

    @property
    def profile(self) -> str:
        return self.scenario.profile


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


def load_yaml(path: str | Path) -> Any:
    """A YAML file's content; a missing, malformed or non-UTF-8 file is one line of InputError."""
    path = Path(path)
    if not path.is_file():
        raise InputError([f"{path}: no such file"])
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError([f"{path}: malformed YAML: {where}{problem}"]) from None
    except UnicodeDecodeError:
        raise InputError([f"{path}: not a UTF-8 text file"]) from None


def read_scenario_file(path: str | Path) -> list[dict[str, Any]]:
    """The raw scenario mappings of a file, ``defaults:`` merged in."""
    path = Path(path)
    data = load_yaml(path)
    defaults: dict[str, Any] = {}
    if isinstance(data, dict) and "scenarios" in data:
        extra = sorted(set(data) - {"scenarios", "defaults"})
        if extra:
            raise InputError([f"{path}: {k}: unknown key beside scenarios/defaults" for k in extra])
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
        out.append(merged)
    return out


def _divides(a: int, b: int) -> bool:
    return b % a == 0


def resolve(
    raw: dict[str, Any] | Scenario, *, source: str | None = None, base_dir: Path | None = None
) -> ResolvedScenario:
    """Validate a scenario mapping and resolve it; raises :class:`InputError` listing every problem.

    ``source`` prefixes every message (the file, and the index in a list); ``base_dir`` is
    where relative ``config.json`` paths are looked up first (the scenario file's folder).
    """
    prefix = f"{source}: " if source else ""
    if isinstance(raw, Scenario):
        scenario = raw
    else:
        try:
            scenario = Scenario.model_validate(raw)
        except ValidationError as exc:
            raise InputError([prefix + line for line in format_validation_error(exc, Scenario)]) from None
    problems: list[str] = []
    warnings: list[str] = []

    model: ModelSpec | None = None
    if isinstance(scenario.model, str):
        try:
            model = catalog.get_model(scenario.model, base_dir=base_dir)
        except (UnknownName, ConfigError) as exc:
            problems.append(f"model: {exc}")
    else:
        model = scenario.model
        if model.params_b is None and not has_full_architecture(model):
            problems.append("model: give params_b, or heads, ffn and vocab to count parameters")

    gpu: GpuSpec | None = None
    lay = scenario.layout
    if lay.gpu is not None:
        try:
            gpu = catalog.get_gpu(lay.gpu)
        except UnknownName as exc:
            problems.append(f"layout.gpu: {exc}")

    # gpus = dp·tp·pp·cp, with whichever of gpus and dp is missing derived from the other.
    mp = lay.tp * lay.pp * lay.cp
    dp, gpus = lay.dp, lay.gpus
    if dp is None:
        if gpus is None:
            dp = 1
        elif gpus % mp:
            problems.append(
                f"layout.gpus: {gpus} is not a multiple of tp·pp·cp = {lay.tp}·{lay.pp}·{lay.cp} = {mp}"
            )
            dp = 1
        else:
            dp = gpus // mp
    if gpus is None:
        gpus = dp * mp
    elif gpus != dp * mp:
        problems.append(
            f"layout.gpus: {gpus} ≠ dp·tp·pp·cp = {dp}·{lay.tp}·{lay.pp}·{lay.cp} = {dp * mp}"
        )

    if model is not None:
        if model.heads is not None and not _divides(lay.tp, model.heads):
            problems.append(f"layout.tp: {lay.tp} does not divide the model's {model.heads} attention heads")
        kv = model.kv_heads_eff
        if kv is not None and model.mla is None and kv % lay.tp and lay.tp % kv:
            problems.append(f"layout.tp: {lay.tp} does not divide the model's {kv} KV heads")
        if not _divides(lay.pp, model.layers):
            if not (lay.uneven_pp and scenario.profile == "detailed"):
                problems.append(f"layout.pp: {lay.pp} does not divide the model's {model.layers} layers"
                                + ("" if scenario.profile != "detailed" else
                                   " (set layout.uneven_pp: true for stages of unequal size)"))
            else:
                warnings.append(f"layout.pp: {lay.pp} does not divide {model.layers} layers: the "
                                f"heaviest stage holds {-(-model.layers // lay.pp)}")
    wl = scenario.workload
    if not _divides(lay.cp, wl.seq_len):
        problems.append(f"layout.cp: {lay.cp} does not divide workload.seq_len {wl.seq_len}")
    if lay.ep > 1:
        if model is not None and model.moe is None:
            problems.append(f"layout.ep: {lay.ep} needs a mixture-of-experts model")
        elif model is not None and model.moe.experts % lay.ep:
            problems.append(f"layout.ep: {lay.ep} does not divide the model's {model.moe.experts} experts")
        if dp % lay.ep:
            problems.append(f"layout.ep: {lay.ep} does not divide dp = {dp} (experts are split within dp)")
    if lay.offload != "none" and lay.zero == 0:
        problems.append(f"layout.offload: {lay.offload!r} needs ZeRO/FSDP (layout.zero ≥ 1)")
    if lay.offload == "optimizer+params" and lay.zero != 3:
        problems.append("layout.offload: 'optimizer+params' needs layout.zero: 3 (parameters must be sharded)")
    if wl.method == "inference" and (lay.zero or lay.offload != "none"):
        problems.append("layout.zero: ZeRO and offload apply to training, not to method: inference")

    grad_accum = wl.grad_accum
    if wl.global_batch is not None and wl.method != "inference":
        per_step = wl.micro_batch * dp
        if grad_accum is None:
            if wl.global_batch % per_step:
                problems.append(
                    f"workload.global_batch: {wl.global_batch} is not a multiple of "
                    f"micro_batch·dp = {wl.micro_batch}·{dp} = {per_step}"
                )
            else:
                grad_accum = wl.global_batch // per_step
        elif wl.global_batch != per_step * grad_accum:
            problems.append(
                f"workload.global_batch: {wl.global_batch} ≠ micro_batch·dp·grad_accum = "
                f"{wl.micro_batch}·{dp}·{grad_accum} = {per_step * grad_accum}"
            )

    if scenario.profile == "detailed" and model is not None and not has_full_architecture(model):
        if "profile" in scenario.model_fields_set:
            problems.append("profile: 'detailed' needs the full architecture (heads, ffn, vocab), "
                            "not only params_b; give them or use profile: seed")
        else:
            # The default profile cannot model a model given only as params_b/layers/hidden: the
            # documents' rules (seed) can, and the answer says which profile it used.
            scenario = scenario.model_copy(update={"profile": "seed"})
            warnings.append("profile: the model gives no full architecture, so the seed profile (the "
                            "documents' rules) is used; give heads, ffn and vocab for the detailed one")

    if gpu is not None:
        if wl.precision == "bf16" and not gpu.supports_bf16:
            warnings.append(f"{gpu.name} has no BF16: pure-BF16 training will not run natively; use fp16")
        if wl.precision == "mixed" and not gpu.supports_bf16:
            warnings.append(f"{gpu.name} has no BF16: mixed precision runs as FP16 with loss scaling")
        if lay.attention == "flash" and not gpu.supports_flash_attn2:
            warnings.append(
                f"{gpu.name} has no FlashAttention-2: 'flash' means a memory-efficient kernel (SDPA/xformers)"
            )
        if lay.tp > gpu.gpus_per_node:
            problems.append(f"layout.tp: {lay.tp} exceeds the {gpu.gpus_per_node} GPUs of a {gpu.name} node")
        elif lay.tp > gpu.nvlink_domain:
            warnings.append(f"TP {lay.tp} on {gpu.name} runs over PCIe (NVLink domain {gpu.nvlink_domain})")

    if problems:
        raise InputError([prefix + p for p in problems])
    return ResolvedScenario(
        scenario=scenario,
        model=model,
        gpu=gpu,
        layout=lay.model_copy(update={"dp": dp, "gpus": gpus}),
        grad_accum=grad_accum,
        warnings=tuple(warnings),
        source=source,
    )


def load_scenarios(path: str | Path) -> list[ResolvedScenario]:
    """Read and resolve every scenario in a file (all problems of all scenarios together)."""
    raws = read_scenario_file(path)
    resolved: list[ResolvedScenario] = []
    problems: list[str] = []
    for i, raw in enumerate(raws):
        source = str(path) if len(raws) == 1 else f"{path}[{i}]"
        try:
            resolved.append(resolve(raw, source=source, base_dir=Path(path).parent))
        except InputError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InputError(problems)
    return resolved
