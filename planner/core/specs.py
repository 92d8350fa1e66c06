"""Typed schemas: catalog entries (GPUs, models) and the scenario format.

Validation happens here, at the edge, strictly: unknown keys are errors (``extra="forbid"``), so a
typo'd key in a scenario file is reported rather than silently dropped. Past this module, code
trusts its inputs. Counts accept YAML's ``1e9`` (read as a string) wherever an integer is meant.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)

# --------------------------------------------------------------------------------------------
# Value types


def _parse_number(value: Any) -> Any:
    """Accept ``"1e9"`` and ``"7_000"`` (YAML reads both as strings); reject booleans."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")  # noqa: TRY004 - pydantic reports ValueErrors
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"must be a number, got {value!r}") from None
    return value


def _parse_count(value: Any) -> Any:
    value = _parse_number(value)
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"must be a whole number, got {value:g}")
        value = int(value)
    return value


#: A positive whole number (accepts ``1e9``).
Count = Annotated[int, BeforeValidator(_parse_count), Field(ge=1)]
#: A non-negative whole number.
NonNegCount = Annotated[int, BeforeValidator(_parse_count), Field(ge=0)]
#: A non-negative real number (accepts ``4e9``).
NonNegFloat = Annotated[float, BeforeValidator(_parse_number), Field(ge=0, allow_inf_nan=False)]
PosFloat = Annotated[float, BeforeValidator(_parse_number), Field(gt=0, allow_inf_nan=False)]

#: Upper bounds that catch absurd input (a typo of three extra zeros) without limiting real use.
MAX_GPUS = 1_000_000
#: "Up to 1,024 GPUs" unless the scenario says otherwise (``search.max_gpus``).
DEFAULT_MAX_GPUS = 1024
#: Share of a node's host RAM that offloaded states may take (the OS, data loaders and pinned
#: buffers need the rest): a guess, stated.
HOST_RAM_USABLE_SHARE = 0.8
MAX_SEQ_LEN = 16 * 1024 * 1024
#: The largest token budget a scenario may ask for: 10^15, about 28 times the largest published
#: pre-training run (Qwen3, 36 trillion tokens; Qwen3 technical report, Yang et al. 2025). A
#: larger figure is a typo (``1e300``), and would plan jobs of 10^295 days.
MAX_TOKENS = 1e15
MAX_MICRO_BATCH = 1_000_000

Method = Literal["full", "lora", "qlora", "inference"]
Optimizer = Literal["adamw", "adam8bit", "paged_adamw8bit", "sgd"]
Precision = Literal["mixed", "bf16", "fp16", "fp32"]
Checkpointing = Literal["none", "selective", "full"]
Attention = Literal["eager", "flash"]
Offload = Literal["none", "optimizer", "optimizer+params"]
ZeroImpl = Literal["fsdp", "deepspeed"]
Profile = Literal["seed", "detailed"]
Objective = Literal["gpus", "hourly", "cost", "time"]
Vendor = Literal["nvidia", "amd", "huawei", "intel", "google"]
QuantType = Literal["nf4", "torchao-nf4", "gptq"]

#: Linear layers LoRA can adapt, in PEFT's Llama naming (``all`` = every one of them).
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------
# Catalog entries


class GpuSpec(StrictModel):
    """One GPU type. Memory in MiB as nvidia-smi (or the vendor's tool) reports it."""

    id: str
    name: str
    vendor: Vendor
    aliases: list[str] = []
    architecture: str
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
    notes: str | None = None

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
    layers: Annotated[int, BeforeValidator(_parse_count), Field(ge=1, le=100_000)]
    hidden: Annotated[int, BeforeValidator(_parse_count), Field(ge=1, le=10_000_000)]
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
    params_b: Annotated[float | None, BeforeValidator(_parse_number), Field(gt=0, le=100_000)] = None
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


# --------------------------------------------------------------------------------------------
# Scenario


#: The loss's implementation (``Workload.loss``) and the layer kernels (``Workload.kernels``).
Loss = Literal["standard", "chunked", "fused", "held_fp32", "compiled", "cce", "in_forward", "inplace",
               "chunked_head", "chunked_head_in_forward", "rowwise", "rowwise_fp32"]
