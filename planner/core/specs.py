"""The scenario format, typed: workload, layout, recipe, overrides, search space, constraints (catalog
entries are in planner.core.entries, the shared value types in planner.core.values).

Validation happens here, at the edge, strictly: unknown keys are errors (``extra="forbid"``), so a
typo'd key in a scenario file is reported rather than silently dropped. Past this module, code
trusts its inputs. Counts accept YAML's ``1e9`` (read as a string) wherever an integer is meant.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BeforeValidator, Discriminator, Field, Tag, model_validator

from planner.core.entries import ModelSpec
from planner.core.values import (
    LORA_TARGETS,
    MAX_GPUS,
    MAX_MICRO_BATCH,
    MAX_SEQ_LEN,
    MAX_TOKENS,
    Attention,
    Checkpointing,
    Count,
    GradDtype,
    Kernels,
    Loss,
    Method,
    NonNegCount,
    NonNegFloat,
    Objective,
    Offload,
    Optimizer,
    OptimizerStep,
    PosFloat,
    Precision,
    Profile,
    QuantType,
    Selective,
    StrictModel,
    ZeroImpl,
    parse_count,
    parse_number,
)


class Workload(StrictModel):
    """What is trained (or served) and how: everything that changes the result of training."""

    method: Method = "full"
    optimizer: Optimizer = "adamw"
    precision: Precision = "mixed"
    seq_len: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=MAX_SEQ_LEN)] = 2048
    micro_batch: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=MAX_MICRO_BATCH)] = 1
    grad_accum: Count | None = None
    global_batch: Count | None = None
    tokens: Annotated[float, BeforeValidator(parse_number), Field(gt=0, le=MAX_TOKENS, allow_inf_nan=False)] | None = None
    lora_rank: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=65_536)] = 16
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
    #: token of both sequences. ``grpo``: group-relative policy optimisation as TRL's GRPOTrainer
    #: runs it: each step generates ``num_generations`` completions of at most ``completion_len``
    #: tokens for every prompt (``seq_len`` = prompt + completion), scores them and trains on them;
    #: ``micro_batch``, ``grad_accum`` and ``global_batch`` count completions, ``tokens`` every
    #: token trained on. The generation engine (vLLM) is placed by ``layout.generation_gpus``.
    algorithm: Literal["sft", "dpo", "grpo"] = "sft"
    #: GRPO: completions generated per prompt (TRL's ``num_generations``, default 8; at least 2,
    #: and the global batch a multiple of it).
    num_generations: Annotated[int, BeforeValidator(parse_count), Field(ge=2, le=1024)] = 8
    #: GRPO: the longest completion generated (TRL's ``max_completion_length``, default 512); the
    #: prompt is the rest of ``seq_len``.
    completion_len: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=MAX_SEQ_LEN)] = 512
    #: DPO's reference policy: ``model`` (the frozen starting weights, run forward on every pair:
    #: full fine-tuning keeps a 16-bit copy, sharded like the policy under ZeRO-3/FSDP and offloaded
    #: with it; LoRA and QLoRA use the base with the adapters disabled, no copy), ``precomputed``
    #: (TRL's ``precompute_ref_log_probs``: reference log-probabilities computed in a pass before
    #: training; no copy, no reference forward in the step) or ``none`` (reference-free: ORPO,
    #: SimPO). Under ``grpo``: ``model`` where the KL term's ``beta`` is above 0 (a reference
    #: forward on every completion), ``none`` where it is 0, TRL's default and the default here.
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
    eval_micro_batch: Annotated[int | None, BeforeValidator(parse_count),
                                Field(ge=1, le=MAX_MICRO_BATCH)] = None
    # 4-bit base: bitsandbytes NF4, torchao NF4 (torchtune), GPTQ
    quant_type: QuantType = "nf4"
    adapter_dtype: Literal["fp32", "compute"] = "fp32"  # PEFT keeps adapters in FP32 by default
    #: The dtype LoRA's frozen base weights are kept in: ``compute`` (loaded in bf16/fp16, the
    #: ``torch_dtype`` most scripts pass) or ``fp32`` (a model loaded in FP32 and run under
    #: autocast: Lightning's ``bf16-mixed``, a Trainer's ``--bf16`` over a model loaded without
    #: ``torch_dtype`` in transformers 4.x). An FP32 base costs 4 bytes per weight, and autocast casts
    #: each frozen weight to 16 bits at every use; the linear keeps that copy for its input's
    #: gradient, so a forward holds a 16-bit copy of every weight it has passed (measured on the
    #: CPU: ``tests/truth``). Needs precision ``mixed`` or ``fp16`` (autocast).
    base_dtype: Literal["compute", "fp32"] = "compute"
    lora_dropout: Annotated[float, BeforeValidator(parse_number), Field(ge=0, lt=1)] = 0.0
    fp8: bool = False  # Float8 linears (saved inputs and gathered weights in FP8)

    @model_validator(mode="before")
    @classmethod
    def _grpo_reference(cls, data: Any) -> Any:
        """GRPO without a stated reference takes TRL's ``beta`` 0: no reference model."""
        if isinstance(data, dict) and data.get("algorithm") == "grpo" and "reference" not in data:
            return {**data, "reference": "none"}
        return data

    @property
    def generates(self) -> bool:
        """Whether each step generates its samples first (GRPO)."""
        return self.algorithm == "grpo"

    @property
    def prompt_len(self) -> int:
        """GRPO: the prompt's tokens, ``seq_len`` less the completion (at least 1)."""
        return max(1, self.seq_len - self.completion_len)

    @property
    def sequences_per_sample(self) -> int:
        """Sequences the policy runs per example of the micro-batch: 2 for a DPO pair, else 1."""
        return 2 if self.algorithm == "dpo" else 1

    @property
    def reference_forward(self) -> bool:
        """Whether each step runs the reference policy forward (DPO, or GRPO with ``beta`` > 0,
        with a reference model)."""
        return self.algorithm in ("dpo", "grpo") and self.reference == "model"

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
    gpus: Annotated[int | None, BeforeValidator(parse_count), Field(ge=1, le=MAX_GPUS)] = None
    dp: Annotated[int | None, BeforeValidator(parse_count), Field(ge=1, le=MAX_GPUS)] = None
    tp: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=MAX_GPUS)] = 1
    pp: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=MAX_GPUS)] = 1
    cp: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=MAX_GPUS)] = 1
    #: Expert parallelism (MoE): routed experts split over ep ranks carved out of dp (ep | dp).
    ep: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=MAX_GPUS)] = 1
    #: Expert tensor parallelism (MoE; Megatron-Core's ``--expert-tensor-parallel-size``): each
    #: routed expert split etp ways instead of tp, the expert layers regrouping the stage's dp·cp·tp
    #: GPUs as etp × ep × expert-dp (MoE parallel folding: ep·etp divides dp·cp·tp). Unset: experts
    #: split like the dense layers (tp ways) and ep carved out of dp.
    etp: Annotated[int | None, BeforeValidator(parse_count), Field(ge=1, le=MAX_GPUS)] = None
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
    pp_virtual_stages: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=1024)] = 1
    #: GRPO's generation engine (vLLM): 0 colocated on the training GPUs (TRL's
    #: ``vllm_mode="colocate"``: an engine per ``generation_tp`` GPUs holding
    #: ``generation_memory_fraction`` of each GPU through the whole step), or that many more GPUs
    #: serving it apart (``vllm_mode="server"``, ``trl vllm-serve``), which the plan counts and bills.
    generation_gpus: Annotated[int, BeforeValidator(parse_count), Field(ge=0, le=MAX_GPUS)] = 0
    #: Share of each GPU's memory the engine takes (vLLM's ``gpu_memory_utilization``; TRL's
    #: colocated default 0.3, vLLM's own 0.9 when it serves on GPUs of its own).
    generation_memory_fraction: Annotated[float | None, BeforeValidator(parse_number), Field(gt=0, lt=1)] = None
    #: GPUs per engine (vLLM tensor parallelism; TRL's ``vllm_tensor_parallel_size``, default 1).
    generation_tp: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=MAX_GPUS)] = 1

    @property
    def expert_tp(self) -> int:
        """The routed experts' tensor parallelism: ``etp`` where set, else tp."""
        return self.tp if self.etp is None else self.etp

    @property
    def engine_memory_fraction(self) -> float:
        """The engine's share of each GPU it runs on: as set, else TRL's colocated 0.3 or vLLM's 0.9
        on GPUs of its own."""
        if self.generation_memory_fraction is not None:
            return self.generation_memory_fraction
        return COLOCATED_ENGINE_FRACTION if self.generation_gpus == 0 else SERVED_ENGINE_FRACTION


