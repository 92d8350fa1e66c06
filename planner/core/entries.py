"""Catalog entries: a GPU type, a model's architecture (with its mixture-of-experts and latent
attention parts) and a training stack with its recipe, each validated strictly at the edge.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import (
    AliasChoices,
    BeforeValidator,
    Field,
    model_validator,
)

from planner.core.values import (
    HOST_RAM_USABLE_SHARE,
    Checkpointing,
    Count,
    GradDtype,
    Kernels,
    Loss,
    NonNegCount,
    Offload,
    OptimizerStep,
    QuantType,
    Selective,
    StrictModel,
    Vendor,
    ZeroImpl,
    parse_count,
    parse_number,
)

#: Card architectures whose FP8 GEMMs take any operand layout, so Transformer Engine keeps no
#: transposed copy of an FP8 weight, where the card's compute capability is not given (TE
#: ``is_non_tn_fp8_gemm_supported``: capability 10.x or 13+; the consumer Blackwell cards, 12.x,
#: still need the TN layout: utils.py L663 at d0067d0d, 2026-08).
FP8_ANY_LAYOUT_ARCHITECTURES = frozenset({"blackwell"})


class GpuSpec(StrictModel):
    """One GPU type. Memory in MiB as nvidia-smi (or the vendor's tool) reports it."""

    id: str
    name: str
    vendor: Vendor
    aliases: list[str] = []
    architecture: str
    #: CUDA compute capability (major.minor), where it decides something (FP8 layouts)
    compute_capability: float | None = None
    memory_mib: Annotated[int, Field(gt=0)]
    memory_mib_kind: Literal["nvidia-smi", "vendor-tool", "nominal"]
    memory_source: str
    bf16_dense_tflops: float | None
    fp16_dense_tflops: float | None
    fp8_dense_tflops: float | None
    tflops_source: str
    supports_bf16: bool
    supports_flash_attn2: bool
    memory_bandwidth_gbps: float | None
    gpus_per_node: Annotated[int, Field(ge=1)]
    nvlink_domain: Annotated[int, Field(ge=1)]
    p2p: bool
    intra_node_gbps: float | None
    inter_node_gbps: float | None
    whole_node_only: bool
    host_ram_per_node_gib: float | None
    price_on_demand_usd_per_hour: float | None
    price_on_demand_source: str | None
    price_spot_usd_per_hour: float | None
    price_spot_source: str | None
    price_purchase_usd: float | None
    price_purchase_source: str | None
    price_retrieved: str | None
    utilization_low: Annotated[float, Field(gt=0, le=1)]
    utilization_high: Annotated[float, Field(gt=0, le=1)]
    utilization_source: str
    #: The largest BF16 matmul rate measured on this card as a share of its dense BF16 peak
    #: (Bekman's "maximum achievable matmul FLOPS", MAMF); None where the card has no measurement
    #: (read as :data:`planner.perf.hardware.REFERENCE_MATMUL_EFFICIENCY`).
    matmul_efficiency: Annotated[float | None, Field(gt=0, le=1)] = None
    matmul_efficiency_source: str | None = None
    notes: str | None = None

    @property
    def keeps_fp8_transpose(self) -> bool:
        """Whether Transformer Engine caches a transposed copy of each FP8 weight on this card:
        its FP8 GEMM needs the TN layout unless its compute capability is 10.x or 13+ (B200, not
        the RTX 5090's 12.0), or, where the catalog gives none, its architecture is Blackwell."""
        cc = self.compute_capability
        if cc is None:
            return self.architecture not in FP8_ANY_LAYOUT_ARCHITECTURES
        return not (10.0 <= cc < 12.0 or cc >= 13.0)

    @property
    def memory_bytes(self) -> int:
        from planner.core.units import mib_to_bytes

        return mib_to_bytes(self.memory_mib)

    @property
    def host_ram_budget_bytes(self) -> float:
        """Host RAM per node that offloaded states may take (inf when the node's RAM is unknown):
        the one host-RAM rule of the search, the checker and the config warnings."""
        if self.host_ram_per_node_gib is None:
            return math.inf
        return self.host_ram_per_node_gib * 2**30 * HOST_RAM_USABLE_SHARE

    @property
    def peak_tflops_16bit(self) -> float | None:
        """Dense 16-bit tensor peak: BF16 where supported, else FP16."""
        return self.bf16_dense_tflops if self.supports_bf16 else self.fp16_dense_tflops


class MoESpec(StrictModel):
    """Mixture of experts: ``first_dense_layers`` dense layers, then MoE layers."""

    experts: Count
    active: Count
    expert_ffn: Count
    shared_experts: NonNegCount = 0
    shared_ffn: NonNegCount = 0
    first_dense_layers: NonNegCount = 0
    moe_every: Count = 1
    #: Whether each routed expert is built of linear modules (gate, up, down), which LoRA's MLP
    #: targets adapt one by one: PEFT in transformers' Mixtral, Qwen-MoE, DeepSeek and OLMoE
    #: blocks, and Megatron-Core's per-expert LoRA. False where the implementation stores the
    #: experts as fused 3-D parameters (transformers' GPT-OSS), which module targets never reach.
    #: transformers 5 fuses every MoE family's experts so; a run on it sets this false.
    linear_experts: bool = True

    @property
    def shared_width(self) -> int:
        """The shared experts' combined inner width: they run on every token side by side, one
        MLP this wide (0 without shared experts). Every count, FLOP and byte of theirs reads it."""
        return self.shared_ffn * self.shared_experts


class MLASpec(StrictModel):
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    q_lora_rank: NonNegCount | None = None
    kv_lora_rank: Count
    qk_nope_head_dim: Count
    qk_rope_head_dim: Count
    v_head_dim: Count


class ModelSpec(StrictModel):
    """A transformer's architecture. ``params_b`` overrides the count computed from it.

    Catalog entries carry every field; a scenario may give only ``params_b``, ``layers`` and
    ``hidden`` (enough for the ``seed`` profile), or a full architecture.
    """

    id: str = "custom"
    name: str | None = None
    hf_repo: str | None = None
    aliases: list[str] = []
    family: str | None = None
    layers: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=100_000)]
    hidden: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=10_000_000)]
    heads: Count | None = None
    kv_heads: Count | None = None
    head_dim: Count | None = None
    ffn: Count | None = None
    vocab: Count | None = None
    tied_embeddings: bool = False
    gated_mlp: bool = True
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norms_per_layer: NonNegCount = 2
    fused_qkv: bool = False  # one QKV linear (Qwen v1 c_attn, GPT-NeoX, litgpt): one LoRA input
    #: Whose module code saves the activations: Hugging Face transformers/PEFT, or litgpt's GPT
    #: (q, k, v split as views of the fused QKV output; LoRA q/v updates zero-padded).
    impl: Literal["hf", "litgpt"] = "hf"
    norm_upcast: bool = True  # RMSNorm computes in FP32 (False: litgpt before Oct 24, 2023)
    #: The RMSNorm scales by its weight in FP32 and casts after (Gemma 1-3:
    #: ``x.float() * (1 + weight.float())``; OLMo 2), so a trainable weight keeps the FP32
    #: normalised x.
    norm_fp32_scale: bool = False
    #: FFN-wide tensors the (ungated) MLP's activation keeps beyond its input: 3 for the GELU
    #: written out in Python (transformers' ``gelu_new``: GPT-2, GPT-J, Phi-1.5/2, CodeGen keep
    #: the tanh, 0.5·x and 1 + tanh), 0 for a kernel (``gelu``, ``gelu_pytorch_tanh``, ReLU).
    activation_saved_copies: NonNegCount = 0
    #: The (ungated) MLP's activation keeps its output, not its input (ReLU: OPT), and that
    #: output is the down projection's saved input: one FFN-wide tensor instead of two.
    activation_keeps_output: bool = False
    #: Eager attention's softmax runs in FP32 and is cast back (Llama and most since); False:
    #: in the compute dtype (transformers' GPT-2), keeping only the e-byte probabilities.
    softmax_fp32: bool = True
    #: litgpt before Oct 24, 2023 (PR #667) left multi-query K/V unexpanded, so PyTorch's SDPA
    #: (no grouped-query kernels before 2.5) ran its math path, keeping the s² probabilities.
    mqa_sdpa_math: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    #: tanh soft-capping of the attention scores / of the final logits (Gemma 2): the tanh keeps
    #: its output for backward, and capped scores cannot go through SDPA's fused kernels.
    attention_softcap: bool = False
    logit_softcap: bool = False
    #: The stack's eager attention clamps the masked scores from below with ``torch.max``, which
    #: keeps its input for backward: one more s²-sized tensor per layer. transformers' Llama
    #: before 4.31.0 and OPT before 4.49.0 did, as does Baichuan-7B's remote code; today's
    #: releases do not.
    eager_mask_clamp: bool = False
    position: Literal["rope", "learned", "alibi", "none"] = "rope"
    max_position: Count | None = None
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    params_b: Annotated[float | None, BeforeValidator(parse_number), Field(gt=0, le=100_000)] = None
    official_params_b: float | None = None
    params_source: str | None = None
    notes: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if (self.kv_heads is not None and self.heads is not None
                and (self.kv_heads > self.heads or self.heads % self.kv_heads)):
            raise ValueError(
                f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})"
            )
        if self.moe is not None and self.moe.active > self.moe.experts:
            raise ValueError("moe.active must not exceed moe.experts")
        return self

    @property
    def kv_heads_eff(self) -> int | None:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_dim_eff(self) -> int | None:
        if self.head_dim is not None:
            return self.head_dim
        if self.heads:
            return self.hidden // self.heads
        return None


