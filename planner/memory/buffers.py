"""Transient buffers of a training step on one GPU, beside the model states and activations.

ZeRO-3/FSDP's gathered units (the root unit and the layer units in flight), DDP's gradient
buckets, DeepSpeed ZeRO-1/2's reduce buckets, the dequantized weight of a quantized base (and
LLM.int8's matmul temporaries), the optimizer step's temporaries (foreach lists, one tensor at a
time, DeepSpeed's FP32 gradient copies) and ZeRO-Offload's buffers on the GPU; and which sharding
gathers units (:func:`gathers_units`). :mod:`planner.memory.detailed` places them in the phases
of a step.
"""

from __future__ import annotations

from planner.core.arch import (
    _dims,
    expert_params,
    hidden_matrices,
    lora_adapters,
    lora_module_shapes,
    param_counts,
    routed_expert_matrices,
)
from planner.core.entries import ModelSpec
from planner.core.specs import Layout, Recipe, Workload
from planner.core.units import zero_degree
from planner.memory.model_states import (
    StateParts,
    adapter_groups,
    compute_bytes,
    int8_base,
    quantized_linear_bytes,
    saved_module_params,
)

#: FP32 tensors of the stepped tensor's size that transformers' Adafactor holds at once in its
#: per-tensor step (``update`` and the next one made from it; optimization.py ``Adafactor.step``).
ADAFACTOR_STEP_COPIES = 2
#: DeepSpeed ZeRO-3's ``sub_group_size`` default (elements the optimizer steps at a time).
DEEPSPEED_SUB_GROUP_ELEMENTS = 1e9
#: FSDP / ZeRO-3 units gathered at once: the one computing and the one prefetched (FSDP
#: ``BackwardPrefetch.BACKWARD_PRE`` and forward prefetch hold two units' unsharded parameters).
ZERO3_LIVE_UNITS = 2


