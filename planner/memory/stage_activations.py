"""The activation side of the detailed profile, for one pipeline stage of a step.

From a workload, layout and recipe to the activation model's terms: the layer recipe
(:class:`~planner.memory.inventory.LayerRecipe`) a workload runs, the micro-batches a pipeline
stage holds at once, the saved activations (checkpointed, offloaded or not), the working set of
the layer being recomputed and of the last layer's backward, the loss's saved, peak and held
bytes, inputs kept on autograd contexts, a returned KV cache, and an evaluation forward's terms.
:mod:`planner.memory.detailed` places them in the phases of a step.
"""

from __future__ import annotations

from planner.core.arch import _dims, liger_kernels
from planner.core.entries import ModelSpec
from planner.core.specs import Layout, Recipe, Workload
from planner.memory import activations as act
from planner.memory.attention import eager_mask_bytes
from planner.memory.inventory import FP32, LayerRecipe
from planner.memory.logits import eval_loss_bytes, loss_bytes
from planner.memory.model_states import (
    bnb_base,
    bnb_keeps_input,
    bnb_prepared,
    compute_bytes,
    fp32_embeddings,
    fp32_lora_base,
    int8_base,
    quantized_head,
)

#: Activation offloading keeps this many layers' checkpoints on the GPU (the one in use and the
#: one being copied; torchtune ``OffloadActivations`` uses one side stream).
OFFLOAD_RESIDENT_LAYERS = 2


def _recipe(model: ModelSpec, wl: Workload, layout: Layout, recipe: Recipe, *,
            first_layer: bool) -> LayerRecipe:
    e = compute_bytes(wl.precision)
    lora = wl.method in ("lora", "qlora")
    # FP32 embeddings and lm_head: a prepared bitsandbytes base's, or an FP32 LoRA base's
    fp32_ends = fp32_embeddings(wl, recipe) or fp32_lora_base(wl)
    # Liger's RMSNorm and SwiGLU, where its patch for this model puts them
    liger_norm, _, liger_swiglu = liger_kernels(model) if recipe.kernels == "liger" else (False, False, False)
    return LayerRecipe(
        e=e,
        attention=layout.attention,
        trainable_base=wl.method == "full",
        lora_targets=frozenset(wl.lora_target_set) if lora else frozenset(),
        c=(4 if wl.adapter_dtype == "fp32" else e) if lora else e,
        lora_rank=wl.lora_rank if lora else 0,
        lora_dropout=lora and wl.lora_dropout > 0,
        # LoRA's first layer gets a frozen input, unless the embeddings are trained in full
        input_requires_grad=not (first_layer and lora and layout.checkpointing == "none"
                                 and "embed_tokens" not in wl.modules_to_save),
        fused=recipe.compile,
        unsloth=lora and recipe.kernels == "unsloth",
        fused_norm=recipe.kernels == "fused_rmsnorm" or liger_norm,
        fused_swiglu=liger_swiglu,
        te=recipe.kernels == "transformer_engine",
        selective_core_attention=recipe.selective == "core_attention",
        fp8_attention=wl.fp8 and recipe.kernels == "transformer_engine" and recipe.fp8_attention,
        fp8_activation_store=recipe.kernels == "transformer_engine" and recipe.fp8_activation_store,
        fp8=wl.fp8,
        frozen_saves_input=bnb_keeps_input(wl, recipe),
        int8=int8_base(wl),
        int8_transposed=int8_base(wl) and recipe.int8_keeps_transposed,
        autocast=lora and wl.precision in ("mixed", "fp16"),
        one_dtype=wl.precision in ("bf16", "fp32"),
        lora_shares_input=bnb_base(wl),
        fp32_stream=(bnb_prepared(wl, recipe)
                     and (fp32_embeddings(wl, recipe) or not _norm_keeps_dtype(model))),
        fp32_embeddings=fp32_ends,
        fp32_base=fp32_lora_base(wl),
        clamp_bytes=(FP32 if fp32_ends else e) if model.eager_mask_clamp else 0,
        moe_loop=recipe.moe_experts == "loop",
    )