Kernels = Literal["standard", "fused_rmsnorm", "unsloth"]


class Workload(StrictModel):
    """What is trained (or served) and how: everything that changes the result of training."""

    method: Method = "full"
    optimizer: Optimizer = "adamw"
    precision: Precision = "mixed"
    seq_len: Annotated[int, BeforeValidator(_parse_count), Field(ge=1, le=MAX_SEQ_LEN)] = 2048
    micro_batch: Annotated[int, BeforeValidator(_parse_count), Field(ge=1, le=MAX_MICRO_BATCH)] = 1
    grad_accum: Count | None = None
    global_batch: Count | None = None
    tokens: Annotated[float, BeforeValidator(_parse_number), Field(gt=0, le=MAX_TOKENS, allow_inf_nan=False)] | None = None
    lora_rank: Annotated[int, BeforeValidator(_parse_count), Field(ge=1, le=65_536)] = 16
    lora_alpha: PosFloat | None = None
    lora_targets: list[Literal["q", "k", "v", "o", "gate", "up", "down", "all", "lm_head"]] = ["all"]
    #: Bits per quantized base weight: 4 (NF4, GPTQ) or 8 (bitsandbytes LLM.int8, ``Linear8bitLt``).
    quant_bits: Literal[4, 8] = 4
    double_quant: bool = True
    allow_relax: list[Literal["method", "seq_len"]] = []
    #: The training objective: ``sft`` (supervised: the next-token loss) or ``dpo`` (direct
    #: preference optimisation and its family, IPO, ORPO, SimPO). Under ``dpo`` each example is a
    #: pair, chosen and rejected, run through the policy together as TRL's DPOTrainer concatenates
    #: them: ``micro_batch``, ``grad_accum`` and ``global_batch`` count pairs, ``tokens`` every
    #: token of both sequences.
    algorithm: Literal["sft", "dpo"] = "sft"
    #: DPO's reference policy: ``model`` (the frozen starting weights, run forward on every pair:
    #: full fine-tuning keeps a 16-bit copy, sharded like the policy under ZeRO-3/FSDP and offloaded
    #: with it; LoRA and QLoRA use the base with the adapters disabled, no copy), ``precomputed``
    #: (TRL's ``precompute_ref_log_probs``: reference log-probabilities computed in a pass before
    #: training; no copy, no reference forward in the step) or ``none`` (reference-free: ORPO,
    #: SimPO).
    reference: Literal["model", "precomputed", "none"] = "model"
    # Recipe details the ``detailed`` profile models (the ``seed`` profile ignores them).
    #: Whole modules trained beside the adapters (PEFT ``modules_to_save``, LLaMA-Factory
    #: ``additional_target``): each gets a trainable copy (the frozen original stays) with its
    #: gradient, optimizer states and master copy, in the adapters' dtype (``adapter_dtype``:
    #: FP32 as LLaMA-Factory and FP16-AMP scripts cast trainable weights; 16-bit with FP32
    #: states under DeepSpeed). Training the embeddings and LM head is how a LoRA run learns an
    #: extended vocabulary or a new chat template. The detailed profile counts them.
    modules_to_save: list[Literal["embed_tokens", "lm_head"]] = []
    #: Sequences per GPU in the evaluation passes a training run makes between steps (the Hugging
    #: Face Trainer's ``per_device_eval_batch_size``, 8 unless set, whatever the training batch);
    #: unset: no evaluation during training. The detailed profile sizes an evaluation phase: a
    #: forward without gradients at this batch, its logits and its loss, beside the model states.
    eval_micro_batch: Annotated[int | None, BeforeValidator(_parse_count),
                                Field(ge=1, le=MAX_MICRO_BATCH)] = None
    # 4-bit base: bitsandbytes NF4, torchao NF4 (torchtune), GPTQ
    quant_type: QuantType = "nf4"
    # Whether a bitsandbytes matmul keeps its input on its autograd context (``ctx.tensors``),
    # alive for as long as the graph. None: the current bitsandbytes, whose 4-bit matmul does not
    # (0.43.2, July 2024, dropped ``ctx.tensors = (A, B)``) and whose LLM.int8 matmul does (from
    # 0.40.0, ``ctx.tensors = (CAt, subA, A)``).
    bnb_keeps_input: bool | None = None
    # bitsandbytes before 0.45.0 (December 2024): each LLM.int8 matmul also keeps an int8 copy of
    # its input (``CAt``, one byte per element) whenever that input needs a gradient.
    int8_keeps_transposed: bool = False
    # how a Hugging Face QLoRA script readies the 4-bit model: "peft" = peft's
    # prepare_model_for_kbit_training (norms, embeddings and lm_head to FP32), "trl" = TRL's
    # SFTTrainer after it (embeddings and lm_head back to BF16 for a 4-bit base under bf16; FP32
    # otherwise; norms FP32), "none"
    kbit_prep: Literal["none", "peft", "trl"] = "none"
    adapter_dtype: Literal["fp32", "compute"] = "fp32"  # PEFT keeps adapters in FP32 by default
    lora_dropout: Annotated[float, BeforeValidator(_parse_number), Field(ge=0, lt=1)] = 0.0
    grad_dtype: Literal["param", "fp32"] = "param"  # fp32: FP32 main gradients (Megatron)
    optimizer_paged: bool = False  # bitsandbytes paged states (CUDA unified memory)
    # how the optimizer steps: "foreach" (torch's multi-tensor default on CUDA: one
    # intermediate the size of all stepped tensors), "foreach_torch20" (torch 2.0's, which kept
    # two), "fused" (one kernel, no intermediates), "in_backward" (each parameter stepped as its
    # gradient is ready), "for_loop" (one tensor at a time: torch's default before 2.0, torch
    # 2.0 over FSDP1's FlatParameter, Composer's DecoupledAdamW, transformers' adamw_hf)
    optimizer_step: Literal["foreach", "foreach_torch20", "fused", "in_backward", "for_loop"] = "foreach"
    # the stack keeps rotary cos/sin tables of max_position rows in every attention layer
    # (transformers before 4.41; memory/model_states.rope_cache_bytes)
    rope_cache_per_layer: bool = False
    # the training forward returns the model's KV cache (a transformers model whose config has
    # use_cache on, run without gradient checkpointing by a script that leaves the cache on): the
    # cached keys and values that are not tensors saved for backward live until the loss is done
    # (memory/activations.kv_cache_bytes). Most fine-tuning scripts turn the cache off.
    keeps_kv_cache: bool = False
    # cross-entropy over the vocabulary; "held_fp32": the model returns FP32 logits that the
    # training loop keeps through backward (torchtune before its chunked loss); "compiled":
    # torch.compile fuses the upcast, log-softmax and their backward (torchtitan with compile);
    # "cce": Cut Cross-Entropy (Wijmans et al. 2024, apple/ml-cross-entropy) computes the loss
    # and its gradient block by block from the hidden states and the classifier: no logits;
    # "in_forward": the loss and the hidden states' gradient computed in the forward, the
    # logits upcast to FP32 (Unsloth's fused cross-entropy, 2025: one chunk unless the FP32
    # logits exceed half the free memory); "inplace": the logits in the compute dtype, their
    # gradient written into them (Unsloth's Fast_CrossEntropyLoss before 2025); "chunked_head":
    # the head and FP32 cross-entropy run per chunk of tokens with each chunk's graph kept for
    # the one backward (torchtune's LinearCrossEntropyLoss); "chunked_head_in_forward": each
    # chunk's head, loss and backward run in the forward into a gradient of the hidden states
    # (torchtitan's ChunkedLossWrapper)
    loss: Loss = "standard"
    # the largest micro-batch is the run's first step (litgpt before 2024 put its longest sample
    # first): no earlier step's outputs are still held by the training loop at the peak
    peak_at_first_step: bool = False
    compile: bool = False  # torch.compile: fused norms and activations
    # "fused_rmsnorm": a fused RMSNorm kernel (torchtitan's Triton ``fused_rmsnorm``, Liger's)
    # keeps only its input and rsqrt: no FP32 copy, no normalised output;
    # "unsloth": Unsloth's hand-written LoRA autograd and Triton kernels for Llama-style layers
    # (unsloth/kernels/fast_lora.py, rms_layernorm.py, swiglu.py): LoRA_MLP keeps its input and
    # the gate and up outputs, recomputes the SwiGLU product in backward and writes the
    # gradients into those buffers; LoRA_QKV and LoRA_W keep their input only; RMSNorm keeps
    # its input and rsqrt
    kernels: Kernels = "standard"
    fp8: bool = False  # Float8 linears (saved inputs and gathered weights in FP8)
    #: How a MoE layer runs its experts: ``grouped``, one grouped GEMM over every routed token
    #: (transformers 5's default ``experts_implementation``, Megatron-Core, torchtitan), or
    #: ``loop``, an eager loop (transformers 4, or 5 with ``experts_implementation="eager"``):
    #: one expert's tokens at a time, each output added into the result by ``index_add_``,
    #: which keeps it.
    moe_experts: Literal["grouped", "loop"] = "grouped"

    @property
    def sequences_per_sample(self) -> int:
        """Sequences the policy runs per example of the micro-batch: 2 for a DPO pair, else 1."""
        return 2 if self.algorithm == "dpo" else 1

    @property
    def loss_impl(self) -> str:
        """The loss as it runs: a DPO step's "standard" loss is not a cross-entropy but the
        per-token log-probabilities of both sequences, row by row in the compute dtype (TRL's
        ``selective_log_softmax``): ``rowwise``."""
        return "rowwise" if self.algorithm == "dpo" and self.loss == "standard" else self.loss

    @property
    def reference_forward(self) -> bool:
        """Whether each step runs the reference policy forward (DPO with a reference model)."""
        return self.algorithm == "dpo" and self.reference == "model"

    @property
    def reference_copy(self) -> bool:
        """Whether a frozen copy of the weights stays beside the policy (full fine-tuning only)."""
        return self.reference_forward and self.method == "full"

    @property
    def lora_target_set(self) -> tuple[str, ...]:
        if "all" in self.lora_targets:
            return LORA_TARGETS
        return tuple(t for t in LORA_TARGETS if t in self.lora_targets)


