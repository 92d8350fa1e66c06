"""Model-state bytes of the ``detailed`` profile: weights, gradients, optimizer states, master
copies and adapters, per GPU, for the precision recipe and quantized base actually used.

Bytes per parameter (trainable, before sharding):
- pure BF16/FP16 (``precision: bf16``): weights 2, gradients 2, AdamW m and v in the parameter
  dtype (``torch.optim.AdamW`` allocates ``zeros_like(param)``): 4 → 8 bytes.
- mixed precision (``mixed``/``fp16``): 16-bit weights 2, gradients 2, FP32 master 4, FP32 Adam 8
  → 16 (ZeRO paper, K = 12); ``grad_dtype: fp32`` (Megatron's FP32 main grads) → 18.
- FP32: 4 + 4 + 8 = 16.
- 16-bit adapters (and ``modules_to_save`` copies) under autocast: 2 + 2 + 4 where torch's
  AdamW steps them (moments like the weights); 2 + 2 + 4 + 8 where DeepSpeed's or Megatron's
  optimizer keeps an FP32 main copy (:func:`keeps_fp32_main_copy`).
- 8-bit Adam (bitsandbytes, block size 256 since 2024-09): 2 + 2·4/256 = 2.031 bytes for m and v.
- Adafactor (no momentum): FP32 row and column means of each matrix's squared gradient, a full
  FP32 second moment for vectors and for the flat partitions ZeRO/FSDP1 hand the optimizer.
- Lion (bitsandbytes' 32-bit Lion, the Trainer's ``lion_32bit``): one FP32 momentum, 4 bytes.
- Paged optimizers keep every state tensor of ≥ 1e5 elements in CUDA unified memory, outside the
  PyTorch allocator and evictable to host (bitsandbytes ``get_state_buffer``): counted on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.core.arch import (
    ParamCounts,
    _attention_dims,
    _dims,
    expert_params,
    lora_adapter_groups,
    lora_module_shapes,
    param_counts,
)
from planner.core.entries import ModelSpec
from planner.core.specs import Recipe, Workload
from planner.core.units import expert_ways

#: Bytes per element by dtype name.
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

#: 8-bit Adam: two uint8 states plus one FP32 absmax per 256-element block each (bitsandbytes
#: PR #1365, blocksize 2048 → 256): 2 + 2·4/256 bytes per parameter.
ADAM8BIT_STATE_BYTES = 2.0 + 2 * 4 / 256

#: bitsandbytes pages only state tensors with at least this many elements (``get_state_buffer``).
PAGED_MIN_ELEMENTS = 100_000

#: NF4 (bitsandbytes ``quantize_4bit``, block 64): 4 bits + one FP32 absmax per 64 weights;
#: double quantization stores absmax as 8 bits per block with one FP32 constant per 256 blocks.
NF4_BYTES = 0.5 + 4 / 64
NF4_DQ_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
#: GPTQ int4 (AutoGPTQ, group size 128): packed int4 weights, an FP16 scale and a packed int4 zero
#: point per group of 128 inputs; the int32 ``g_idx`` per input row is counted separately.
GPTQ_BYTES = 0.5 + 2 / 128 + 0.5 / 128
#: A bitsandbytes 4-bit base measures more than its tensors. The QLoRA paper's memory breakdown
#: (Dettmers et al. 2023, Fig. 6; batch 1, 512 tokens, checkpointing) gives the 4-bit model part
#: of LLaMA 7B/13B/33B/65B as 5,046 / 8,476 / 19,302 / 37,074 MB against 3.87 / 7.21 / 17.4 /
#: 34.0 GB analytic (NF4 + DQ linears, 16-bit embeddings and head): excesses of 1.18 / 1.27 / 1.9 /
#: 3.07 GB, which a fixed part plus a part per quantized weight fit within 0.13 GB:
#: 0.97 GB + 0.033 bytes per weight. The fixed part holds the CUDA context the detailed profile
#: counts on its own (``CUDA_CONTEXT_BYTES``, 0.795 GB): 0.17 GB is left per GPU (cuBLAS
#: workspace, bitsandbytes' buffers); the per-weight part is counted on each quantized weight.
BNB_4BIT_MEASURED_OVERHEAD = 0.033
BNB_4BIT_FIXED_BYTES = 0.17e9
#: LLM.int8 (bitsandbytes 8-bit): int8 weights plus an FP32 scale per output row (counted per row).
INT8_BYTES = 1.0


@dataclass(frozen=True)
class StateParts:
    """Device and host bytes of each model-state component on one GPU."""

    device: dict[str, float]
    host: float
    trainable: float  # trainable parameters on this GPU (after TP/PP, before ZeRO)
    largest_grad: float  # bytes of the largest trainable tensor's gradient
    #: Trainable elements this GPU's optimizer steps: its ZeRO share of the dense ones and of the
    #: routed experts its expert-parallel rank holds (sharded over the expert data-parallel group).
    stepped: float = 0.0
    #: Share of the trainable elements on this GPU that are Muon's hidden matrices (the rest,
    #: embeddings, head, norms and modules trained whole beside LoRA, AdamW steps).
    matrix_share: float = 1.0


def compute_bytes(precision: str) -> int:
    """Bytes per element of activations and of 16-bit weights: FP32 only for ``fp32``."""
    return 4 if precision == "fp32" else 2


def quantized_linear_bytes(workload: Workload) -> float:
    """Bytes per parameter of a quantized linear weight (QLoRA base)."""
    if workload.quant_bits == 8:
        return INT8_BYTES
    if workload.quant_type == "gptq":
        return GPTQ_BYTES
    return NF4_DQ_BYTES if workload.double_quant else NF4_BYTES


def quantized_head(model: ModelSpec, workload: Workload) -> bool:
    """Whether a QLoRA base quantizes ``lm_head`` too: litgpt's does (Lightning's
    ``BitsandbytesPrecision`` replaces every ``torch.nn.Linear`` built under ``init_module``);
    Hugging Face's ``BitsAndBytesConfig`` keeps the output layer in 16 bits
    (``get_keys_to_not_convert``), as do torchtune and GPTQ checkpoints."""
    return bnb_base(workload) and model.impl == "litgpt"


def bnb_base(workload: Workload) -> bool:
    """A bitsandbytes base under LoRA: NF4 at 4 bits, LLM.int8 (``Linear8bitLt``) at 8."""
    return workload.method == "qlora" and workload.quant_type == "nf4"


def int8_base(workload: Workload) -> bool:
    """An LLM.int8 base (bitsandbytes ``load_in_8bit``)."""
    return bnb_base(workload) and workload.quant_bits == 8


def bnb_keeps_input(workload: Workload, recipe: Recipe) -> bool:
    """Whether the base's bitsandbytes matmuls keep their inputs (``Recipe.bnb_keeps_input``;
    unset: the current release, which keeps them for LLM.int8 only)."""
    if not bnb_base(workload):
        return False
    keeps = recipe.bnb_keeps_input
    return int8_base(workload) if keeps is None else keeps


def bnb_prepared(workload: Workload, recipe: Recipe) -> bool:
    """A bitsandbytes base whose 16-bit weights a script cast to FP32 (``kbit_prep``): norms
    FP32, and with ``peft`` embeddings and lm_head too (``prepare_model_for_kbit_training``; its
    2023 predecessor ``prepare_model_for_int8_training`` cast only norms named ``layer_norm``,
    which Llama's are not: such a run is ``none``)."""
    return bnb_base(workload) and recipe.kbit_prep != "none"


def fp32_embeddings(workload: Workload, recipe: Recipe) -> bool:
    """Whether a prepared bitsandbytes base keeps its embeddings and lm_head in FP32: peft's
    ``prepare_model_for_kbit_training`` casts them up, and TRL's SFTTrainer casts them back to
    BF16 only for a 4-bit base trained with ``bf16`` (``peft_module_casting_to_bf16`` under
    ``args.bf16 and is_loaded_in_4bit``): under FP16 (T4, V100), FP32 or LLM.int8 they stay FP32."""
    if not bnb_prepared(workload, recipe):
        return False
    trl_casts_back = workload.precision in ("mixed", "bf16") and workload.quant_bits == 4
    return recipe.kbit_prep == "peft" or not trl_casts_back


def fp32_lora_base(workload: Workload) -> bool:
    """Whether LoRA's frozen base is kept in FP32 and run under autocast
    (``Workload.base_dtype``): 4 bytes per weight, and 16-bit casts saved by every linear."""
    return (workload.method == "lora" and workload.base_dtype == "fp32"
            and workload.precision in ("mixed", "fp16"))


def frozen_weight_bytes(workload: Workload) -> int:
    """Bytes per weight of LoRA's frozen base (and of its gradients where a stack makes them):
    FP32 for an FP32 base (:func:`fp32_lora_base`), else the compute dtype's."""
    return 4 if fp32_lora_base(workload) else compute_bytes(workload.precision)


#: Adafactor (Shazeer & Stern 2018, arXiv 1804.04235) as transformers' ``Adafactor`` runs it (the
#: Trainer's ``optim="adafactor"``), without a first moment (``beta1=None``, its default): a tensor
#: of two or more dimensions keeps running means of its squared gradient over its rows and over its
#: columns, (m + n) values for an m×n matrix; a vector keeps the full second moment. Every state
#: is FP32 (the step casts a 16-bit gradient to FP32 first and allocates the states like it).
ADAFACTOR_STATE_ELEM_BYTES = 4
#: Lion (Chen et al. 2023, arXiv 2302.06675) keeps one momentum; bitsandbytes' ``Lion`` with 32-bit
#: states (the Trainer's ``lion_32bit``) keeps it in FP32 whatever the parameter dtype.
LION_STATE_BYTES = 4.0
#: Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers in neural networks"; Liu et
#: al. 2025, arXiv 2502.16982; ``torch.optim.Muon`` since PyTorch 2.9) orthogonalises the update
#: of each hidden weight matrix by Newton–Schulz iterations and keeps one momentum buffer per
#: matrix (``momentum_buffer``, ``zeros_like`` the gradient: the parameter's dtype, FP32 under a
#: mixed-precision wrapper's FP32 main copy). It is defined for 2-D hidden matrices only: every
#: published recipe (modded-nanogpt, Moonlight, nanochat, Megatron-Core's and DeepSpeed's Muon)
#: steps the embeddings, the LM head, norms and biases with AdamW beside it, two moments each.
#: Moments per parameter: 1 on a hidden matrix, :data:`MUON_ADAMW_MOMENTS` on the rest.
MUON_MATRIX_MOMENTS = 1
MUON_ADAMW_MOMENTS = 2


def adafactor_bytes_per_param(model: ModelSpec, workload: Workload, flat: bool) -> float:
    """Adafactor's state bytes per trainable parameter: a flat tensor (``flat``: DeepSpeed ZeRO's
    and FSDP1's flat partitions, which the optimizer receives as vectors) keeps a full second
    moment; otherwise each matrix its row and column means (the model's matrices: every decoder
    layer's linear layers, embeddings, an untied head; or the LoRA matrices and the modules a run
    trains whole), each norm weight its full moment."""
    b = ADAFACTOR_STATE_ELEM_BYTES
    if flat:
        return float(b)
    (vocab,) = _dims(model, "vocab")
    h = model.hidden
    if workload.method == "full":
        n = param_counts(model).total
        per_layer = sum(d_in + d_out for d_in, d_out in lora_module_shapes(model).values())
        ends = (1 if model.tied_embeddings else 2) * (vocab + h)
        vectors = (2 * model.layers + 1) * h
        return b * (model.layers * per_layer + ends + vectors) / n
    r = workload.lora_rank
    shapes = adapter_shapes(model, workload)
    saved = saved_module_params(model, workload.modules_to_save)
    n = sum(c * r * (d_in + d_out) for c, d_in, d_out in shapes) + sum(saved.values())
    rows_cols = sum(c * (r + d_in + d_out + r) for c, d_in, d_out in shapes) + len(saved) * (vocab + h)
    return b * rows_cols / n if n else 0.0


def steps_flat_tensors(zero: int, recipe: Recipe) -> bool:
    """Whether the optimizer receives flat 1-D partitions rather than the parameters' shapes:
    DeepSpeed ZeRO (``single_partition_of_fp32_groups``, stage 3's flat sub-groups), FSDP1's and
    Megatron's flat buffers; FSDP2 hands it DTensors of the parameters' own shapes."""
    return zero >= 1 and not (recipe.zero_impl == "fsdp" and recipe.fsdp_version == 2)


def adam_bytes(optimizer: str, state_elem_bytes: int, paged: bool = False) -> float:
    """Optimizer-state bytes per trainable parameter (bitsandbytes 32-bit paged AdamW keeps FP32
    states whatever the parameter dtype). Adafactor's depend on the tensors' shapes
    (:func:`adafactor_bytes_per_param`)."""
    if paged and optimizer == "adamw":
        return 8.0
    if optimizer in ("adam8bit", "paged_adamw8bit"):
        return ADAM8BIT_STATE_BYTES
    if optimizer == "lion":
        return LION_STATE_BYTES
    if optimizer == "sgd":
        return float(state_elem_bytes)
    return 2.0 * state_elem_bytes


def muon_bytes_per_param(state_elem_bytes: int, matrix_share: float) -> float:
    """Muon's state bytes per trainable parameter, ``matrix_share`` of them hidden matrices
    (one momentum, :data:`MUON_MATRIX_MOMENTS`) and the rest stepped by AdamW beside it
    (:data:`MUON_ADAMW_MOMENTS`)."""
    moments = matrix_share * MUON_MATRIX_MOMENTS + (1.0 - matrix_share) * MUON_ADAMW_MOMENTS
    return float(state_elem_bytes) * moments


def _optimizer_bytes(model: ModelSpec, workload: Workload, recipe: Recipe, place: _Placement,
                     state_elem_bytes: int, paged: bool, matrix_share: float = 1.0) -> float:
    """Optimizer-state bytes per trainable parameter on this GPU's placement: Adafactor's by the
    tensors' shapes (flat where ZeRO or FSDP1 hands it partitions), Muon's by the share of them
    that are hidden matrices (``matrix_share``, :func:`muon_bytes_per_param`), AdamW's moments at
    2 bytes where the recipe keeps them in BF16 (:attr:`Recipe.optimizer_moments`), else
    :func:`adam_bytes` at ``state_elem_bytes`` per element."""
    if workload.optimizer == "adafactor":
        return adafactor_bytes_per_param(model, workload, steps_flat_tensors(place.zero, recipe))
    if workload.optimizer == "muon":
        return muon_bytes_per_param(state_elem_bytes, matrix_share)
    bf16_moments = recipe.optimizer_moments == "bf16" and workload.optimizer == "adamw"
    return adam_bytes(workload.optimizer, 2 if bf16_moments else state_elem_bytes, paged)


def keeps_fp32_main_copy(recipe: Recipe, zero: int) -> bool:
    """Whether the run's optimizer wrapper keeps an FP32 main copy (and FP32 states) of 16-bit
    trainable weights: DeepSpeed's ZeRO optimizers, Megatron's (its distributed optimizer is
    stage 1, no FSDP stage is; ``grad_dtype`` fp32 is its FP32 main gradients). A torch
    optimizer stepping 16-bit weights (the Trainer without DeepSpeed, Lightning, torchtune,
    FSDP) keeps neither: its moments take the weights' dtype (``zeros_like``)."""
    return recipe.zero_impl == "deepspeed" or recipe.grad_dtype == "fp32" or zero == 1


def adapter_shapes(model: ModelSpec, workload: Workload) -> list[tuple[int, int, int]]:
    """(count, d_in, d_out) of each adapted linear layer in the whole model."""
    dense, experts = adapter_groups(model, workload)
    return dense + experts


def adapter_groups(model: ModelSpec, workload: Workload
                   ) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """:func:`adapter_shapes`, the routed experts' apart (:func:`lora_adapter_groups`)."""
    targets = workload.lora_target_set + (("lm_head",) if "lm_head" in workload.lora_targets else ())
    return lora_adapter_groups(model, targets)


def saved_module_params(model: ModelSpec, modules: Sequence[str]) -> dict[str, int]:
    """Parameters of each whole module a LoRA run trains (``Workload.modules_to_save``), by
    name: the input embeddings, and the LM head (a separate copy even where the model ties the
    two)."""
    counts, (vocab,) = param_counts(model), _dims(model, "vocab")
    sizes = {"embed_tokens": counts.embedding, "lm_head": vocab * model.hidden}
    return {m: sizes[m] for m in modules}


def _paged_share(tensor_elems: Sequence[tuple[float, float]]) -> float:
    """Share of the elements that sit in tensors of ≥ ``PAGED_MIN_ELEMENTS`` elements."""
    total = sum(n * size for n, size in tensor_elems)
    big = sum(n * size for n, size in tensor_elems if size >= PAGED_MIN_ELEMENTS)
    return big / total if total else 0.0


@dataclass(frozen=True)
class _Placement:
    """This GPU's share of the parameters (after TP/PP, before ZeRO) and how ZeRO and expert
    parallelism divide each state (see :func:`model_states`)."""

    counts: ParamCounts
    tp: int
    pp: int
    zero_degree: int
    zero: int
    ep: int
    etp: int | None  # the experts' own tensor parallelism (None: tp)
    layer_share: float  # decoder-layer parameters of this stage, before TP
    linears: float  # decoder-layer matrices on this GPU (its TP share, the experts' etp share)
    n_matrix: float  # matrices (layers and the stage's end) on this GPU
    n_norm: float
    n_local: float
    n_exp: float  # routed-expert parameters on this GPU, before expert parallelism

    @property
    def expert_tp(self) -> int:
        """The ways a routed expert is split: ``etp`` where set, else tp."""
        return self.tp if self.etp is None else self.etp

    def sharded(self, part: str) -> bool:
        return self.zero >= {"optimizer": 1, "gradients": 2, "weights": 3}[part]

    def shard(self, part: str) -> int:
        return self.zero_degree if self.sharded(part) else 1

    def spread(self, dense_bytes: float, expert_bytes: float, part: str) -> float:
        """Bytes on this GPU of a state split into dense and routed-expert bytes."""
        s = self.shard(part)
        ways = expert_ways(self.ep, s, self.sharded(part), tp=self.tp, etp=self.etp)
        return dense_bytes / s + expert_bytes / float(ways)


def _placement(model: ModelSpec, *, tp: int, pp: int, zero_degree: int, zero: int,
               ep: int, etp: int | None = None) -> _Placement:
    counts: ParamCounts = param_counts(model)
    layer_share = (counts.attention + counts.mlp) * -(-model.layers // pp) / model.layers
    end_share = max(counts.embedding + counts.positions, counts.lm_head)
    if pp == 1:
        end_share = counts.embedding + counts.positions + counts.lm_head
    experts = expert_params(model) * -(-model.layers // pp) / model.layers  # routed experts here
    n_exp = experts / (tp if etp is None else etp)
    own_tp = n_exp - experts / tp  # the experts split etp ways rather than tp (0 with no etp)
    n_matrix = (layer_share + end_share) / tp + own_tp
    n_norm = counts.norms / pp
    n_local = n_matrix + n_norm
    return _Placement(counts, tp, pp, zero_degree, zero, ep, etp, layer_share, layer_share / tp + own_tp,
                      n_matrix, n_norm, n_local, n_exp)


class _Ledger:
    """Device bytes by component, in the order first put, and host bytes."""

    def __init__(self) -> None:
        self.dev: dict[str, float] = {}
        self.host = 0.0

    def put(self, name: str, n_bytes: float, to_host: bool = False) -> None:
        self.dev.setdefault(name, 0.0)
        if to_host:
            self.host += n_bytes
        else:
            self.dev[name] += n_bytes


def model_states(model: ModelSpec, workload: Workload, *, recipe: Recipe, tp: int, pp: int,
                 zero_degree: int, zero: int, offload: str, adapter_bytes: int, ep: int = 1,
                 etp: int | None = None, frozen_grads: bool = False) -> StateParts:
    """Per-GPU bytes of weights, gradients, optimizer states, master weights and adapters.

    TP divides every matrix (norms are replicated: a few KB); PP gives each stage L/pp layers and
    the heavier end (embedding on the first stage, LM head on the last; the larger is taken).
    ZeRO stage 1 shards optimizer states and master copies over D = dp·cp, stage 2 also the
    gradients, stage 3 also the weights. Offload moves optimizer states (and with
    ``optimizer+params`` the weights) to host memory. Expert parallelism (MoE) splits the routed
    experts over ``ep`` ranks of the data-parallel group: an unsharded part holds N_experts/ep of
    them, a ZeRO-sharded part N_experts/max(D, ep) (ep divides D); with an expert TP of its own
    (``etp``, MoE parallel folding) each expert is split etp ways instead of tp and a sharded part
    spreads over the expert layers' data-parallel group (:func:`~planner.core.units.expert_ways`).
    ``frozen_grads``: LoRA under
    FSDP1 units that mix frozen and trainable weights, whose gradients cover the frozen layers.
    """
    place = _placement(model, tp=tp, pp=pp, zero_degree=zero_degree, zero=zero, ep=ep, etp=etp)
    if workload.method == "full":
        states = _full_states(model, workload, recipe, place, offload)
    else:
        states = _adapter_states(model, workload, recipe, place, offload, adapter_bytes, frozen_grads)
    cache = rope_cache_bytes(model, workload, recipe, pp)
    if cache:
        states.device["weights"] = states.device.get("weights", 0.0) + cache
    return states


def rope_cache_bytes(model: ModelSpec, workload: Workload, recipe: Recipe, pp: int = 1) -> float:
    """Rotary cos/sin tables a stack keeps in every attention layer (``rope_cache_per_layer``):
    transformers before 4.41 built each layer's ``LlamaRotaryEmbedding`` with ``cos_cached``
    and ``sin_cached`` buffers of max_position_embeddings × head_dim in the model's dtype (here
    the compute dtype; 4.38–4.40 keep them as ``_cos_cached``/``_sin_cached``), replicated on
    every GPU: neither TP nor ZeRO shards a buffer. Negligible at 4K positions; 6 GB for a
    60-layer model at 200K."""
    if not recipe.rope_cache_per_layer or model.position != "rope" or not model.max_position:
        return 0.0
    layers = -(-model.layers // pp)
    return layers * 2 * model.max_position * _attention_dims(model)[2] * compute_bytes(workload.precision)


def _full_states(model: ModelSpec, workload: Workload, recipe: Recipe, place: _Placement,
                 offload: str) -> StateParts:
    """Full fine-tuning: every parameter's weight, gradient, optimizer states and master copy."""
    e = compute_bytes(workload.precision)
    n_local, n_exp = place.n_local, place.n_exp
    on_host_opt = offload in ("optimizer", "optimizer+params")
    on_host_w = offload == "optimizer+params"
    ledger = _Ledger()
    mixed = workload.precision in ("mixed", "fp16")
    state_elem = 4 if (mixed or workload.precision == "fp32") else e
    paged = recipe.optimizer_paged or workload.optimizer == "paged_adamw8bit"
    grad_b = 4 if (recipe.grad_dtype == "fp32" or workload.precision == "fp32") else e
    # Muon's hidden matrices: the decoder layers' weights on this GPU (not embeddings, head, norms)
    matrix_share = place.linears / place.n_local
    opt_b = _optimizer_bytes(model, workload, recipe, place, state_elem, paged, matrix_share=matrix_share)
    paged_share = place.n_matrix / n_local if paged else 0.0  # all but norms are ≥ 1e5
    dense_w, expert_w = _weight_bytes(workload, recipe, place, e)
    ledger.put("weights", place.spread(dense_w, expert_w, "weights"), on_host_w)
    # Offloading the optimizer moves the reduced gradients to the host too (ZeRO-Offload,
    # FSDP CPUOffload): the GPU holds them only bucket by bucket; Megatron-Core keeps its
    # gradient buffers on the GPU (``offload_keeps_grads``).
    ledger.put("gradients", place.spread((n_local - n_exp) * grad_b, n_exp * grad_b, "gradients"),
               on_host_opt and not (recipe.offload_keeps_grads and offload == "optimizer"))
    opt = place.spread((n_local - n_exp) * opt_b, n_exp * opt_b, "optimizer")
    ledger.put("optimizer_states", opt * (1 - paged_share), on_host_opt)
    ledger.host += opt * paged_share
    if mixed:
        ledger.put("master_weights", place.spread((n_local - n_exp) * 4, n_exp * 4, "optimizer"),
                   on_host_opt)
    ffn = model.ffn if model.moe is None else model.moe.expert_ffn
    (vocab,) = _dims(model, "vocab")
    ffn_tp = place.tp if model.moe is None else place.expert_tp  # an expert: etp ways
    largest = max(vocab * model.hidden / place.tp, model.hidden * (ffn or model.hidden) / ffn_tp) * grad_b
    return StateParts(ledger.dev, ledger.host, n_local, largest,
                      stepped=place.spread(n_local - n_exp, n_exp, "optimizer"), matrix_share=matrix_share)


def fp8_weight_bytes(workload: Workload, recipe: Recipe) -> float | None:
    """Bytes per decoder-layer linear weight stored in FP8 (``Recipe.fp8_params`` on Transformer
    Engine layers with FP8 linears): the FP8 data and, where the card's FP8 GEMM needs the TN
    layout, the transposed copy Transformer Engine caches on the weight
    (``Recipe.fp8_transpose_cache``; unset: kept). None: 16-bit weights."""
    if not (workload.fp8 and recipe.fp8_params and recipe.kernels == "transformer_engine"):
        return None
    return BYTES["fp8"] * (1 if recipe.fp8_transpose_cache is False else 2)


def _weight_bytes(workload: Workload, recipe: Recipe, place: _Placement, e: int) -> tuple[float, float]:
    """Weights on this GPU before ZeRO, dense and routed-expert bytes: ``e`` each, or
    :func:`fp8_weight_bytes` for the decoder layers' linears (embeddings, head and norms stay
    16-bit: Transformer Engine stores only its own modules in FP8)."""
    lw = fp8_weight_bytes(workload, recipe) or e
    linears = place.linears
    dense = (place.n_local - place.n_exp) * e + (linears - place.n_exp) * (lw - e)
    return dense, place.n_exp * lw


def _adapter_states(model: ModelSpec, workload: Workload, recipe: Recipe, place: _Placement,
                    offload: str, adapter_bytes: int, frozen_grads: bool) -> StateParts:
    """LoRA / QLoRA: a frozen base and trainable adapters."""
    ledger = _Ledger()
    _frozen_base(model, workload, recipe, place, ledger, on_host_w=offload == "optimizer+params")
    n_lora, largest, matrix_share, stepped = _adapters(model, workload, recipe, place, ledger, adapter_bytes)
    if frozen_grads and workload.method == "lora":
        e = frozen_weight_bytes(workload)
        ledger.put("gradients", place.linears * e / place.shard("gradients"))
    return StateParts(ledger.dev, ledger.host, n_lora, largest, stepped=stepped, matrix_share=matrix_share)


def _frozen_base(model: ModelSpec, workload: Workload, recipe: Recipe, place: _Placement,
                 ledger: _Ledger, *, on_host_w: bool) -> None:
    """The frozen base's weights: 16-bit (FP32 for an FP32 LoRA base), or quantized linears for
    QLoRA."""
    e = frozen_weight_bytes(workload)
    bnb = False
    if workload.method == "qlora":
        q = quantized_linear_bytes(workload)
        bnb = bnb_base(workload) and not int8_base(workload)
        q_total = q + (BNB_4BIT_MEASURED_OVERHEAD if bnb else 0.0)
        # peft's prepare_model_for_kbit_training casts every 16-bit weight to FP32; TRL casts
        # embeddings and lm_head back (``kbit_prep``); norms stay FP32 either way.
        e_end = 4 if fp32_embeddings(workload, recipe) else e
        e_norm = 4 if bnb_prepared(workload, recipe) else e
        counts = place.counts
        emb = (counts.embedding + counts.positions) * e_end
        head = counts.lm_head * (q_total if quantized_head(model, workload) else e_end)
        end_bytes = emb + head if place.pp == 1 else max(emb, head)
        frozen = ((place.layer_share * q_total + end_bytes) / place.tp + place.n_norm * e_norm
                  + (place.linears - place.layer_share / place.tp) * q_total)  # experts' own TP
        dense, experts = frozen - place.n_exp * q_total, place.n_exp * q_total
    else:
        dense, experts = _weight_bytes(workload, recipe, place, e)
    ledger.put("weights", place.spread(dense, experts, "weights"), on_host_w)
    if bnb:
        ledger.put("weights", BNB_4BIT_FIXED_BYTES)  # per GPU, whatever the sharding


def _adapters(model: ModelSpec, workload: Workload, recipe: Recipe, place: _Placement,
              ledger: _Ledger, adapter_bytes: int) -> tuple[float, float, float, float]:
    """The trainable adapters' weights, gradients, optimizer states and master copies (paged
    states on the host); the routed experts' adapters divided as the experts' own states are.
    Returns: adapter parameters on this GPU, bytes of the largest gradient, the share of them
    that are Muon's matrices (the adapters; not the modules trained whole), and the parameters
    this GPU's optimizer steps."""
    mixed = workload.precision in ("mixed", "fp16")
    paged = recipe.optimizer_paged or workload.optimizer == "paged_adamw8bit"
    dense_shapes, expert_shapes = adapter_groups(model, workload)
    shapes = dense_shapes + expert_shapes
    r = workload.lora_rank
    n_dense = sum(n * r * (d_in + d_out) for n, d_in, d_out in dense_shapes) / (place.tp * place.pp)
    # the routed experts' adapters split as the experts are (their own TP), then over ep ranks
    n_exp = sum(n * r * (d_in + d_out) for n, d_in, d_out in expert_shapes) / (place.expert_tp * place.pp)
    trains_saved = workload.method in ("lora", "qlora")
    saved = list(saved_module_params(model, workload.modules_to_save).values()) if trains_saved else []
    n_saved = (sum(saved) if place.pp == 1 else max(saved, default=0)) / place.tp
    n_dense += n_saved
    n_lora = n_dense + n_exp / max(place.ep, 1)  # on this GPU, before ZeRO
    c = adapter_bytes
    # 16-bit adapters under autocast get an FP32 master and FP32 states only where a
    # mixed-precision optimizer wrapper keeps them (DeepSpeed, Megatron's FP32 main copy);
    # torch's own optimizers allocate their states like the parameters (zeros_like).
    wrapped = mixed and c < 4 and keeps_fp32_main_copy(recipe, place.zero)
    master = 4 if wrapped else 0
    # Muon steps the adapter matrices; the modules trained whole (embeddings, head) take AdamW
    matrix_share = 1.0 - n_saved / n_lora if n_lora else 1.0
    opt_b = _optimizer_bytes(model, workload, recipe, place, 4 if wrapped else c, paged, matrix_share=matrix_share)
    paged_share = _paged_share(
        [(n, r * d_in) for n, d_in, _ in shapes] + [(n, r * d_out) for n, _, d_out in shapes]
        + [(1, n) for n in saved]
    ) if paged else 0.0
    def spread(per_param: float, part: str) -> float:
        return float(place.spread(n_dense * per_param, n_exp * per_param, part))

    ledger.put("adapter_states", spread(c, "weights") + spread(c, "gradients")
               + spread(opt_b * (1 - paged_share) + master, "optimizer"))
    ledger.host += spread(opt_b * paged_share, "optimizer")
    largest = max([r * max(d_in, d_out) for _, d_in, d_out in shapes]
                  + [n / place.tp for n in saved], default=0) * c
    return n_lora, largest, matrix_share, spread(1.0, "optimizer")