class Recipe(StrictModel):
    """How the training stack runs the step where its version or implementation changes memory
    and time. The stack's defaults come from ``catalogs/stacks.yaml`` (``recipe:``,
    :class:`~planner.core.entries.StackRecipe`); a key the scenario sets wins."""

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
    grad_dtype: GradDtype = "param"  # fp32: FP32 main gradients (Megatron)
    optimizer_paged: bool = False  # bitsandbytes paged states (CUDA unified memory)
    # dtype of Adam's two moments: "default" (FP32 under mixed precision, the parameters' dtype
    # under pure 16-bit training) or "bf16" (Megatron-Core's precision-aware optimizer,
    # ``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``: 2 + 2
    # bytes per parameter beside the FP32 master)
    optimizer_moments: Literal["default", "bf16"] = "default"
    # how the optimizer steps: "foreach" (torch's multi-tensor default on CUDA: one
    # intermediate the size of all stepped tensors), "foreach_torch20" (torch 2.0's, which kept
    # two), "fused" (one kernel, no intermediates), "in_backward" (each parameter stepped as its
    # gradient is ready), "for_loop" (one tensor at a time: torch's default before 2.0, torch
    # 2.0 over FSDP1's FlatParameter, Composer's DecoupledAdamW, transformers' adamw_hf)
    optimizer_step: OptimizerStep = "foreach"
    # the stack keeps rotary cos/sin tables of max_position rows in every attention layer
    # (transformers before 4.41; memory/model_states.rope_cache_bytes)
    rope_cache_per_layer: bool = False
    # the training forward returns the model's KV cache (a transformers model whose config has
    # use_cache on, run by a script that leaves the cache on, without transformers' own gradient
    # checkpointing, which turns it off): the cached keys and values that are not tensors saved
    # for backward live until the loss is done, every one of them where a wrapper (FSDP's
    # apply_activation_checkpointing) checkpoints the layers (memory/activations.kv_cache_bytes).
    # Most fine-tuning scripts turn the cache off.
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
    # (torchtitan's ChunkedLossWrapper); "vocab_parallel": Megatron-Core's
    # vocab_parallel_cross_entropy (its default, cross_entropy_loss_fusion off): the logits
    # upcast to FP32, exponentiated in place and saved; the backward writes the gradient into
    # that FP32 tensor and casts it to the compute dtype; "compute_dtype": ``nn.CrossEntropyLoss``
    # on the compute-dtype logits of a loop with neither autocast nor an upcast (log-softmax in
    # 16 bits over the whole batch); "xentropy": flash-attn's cross-entropy kernel (llm-foundry's
    # fused_crossentropy): the compute-dtype logits kept, a compute-dtype gradient written
    loss: Loss = "standard"
    # the largest micro-batch is the run's first step (litgpt before 2024 put its longest sample
    # first): no earlier step's outputs are still held by the training loop at the peak
    peak_at_first_step: bool = False
    compile: bool = False  # torch.compile: fused norms and activations
    # "fused_rmsnorm": a fused RMSNorm kernel (torchtitan's Triton ``fused_rmsnorm``, Liger's)
    # keeps only its input and rsqrt: no FP32 copy, no normalised output; "liger": Liger-Kernel's
    # patches as a whole (``apply_liger_kernel_to_*`` defaults: RMSNorm, rotary, SwiGLU): its RMSNorm
    # as above, its rotary keeping no per-token tensor, its SwiGLU (``LigerSiLUMulFunction``)
    # keeping gate and up only and writing their gradients into them in backward;
    # "unsloth": Unsloth's hand-written LoRA autograd and Triton kernels for Llama-style layers
    # (unsloth/kernels/fast_lora.py, rms_layernorm.py, swiglu.py): LoRA_MLP keeps its input and
    # the gate and up outputs, recomputes the SwiGLU product in backward and writes the
    # gradients into those buffers; LoRA_QKV and LoRA_W keep their input only; RMSNorm keeps
    # its input and rsqrt; "transformer_engine": Megatron-Core's Transformer Engine layers
    # (LayerNormLinear, fused attention, Megatron's SwiGLU/bias-GELU functions): a norm fused
    # into the next linear keeps its input and rsigma; q, k and v are one linear (one LoRA
    # adapter on linear_qkv); the gated activation keeps only its input, the fc1 output; a linear
    # keeps its input only when its weight trains (TE ``backward_needs_input``); rotary embedding
    # is fused and keeps no per-token tensor. In time, fused_rmsnorm, liger and unsloth take the eager
    # ops' memory traffic their kernels replace (planner.perf.timing.KERNEL_FUSIONS);
    # transformer_engine is timed through its stack's ``fused_kernels``
    kernels: Kernels = "standard"
    #: What ``checkpointing: selective`` reruns in backward: ``op``, torchtitan's op-level policy
    #: (every second matmul's output and the attention kernel's saved, the rest rerun:
    #: ``_save_list`` and ``_custom_policy``), or ``core_attention``, Megatron's
    #: ``--recompute-granularity selective`` (``recompute_modules`` default ``core_attn``: the
    #: attention kernel rerun from its inputs, everything else kept). The ``megatron`` stack's is
    #: ``core_attention``.
    selective: Selective = "op"
    #: Transformer Engine's FP8 dot-product attention (Megatron ``fp8_dot_product_attention``,
    #: with ``NVTE_FP8_DPA_BWD=1``): q, k, v and the output are kept in FP8 for backward (one byte
    #: each), with two FP32 softmax statistics per head (M and ZInv) instead of one log-sum-exp.
    #: Source: TE v2.2 ``attention.py`` ``FusedAttnFunc`` save_for_backward and
    #: ``fused_attn_fp8.cu``. Needs FP8 linears (``workload.fp8``) and ``kernels:
    #: transformer_engine``.
    fp8_attention: bool = False
    #: Megatron's ``activation_func_fp8_input_store``: the gated activation keeps its input (the
    #: fc1 output, 2·ffn wide) as ``float8_e4m3fn`` (Megatron-Core ``fused_bias_swiglu.py``
    #: ``SwiGLUFunction``). With ``kernels: transformer_engine``.
    fp8_activation_store: bool = False
    #: The linear weights are stored in FP8 (Transformer Engine ``fp8_model_init``, NeMo and
    #: Megatron ``fp8_params``): one byte each, no 16-bit copy (FP32 main copies stay with the
    #: optimizer for the weights that train). Needs FP8 linears (``workload.fp8``) and
    #: ``kernels: transformer_engine``.
    fp8_params: bool = False
    #: With ``fp8_params``: whether each weight also keeps a transposed FP8 copy for the
    #: backward GEMM. Transformer Engine 2.x caches it on the weight on cards whose FP8 GEMM needs
    #: the TN layout (compute capability below 10: Hopper, Ada) and needs none from Blackwell
    #: (``non_tn_fp8_gemm_supported``); under Transformer Engine 1.x Megatron's
    #: ``disable_parameter_transpose_cache`` made it transient (TE 2.x keeps a primary FP8
    #: weight's copy whatever that setting).
    #: Unset: by the scenario's card where it names one (none on Blackwell), else kept (the upper
    #: bound a search across cards uses).
    fp8_transpose_cache: bool | None = None
    #: How a MoE layer runs its experts: ``grouped``, one grouped GEMM over every routed token
    #: (transformers 5's default ``experts_implementation``, Megatron-Core, torchtitan), or
    #: ``loop``, an eager loop (transformers 4, or 5 with ``experts_implementation="eager"``):
    #: one expert's tokens at a time, each output added into the result by ``index_add_``,
    #: which keeps it.
    moe_experts: Literal["grouped", "loop"] = "grouped"
    #: GRPO: the engine sleeps while the step trains (vLLM sleep mode: TRL
    #: ``vllm_enable_sleep_mode``, verl ``free_cache_engine``, ms-swift ``sleep_level``, NeMo RL
    #: colocated): its weights go to host memory, its KV cache is dropped, and both come back for
    #: the next generation.
    generation_sleep: bool = False
    #: GRPO: vLLM's sleep level. 2 (TRL 1.x's ``vllm_enable_sleep_mode``, verl) discards the
    #: engine's weights, which the next generation reloads from the trainer as it does every step
    #: anyway; 1 (NeMo RL's colocated worker) moves them to host memory and back over PCIe.
    sleep_level: Literal[1, 2] = 2
    #: GRPO: the trainer's weights and optimizer states go to host memory while the engine
    #: generates (verl ``param_offload``/``optimizer_offload``, ms-swift ``offload_model``/
    #: ``offload_optimizer``, NeMo RL's offload after the refit). With the engine asleep while the
    #: step trains, each phase then has the card to itself.
    rollout_offload: bool = False
    #: GRPO: each step runs the policy forward once more over its completions before training, to
    #: score them with the trainer's own numerics (verl's hybrid engine always recomputes the old
    #: log-probs; NeMo RL's previous log-probs); TRL at ``num_iterations`` 1 takes them from the
    #: training forward itself. Time only: a forward without gradients, 2N FLOPs per token.
    logprob_forward: bool = False
    #: GRPO with an engine on GPUs of its own: it generates the next step's completions while this
    #: step trains (one-step off-policy: NeMo RL's asynchronous GRPO, ``max_trajectory_age_steps``;
    #: verl's one-step-off recipe), so a step takes the longer of the two, plus the weights'
    #: transfer to the engine. Ignored for a colocated engine, which cannot overlap.
    async_generation: bool = False
    #: DPO/GRPO with full fine-tuning: the frozen reference model's weights are kept in host memory
    #: and moved in unit by unit for its forward (FSDP CPU offload of the reference: verl always
    #: does so). Its PCIe transfer each step (the 16-bit shard, under 0.1 s for a 7B model over 8
    #: GPUs) is not timed.
    reference_offload: bool = False
    # How its ZeRO/FSDP implementation and release shard, accumulate, check and free.
    unsharded_grad_accumulation: bool = False  # FSDP no_sync: full gradients between micro-batches
    full_state_dict: bool = False  # FSDP1: the whole unsharded 16-bit model on each GPU once
    #: FSDP1 with ``use_orig_params=True`` and units that hold frozen and trainable weights (a
    #: LoRA layer wrapped whole): each flat parameter's gradient covers the frozen weights too,
    #: "equivalent to not freezing those parameters" (PyTorch FSDP docs).
    fsdp_mixed_units: bool = False
    #: DeepSpeed's gradient reduce buckets with contiguous_gradients, in elements of the compute
    #: dtype (reduce_bucket_size, twice with overlap_comm): ZeRO-1/2 allocate them at each
    #: backward, ZeRO-3 once with its optimizer. 0: the Hugging Face Trainer's "auto", hidden²
    #: (what a plan's exported DeepSpeed config writes; DeepSpeed's own default is 5e8).
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
    #: With the optimizer offloaded (``offload: optimizer``) the gradients stay on the GPU:
    #: Megatron-Core's optimizer CPU offload copies them from its DDP gradient buffers to the host
    #: for the CPU step and the new parameters back (its cpu_offloading README), the buffers
    #: themselves living on the GPU through the step. False: they go to the host with the
    #: optimizer, as ZeRO-Offload and FSDP's CPU offload move them.
    offload_keeps_grads: bool = False
    #: Expert parallelism's all-to-alls overlapped with another micro-batch's compute:
    #: Megatron-Core's batch-level overlap (``--overlap-moe-expert-parallel-comm`` with
    #: ``--delay-wgrad-compute``, MCore 0.14; off by default), as Megatron-Bridge's performance
    #: presets enable it (``moe_a2a_overlap``). The time model hides the all-to-alls behind the
    #: micro-batch's compute up to ``COMM_OVERLAP_SHARE`` of it. Time only.
    ep_overlap: bool = False
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
    #: DeepSpeed ZeRO-3 running stock ``F.linear``: a model built outside ``deepspeed.zero.Init``
    #: (a script that loads it before its ``TrainingArguments``/``HfDeepSpeedConfig`` exists, so
    #: ``from_pretrained`` does not enter ``zero.Init``) under DeepSpeed before 0.19.4 (PR #8189
    #: installs the memory-efficient linear on such models too), or ``memory_efficient_linear:
    #: false``. Autograd saves a view of each gathered weight (``weight.t()``) for the input's
    #: gradient, and ZeRO-3's release (``param.data = torch.empty(0)``) does not free the storage
    #: that view holds: every layer's gathered 16-bit weights stay until its own backward
    #: (deepspeed/runtime/zero/linear.py says this is why its linear exists). Without
    #: checkpointing the whole stage's are alive at backward start.
    zero3_stock_linear: bool = False

    def loss_impl(self, algorithm: str) -> str:
        """The loss as it runs for the workload's ``algorithm``: a DPO step's "standard" loss is
        not a cross-entropy but the per-token log-probabilities of both sequences, row by row in
        the compute dtype (TRL's ``selective_log_softmax``): ``rowwise``; so is GRPO's, the
        completions' log-probabilities under the policy."""
        return "rowwise" if algorithm in ("dpo", "grpo") and self.loss == "standard" else self.loss