class Layout(StrictModel):
    """How the work is laid out on hardware: systems choices that do not change what is trained."""

    gpu: str | None = None
    gpus: Annotated[int | None, BeforeValidator(_parse_count), Field(ge=1, le=MAX_GPUS)] = None
    dp: Annotated[int | None, BeforeValidator(_parse_count), Field(ge=1, le=MAX_GPUS)] = None
    tp: Annotated[int, BeforeValidator(_parse_count), Field(ge=1, le=MAX_GPUS)] = 1
    pp: Annotated[int, BeforeValidator(_parse_count), Field(ge=1, le=MAX_GPUS)] = 1
    cp: Annotated[int, BeforeValidator(_parse_count), Field(ge=1, le=MAX_GPUS)] = 1
    #: Expert parallelism (MoE): routed experts split over ep ranks carved out of dp (ep | dp).
    ep: Annotated[int, BeforeValidator(_parse_count), Field(ge=1, le=MAX_GPUS)] = 1
    sp: bool = False
    zero: Literal[0, 1, 2, 3] = 0
    offload: Offload = "none"
    checkpointing: Checkpointing = "none"
    attention: Attention = "flash"
    # Layout details the ``detailed`` profile models (the ``seed`` profile ignores them).
    activation_offload: bool = False  # checkpointed layer inputs kept in host memory
    pp_schedule: Literal["1f1b", "interleaved", "gpipe"] = "1f1b"
    #: Pipeline stages of unequal layer counts when pp does not divide the layers (torchtitan
    #: splits a 126-layer model over 8 stages); the detailed profile sizes the heaviest stage.
    uneven_pp: bool = False
    pp_virtual_stages: Annotated[int, BeforeValidator(_parse_count), Field(ge=1, le=1024)] = 1
    unsharded_grad_accumulation: bool = False  # FSDP no_sync: full gradients between micro-batches
    full_state_dict: bool = False  # FSDP1: the whole unsharded 16-bit model on each GPU once
    #: FSDP1 with ``use_orig_params=True`` and units that hold frozen and trainable weights (a
    #: LoRA layer wrapped whole): each flat parameter's gradient covers the frozen weights too,
    #: "equivalent to not freezing those parameters" (PyTorch FSDP docs).
    fsdp_mixed_units: bool = False
    #: DeepSpeed ZeRO-1/2 with contiguous_gradients: gradient buckets allocated at each backward,
    #: in elements of the compute dtype (reduce_bucket_size, twice with overlap_comm).
    zero_bucket_elements: NonNegCount = 0
    #: DeepSpeed ZeRO-1/2 checks gradients for inf/NaN on the GPU one tensor at a time: with the
    #: optimizer offloaded (ZeRO-Offload) each whole gradient it owns at the last micro-batch, and
    #: in FP16 training the owned parts at the step: bytes per element the check allocates. 4
    #: before DeepSpeed 0.13.3 (``x.float().sum()``); 11 from 0.13.3 (PR #5115: an FP32 copy,
    #: ``isnan`` and ``isinf`` masks, their union and its float for ``max``).
    zero_overflow_check_bytes: Literal[4, 11] = 11
    #: DeepSpeed ZeRO-1/2 with the optimizer offloaded copies its FP32 partition to the GPU at
    #: the step before casting it into the 16-bit weights (``fp32_partition.to(device)``):
    #: releases 0.14.1 (PR #5301) to 0.16.x; PR #7309 (2025-05-23) casts on the host again.
    zero_offload_gpu_copy: bool = False
    #: How ZeRO-3 gathers are freed: 1 for FSDP1 and DeepSpeed ZeRO-3 (``record_stream``: a block
    #: returns to the all-gather stream's pool once the GPU is done with it, which fragments the
    #: caching allocator's segments), 2 for FSDP2 (``fully_shard``: stream-to-stream waits, the
    #: frees deterministic). The detailed profile's reserved view.
    fsdp_version: Literal[1, 2] = 1
    #: Who implements the ZeRO stage: "fsdp" (PyTorch FSDP: sharded gradients made in backward,
    #: freed at zero_grad; also Megatron's distributed optimizer) or "deepspeed" (stage3.py: a flat
    #: partition of every gradient allocated at initialisation and kept, and an FP32 copy of it
    #: made at the optimizer step; stage_1_and_2.py: the FP32 copy of its gradient partition at
    #: the step). ``zero3_impl`` is read as this key too.
    zero_impl: ZeroImpl = Field("fsdp", validation_alias=AliasChoices("zero_impl", "zero3_impl"))


