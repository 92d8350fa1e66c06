"""Raw scenario mappings (planner.scenario.files) -> validated, resolved scenarios.

Names are resolved against the catalogs and the layout checked against the model and the card
(planner.scenario.legality); every problem is collected and reported at once, one line per field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner import catalog
from planner.catalog.hf_config import ConfigError
from planner.catalog.store import UnknownName
from planner.core.arch import has_full_architecture, liger_patches
from planner.core.entries import GpuSpec, ModelSpec
from planner.core.errors import EXCERPT_CHARS, InputError, clip, excerpt, format_validation_error
from planner.core.specs import Layout, Recipe, Scenario, Workload
from planner.scenario import legality
from planner.scenario.files import deep_merge, read_scenario_file


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
    def recipe(self) -> Recipe:
        """How the stack runs the step (the scenario's ``recipe:``; a plan's pins its stack's)."""
        return self.scenario.recipe

    @property
    def overrides(self):
        return self.scenario.overrides

    @property
    def profile(self) -> str:
        return self.scenario.profile


def resolve(
    raw: dict[str, Any] | Scenario, *, source: str | None = None, base_dir: Path | None = None,
    search: bool = False,
) -> ResolvedScenario:
    """Validate a scenario mapping and resolve it; raises :class:`InputError` listing every problem.

    ``source`` prefixes every message (the file, and the index in a list); ``base_dir`` is
    where relative ``config.json`` paths are looked up first (the scenario file's folder).
    ``search``: the scenario is a search's, whose unpinned degrees are decisions, not the
    defaults: rules on degrees it leaves free are the search's to apply, layout by layout.
    """
    prefix = f"{source}: " if source else ""
    scenario = _validated(raw, prefix)
    problems: list[str] = []
    warnings: list[str] = []
    model = _resolve_model(scenario, base_dir, problems)
    gpu = _resolve_gpu(scenario.layout, problems)
    lay, wl = scenario.layout, scenario.workload
    dp, gpus = _derive_dp_and_gpus(lay, problems)
    if model is not None:
        _check_model_split(scenario, model, problems, warnings)
    _check_sequence(wl, lay, model, problems, warnings)
    _check_experts(lay, model, dp, problems, search=search)
    _check_sharding(wl, lay, problems)
    _check_generation(wl, lay, gpus, problems)
    grad_accum = _derive_grad_accum(wl, dp, problems)
    scenario = _fit_profile(scenario, model, problems, warnings)
    scenario = _card_recipe(scenario, gpu)
    scenario = _liger_scope(scenario, model, warnings)
    _check_saved_modules(scenario, warnings)
    _check_base_dtype(scenario, problems, warnings)
    _check_fp8_recipe(scenario, warnings)
    if gpu is not None:
        _check_gpu(wl, lay, gpu, scenario.constraints.pcie_model_parallel, problems, warnings)
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


def _card_recipe(scenario: Scenario, gpu: GpuSpec | None) -> Scenario:
    """The recipe keys a named card decides where the scenario leaves them unset: whether FP8
    weights keep a transposed copy (``Recipe.fp8_transpose_cache``)."""
    rec = scenario.recipe
    if gpu is None or not rec.fp8_params or rec.fp8_transpose_cache is not None:
        return scenario
    update = {"fp8_transpose_cache": gpu.keeps_fp8_transpose}
    return scenario.model_copy(update={"recipe": rec.model_copy(update=update)})


def _liger_scope(scenario: Scenario, model: ModelSpec | None, warnings: list[str]) -> Scenario:
    """``kernels: liger`` on a model Liger-Kernel has no patch for (:func:`~planner.core.arch.liger_patches`)
    applies nothing: the Trainer's ``use_liger_kernel`` and LLaMA-Factory's ``enable_liger_kernel``
    log that the model is not supported and go on without its kernels or its fused loss. Read as
    standard kernels, and ``loss: fused`` beside it as the standard loss, each said."""
    rec = scenario.recipe
    if rec.kernels != "liger" or model is None or liger_patches(model):
        return scenario
    update: dict[str, Any] = {"kernels": "standard"}
    what = "its RMSNorm, rotary and SwiGLU kernels do not apply"
    if rec.loss == "fused":
        update["loss"] = "standard"
        what = ("neither its RMSNorm, rotary and SwiGLU kernels nor its fused linear cross-entropy "
                "(loss: fused) apply")
    warnings.append(f"recipe.kernels: liger: Liger-Kernel has no patch for {model.name or model.id} "
                    f"(family {model.family or 'unknown'}), so {what}; read as standard")
    return scenario.model_copy(update={"recipe": rec.model_copy(update=update)})


def _validated(raw: dict[str, Any] | Scenario, prefix: str) -> Scenario:
    """The scenario checked against the schema; every schema problem is one line of InputError."""
    if isinstance(raw, Scenario):
        return raw
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        raise InputError([prefix + line for line in format_validation_error(exc, Scenario)]) from None
    except (TypeError, ValueError) as exc:  # a check that fails on a value instead of refusing it
        raise InputError([prefix + line for line in _unvalidatable(raw, exc)]) from None


def _resolve_model(scenario: Scenario, base_dir: Path | None, problems: list[str]) -> ModelSpec | None:
    """The scenario's model: a catalog name or a config path looked up, or the spec given inline."""
    if not isinstance(scenario.model, str):
        model = scenario.model
        if model.params_b is None and not has_full_architecture(model):
            problems.append("model: give params_b, or heads, ffn and vocab to count parameters")
        return model
    try:
        return catalog.get_model(scenario.model, base_dir=base_dir)
    except (UnknownName, ConfigError) as exc:
        problems.append(f"model: {exc}")
    except (OSError, ValueError) as exc:  # a name no file system accepts as a path (too long…)
        problems.append(f"model: {excerpt(scenario.model)} is no catalog name, nor a readable path "
                        f"({clip(getattr(exc, 'strerror', None) or str(exc), EXCERPT_CHARS)})")
    return None


def _resolve_gpu(lay: Layout, problems: list[str]) -> GpuSpec | None:
    if lay.gpu is None:
        return None
    try:
        return catalog.get_gpu(lay.gpu)
    except UnknownName as exc:
        problems.append(f"layout.gpu: {exc}")
        return None


def _derive_dp_and_gpus(lay: Layout, problems: list[str]) -> tuple[int, int]:
    """(dp, gpus) of the layout."""
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
    return dp, gpus


def uneven_pp_allowed(scenario: Scenario) -> bool:
    """Pipeline stages of unequal layer counts: asked for (``layout.uneven_pp``), and modelled by
    the profile (the detailed profile sizes the heaviest stage; the seed profile's documents do
    not)."""
    return bool(scenario.layout.uneven_pp) and scenario.profile == "detailed"


def _check_model_split(scenario: Scenario, model: ModelSpec, problems: list[str],
                       warnings: list[str]) -> None:
    """Tensor parallelism divides the model's heads; pipeline parallelism its layers."""
    lay = scenario.layout
    problems.extend(legality.problems([legality.tp_heads(model, lay.tp), legality.tp_kv_heads(model, lay.tp)],
                                   {"tp": lay.tp}))
    fault = legality.first_fault(legality.pp_rules(model, None, lay.pp, uneven=uneven_pp_allowed(scenario)))
    if fault:
        hint = (" (set layout.uneven_pp: true for stages of unequal size)"
                if scenario.profile == "detailed" and lay.pp <= model.layers else "")
        problems.append(f"layout.pp: {lay.pp} {fault}{hint}")
    elif model.layers % lay.pp:
        warnings.append(f"layout.pp: {lay.pp} does not divide {model.layers} layers: the "
                        f"heaviest stage holds {-(-model.layers // lay.pp)}")


#: Recipe keys of Transformer Engine's FP8 recipe: they need FP8 linears.
FP8_RECIPE_KEYS = ("fp8_attention", "fp8_activation_store", "fp8_params")


def _check_fp8_recipe(scenario: Scenario, warnings: list[str]) -> None:
    """Transformer Engine's FP8 storage keys change nothing without FP8 linears
    (``workload.fp8``), nor outside its layers (``kernels: transformer_engine``, the megatron
    stack's, which a search may still pick): each set one is said to."""
    rec = scenario.recipe
    for key in FP8_RECIPE_KEYS:
        if not getattr(rec, key):
            continue
        if not scenario.workload.fp8:
            warnings.append(f"recipe.{key}: needs FP8 linears (workload.fp8: true); ignored")
        elif "kernels" in rec.model_fields_set and rec.kernels != "transformer_engine":
            warnings.append(f"recipe.{key}: Transformer Engine's FP8 recipe; kernels: {rec.kernels} ignores it")


def _check_saved_modules(scenario: Scenario, warnings: list[str]) -> None:
    """``modules_to_save`` counts only for a LoRA run (or a search that may relax to one) under
    the detailed profile, ``eval_micro_batch`` only for training under it: elsewhere each is
    said to change nothing."""
    wl = scenario.workload
    if wl.eval_micro_batch and (wl.method == "inference" or scenario.profile == "seed"):
        why = "inference has no evaluation passes" if wl.method == "inference" else \
            "the seed profile (the documents' rules) does not size evaluation; the detailed profile does"
        warnings.append(f"workload.eval_micro_batch: {why}")
    if wl.method == "inference" and {"optimizer", "grad_accum", "global_batch"} & wl.model_fields_set:
        keys = sorted({"optimizer", "grad_accum", "global_batch"} & wl.model_fields_set)
        warnings.append(f"workload.{keys[0]}: inference trains nothing; "
                        f"{', '.join(keys)} change{'s' if len(keys) == 1 else ''} nothing")
    if not wl.modules_to_save:
        return
    if wl.method not in ("lora", "qlora") and "method" not in wl.allow_relax:
        what = "nothing is trained" if wl.method == "inference" else "full fine-tuning trains every module"
        warnings.append(f"workload.modules_to_save: applies to LoRA and QLoRA; {what}")
    elif scenario.profile == "seed":
        warnings.append("workload.modules_to_save: the seed profile (the documents' rules) does not "
                        "count modules trained in full beside the adapters; the detailed profile does")


def _check_base_dtype(scenario: Scenario, problems: list[str], warnings: list[str]) -> None:
    """An FP32 LoRA base (``workload.base_dtype: fp32``) runs under autocast: with precision
    ``bf16`` (one dtype, no autocast) the two contradict each other; with ``fp32`` every weight
    is FP32 already. It counts for LoRA alone (QLoRA's base is quantized, full fine-tuning's
    weights are its trained ones) and in the detailed profile."""
    wl = scenario.workload
    if wl.base_dtype != "fp32":
        return
    if wl.precision == "bf16":
        problems.append("workload.base_dtype: an FP32 base computes in 16 bits only under autocast; "
                        "use precision mixed (or fp16), or fp32 for FP32 compute")
    elif wl.method != "lora" and "method" not in wl.allow_relax:
        warnings.append(f"workload.base_dtype: applies to LoRA's frozen base; {wl.method} ignores it")
    elif scenario.profile == "seed":
        warnings.append("workload.base_dtype: the seed profile (the documents' rules) keeps the base in "
                        "16 bits; the detailed profile counts an FP32 base")


def _check_sequence(wl: Workload, lay: Layout, model: ModelSpec | None, problems: list[str],
                    warnings: list[str]) -> None:
    """The sequence against the model's context, and context parallelism dividing it."""
    if model is not None and model.max_position and wl.seq_len > model.max_position:
        warnings.append(f"workload.seq_len: {wl.seq_len} exceeds the model's context of "
                        f"{model.max_position} tokens (max_position_embeddings): positions past it "
                        "were never trained, unless the RoPE is scaled to reach them")
    problems.extend(legality.problems([legality.cp_sequence(wl.seq_len, lay.cp)], {"cp": lay.cp}))


def _check_experts(lay: Layout, model: ModelSpec | None, dp: int, problems: list[str], *,
                   search: bool = False) -> None:
    """Expert parallelism needs a mixture-of-experts model, and divides its experts and dp (or,
    with its own expert TP, dp·cp·tp); expert TP splits the experts' FFN. In a search the
    degree rule waits for the degrees it reads to be decided, unless the scenario pins them."""
    if lay.etp is not None and model is not None:
        problems.extend(legality.problems(legality.etp_rules(model, lay.etp), {"etp": lay.etp}))
    if lay.ep <= 1 and lay.etp is None:
        return
    if model is not None and lay.ep > 1:
        problems.extend(legality.problems([legality.ep_moe(model, lay.ep), legality.ep_experts(model, lay.ep)],
                                       {"ep": lay.ep}))
    if search and not _expert_degrees_pinned(lay):
        return
    problems.extend(legality.problems([legality.ep_dp(dp, lay.ep, tp=lay.tp, cp=lay.cp, etp=lay.etp)],
                                      {"ep": lay.ep}))


def _expert_degrees_pinned(lay: Layout) -> bool:
    """The layout pins every degree the expert-parallel rule reads: dp (or the GPU count with
    tp, pp and cp), and under MoE parallel folding tp and cp too."""
    pinned = lay.model_fields_set
    dp_pinned = "dp" in pinned or ("gpus" in pinned and {"tp", "pp", "cp"} <= pinned)
    return dp_pinned and (lay.etp is None or {"tp", "cp"} <= pinned)


def _check_sharding(wl: Workload, lay: Layout, problems: list[str]) -> None:
    """Offload needs ZeRO (parameter offload ZeRO-3); neither applies to inference."""
    problems.extend(legality.problems(legality.offload_rules(lay.zero, lay.offload), {"offload": lay.offload}))
    if wl.method == "inference" and (lay.zero or lay.offload != "none"):
        problems.append("layout.zero: ZeRO and offload apply to training, not to method: inference")


def _check_generation(wl: Workload, lay: Layout, gpus: int, problems: list[str]) -> None:
    """GRPO's completions fit the sequence, its batch holds whole groups, and its engine's GPUs
    split into engines; generation settings without GRPO are refused rather than ignored."""
    if not wl.generates:
        if lay.generation_gpus or lay.generation_memory_fraction is not None or lay.generation_tp > 1:
            problems.append("layout.generation_gpus: the generation engine applies to workload.algorithm: grpo")
        return
    if wl.method == "inference":
        problems.append("workload.algorithm: grpo trains; method inference trains nothing")
    if wl.completion_len >= wl.seq_len:
        problems.append(f"workload.completion_len: {wl.completion_len} leaves no prompt in seq_len {wl.seq_len} "
                        "(seq_len counts prompt + completion)")
    if wl.reference == "precomputed":
        problems.append("workload.reference: GRPO scores fresh completions each step; use model (beta > 0) "
                        "or none (beta 0)")
    if wl.global_batch is not None and wl.global_batch % wl.num_generations:
        problems.append(f"workload.global_batch: {wl.global_batch} is not a multiple of num_generations "
                        f"{wl.num_generations} (each prompt's completions form one group)")
    engine_gpus = lay.generation_gpus or gpus
    if engine_gpus % lay.generation_tp:
        where = f"layout.generation_gpus {lay.generation_gpus}" if lay.generation_gpus else f"the {gpus} training GPUs"
        problems.append(f"layout.generation_tp: {lay.generation_tp} does not divide {where}")


def _derive_grad_accum(wl: Workload, dp: int, problems: list[str]) -> int | None:
    """The workload's grad_accum, derived from global_batch = micro_batch·dp·grad_accum if missing."""
    grad_accum = wl.grad_accum
    if wl.global_batch is None or wl.method == "inference":
        return grad_accum
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
    return grad_accum


def _fit_profile(scenario: Scenario, model: ModelSpec | None, problems: list[str],
                 warnings: list[str]) -> Scenario:
    """The scenario, its profile switched to seed where detailed was only the default and the
    model has no full architecture."""
    if scenario.profile != "detailed" or model is None or has_full_architecture(model):
        return scenario
    if "profile" in scenario.model_fields_set:
        problems.append("profile: 'detailed' needs the full architecture (heads, ffn, vocab), "
                        "not only params_b; give them or use profile: seed")
        return scenario
    # The default profile cannot model a model given only as params_b/layers/hidden: the
    # documents' rules (seed) can, and the answer says which profile it used.
    warnings.append("profile: the model gives no full architecture, so the seed profile (the "
                    "documents' rules) is used; give heads, ffn and vocab for the detailed one")
    return scenario.model_copy(update={"profile": "seed"})


def _check_gpu(wl: Workload, lay: Layout, gpu: GpuSpec, pcie_model_parallel: bool, problems: list[str],
               warnings: list[str]) -> None:
    """What the GPU lacks for the workload (BF16, FlashAttention-2), and TP and PP against its
    node and NVLink (planner.scenario.legality: the rules the search and the checker apply)."""
    if wl.precision == "bf16" and not gpu.supports_bf16:
        warnings.append(f"{gpu.name} has no BF16: pure-BF16 training will not run natively; use fp16")
    if wl.precision == "mixed" and not gpu.supports_bf16:
        warnings.append(f"{gpu.name} has no BF16: mixed precision runs as FP16 with loss scaling")
    if lay.attention == "flash" and not gpu.supports_flash_attn2:
        warnings.append(
            f"{gpu.name} has no FlashAttention-2: 'flash' means a memory-efficient kernel (SDPA/xformers)"
        )
    tp_fault = legality.first_fault(legality.tp_rules(None, gpu, lay.tp, pcie_model_parallel=pcie_model_parallel))
    pp_fault = legality.first_fault(legality.pp_rules(None, gpu, lay.pp, pcie_model_parallel=pcie_model_parallel))
    problems.extend(f"layout.{key}: {getattr(lay, key)} {fault}"
                    for key, fault in (("tp", tp_fault), ("pp", pp_fault)) if fault)
    if lay.tp > gpu.nvlink_domain and legality.tp_node(gpu, lay.tp).fault() is None:
        warnings.append(f"TP {lay.tp} on {gpu.name} runs over PCIe (NVLink domain {gpu.nvlink_domain})")


def _null_leaves(raw: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(raw, dict):
        return [p for k, v in raw.items() for p in _null_leaves(v, path + (k,))]
    return [path] if raw is None and path else []


def _without(raw: dict[str, Any], path: tuple) -> dict[str, Any]:
    out = dict(raw)
    if len(path) == 1:
        out.pop(path[0], None)
    else:
        out[path[0]] = _without(out[path[0]], path[1:])
    return out


def _unvalidatable(raw: dict[str, Any], exc: Exception) -> list[str]:
    """Lines naming the fields whose value the schema's checks could not even test (an explicit
    ``null`` where a number with bounds is expected): with every null left out the mapping can
    be checked; each null put back alone that breaks the check again is one line."""
    nulls = _null_leaves(raw)[:100]
    bare = raw
    for path in nulls:
        bare = _without(bare, path)

    def breaks(mapping: dict[str, Any]) -> bool:
        try:
            Scenario.model_validate(mapping)
        except ValidationError:
            return False
        except (TypeError, ValueError):
            return True
        return False

    culprits = []
    if nulls and not breaks(bare):
        for path in nulls:  # the other nulls stay out
            if breaks(deep_merge(bare, _nested(path, None))):
                culprits.append(path)
    if not culprits:
        return [f"(top level): cannot be checked: {clip(str(exc), EXCERPT_CHARS)}"]
    lines = [f"{'.'.join(map(str, p))}: null is not a value here (leave the key out for its default)"
             for p in culprits]
    rest = raw
    for path in culprits:
        rest = _without(rest, path)
    try:
        Scenario.model_validate(rest)
    except ValidationError as other:  # the problems of the other fields, as usual
        lines += format_validation_error(other, Scenario)
    except (TypeError, ValueError):
        pass
    return lines


def _nested(path: tuple, value: Any) -> dict[str, Any]:
    out: Any = value
    for key in reversed(path):
        out = {key: out}
    return out


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