#: Recipe keys that scenarios once wrote under ``workload:`` or ``layout:``, by the model that
#: held them: a key still written there is reported with its place in ``recipe:``
#: (planner.core.errors), not as an unknown key.
MOVED_KEYS: dict[type, dict[str, str]] = {
    Workload: {k: f"recipe.{k}" for k in (
        "bnb_keeps_input", "int8_keeps_transposed", "kbit_prep", "grad_dtype", "optimizer_paged", "optimizer_moments",
        "optimizer_step", "rope_cache_per_layer", "keeps_kv_cache", "loss", "peak_at_first_step",
        "compile", "kernels", "moe_experts", "fp8_attention", "fp8_activation_store", "fp8_params",
        "fp8_transpose_cache")},
    Layout: {**{k: f"recipe.{k}" for k in (
        "unsharded_grad_accumulation", "full_state_dict", "fsdp_mixed_units", "zero_bucket_elements",
        "zero_overflow_check_bytes", "zero_offload_gpu_copy", "fsdp_version", "zero_impl", "selective",
        "offload_keeps_grads", "ep_overlap")},
        "zero3_impl": "recipe.zero_impl"},
}


#: vLLM's ``gpu_memory_utilization`` where the scenario does not set it: TRL's default when the
#: engine shares the training GPUs (GRPOConfig ``vllm_gpu_memory_utilization`` 0.3, TRL 1.16) and
#: vLLM's own default on GPUs of its own (``--gpu-memory-utilization`` 0.9).
COLOCATED_ENGINE_FRACTION = 0.3
SERVED_ENGINE_FRACTION = 0.9

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
    reserve: Annotated[float | None, BeforeValidator(parse_number), Field(ge=0, lt=1)] = None


class SearchSpace(StrictModel):
    """Candidate lists and limits for ``planner plan`` (None = the whole space)."""

    gpu_types: list[str] | None = None
    max_gpus: Annotated[int | None, BeforeValidator(parse_count), Field(ge=1, le=MAX_GPUS)] = None
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
    utilization: Annotated[float | None, BeforeValidator(parse_number), Field(gt=0, le=1)] = None


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
    recipe: Recipe = Recipe()
    overrides: Overrides = Overrides()
    search: SearchSpace = SearchSpace()
    constraints: Constraints = Constraints()
    objective: Objective | None = None  # default: cost with a token budget, else gpus
    top: Annotated[int, BeforeValidator(parse_count), Field(ge=1, le=1000)] = 10
    time_limit_s: PosFloat = 30.0