#: Bounds of the overrides: finite, non-negative and at most what one GPU could ever hold, so no
#: figure built from them overflows the int64 byte counts (2^63 ≈ 9.2e18) the search uses.
MAX_BYTES_PER_GPU = 10**15  # 1 PB, thousands of times any GPU's memory
#: Bytes per activation token·hidden·layer unit: the documents give 2–20 (K); 1,000 is absurd.
MAX_K_FACTOR = 1_000
#: Trainable adapter parameters: 1e15 is far beyond any model.
MAX_PARAMS = 10**15
#: Bytes per parameter of a state or a base: FP64 Adam with a master copy is under 32.
MAX_BYTES_PER_PARAM = 64


class Overrides(StrictModel):
    """Replace one formula's output with a figure of your own (e.g. to reproduce a document)."""

    activation_bytes: Annotated[NonNegFloat | None, Field(le=MAX_BYTES_PER_GPU)] = None
    k_factor: Annotated[PosFloat | None, Field(le=MAX_K_FACTOR)] = None
    lora_params: Annotated[NonNegCount | None, Field(le=MAX_PARAMS)] = None
    lora_bytes_per_param: Annotated[NonNegFloat | None, Field(le=MAX_BYTES_PER_PARAM)] = None
    base_bytes_per_param: Annotated[PosFloat | None, Field(le=MAX_BYTES_PER_PARAM)] = None
    #: Share of the card kept free; unset: the profile's fit rule (seed: 10 % reserve; detailed:
    #: predicted bytes needed plus a fit margin within capacity, planner.memory.estimate).
    reserve: Annotated[float | None, BeforeValidator(_parse_number), Field(ge=0, lt=1)] = None