def _norm_keeps_dtype(model: ModelSpec) -> bool:
    """Gemma's RMSNorm returns ``output.type_as(x)``: an FP32 weight leaves a bf16 stream bf16
    (Llama-style norms return ``weight * x``, FP32 with an FP32 weight)."""
    return (model.family or "").startswith("gemma")


def in_flight_micro_batches(layout: Layout, grad_accum: int | None, *, last_stage: bool = False) -> float:
    """Micro-batches whose activations a pipeline stage holds at once, in whole stages: the
    first stage's (the most), or the last stage's.

    1F1B: min(p, m) on the first stage (Narayanan et al. 2021), 1 on the last (each forward's
    backward follows at once); interleaved with v chunks: the chunks of
    :func:`_interleaved_in_flight`, p·(1 + (p−1)/(p·v)) on the first stage when m is large
    (Korthikanti et al. 2022 §4.2.3), never more than the step's m; GPipe: all m on every stage.
    m unknown → p (interleaved: not capped, as when m is large).
    Not modelled: Megatron's warm-up group size other than p
    (``microbatch_group_size_per_vp_stage``) and the extra micro-batch its overlapped MoE
    all-to-all (``overlap_moe_expert_parallel_comm``) warms up.
    """
    p = layout.pp
    if p == 1:
        return 1.0
    if layout.pp_schedule == "interleaved":
        return _interleaved_in_flight(p, layout.pp_virtual_stages, grad_accum, rank=p - 1 if last_stage else 0)
    m = grad_accum or p
    if layout.pp_schedule == "gpipe":
        return float(m)
    return 1.0 if last_stage else float(min(p, m))


def _interleaved_in_flight(p: int, v: int, m: int | None, *, rank: int) -> float:
    """Interleaved 1F1B (Megatron's ``forward_backward_pipelining_with_interleaving``): pipeline
    rank ``rank`` runs 2·(p−rank−1) + (v−1)·p chunk forwards of warm-up before its first backward,
    at most the m·v chunks of the step (no cap where m is unknown), so it holds that many + 1
    chunks of L/(p·v) layers at once: in whole stages, that count / v."""
    chunks = 2 * (p - rank - 1) + (v - 1) * p + 1
    return (chunks if m is None else min(chunks, m * v)) / v