def buffer_terms(model: ModelSpec, wl: Workload, layout: Layout, st: StateParts, *,
                 recipe: Recipe) -> dict[str, float]:
    """Transient buffers: ZeRO-3/FSDP gathered units, DDP gradient buckets, the dequantized weight
    of a quantized base, and the optimizer step's temporaries."""
    e = compute_bytes(wl.precision)
    counts = param_counts(model)
    tp, pp = layout.tp, layout.pp
    # a layer's parameters on this GPU: its routed experts 1/ep of them, each split etp ways
    experts = expert_params(model) / model.layers
    layer = ((counts.attention + counts.mlp) / model.layers / tp
             - (experts / tp - experts / (layout.expert_tp * max(layout.ep, 1))))
    end = max(counts.embedding, counts.lm_head) / tp
    partition = st.stepped  # a ZeRO rank's share of the trainable elements (its experts' share)
    out = {"gather": 0.0, "unit": 0.0, "ddp": 0.0, "dequant": 0.0, "optimizer_temp": 0.0,
           "saved_weights": 0.0,
           # DeepSpeed ZeRO-1/2 ``backward`` allocates ``ipg_buffer`` (buf_0, and buf_1 with
           # overlap_comm) of reduce_bucket_size elements in the training dtype when
           # contiguous_gradients is on (deepspeed/runtime/zero/stage_1_and_2.py).
           "zero_buckets": _reduce_bucket_elements(model, layout, recipe) * e, "kept_bucket": 0.0,
           **_zero_offload_terms(model, wl, layout, recipe, partition)}
    if gathers_units(layout):
        w_b = 1 if wl.fp8 else (quantized_linear_bytes(wl) if wl.method == "qlora" else e)
        unit = max(layer * w_b, end * e)
        out["unit"] = unit
        # The root unit (what no layer unit wraps: embedding, final norm, LM head) is gathered
        # for the forward and kept unsharded until backward ends (FSDP2 ``fully_shard``: "the
        # root FSDP state has its value specially set to False"; FSDP1 does not free the
        # root's parameters after forward); under PP each end stage holds its own end.
        root = (counts.embedding + counts.lm_head if pp == 1 else end * tp) / tp * e
        # Beside it the rate limiter keeps two layer units in flight (the one computing and
        # the one prefetched; FSDP1 ``limit_all_gathers``, FSDP2's all-gather stream).
        out["gather"] = root + ZERO3_LIVE_UNITS * layer * w_b
        if wl.method == "full":  # the unit's unsharded gradients before reduce-scatter
            out["gather"] += layer * (4 if recipe.grad_dtype == "fp32" else e)
        out["saved_weights"] = zero3_saved_weight_bytes(model, wl, layout, recipe)
    if deepspeed_zero3(layout, recipe):
        # DeepSpeed ZeRO-3 with contiguous_gradients (its default) allocates its reduce bucket
        # (``__ipg_bucket_flat_buffer``: reduce_bucket_size elements of the training dtype) when
        # the optimizer is built and keeps it through every phase (stage3.py), where ZeRO-1/2
        # allocate theirs in each backward.
        out["kept_bucket"], out["zero_buckets"] = out["zero_buckets"], 0.0
    if layout.zero == 0 and zero_degree(layout.dp, layout.cp) > 1 and wl.method == "full":
        # PyTorch DDP copies gradients into its buckets unless gradient_as_bucket_view=True
        # (DDP docs: the saving "will be equal to the total gradients size").
        out["ddp"] = st.device.get("gradients", 0.0)
    if wl.method == "qlora":
        shapes = lora_module_shapes(model).values()
        if int8_base(wl):
            out["dequant"] = max(_int8_matmul_transient(wl, recipe, d_in, d_out, layout.cp)
                                 for d_in, d_out in shapes) / tp
        else:
            out["dequant"] = max(d_in * d_out for d_in, d_out in shapes) / tp * e
    # Elements of trainable state this rank's optimizer steps, and per step call: DeepSpeed
    # ZeRO-3 prepares and steps one sub-group of its partition at a time (sub_group_size, 1e9
    # elements by default; ``_prepare_fp32_grad_for_sub_group``, and ``_optimizer_step`` hands
    # the optimizer ``param_groups[...]['params'] = [fp32_param]``).
    per_call = min(partition, DEEPSPEED_SUB_GROUP_ELEMENTS) if deepspeed_zero3(layout, recipe) else partition
    if deepspeed_zero3(layout, recipe) and compute_bytes(wl.precision) < 4 and layout.offload == "none":
        # At the step DeepSpeed ZeRO-3 copies each sub-group's gradient partition to FP32.
        out["optimizer_temp"] += per_call * 4
    if _deepspeed_zero12(layout, recipe) and layout.offload == "none" and wl.precision in ("mixed", "fp16"):
        # DeepSpeed ZeRO-1/2 (stage_1_and_2.py ``step``) flattens the rank's 16-bit gradient
        # partition and converts it to the FP32 master's dtype for the optimizer, alive through
        # the step: 4 bytes per element of the partition.
        out["optimizer_temp"] += partition * 4
    # bitsandbytes' paged AdamW (``paged_adamw_32bit``) steps each tensor in its own kernel
    # (``Optimizer2State``): no list-wide temporaries.
    stepped = (recipe.optimizer_step in ("foreach", "foreach_torch20", "for_loop")
               and not recipe.optimizer_paged)
    if stepped and wl.optimizer in ("adamw", "sgd") and layout.offload == "none":
        # With the optimizer offloaded the step runs on the CPU (DeepSpeedCPUAdam for
        # ZeRO-Offload, arXiv 2101.06840; FSDP CPUOffload steps the CPU shards): its
        # temporaries live in host memory, none on the GPU.
        state_bytes = _step_state_bytes(wl)
        if recipe.optimizer_step != "for_loop":
            # torch._foreach AdamW: exp_avg_sq.sqrt() is materialised for every tensor of the
            # step call (torch 2.0 also kept ``denom``, a second such list; PyTorch PR #104898)
            copies = 2 if recipe.optimizer_step == "foreach_torch20" else 1
            out["optimizer_temp"] += copies * per_call * state_bytes
        else:
            # one tensor at a time: ``(exp_avg_sq.sqrt() / bias_correction2_sqrt)`` holds two
            # copies of the tensor being stepped, the largest of them at the peak
            largest = _largest_stepped(model, wl, layout, recipe, per_call, layer, end)
            out["optimizer_temp"] += 2 * largest * state_bytes
    if wl.optimizer == "muon" and layout.offload == "none":
        out["optimizer_temp"] += _muon_step_bytes(model, wl, layout, st, partition)
    if wl.optimizer == "adafactor" and layout.offload == "none":
        # transformers' Adafactor steps one tensor at a time: ``update = grad**2 + eps`` and the
        # factored (or full) second moment's ``rsqrt`` times the gradient are two FP32 tensors of
        # the stepped tensor's size alive together (the second, then ``-update`` at the final add);
        # a 16-bit gradient and parameter are first copied to FP32 (``grad.float()``, ``p.float()``).
        largest = _largest_stepped(model, wl, layout, recipe, per_call, layer, end)
        sixteen_bit = wl.precision == "bf16" and (wl.method == "full" or wl.adapter_dtype != "fp32")
        out["optimizer_temp"] += (ADAFACTOR_STEP_COPIES + (2 if sixteen_bit else 0)) * largest * 4
    if _deepspeed_zero12(layout, recipe) and layout.offload == "none" and wl.precision == "fp16":
        # With FP16's loss scaling DeepSpeed's step first checks each gradient part it owns for
        # inf/NaN (``check_overflow``, one tensor at a time), before any FP32 copy exists.
        owned = min(max(_largest_trainable(model, wl, layout, recipe)), partition)
        out["optimizer_temp"] = max(out["optimizer_temp"], recipe.zero_overflow_check_bytes * owned)
    del pp
    return out