class StackRecipe(StrictModel):
    """A stack's defaults where memory and time depend on them (``catalogs/stacks.yaml``,
    ``recipe:``). Each is a key of the scenario's of the same name (``Layout`` for the sharding
    keys, ``Workload`` for the loss, kernels and compile): a plan naming the stack is estimated
    and timed with them unless the scenario sets its own."""

    #: How its ZeRO-3/FSDP frees gathered parameters (``Layout.fsdp_version``: 1 for FSDP1 and
    #: DeepSpeed's record_stream frees, 2 for FSDP2).
    fsdp_version: Literal[1, 2] = 1
    #: Who implements its ZeRO stages (``Layout.zero_impl``): DeepSpeed copies its gradient
    #: partition to FP32 at the step, and at stage 3 keeps a flat gradient partition.
    zero_impl: ZeroImpl = Field("fsdp", validation_alias=AliasChoices("zero_impl", "zero3_impl"))
    #: Its training loop under FSDP accumulates gradients unsharded between optimizer steps
    #: (``Layout.unsharded_grad_accumulation``: FSDP's ``no_sync`` on every micro-batch but the
    #: last, as the Hugging Face Trainer and accelerate's ``accumulate`` do by default).
    unsharded_grad_accumulation: bool = False
    #: Element-wise work fused into fewer kernels (Transformer Engine in Megatron-Core; the time
    #: model's ``fused_elementwise_share``). Time only: no scenario key of its own.
    fused_kernels: bool = False
    #: The loss's implementation, the norm and activation kernels, torch.compile (``Workload``).
    loss: Loss = "standard"
    kernels: Kernels = "standard"
    compile: bool = False


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
    sp: bool = False
    #: It trains whole modules beside LoRA adapters (``Workload.modules_to_save``: PEFT's
    #: ``modules_to_save``, axolotl's ``lora_modules_to_save``).
    modules_to_save: bool = False
    #: What its training loop does by default where memory and time depend on it.
    recipe: StackRecipe = StackRecipe()
    sources: list[dict[str, str]] = []
    notes: str | None = None


