"""The time model's arguments for a scenario's plans: the one builder of them.

:func:`step_arguments` takes the plan's own decisions (method, layout, micro-batch,
accumulation; scalars for one plan, arrays for the search's columns) and adds what the scenario
fixes for every plan (LoRA's trainable parameters and adapter traffic, modules trained in full,
FP8, interleaved stages, a DPO reference pass, two sequences per pair). The search, its
best-first bound and the plan checker all time plans through it and
:func:`planner.perf.timing.step_time_s`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from planner.core.arch import has_full_architecture
from planner.core.codes import FULL, SELECTIVE
from planner.perf.timing import adapter_bytes_per_token

if TYPE_CHECKING:
    from planner.core.entries import ModelSpec
    from planner.core.specs import Layout, Recipe, Workload
    from planner.scenario.resolve import ResolvedScenario


def n_lora_of(rs: ResolvedScenario) -> tuple[float, float, float]:
    """Trainable adapter parameters, those a token passes through (of a MoE model's routed
    experts, its active ones') and the routed experts' (0 where the count is not exact): the
    override, the exact counts (detailed profile), or L·18·r·H."""
    from planner.core.arch import lora_param_counts, seed_lora_params

    wl, ov = rs.workload, rs.overrides
    if ov.lora_params is not None:
        return float(ov.lora_params), float(ov.lora_params), 0.0
    if rs.profile != "seed" and has_full_architecture(rs.model):
        c = lora_param_counts(rs.model, wl.lora_rank, wl.lora_target_set)
        return float(c.total), float(c.active), float(c.experts)
    rule = float(seed_lora_params(rs.model, wl.lora_rank))
    return rule, rule, 0.0


def saved_modules_of(rs: ResolvedScenario) -> dict[str, float]:
    """``n_saved`` and ``saved_head``: parameters of the modules a LoRA run trains in full
    (``Workload.modules_to_save``) and of the LM head among them, as the time model takes them
    (0 without a full architecture to count them)."""
    from planner.memory.model_states import saved_module_params

    wl = rs.workload
    if not wl.modules_to_save or not has_full_architecture(rs.model):
        return {"n_saved": 0.0, "saved_head": 0.0}
    sizes = saved_module_params(rs.model, wl.modules_to_save)
    return {"n_saved": float(sum(sizes.values())), "saved_head": float(sizes.get("lm_head", 0))}


def forwards_beside_training(wl: Workload, logprob_forward: Any) -> Any:
    """Forwards without gradients per token beside training (the time model's
    ``reference_forward``): the reference policy's where it runs, and for GRPO the old
    log-probs' where the stack scores its completions apart (``logprob_forward``: a flag, or an
    array of them per stack)."""
    return int(wl.reference_forward) + (np.asarray(logprob_forward, dtype=np.int64) if wl.generates else 0)


def generation_arguments(model: ModelSpec, wl: Workload, lay: Layout, recipe: Recipe) -> dict[str, Any]:
    """GRPO's arguments of :func:`planner.perf.timing.generation_s`: the completions, the engine's
    placement and share, its 16-bit weights and KV cache per token, and whether the phases swap
    (for a scenario's plans, and for measured rows read into the same models)."""
    from planner.memory.generation import engine_weight_bytes, kv_bytes_per_token

    return {"gen_completion_len": wl.completion_len, "gen_prompt_len": wl.prompt_len,
            "gen_num_generations": wl.num_generations, "gen_tp": lay.generation_tp,
            "gen_gpus": lay.generation_gpus, "gen_fraction": lay.engine_memory_fraction,
            "gen_weight_bytes": engine_weight_bytes(model), "gen_kv_bytes_per_token": kv_bytes_per_token(model),
            "gen_sleep": int(recipe.generation_sleep), "gen_sleep_level": recipe.sleep_level,
            "gen_rollout_offload": int(recipe.rollout_offload),
            "gen_async": int(recipe.async_generation and lay.generation_gpus > 0)}


def muon_flops_of(rs: ResolvedScenario, method: Any, optimizer: Any = None) -> Any:
    """Newton–Schulz FLOPs of one optimizer step over the whole model where the plan's optimizer
    is Muon (:func:`planner.perf.flops.muon_step_flops`; 0 for other optimizers), by method code,
    and the routed experts' part of them (:func:`planner.perf.flops.muon_expert_flops`); None
    where no plan runs Muon."""
    from planner.core.codes import OPTIMIZERS
    from planner.memory.model_states import adapter_groups
    from planner.perf.flops import muon_expert_flops, muon_step_flops

    wl = rs.workload
    opt = np.asarray(wl.optimizer if optimizer is None else optimizer)
    is_muon = (opt == "muon") if opt.dtype.kind in "UO" else (opt == OPTIMIZERS.index("muon"))
    if not np.any(is_muon):
        return None
    full, full_experts = muon_step_flops(rs.model, "full"), muon_expert_flops(rs.model, "full")
    adapters = adapter_experts = 0.0
    if has_full_architecture(rs.model):
        dense, experts = adapter_groups(rs.model, wl)
        adapters = muon_step_flops(rs.model, "lora", wl.lora_rank, dense + experts)
        adapter_experts = muon_expert_flops(rs.model, "lora", wl.lora_rank, experts)
    full_run = np.asarray(method) == FULL
    return (np.where(is_muon, np.where(full_run, full, adapters), 0.0),
            np.where(is_muon, np.where(full_run, full_experts, adapter_experts), 0.0))


def kernel_vectors_of(rs: ResolvedScenario, kernels: str) -> float:
    """Hidden vectors per token and layer that a recipe's ``kernels`` save from the eager
    element-wise traffic (:data:`planner.perf.timing.KERNEL_FUSIONS`; 0 for the standard modules
    and for Transformer Engine, which the ``fused`` share prices)."""
    from planner.core.arch import liger_kernels
    from planner.perf.flops import model_flops
    from planner.perf.timing import KERNEL_FUSIONS, fused_kernel_vectors

    ops = KERNEL_FUSIONS.get(kernels)
    if not ops:
        return 0.0
    # Liger's kernels only where its patch for this model puts them
    norm, rope, swiglu = liger_kernels(rs.model) if kernels == "liger" else ops
    return fused_kernel_vectors(model_flops(rs.model), norm, rope, swiglu)


def selective_is_op(selective: Any) -> Any:
    """Whether selective checkpointing is op-level (torchtitan's policy: every second matmul
    rerun) rather than Megatron's core-attention recomputation, by ``Recipe.selective`` (a name
    or its code)."""
    arr = np.asarray(selective)
    codes = (np.array([SELECTIVE.index(k) for k in arr.ravel()], dtype=np.int64).reshape(arr.shape)
             if arr.dtype.kind in "UO" else arr.astype(np.int64))
    return (codes == SELECTIVE.index("op")).astype(np.int64)


def step_arguments(rs: ResolvedScenario, *, method: Any, checkpointing: Any, offload: Any, zero: Any,
                   seq_len: Any, micro_batch: Any, grad_accum: Any, tp: Any, pp: Any, cp: Any, ep: Any,
                   dp: Any, attention: Any, fused: Any, native_attention: Any = 0, selective_op: Any = 0,
                   optimizer: Any = None, intra_only: bool = False, kernel_vectors: Any = None) -> dict[str, Any]:
    """The keyword arguments of :func:`planner.perf.timing.step_time_s` for plans of scenario
    ``rs`` (categorical values as codes; ``micro_batch`` counts the workload's samples, a DPO
    pair being two sequences). ``native_attention``: the stack runs the card generation's own
    fused attention kernels (its recipe's ``native_attention``). ``selective_op``: its selective
    checkpointing is op-level (:func:`selective_is_op`). ``optimizer``: the plan's optimizer (a
    name or its code; the workload's where None), for Muon's Newton–Schulz FLOPs. ``intra_only``
    prices every group at the in-node link. ``kernel_vectors``: the element-wise traffic its fused
    norm, rotary and SwiGLU kernels save (:func:`kernel_vectors_of`; the scenario recipe's where
    None)."""
    wl, lay = rs.workload, rs.layout
    n_lora, n_active, n_experts = n_lora_of(rs)
    full = np.asarray(method) == FULL
    x = dict(method=method, checkpointing=checkpointing, offload=offload, zero=zero, seq_len=seq_len,
             micro_batch=micro_batch * wl.sequences_per_sample, grad_accum=grad_accum, tp=tp, pp=pp,
             cp=cp, ep=ep, dp=dp, n_lora=np.where(full, 0.0, n_lora), n_lora_active=np.where(full, 0.0, n_active),
             n_lora_experts=np.where(full, 0.0, n_experts),
             **saved_modules_of(rs),
             # LoRA's side-path memory traffic per token, from the adapted width a token passes
             # through (n_lora / rank) and the adapters' dtype (the time model charges it to LoRA
             # and QLoRA columns only)
             adapter_bytes=adapter_bytes_per_token(n_active, wl.lora_rank, wl.adapter_dtype),
             attention=attention, native_attention=native_attention, selective_op=selective_op,
             fp8=int(bool(wl.fp8)), fused=fused, ep_overlap=int(rs.recipe.ep_overlap),
             vp=lay.pp_virtual_stages if lay.pp_schedule == "interleaved" else 1)
    if lay.etp is not None:  # the experts' own tensor parallelism (MoE parallel folding)
        x["etp"] = lay.etp
    x["kernel_vectors"] = kernel_vectors_of(rs, rs.recipe.kernels) if kernel_vectors is None else kernel_vectors
    muon = muon_flops_of(rs, method, optimizer)
    if muon is not None:
        x["optimizer_flops"], x["optimizer_expert_flops"] = muon
    forwards = int(forwards_beside_training(wl, rs.recipe.logprob_forward))
    if forwards:
        x["reference_forward"] = forwards
    if wl.generates:
        x.update(generation_arguments(rs.model, wl, lay, rs.recipe))
    if intra_only:
        x["intra_only"] = True
    return x