def _largest_trainable(model: ModelSpec, wl: Workload, layout: Layout,
                       recipe: Recipe) -> tuple[float, float]:
    """Elements of the largest trainable parameter on one GPU (its TP shard) whose gradient is
    complete during the last layer's backward, and of the input embedding's (complete at the end
    of backward). Full training: a layer matrix (q, k and v as one where the model fuses them; a
    MoE layer's fused expert weight) or the LM head unless tied to the embeddings. Adapters: the
    largest LoRA matrix (rank × the wider side of the adapted layer, a routed expert's split over
    the experts' own TP) or a module trained whole (``modules_to_save``); the embedding only where
    trained whole."""
    tp = layout.tp
    if wl.method == "full":
        (vocab,) = _dims(model, "vocab")
        shapes = list(lora_module_shapes(model).values())
        if model.fused_qkv:
            shapes.append(lora_adapters(model, ("q", "k", "v"))[0][1:])
        matrix = max(max(d_in * d_out for d_in, d_out in shapes) / tp, _expert_tensor(model, layout, recipe))
        head = 0 if model.tied_embeddings else vocab * model.hidden / tp
        return max(matrix, head), vocab * model.hidden / tp
    saved = saved_module_params(model, wl.modules_to_save)
    dense, experts = adapter_groups(model, wl)
    adapter = wl.lora_rank * max([max(d_in, d_out) / tp for _n, d_in, d_out in dense]
                                 + [max(d_in, d_out) / layout.expert_tp for _n, d_in, d_out in experts])
    return max(adapter, saved.get("lm_head", 0) / tp), saved.get("embed_tokens", 0) / tp


def _zero_offload_terms(model: ModelSpec, wl: Workload, layout: Layout, recipe: Recipe,
                        partition: float) -> dict[str, float]:
    """What DeepSpeed's ZeRO-1/2 with the optimizer offloaded (ZeRO-Offload; stage_1_and_2.py)
    holds on the GPU beside the 16-bit weights. ``offload_buffer``: the gradient buffer it
    allocates at initialisation and keeps (``temp_grad_buffer_for_gpu_offload``, the largest
    trainable parameter's elements in the training dtype). At the last micro-batch's backward,
    once a bucket is reduced, ``copy_grads_in_partition`` takes each gradient this rank owns in
    turn: its norm in FP64 (``.double().norm(2)``, 8 bytes per owned element), the overflow check
    over the whole gradient (:attr:`Recipe.zero_overflow_check_bytes`) and an FP32 copy of the
    owned part for the host (4 bytes per element): the largest of the three for the largest
    gradient. The head's gradient (or the largest layer matrix's, where the model ties its
    embeddings) is reduced during the last layer's backward (``offload_early``); the input
    embedding's completes at the end of backward (``offload_end``). ``offload_step``: the FP32
    partition copied to the GPU at the step (:attr:`Recipe.zero_offload_gpu_copy`)."""
    out = {"offload_buffer": 0.0, "offload_early": 0.0, "offload_end": 0.0, "offload_step": 0.0}
    if not (_deepspeed_zero12(layout, recipe) and layout.offload != "none"):
        return out
    e = compute_bytes(wl.precision)
    check = recipe.zero_overflow_check_bytes - (4 if e >= 4 else 0)  # ``x.float()`` of FP32 is x
    copy = 4 if e < 4 else 0

    def transient(n: float) -> float:
        owned = min(n, partition)
        return max(8 * owned, check * n, copy * owned)

    early, end = _largest_trainable(model, wl, layout, recipe)
    out["offload_buffer"] = max(early, end) * e
    out["offload_early"] = transient(early)
    out["offload_end"] = transient(end)
    if recipe.zero_offload_gpu_copy:
        out["offload_step"] = partition * 4
    return out