class SearchSpace(StrictModel):
    """Candidate lists and limits for ``planner plan`` (None = the whole space)."""

    gpu_types: list[str] | None = None
    max_gpus: Annotated[int | None, BeforeValidator(_parse_count), Field(ge=1, le=MAX_GPUS)] = None
    micro_batch: list[Count] | None = None
    attention: list[Attention] | None = None
    checkpointing: list[Checkpointing] | None = None
    zero: list[Literal[0, 1, 2, 3]] | None = None
    offload: list[Offload] | None = None
    tp: list[Count] | None = None
    pp: list[Count] | None = None
    cp: list[Count] | None = None
    ep: list[Count] | None = None
    method: list[Method] | None = None
    precision: list[Precision] | None = None
    optimizer: list[Optimizer] | None = None
    seq_len: list[Count] | None = None
    distinct: Literal["layout", "none"] = "layout"
    #: Stacks a plan may use (catalogs/stacks.yaml ids), in order of preference; None = all.
    stacks: list[str] | None = None
    utilization: Annotated[float | None, BeforeValidator(_parse_number), Field(gt=0, le=1)] = None


class Constraints(StrictModel):
    budget_usd: PosFloat | None = None
    deadline_hours: PosFloat | None = None
    fleet: dict[str, Count] | None = None
    #: TP/PP between cards without NVLink run over PCIe: allowed (and charged) unless false.
    pcie_model_parallel: bool = True


def _model_kind(value: Any) -> str:
    return "name" if isinstance(value, str) else "dims"


#: A catalog name, a path to a Hugging Face ``config.json``, or explicit dims.
ModelField = Annotated[
    Annotated[str, Tag("name")] | Annotated[ModelSpec, Tag("dims")],
    Discriminator(_model_kind),
]

#: Union tags that pydantic puts into error locations; error messages leave them out.
UNION_TAGS = frozenset({"name", "dims"})


class Scenario(StrictModel):
    name: str = "scenario"
    profile: Profile = "detailed"  # detailed beats seed on measured runs (planner validate)
    model: ModelField
    workload: Workload = Workload()
    layout: Layout = Layout()
    overrides: Overrides = Overrides()
    search: SearchSpace = SearchSpace()
    constraints: Constraints = Constraints()
    objective: Objective | None = None  # default: cost with a token budget, else gpus
    top: Annotated[int, BeforeValidator(_parse_count), Field(ge=1, le=1000)] = 10
    time_limit_s: PosFloat = 30.0