def activation_terms(model: ModelSpec, wl: Workload, layout: Layout, grad_accum: int | None,
                     *, recipe: Recipe, last_stage: bool) -> dict[str, float]:
    """Saved activations of one pipeline stage (``saved``), the working set of the layer being
    recomputed (``working``) and of the last layer's backward (``working_end``), the loss (``loss_saved``, ``loss_peak``) and offloaded bytes."""
    b, s = wl.micro_batch * wl.sequences_per_sample, wl.seq_len // layout.cp
    tp, sp = layout.tp, layout.sp
    rec = _recipe(model, wl, layout, recipe, first_layer=False)
    n_layers = -(-model.layers // layout.pp)  # the heaviest stage when pp does not divide L
    layer = act.layer_saved(model, rec, b, s)
    full_layer = layer.total(tp, sp)
    temps = act.backward_temporaries(model, rec, b, s).total(tp, sp)
    first = act.layer_saved(model, _recipe(model, wl, layout, recipe, first_layer=True), b, s).total(tp, sp)
    if layout.checkpointing == "none":
        per, working = full_layer, temps
        bottom = first if not last_stage or layout.pp == 1 else per  # the stage's first layer
        layers = (n_layers - 1) * per + bottom
        # The layer whose backward runs last keeps its own saved tensors until that backward
        # is done: at the end of backward they sit beside its temporaries.
        working_end = bottom + temps
    else:
        pick = act.selective_saved if layout.checkpointing == "selective" else act.checkpoint_saved
        per, working = pick(model, rec, b, s).total(tp, sp), full_layer + temps
        layers = n_layers * per
        working_end = working
    host = 0.0
    if layout.activation_offload and layout.checkpointing != "none":
        resident = min(n_layers, OFFLOAD_RESIDENT_LAYERS) * per
        host, layers = layers - resident, resident
    in_flight = in_flight_micro_batches(layout, grad_accum, last_stage=last_stage)
    saved = (layers + act.shared_saved(model, rec, b, s) + eager_mask_bytes(rec, b, s)) * in_flight
    host *= in_flight
    loss_saved = loss_peak = loss_held = 0.0
    on_context = 0.0
    if rec.frozen_saves_input and layout.checkpointing == "none":
        # legacy bitsandbytes: each step's matmul inputs on autograd contexts (with
        # checkpointing they belong to the recomputed layer; not modelled beyond it)
        on_context = n_layers * layer.on_context_total(tp, sp) * in_flight
    if last_stage:
        lm_head_trainable = (wl.method == "full" or "lm_head" in wl.lora_targets
                             or "lm_head" in wl.modules_to_save)
        embedding_trainable = wl.method == "full" or "embed_tokens" in wl.modules_to_save
        # GPipe runs every micro-batch's forward first: the last stage keeps each one's head
        # tensors and loss graph until the backwards begin (1F1B and interleaving: one at a time)
        heads = in_flight if layout.pp_schedule == "gpipe" and layout.pp > 1 else 1.0
        saved += heads * act.head_saved(model, rec, b, s, lm_head_trainable=lm_head_trainable,
                                        embedding_trainable=embedding_trainable) / (tp if sp else 1)
        head_q = quantized_head(model, wl)
        if head_q and rec.frozen_saves_input:  # the chunked lm_head's inputs
            on_context += b * s * rec.e * model.hidden * in_flight
        # litgpt's loop holds the previous step's outputs, so their graph with every input
        # bitsandbytes kept on its contexts lives until this step's forward returns.
        carried = on_context if model.impl == "litgpt" else 0.0
        loss_saved, loss_peak, loss_held = loss_bytes(
            model, rec.e, b * s, recipe.loss_impl(wl.algorithm), tp, compiled=recipe.compile, batch=b,
            first_step=recipe.peak_at_first_step, carried=carried,
            head_dequant=_dims(model, "vocab")[0] * model.hidden * rec.e / tp if head_q else 0.0)
        saved += (heads - 1.0) * loss_saved  # the earlier micro-batches' loss graphs (GPipe)
    # A returned KV cache lives until the loss is done (the Trainer drops the model's outputs
    # before backward). Hugging Face turns it off under its own gradient checkpointing; a cache
    # kept under checkpointing comes from a wrapper that transformers does not see (selective
    # recomputation saves attention's K and V, which the cache then shares).
    kv_cache = loss_forward = 0.0
    if recipe.keeps_kv_cache:
        kv_cache = n_layers * act.kv_cache_bytes(
            model, rec, b, s, checkpointed=layout.checkpointing == "full").total(tp, sp) * in_flight
        if last_stage:
            loss_forward = eval_loss_bytes(model, rec.e, b * s, recipe.loss_impl(wl.algorithm), tp)
    return {"saved": saved, "working": working, "working_end": working_end,
            "loss_saved": loss_saved,
            "loss_peak": loss_peak, "loss_held": loss_held, "on_context": on_context, "host": host,
            "kv_cache": kv_cache, "loss_forward": loss_forward}


def eval_terms(model: ModelSpec, wl: Workload, layout: Layout, *, recipe: Recipe,
               last_stage: bool) -> dict[str, float]:
    """An evaluation forward at ``Workload.eval_micro_batch`` (none: empty): ``working``, the
    tensors one layer's forward makes (all it would save for backward, as an upper bound of what
    is alive at once without gradients), and ``logits``, the loss's forward on the last stage."""
    if not wl.eval_micro_batch or wl.method == "inference":
        return {}
    b, s = wl.eval_micro_batch, wl.seq_len // layout.cp
    rec = _recipe(model, wl, layout, recipe, first_layer=False)
    working = act.layer_saved(model, rec, b, s).total(layout.tp, layout.sp)
    loss = recipe.loss_impl(wl.algorithm)
    logits = eval_loss_bytes(model, rec.e, b * s, loss, layout.tp) if last_stage else 0.0
    return {"working": working, "logits": logits}