def _step_state_bytes(wl: Workload) -> int:
    """Bytes per element of the states a torch optimizer steps: FP32 under mixed precision (and
    for FP32 adapters), else the compute dtype's."""
    mixed = wl.precision in ("mixed", "fp16", "fp32")
    adapters_fp32 = wl.method != "full" and wl.adapter_dtype == "fp32"
    return 4 if (mixed or adapters_fp32) else compute_bytes(wl.precision)


#: Bytes per element of the Newton–Schulz workspace Muon holds for the matrix it orthogonalises
#: (``torch.optim.Muon``: the BF16 copy X of the update and the product B·X that replaces it, 2 + 2
#: per element of the m×n matrix; the Gram matrix A = X·Xᵀ and A·A, 2 + 2 per element of the m×m
#: one, m ≤ n), beside the Nesterov update in the state dtype.
MUON_NS_BYTES_PER_ELEMENT = 4
MUON_NS_BYTES_PER_GRAM_ELEMENT = 4


def _muon_step_bytes(model: ModelSpec, wl: Workload, layout: Layout, st: StateParts,
                     partition: float) -> float:
    """Muon's step temporaries on one GPU: the Newton–Schulz workspace of its largest matrix (one
    matrix at a time; distributed Muon gathers each whole matrix on the rank that orthogonalises
    it; a tensor-parallel rank its own shard, a routed expert's over the experts' own TP), plus
    the AdamW beside it stepping what is not a hidden matrix (embeddings, head, norms; modules
    trained whole beside LoRA) as torch's foreach AdamW does (one square root of its states): the
    share the model states count (``StateParts.matrix_share``)."""
    state = _step_state_bytes(wl)
    r, tp, etp = wl.lora_rank, layout.tp, layout.expert_tp
    # (d_in, d_out, ways a rank's shard of it is split): a routed expert's by the experts' own TP
    if wl.method == "full":
        shapes = ([(d_in, d_out, tp) for _, d_in, d_out in hidden_matrices(model, routed=False)]
                  + [(d_in, d_out, etp) for _, d_in, d_out in routed_expert_matrices(model)])
    else:
        dense, experts = adapter_groups(model, wl)
        shapes = ([(r, max(d_in, d_out), tp) for _, d_in, d_out in dense]
                  + [(r, max(d_in, d_out), etp) for _, d_in, d_out in experts])
    matrix_share = st.matrix_share
    workspace = 0.0
    for d_in, d_out, split in shapes:
        m, wide = sorted((d_in, d_out))
        n = wide / split  # a tensor-parallel shard
        workspace = max(workspace, (state + MUON_NS_BYTES_PER_ELEMENT) * m * n
                        + MUON_NS_BYTES_PER_GRAM_ELEMENT * m * m)
    return workspace + (1.0 - matrix_share) * partition * state


def _largest_stepped(model: ModelSpec, wl: Workload, layout: Layout, recipe: Recipe,
                     per_call: float, layer: float, end: float) -> float:
    """Elements of the largest tensor a one-tensor-at-a-time optimizer steps on one GPU: the flat
    tensor a ZeRO optimizer hands it (``per_call``: a ZeRO-1/2 rank's partition of every
    trainable parameter, DeepSpeed ZeRO-3's sub-group of it), an FSDP unit's flat shard (``layer``
    and ``end`` are per GPU already), else the largest trainable parameter
    (:func:`_largest_trainable`)."""
    if layout.zero in (1, 2) or deepspeed_zero3(layout, recipe):
        return per_call
    if layout.zero == 3 and wl.method == "full":
        return max(layer, end) / _opt_shard(layout)
    return max(_largest_trainable(model, wl, layout, recipe))


def _expert_tensor(model: ModelSpec, layout: Layout, recipe: Recipe) -> float:
    """Elements of a MoE layer's largest expert weight on one GPU: grouped experts keep each
    projection of all local experts in one tensor (transformers 5's ``gate_up_proj``,
    experts × 2f × h with a gated MLP); the expert loop of transformers 4 one matrix per expert.
    Each expert is split tp ways, or etp where the layout sets it. 0 for a dense model."""
    moe = model.moe
    if moe is None:
        return 0.0
    matrix = moe.expert_ffn * model.hidden / layout.expert_tp
    if recipe.moe_experts == "loop":
        return matrix
    return moe.experts / layout.ep * (2 if model.gated_mlp else 1) * matrix