class StackRecipe(StrictModel):
    """A stack's defaults where memory and time depend on them (``catalogs/stacks.yaml``,
    ``recipe:``). Each but the time-only ``fused_kernels`` is a key of the scenario's
    :class:`~planner.core.specs.Recipe` of the same name, type and default: a plan naming the
    stack is estimated and timed with them unless the scenario's ``recipe:`` sets its own."""

    #: How its ZeRO-3/FSDP frees gathered parameters (``Recipe.fsdp_version``: 1 for FSDP1 and
    #: DeepSpeed's record_stream frees, 2 for FSDP2).
    fsdp_version: Literal[1, 2] = 1
    #: Who implements its ZeRO stages (``Recipe.zero_impl``): DeepSpeed copies its gradient
    #: partition to FP32 at the step, and at stage 3 keeps a flat gradient partition.
    zero_impl: ZeroImpl = Field("fsdp", validation_alias=AliasChoices("zero_impl", "zero3_impl"))
    #: Its training loop under FSDP accumulates gradients unsharded between optimizer steps
    #: (``Recipe.unsharded_grad_accumulation``: FSDP's ``no_sync`` on every micro-batch but the
    #: last, as the Hugging Face Trainer and accelerate's ``accumulate`` do by default).
    unsharded_grad_accumulation: bool = False
    #: The dtype of its accumulated and reduced gradients (``Recipe.grad_dtype``): Megatron-LM's
    #: FP32 main gradients under bf16.
    grad_dtype: GradDtype = "param"
    #: How its optimizer steps (``Recipe.optimizer_step``): Composer's DecoupledAdamW one tensor at
    #: a time (``for_loop``: no intermediate the size of every stepped tensor).
    optimizer_step: OptimizerStep = "foreach"
    #: Element-wise work fused into fewer kernels (Transformer Engine in Megatron-Core; the time
    #: model's ``fused_elementwise_share``). Time only: no scenario key of its own.
    fused_kernels: bool = False
    #: Its attention runs the card generation's own fused kernels (Transformer Engine's
    #: DotProductAttention prefers cuDNN's fused attention on Hopper), not a portable
    #: FlashAttention-2-class kernel (``planner.perf.hardware.NATIVE_ATTENTION_SHARE``). Time only.
    native_attention: bool = False
    #: The loss's implementation, the norm and activation kernels, torch.compile (``Recipe``).
    loss: Loss = "standard"
    #: What its selective checkpointing reruns (``Recipe.selective``).
    selective: Selective = "op"
    kernels: Kernels = "standard"
    compile: bool = False
    #: GRPO with a colocated engine: the engine sleeps while the step trains, and the trainer's
    #: states go to host memory while it generates (``Recipe.generation_sleep``,
    #: ``Recipe.rollout_offload``).
    generation_sleep: bool = False
    rollout_offload: bool = False
    #: GRPO: a forward over the completions for their old log-probs each step
    #: (``Recipe.logprob_forward``).
    logprob_forward: bool = False
    #: The frozen reference model's weights in host memory (``Recipe.reference_offload``).
    reference_offload: bool = False
    #: Its optimizer offload leaves the gradient buffers on the GPU (``Recipe.offload_keeps_grads``).
    offload_keeps_grads: bool = False


