"""Profile ``detailed``: per-GPU peak memory from the architecture and the training recipe.

The peak is the maximum over the phases of a step, not a plain sum:
- backward start: persistent states + every saved activation + the loss's peak (or, with
  checkpointing, the recomputed working set of one layer, whichever is larger) + gather buffers;
- backward end: persistent states + all gradients + one layer's working set + buffers;
- optimizer step: persistent states + all gradients + the optimizer's temporaries.
Three views are predicted: ``allocated`` (tensors: ``torch.cuda.max_memory_allocated``),
``reserved`` (the caching allocator's segments: + fragmentation of the memory that churns within
a step) and ``device`` (what nvidia-smi shows and what must fit: + CUDA context and NCCL).

Here: the phases of a step and their peak, the allocator's views and the constants behind them,
inference, and the breakdown a plan reads. The activation terms of a pipeline stage come from
:mod:`planner.memory.stage_activations`, the transient buffers from :mod:`planner.memory.buffers`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

from planner.core.arch import _attention_dims, _dims, expert_params, param_counts
from planner.core.entries import ModelSpec
from planner.core.specs import Layout, Overrides, Recipe, Workload
from planner.core.units import expert_ways, format_bytes, zero_degree
from planner.memory.buffers import buffer_terms, deepspeed_zero3, gathers_units
from planner.memory.generation import GENERATION_PHASE
from planner.memory.model_states import (
    StateParts,
    compute_bytes,
    model_states,
    quantized_linear_bytes,
)
from planner.memory.stage_activations import activation_terms, eval_terms

# ---------------------------------------------------------------------------------------------
# Named constants (each a guess with its source)

#: What nvidia-smi shows above PyTorch's ``max_memory_reserved``: the CUDA context, its loaded
#: kernels and the cuBLAS/cuDNN handles. Reports range from 287 MB with lazy module loading
#: (PyTorch PR #86509) and "300–400 MB" with CUDA ≥ 11.7 (ptrblck, issues #107667/#109888) on
#: older cards to ~0.8 GB on Hopper: the 106 runs of ``bench/gpu_memory.py`` on an H200 (CUDA 12,
#: data/measured_gpu_h200.csv, each a fresh process on one GPU) show nvidia-smi − max_reserved
#: between 0.78 and 0.81 GB, median 0.795 GB = 758 MiB (a test recomputes it). Physical range
#: 280–820 MiB; the measured median is used.
CUDA_CONTEXT_BYTES = 758 * 2**20
#: NCCL buffers per communicator in use (Fujii et al. 2024 memory-estimator notes: ~0.5 GB).
NCCL_COMMUNICATOR_BYTES = 500 * 10**6
#: Caching-allocator fragmentation: share of the memory allocated and freed within a step
#: (activations, logits, buffers, temporaries) that ``max_memory_reserved`` adds on top of
#: ``max_memory_allocated``. GMLake (ASPLOS'24): the PyTorch allocator wastes ~15 % on average
#: (up to 33 %) on LLM training; persistent states, allocated once, fragment little.
ALLOCATOR_FRAGMENTATION = 0.15
#: The same share under ZeRO-3 / FSDP1 across GPUs: every layer's parameters are gathered into
#: fresh blocks and freed again in the forward, the recomputation and the backward, on the
#: all-gather stream (``record_stream``: a block returns to that stream's pool only once the GPU
#: is done with it), interleaved with the other allocations of the layer being run. GMLake
#: (ASPLOS'24, Fig. 3) measures the caching allocator's fragmentation rising as ZeRO-3,
#: recomputation and LoRA are combined. The saved activations (the layers' checkpoints, or every
#: layer's tensors without checkpointing) are a stack, made in forward order and freed in
#: reverse, and keep the unsharded share: llm-foundry's MPT throughput runs (FSDP1 full shard,
#: no activation checkpointing, the largest micro-batch that fit; data/verdicts.csv) would show
#: 10-30 % more than their cards with this share on their 50-70 GB of saved activations. FSDP2
#: frees its gathers with stream waits instead (``Recipe.fsdp_version``); torchtitan's FSDP2 rows
#: of data/measured_calibration.csv keep the 0.15 above. Guess: 0.4. Sharded runs show 0.3–0.9
#: of their churning memory between max_reserved (or nvidia-smi) and max_allocated (Answer.AI
#: fsdp_qlora, median 0.5; PEFT's FSDP/ZeRO-3 guides, 0.3–0.9; data/measured_calibration_more.csv);
#: over both measured files 0.4 and 0.5 score within 0.1 % of each other (mean absolute error),
#: and leave-one-source-out refits pick 0.25–1.0 (``planner validate … --loso``).
ALLOCATOR_FRAGMENTATION_SHARDED = 0.4
#: What the caching allocator cannot give back when memory runs out, as a share of what is
#: allocated. Before it raises an out-of-memory error PyTorch frees every cached segment with no
#: live block and retries (``CUDACachingAllocator`` ``release_cached_blocks``); what stays is the
#: free space inside segments that still hold live blocks. The reserved view above is what a run
#: shows where memory is plentiful; at its card's limit a run needs only allocated + this. The
#: medians of "reserved by PyTorch but unallocated" over "allocated by PyTorch" in the OOM
#: messages of 37 LLM training runs whose sharding is known (data/oom_tracebacks.csv, a test
#: recomputes them): 25 unsharded runs 1.1 %, 12 under ZeRO-3/FSDP 4.8 %.
TRAPPED_FRAGMENTATION = 0.011
TRAPPED_FRAGMENTATION_SHARDED = 0.048


#: Components that are model states (allocated once in fixed sizes, not churned within a step).
STATE_PARTS = frozenset({"weights", "gradients", "optimizer_states", "master_weights",
                         "adapter_states", "reference_weights"})


@dataclass(frozen=True)
class Peak:
    """Bytes of each component at the peak phase, and the three views."""

    phase: str
    parts: dict[str, float]
    allocated: float
    reserved: float
    device: float
    host: float
    notes: tuple[str, ...]
    #: What each phase (and stage) of the step needs to run at the card's limit: allocated + the
    #: trapped share (at most its reserved view) + context + NCCL (:data:`TRAPPED_FRAGMENTATION`).
    phase_needed: dict[str, float]
    #: The last pipeline stage's own peak, allocated and reserved (None without pipeline
    #: parallelism): what its rank reports, e.g. Megatron's TensorBoard and W&B memory scalars,
    #: which only the last rank writes.
    last_stage: tuple[float, float] | None = None


def reference_weight_bytes(model: ModelSpec, wl: Workload, layout: Layout, dp: int) -> float:
    """DPO's frozen reference for full fine-tuning: the weights once more in the compute dtype,
    divided by TP and PP and, under ZeRO-3/FSDP, sharded like the policy (TRL prepares it with
    the trainer's DeepSpeed ZeRO-3 or FSDP settings, offload included), its routed experts split
    by expert parallelism as the policy's; none otherwise."""
    if not wl.reference_copy or layout.offload == "optimizer+params":
        return 0.0
    shard = zero_degree(dp, layout.cp) if layout.zero == 3 else 1
    # its routed experts split as the policy's: over ep ranks, each etp ways where set
    experts = expert_params(model)
    ways = float(expert_ways(layout.ep, shard, layout.zero == 3, tp=layout.tp, etp=layout.etp))
    e = compute_bytes(wl.precision)
    return ((param_counts(model).total - experts) * e / (layout.tp * layout.pp * shard)
            + experts * e / (layout.expert_tp * layout.pp * ways))


def _comm_groups(layout: Layout) -> int:
    """NCCL communicators a GPU joins: its dp, tp, pp and cp groups of more than one rank, and
    with expert parallelism the expert layers' own: the ep group (the all-to-alls), the experts'
    data-parallel group (dp·cp·tp / (ep·etp) ranks, which reduces their gradients) and an expert
    TP group where the experts' TP differs from tp (Megatron-Core's ``parallel_state`` builds
    each; DeepSpeed-MoE and torchtitan their ep and expert-dp groups)."""
    dp = cast(int, layout.dp)  # set: detailed_peak and detailed_memory copy the layout with their dp
    groups = sum(1 for d in (dp, layout.tp, layout.pp, layout.cp) if d > 1)
    if layout.ep > 1:
        expert_tp = layout.expert_tp
        groups += 1 + int(dp * layout.cp * layout.tp // (layout.ep * expert_tp) > 1)
        groups += int(expert_tp > 1 and expert_tp != layout.tp)
    return groups


@dataclass(frozen=True)
class _StepStates:
    """Model states through a step: ``persistent`` (gradients as they stand between
    micro-batches), ``start`` at backward start, and the gradients at backward end
    (``end_grads``) and once reduced (``reduced``: each GPU's shard only)."""

    persistent: dict[str, float]
    start: dict[str, float]
    end_grads: float
    reduced: float


def detailed_peak(model: ModelSpec, wl: Workload, layout: Layout, overrides: Overrides, *,
                  recipe: Recipe, dp: int, grad_accum: int | None) -> Peak:
    """The peak over phases and stages, in the three views (see the module docstring)."""
    layout = layout.model_copy(update={"dp": dp})
    adapter_bytes = 4 if wl.adapter_dtype == "fp32" else compute_bytes(wl.precision)
    st = model_states(model, wl, recipe=recipe, tp=layout.tp, pp=layout.pp,
                      zero_degree=zero_degree(dp, layout.cp), zero=layout.zero, offload=layout.offload,
                      adapter_bytes=adapter_bytes, ep=layout.ep, etp=layout.etp,
                      frozen_grads=recipe.fsdp_mixed_units and layout.zero == 3)
    buf = buffer_terms(model, wl, layout, st, recipe=recipe)
    notes = []
    if buf["offload_buffer"]:
        notes.append(
            f"DeepSpeed ZeRO-Offload on the GPU: a {format_bytes(buf['offload_buffer'])} gradient "
            f"buffer; up to {format_bytes(max(buf['offload_early'], buf['offload_end']))} while the "
            "largest gradient is normed in FP64 and checked for inf/NaN on its way to the host"
            + (f"; its FP32 partition copied to the GPU at the step ({format_bytes(buf['offload_step'])})"
               if buf["offload_step"] else ""))
    if buf["saved_weights"]:
        notes.append(f"DeepSpeed ZeRO-3 with stock F.linear (model built outside zero.Init): autograd keeps "
                     f"each gathered layer weight until its backward, {format_bytes(buf['saved_weights'])} "
                     "more at backward start")
    # FSDP under pipeline parallelism keeps each stage's parameters unsharded for the whole step
    # (torchtitan: reshard_after_forward = not pp_enabled) and syncs gradients on the last
    # micro-batch only, so unsharded gradients accumulate in between.
    fsdp_pp = layout.pp > 1 and layout.zero == 3 and zero_degree(dp, layout.cp) > 1
    if fsdp_pp:
        unsharded = st.trainable * compute_bytes(wl.precision)
        buf["gather"] = max(buf["gather"], unsharded)
        notes.append("FSDP with PP: stage parameters stay unsharded; gradients accumulate unsharded")
    states = _step_states(wl, layout, recipe, st, dp=dp, grad_accum=grad_accum, fsdp_pp=fsdp_pp,
                          notes=notes)
    reference = reference_weight_bytes(model, wl, layout, dp)
    reference_host = 0.0
    if reference and recipe.reference_offload:
        reference_host, reference = reference, 0.0
        notes.append(f"{wl.algorithm.upper()}: the frozen reference's 16-bit weights kept in host memory, moved "
                     "in unit by unit for its forward (FSDP CPU offload)")
    if reference:
        states = replace(states, persistent={**states.persistent, "reference_weights": reference},
                         start={**states.start, "reference_weights": reference})
        notes.append(f"{wl.algorithm.upper()}: a frozen 16-bit copy of the weights as the reference policy, "
                     "sharded like the policy's")
    best: tuple[float, str, dict[str, float], float] | None = None
    frag = _fragmentation(layout, recipe)
    fixed = CUDA_CONTEXT_BYTES + NCCL_COMMUNICATOR_BYTES * _comm_groups(layout)
    trapped = _trapped(layout)
    phase_reserved: dict[str, float] = {}
    phase_needed: dict[str, float] = {}
    last_allocated = last_reserved = 0.0
    stages = [True] if layout.pp == 1 else [False, True]
    for last in stages:
        a = activation_terms(model, wl, layout, grad_accum, recipe=recipe, last_stage=last)
        ev = eval_terms(model, wl, layout, recipe=recipe, last_stage=last)
        for name, parts in _phases(model, wl, layout, recipe, st, buf, states, a, ev).items():
            total = sum(parts.values())
            label = name + (" (last stage)" if last and layout.pp > 1 else "")
            phase_reserved[label] = _reserved_view(name, parts, total, buf["gather"], frag,
                                                   _layer_churn(name, parts, a))
            phase_needed[label] = min(phase_reserved[label], total * (1.0 + trapped))
            if last:
                last_allocated = max(last_allocated, total)
                last_reserved = max(last_reserved, phase_reserved[label], total)
            if best is None or total > best[0]:
                best = (total, label, parts, a["host"])
    assert best is not None  # every stage has its phases (backward start and end at least)
    allocated, phase, parts, act_host = best
    reserved = max(phase_reserved.values())
    notes.append(f"peak phase: {phase}")
    return Peak(phase, parts, allocated, reserved, reserved + fixed, st.host + act_host + reference_host, tuple(notes),
                {k: v + fixed for k, v in phase_needed.items()},
                (last_allocated, last_reserved) if layout.pp > 1 else None)


def _trapped(layout: Layout) -> float:
    """The share of allocated memory the allocator cannot release at the card's limit
    (:data:`TRAPPED_FRAGMENTATION`): the sharded one where ZeRO-3/FSDP gathers units."""
    return TRAPPED_FRAGMENTATION_SHARDED if gathers_units(layout) else TRAPPED_FRAGMENTATION


def _fragmentation(layout: Layout, recipe: Recipe) -> float:
    """The allocator's fragmentation share: the sharded one where FSDP1 or DeepSpeed ZeRO-3
    gathers units (``fsdp_version`` 1; see :data:`ALLOCATOR_FRAGMENTATION_SHARDED`)."""
    sharded = gathers_units(layout) and recipe.fsdp_version == 1
    return ALLOCATOR_FRAGMENTATION_SHARDED if sharded else ALLOCATOR_FRAGMENTATION


def _fragmentation_note(wl: Workload, layout: Layout, recipe: Recipe) -> str:
    """The fragmentation share a breakdown's note states."""
    frag = ALLOCATOR_FRAGMENTATION if wl.method == "inference" else _fragmentation(layout, recipe)
    if frag == ALLOCATOR_FRAGMENTATION:
        return f"{frag:.0%}"
    return (f"{frag:.0%} (FSDP1/DeepSpeed ZeRO-3 gathers; {ALLOCATOR_FRAGMENTATION:.0%} on the saved "
            "activations and in the optimizer step)")


def _step_states(wl: Workload, layout: Layout, recipe: Recipe, st: StateParts, *, dp: int,
                 grad_accum: int | None, fsdp_pp: bool, notes: list[str]) -> _StepStates:
    """The gradients of each phase: accumulated between micro-batches (unsharded under FSDP
    no_sync), and absent at backward start of a run's first micro-batch."""
    dev = st.device
    grads = dev.get("gradients", 0.0)
    persistent = {k: v for k, v in dev.items() if k != "gradients"}
    # DeepSpeed ZeRO-3 allocates its flat gradient partition at initialisation and keeps it
    # (``DeepSpeedZeroOptimizer_Stage3``: ``grad_partitions_flat_buffer``).
    accumulating = (grad_accum or 1) > 1 or layout.pp > 1 or deepspeed_zero3(layout, recipe)
    reduced = grads  # after the last micro-batch's reduce-scatter: each GPU's shard only
    if accumulating and grads:
        if (recipe.unsharded_grad_accumulation or fsdp_pp) and layout.zero >= 2:
            grads *= zero_degree(dp, layout.cp)
            e = compute_bytes(wl.precision)
            if fsdp_pp and wl.precision in ("mixed", "fp16") and recipe.grad_dtype != "fp32" and e < 4:
                # FSDP2 (``fully_shard``) with an FP32 ``reduce_dtype`` upcasts the unsharded
                # gradient it accumulates without syncing (``FSDPParam.
                # to_accumulated_grad_if_needed``: ``unsharded_grad.to(self.reduce_dtype)``).
                grads *= 4 / e
            notes.append("gradients accumulate unsharded between micro-batches (FSDP no_sync)")
        persistent["gradients"] = grads
    # At a run's first micro-batch (``peak_at_first_step``) no earlier micro-batch has left
    # gradients: they exist only once its own backward has made them (backward end).
    start = {k: v for k, v in persistent.items()
             if not (recipe.peak_at_first_step and k == "gradients")}
    end_grads = persistent.get("gradients", reduced) if recipe.peak_at_first_step else reduced
    return _StepStates(persistent, start, end_grads, reduced)


def _phases(model: ModelSpec, wl: Workload, layout: Layout, recipe: Recipe, st: StateParts,
            buf: dict[str, float], states: _StepStates, a: dict[str, float],
            ev: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
    """Components of each phase of a step on one pipeline stage (activation terms ``a``; an
    evaluation pass's terms ``ev``, see :func:`~planner.memory.stage_activations.eval_terms`)."""
    persistent = states.persistent
    held = a["loss_held"]  # logits the training loop keeps until the next step's forward
    # Inputs kept on autograd contexts (legacy bitsandbytes) outlive backward: until the
    # graph is freed, and in a loop that holds the step's outputs, through the optimizer step.
    kept, kept_after = a["on_context"], a["on_context"] if model.impl == "litgpt" else 0.0
    if a["loss_peak"] >= a["working"] + held + buf["dequant"]:  # the loss's backward first
        act_start, logits, dequant = a["saved"], a["loss_peak"], 0.0
    else:  # the last layer's recomputation and its dequantized weight, after the loss
        act_start, logits, dequant = a["saved"] + a["working"], held, buf["dequant"]
    # ZeRO-Offload's gradient buffer and DeepSpeed ZeRO-3's reduce bucket, from initialisation on
    kept_buffer = buf["offload_buffer"] + buf["kept_bucket"]
    end_grads = states.end_grads
    if (layout.checkpointing != "none" and wl.method == "full" and layout.pp == 1
            and "gradients" not in states.start and st.trainable):
        # Gradients made in this backward (none left by an earlier micro-batch): with
        # checkpointing the first layer's backward runs after its recomputation, and the
        # embeddings' gradients after that; at the recomputation neither exists yet. A head
        # tied to the embedding gave it its gradient at the start of backward.
        counts = param_counts(model)
        embeddings = (0 if model.tied_embeddings else counts.embedding) + counts.positions
        first = (embeddings + (counts.attention + counts.mlp) / model.layers) / layout.tp
        end_grads -= min(end_grads, first / st.trainable * end_grads)
    phases = {
        "backward start": {**states.start, "activations": act_start, "logits": logits,
                           "buffers": (buf["gather"] + buf["saved_weights"] + dequant + buf["zero_buckets"]
                                       + kept_buffer)},
        "backward end": {**persistent, "gradients": end_grads,
                         "activations": a["working_end"] + kept, "logits": held,
                         "buffers": (buf["gather"] + buf["ddp"] + buf["dequant"]
                                     + buf["zero_buckets"] + kept_buffer + buf["offload_end"])},
    }
    if buf["offload_early"]:
        # ZeRO-Offload moves the head's gradient to the host during the last layer's backward,
        # after the loss's (see :func:`planner.memory.buffers._zero_offload_terms`).
        phases["gradient offload"] = {**states.start, "activations": a["saved"] + a["working"],
                                      "logits": held,
                                      "buffers": (buf["gather"] + buf["dequant"] + buf["zero_buckets"]
                                                  + kept_buffer + buf["offload_early"])}
    if a["kv_cache"]:
        # The end of the forward and the loss's forward, with the returned KV cache still held.
        phases["end of forward"] = {**states.start, "activations": a["saved"] + a["kv_cache"],
                                    "logits": a["loss_forward"] + held,
                                    "buffers": (buf["gather"] + buf["saved_weights"] + buf["zero_buckets"]
                                                + kept_buffer)}
    if recipe.optimizer_step == "in_backward":
        phases["backward end"]["gradients"] = st.largest_grad
    else:
        phases["optimizer step"] = {**persistent, "gradients": states.reduced, "logits": held,
                                    "activations": kept_after,
                                    "buffers": buf["optimizer_temp"] + kept_buffer + buf["offload_step"]}
    if ev:
        # Evaluation runs between optimizer steps: the Trainer's ``zero_grad`` has set the
        # gradients to None (DeepSpeed ZeRO-3 keeps its flat partition), and no step's
        # activations are left; ZeRO-3/FSDP gathers each unit for the forward as in training.
        at_rest = {k: v for k, v in persistent.items()
                   if k != "gradients" or deepspeed_zero3(layout, recipe)}
        phases["evaluation"] = {**at_rest, "activations": ev["working"] + kept_after,
                                "logits": ev["logits"] + held,
                                "buffers": buf["gather"] + buf["dequant"] + kept_buffer}
    if wl.generates and not layout.generation_gpus:
        # A colocated engine generates between steps beside the trainer's states at rest:
        # ``zero_grad`` has set the gradients to None (DeepSpeed ZeRO-3 keeps its flat
        # partition) and no step's activations or gathers are left (the trainers empty the
        # allocator's cache before waking the engine).
        at_rest = {k: v for k, v in persistent.items()
                   if k != "gradients" or deepspeed_zero3(layout, recipe)}
        phases[GENERATION_PHASE] = {**at_rest, "buffers": kept_buffer}
    if recipe.full_state_dict and layout.zero == 3:
        # A full (unsharded) state dict at a checkpoint save, or an unsharded load with
        # ``sync_module_states``: FSDP gathers it unit by unit. Each unit's pre-state-dict
        # hook unshards it, its tensors are copied to the CPU (``FullStateDictConfig(
        # offload_to_cpu=True, rank0_only=True)``, as accelerate, Lightning and torchtune
        # configure it; FSDP2's ``get_model_state_dict(full_state_dict=True,
        # cpu_offload=True)`` likewise) and the unit is resharded before the next: one
        # unit is materialised on the GPU at a time, never the whole model. It happens
        # outside a step: no gradients exist then (``zero_grad`` sets them to None).
        at_rest = {k: v for k, v in persistent.items() if k != "gradients"}
        phases["full state dict"] = {**at_rest, "logits": held, "activations": kept_after,
                                     "buffers": buf["unit"] + kept_buffer}
    return phases


def _layer_churn(name: str, parts: dict[str, float], a: dict[str, float]) -> float:
    """What a phase allocates and frees beside the gathered units, apart from the saved
    activations: those are a stack (made in forward order, freed in reverse) and fragment like
    any unsharded memory."""
    transient = sum(v for k, v in parts.items() if k not in STATE_PARTS)
    stacked = ("backward start", "end of forward", "gradient offload")
    return transient - (a["saved"] if name in stacked else 0.0)


def _reserved_view(name: str, parts: dict[str, float], total: float, gather: float,
                   frag: float, layered: float | None = None) -> float:
    """One phase's reserved view: its ``total`` allocated, the gather blocks still cached and
    the fragmentation of its churning memory: ``frag`` of what churns beside the gathers
    (``layered``; all of it when not given), the unsharded share of the rest."""
    # Model states (gradients included) are allocated in the same sizes every step, so
    # the allocator hands the same blocks back: only the rest churns and fragments.
    # Gradients count as states whether or not they outlive a micro-batch (with
    # grad_accum 1 ``zero_grad`` frees them each step all the same), so the reserved
    # view cannot jump when a larger dp brings grad_accum down to 1.
    transient = total - sum(v for k, v in parts.items() if k in STATE_PARTS)
    # ``max_memory_reserved`` is the largest the segments ever were: the maximum over
    # phases of each phase's own reserved view, which need not be the phase with the
    # most allocated (a phase of states and one of churning activations).
    # ZeRO-3/FSDP gathers into blocks of its all-gather stream; the caching allocator
    # keeps them in that stream's pool once made, so phases that gather nothing (the
    # optimizer step, a save) still hold them reserved.
    gathers_nothing = name in ("optimizer step", "full state dict")
    cached = gather if gathers_nothing else 0.0
    # The sharded fragmentation comes from gathers interleaved with activations; a phase that
    # gathers nothing (the optimizer step's temporaries) fragments like any other.
    share = min(frag, ALLOCATOR_FRAGMENTATION) if gathers_nothing else frag
    churn = max(transient, 0.0)
    layered = churn if layered is None else min(max(layered, 0.0), churn)
    return total + cached + share * layered + min(share, ALLOCATOR_FRAGMENTATION) * (churn - layered)


#: Error band per method: the 90th percentile of |predicted − measured| / measured that
#: ``planner validate data/measured_calibration.csv`` measures for this profile (a test checks
#: these figures against a fresh validation). Inference has no measured runs: no band.
ERROR_BANDS: dict[str, float] = {"full": 0.14, "lora": 0.08, "qlora": 0.22}
#: How this profile did on published runs it had never seen, per method and for one GPU or
#: several: the prediction recorded when each row was added, before any rule was looked at for it
#: (``predicted_before_gb`` of data/measured_memory_published*.csv and measured_memory_mlperf.csv):
#: rows, median |error|, its 80th percentile and the median signed error (negative: the estimate
#: was low). Runs on several GPUs miss by more (full training 16 % against 7 % on one GPU): their
#: figures are mostly a trainer's or nvidia-smi's of unstated kind, under ZeRO, FSDP or Megatron.
#: Wider than :data:`ERROR_BANDS`, which the calibration file measures; every estimate states the
#: figure of its case. tests/test_validate.py recomputes them from the files.
UNSEEN_ERROR: dict[tuple[str, bool], tuple[int, float, float, float]] = {
    ("full", False): (71, 0.07, 0.175, -0.034), ("full", True): (373, 0.164, 0.386, -0.065),
    ("lora", False): (92, 0.108, 0.313, -0.079), ("lora", True): (66, 0.154, 0.319, -0.088),
    ("qlora", False): (108, 0.154, 0.521, 0.033), ("qlora", True): (28, 0.133, 0.216, -0.008)}
_METHOD_WORDS = {"full": "full-training", "lora": "LoRA", "qlora": "QLoRA"}


def unseen_error_note(method: str, gpus: int = 1) -> str | None:
    """The line an estimate prints about :data:`UNSEEN_ERROR` for its method on one GPU or on
    several (none: no rows)."""
    several = gpus > 1
    if (method, several) not in UNSEEN_ERROR:
        return None
    rows, median, p80, signed = UNSEEN_ERROR[(method, several)]
    if round(abs(signed), 2) == 0:
        side = "the estimate neither low nor high by its median"
    else:
        side = f"the estimate {'low' if signed < 0 else 'high'} by a median {abs(signed):.0%}"
    where = "several GPUs" if several else "one GPU"
    return (f"on {rows} published {_METHOD_WORDS[method]} runs on {where} predicted before they were "
            f"added: median error {median:.0%}, 80% of them within {p80:.0%}, {side} (data/README.md)")


def inference_memory(model: ModelSpec, wl: Workload, layout: Layout) -> dict[str, float]:
    """Serving one batch: weights (16-bit, or quantized linears for a QLoRA-style base), the KV
    cache with the KV heads (B·L·2·T·h_kv·e), and the largest forward intermediate of one layer
    (gate and up, 2·B·T·f·e) with the FP32 logits of the last position (4·B·V)."""
    e = compute_bytes(wl.precision)
    counts = param_counts(model)
    mp = layout.tp * layout.pp
    linear = counts.attention + counts.mlp
    rest = counts.total - linear
    w_b = quantized_linear_bytes(wl) if wl.method == "qlora" else e
    weights = (linear * w_b + rest * e) / mp
    _, kv_heads, d = _attention_dims(model)
    kv = wl.micro_batch * model.layers * 2 * wl.seq_len * kv_heads * d * e
    ffn = _dims(model, "ffn")[0] if model.moe is None else model.moe.expert_ffn * model.moe.active
    work = 2 * wl.micro_batch * wl.seq_len * ffn * e / layout.tp
    (vocab,) = _dims(model, "vocab")
    return {"weights": weights, "kv_cache": kv / (mp * layout.cp),
            "activations": work, "logits": 4 * wl.micro_batch * vocab / layout.tp}


def _inference_peak(model: ModelSpec, wl: Workload, served: Layout) -> Peak:
    """Serving's one phase, the forward, in the three views (``served``: the layout with its dp)."""
    parts = inference_memory(model, wl, served)
    allocated = sum(parts.values())
    reserved = allocated + ALLOCATOR_FRAGMENTATION * (allocated - parts["weights"])
    device = reserved + CUDA_CONTEXT_BYTES + NCCL_COMMUNICATOR_BYTES * _comm_groups(served)
    needed = min(reserved, allocated * (1.0 + TRAPPED_FRAGMENTATION)) + device - reserved
    return Peak("forward", parts, allocated, reserved, device, 0.0, ("peak phase: forward",),
                {"forward": needed})


def detailed_memory(model: ModelSpec, wl: Workload, layout: Layout, overrides: Overrides, *,
                    recipe: Recipe, dp: int, grad_accum: int | None = None):
    """The ``detailed`` profile as a :class:`~planner.memory.seed.MemoryBreakdown`: components at the
    peak phase (``overhead`` = fragmentation, CUDA context and NCCL), ``total_bytes`` = the
    device view, ``predicted`` = the allocated, reserved and device views."""
    from planner.core.units import ceil_bytes
    from planner.memory.breakdown import MemoryBreakdown

    if wl.method == "inference":
        peak = _inference_peak(model, wl, layout.model_copy(update={"dp": dp}))
    else:
        peak = detailed_peak(model, wl, layout, overrides, recipe=recipe, dp=dp, grad_accum=grad_accum)
    components = {k: ceil_bytes(v) for k, v in peak.parts.items() if v > 0}
    allocated = sum(components.values())
    reserved = max(ceil_bytes(peak.reserved), allocated)
    device = max(ceil_bytes(peak.device), reserved)
    # The total a plan must fit: each phase's needed bytes, rounded up; the highest is the total
    # exactly (the total also rounds each component up), so "every phase fits" is "the total fits".
    phase_bytes = {k: ceil_bytes(v) for k, v in peak.phase_needed.items()}
    needed = min(max(max(phase_bytes.values()), allocated), device)
    phase_bytes[max(phase_bytes, key=phase_bytes.__getitem__)] = needed
    components["overhead"] = needed - allocated
    predicted = {"allocated_bytes": allocated, "reserved_bytes": reserved, "device_bytes": device,
                 "needed_bytes": needed}
    if peak.last_stage is not None:  # the last pipeline rank's own peak, as that rank reports it
        last_allocated, last_reserved = (ceil_bytes(v) for v in peak.last_stage)
        predicted["last_stage_allocated_bytes"] = last_allocated
        predicted["last_stage_reserved_bytes"] = max(last_reserved, last_allocated)
        predicted["last_stage_device_bytes"] = max(last_reserved, last_allocated) + ceil_bytes(peak.device - peak.reserved)
    served = layout.model_copy(update={"dp": dp})
    trapped = TRAPPED_FRAGMENTATION if wl.method == "inference" else _trapped(served)
    notes = list(peak.notes) + [
        "detailed profile: per-layer saved tensors, logits and loss, peak over step phases",
        (f"reserved = allocated + {_fragmentation_note(wl, served, recipe)} of the memory "
        f"that churns in a step; device = reserved + CUDA context + NCCL (what nvidia-smi shows "
        f"where memory is plentiful)"),
        (f"needed = allocated + {trapped:.1%} the allocator cannot release at the card's limit "
        f"+ CUDA context + NCCL (at most the device view): the total a plan must fit"),
    ]
    unseen = unseen_error_note(wl.method, dp * layout.tp * layout.pp * layout.cp)
    if unseen:
        notes.append(unseen)
    return MemoryBreakdown(
        components=components,
        host_bytes=ceil_bytes(peak.host),
        assumptions=tuple(notes),
        predicted=predicted,
        error_band=ERROR_BANDS.get(wl.method),
        phase_bytes=phase_bytes,
    )