def _int8_matmul_transient(wl: Workload, recipe: Recipe, d_in: int, d_out: int, cp: int) -> float:
    """The larger of an LLM.int8 linear's forward and backward temporaries (bitsandbytes
    ``MatMul8bitLt``, t tokens). Before 0.45.0 the forward quantizes the input (``CA``, and its
    col32 layout for ``igemmlt``: 2 bytes per input element), multiplies into an int32 result,
    dequantizes it to FP16 and clones the 3-D output (4 + 2 + 2 bytes per output element); the
    backward quantizes the output gradient both ways (``double_quant``: 2 bytes per element) and
    dequantizes the weight from its tiled layout (int8, then FP16: 3 bytes per weight). From
    0.45.0: one int8 input, int32 and FP16 results (t·(d_in + 6·d_out)); the FP16 weight in
    backward (2 bytes per weight)."""
    t = wl.micro_batch * wl.sequences_per_sample * wl.seq_len / cp
    if recipe.int8_keeps_transposed:  # the release that keeps CAt: the col32/igemmlt path
        return max(t * (2 * d_in + 8 * d_out), 2 * t * d_out + 3 * d_in * d_out)
    return max(t * (d_in + 6 * d_out), 2 * d_in * d_out)


def _opt_shard(layout: Layout) -> int:
    return zero_degree(layout.dp, layout.cp) if layout.zero >= 1 else 1


def deepspeed_bucket_elements(model: ModelSpec, recipe: Recipe) -> int:
    """Elements of DeepSpeed's gradient reduce bucket(s) for a run of ``recipe``: its own, else
    the Hugging Face Trainer's "auto" size, hidden² (``HfTrainerDeepSpeedConfig``), which a
    plan's exported DeepSpeed config writes out."""
    return int(recipe.zero_bucket_elements or model.hidden ** 2)


def _reduce_bucket_elements(model: ModelSpec, layout: Layout, recipe: Recipe) -> float:
    """Elements of the reduce bucket(s) the step holds: DeepSpeed's under its ZeRO stages
    (:func:`deepspeed_bucket_elements`); for other ZeRO implementations only what the recipe sets."""
    if recipe.zero_impl == "deepspeed" and layout.zero:
        return float(deepspeed_bucket_elements(model, recipe))
    return float(recipe.zero_bucket_elements)


def zero3_saved_weight_bytes(model: ModelSpec, wl: Workload, layout: Layout, recipe: Recipe) -> float:
    """Gathered 16-bit layer weights that DeepSpeed ZeRO-3 cannot free until each layer's backward
    (``Recipe.zero3_stock_linear``: stock ``F.linear`` keeps a view of its weight on the autograd
    graph), beyond the :data:`ZERO3_LIVE_UNITS` layer units the gather buffer already counts: at
    backward start, every layer of the stage whose forward saved its tensors (no activation
    checkpointing; a checkpointed layer saves nothing in its forward and its recomputation holds
    one unit). Bases quantized to 4 or 8 bits run their own matmuls: none."""
    if not (recipe.zero3_stock_linear and deepspeed_zero3(layout, recipe) and gathers_units(layout)
            and layout.checkpointing != "full" and wl.method in ("full", "lora") and not wl.fp8):
        return 0.0
    counts = param_counts(model)
    layer = (counts.attention + counts.mlp) / model.layers / layout.tp
    stage_layers = -(-model.layers // layout.pp)  # the heaviest stage when pp does not divide L
    return max(stage_layers - ZERO3_LIVE_UNITS, 0) * layer * compute_bytes(wl.precision)


def deepspeed_zero3(layout: Layout, recipe: Recipe) -> bool:
    return layout.zero == 3 and recipe.zero_impl == "deepspeed"


def _deepspeed_zero12(layout: Layout, recipe: Recipe) -> bool:
    """DeepSpeed's ZeRO-1/2 optimizer (``stage_1_and_2.py``)."""
    return layout.zero in (1, 2) and recipe.zero_impl == "deepspeed"


def gathers_units(layout: Layout) -> bool:
    """ZeRO-3/FSDP gathers each unit's parameters: they are sharded over data (or context)
    parallel ranks, or offloaded to the host."""
    return layout.zero == 3 and (zero_degree(layout.dp, layout.cp) > 1 or layout.offload == "optimizer+params")