class StackSpec(StrictModel):
    """A training stack (framework and launcher) and what it can run, each fact with its source
    (``catalogs/stacks.yaml``). The search names, for every plan, a stack that runs all of it."""

    id: str
    name: str
    versions: str
    vendors: list[Vendor]
    methods: list[Literal["full", "lora", "qlora"]]
    #: 4-bit bases it trains QLoRA on, and the vendors where that quantisation runs.
    quant_types: list[QuantType] = []
    qlora_vendors: list[Vendor] = []
    #: ZeRO stages (0 = DDP, 3 = FSDP full shard) in general, with QLoRA, and with pipelines.
    zero: list[Literal[0, 1, 2, 3]]
    zero_with_qlora: list[Literal[0, 1, 2, 3]] = []
    zero_with_pp: list[Literal[0, 1, 2, 3]] = []
    offload: list[Offload]
    checkpointing: list[Checkpointing]
    #: Model parallelism: which methods it runs with TP > 1 / PP > 1; CP, EP and SP at all.
    tp_methods: list[Literal["full", "lora", "qlora"]] = []
    pp_methods: list[Literal["full", "lora", "qlora"]] = []
    cp: bool = False
    ep: bool = False
    #: Expert tensor parallelism apart from tp (``Layout.etp``: Megatron-Core's MoE parallel
    #: folding, ``--expert-tensor-parallel-size``).
    etp: bool = False
    sp: bool = False
    #: It trains whole modules beside LoRA adapters (``Workload.modules_to_save``: PEFT's
    #: ``modules_to_save``, axolotl's ``lora_modules_to_save``).
    modules_to_save: bool = False
    #: Training objectives it runs (``Workload.algorithm``): supervised, DPO, and GRPO with a vLLM
    #: engine colocated on the training GPUs or served on GPUs of its own.
    algorithms: list[Literal["sft", "dpo", "grpo"]] = ["sft"]
    #: Where its GRPO generation engine may run: on the training GPUs (``colocated``) or on GPUs of
    #: its own (``served``, ``layout.generation_gpus`` > 0).
    generation_placements: list[Literal["colocated", "served"]] = ["colocated", "served"]
    #: What its training loop does by default where memory and time depend on it.
    recipe: StackRecipe = StackRecipe()
    sources: list[dict[str, str]] = []
    notes: str | None = None
