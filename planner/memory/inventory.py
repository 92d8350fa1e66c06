"""What decides which tensors a layer saves, and the inventory they are counted in.

:class:`LayerRecipe` holds everything but the shapes (dtypes, attention kernel, what trains,
the libraries' quirks); :class:`Inventory` names each saved storage once, with its bytes, and
says which ones tensor parallelism splits. The element sizes (FP32 statistics, dropout masks,
FP8 and int8 copies) are the ones every part of the activation model uses; see
:mod:`planner.memory.activations` for the layer inventory and its symbols.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Bytes of a saved RMSNorm/LayerNorm statistic per token: rsqrt (RMSNorm) in FP32 = 4;
#: LayerNorm keeps mean and rstd in FP32 = 8 (``aten.native_layer_norm``).
FP32 = 4
#: A dropout mask on CUDA is a bool tensor (``aten.native_dropout``): 1 byte per element.
#: (On CPU it is a float tensor in the input dtype; the CPU harness passes that instead.)
CUDA_DROPOUT_MASK_BYTES = 1.0
#: Bytes per element of an FP8 (e4m3) tensor: Float8 linears save their input cast to FP8.
FP8_BYTES = 1
#: An int8 element (bitsandbytes LLM.int8 quantized activations).
INT8_ELEMENT_BYTES = 1


@dataclass(frozen=True)
class LayerRecipe:
    """What decides which tensors a layer saves (everything but the shapes)."""

    e: int  # bytes per element of activations (compute dtype)
    attention: str = "flash"  # eager | flash (any kernel that saves q, k, v, out and an FP32 lse)
    trainable_base: bool = True  # full fine-tuning: every weight needs its input saved
    lora_targets: frozenset[str] = frozenset()
    c: int = 2  # bytes per element of the LoRA adapters (PEFT's default: FP32 = 4)
    lora_rank: int = 0
    lora_dropout: bool = False
    mask_bytes: float = CUDA_DROPOUT_MASK_BYTES
    input_requires_grad: bool = True  # False for layer 0 of LoRA without checkpointing
    fused: bool = False  # torch.compile: fused norms and SwiGLU (pointwise results recomputed)
    fp8: bool = False  # Float8 linears: the saved linear inputs are FP8
    #: bitsandbytes' 4-bit matmul (``MatMul4Bit``) before 0.43.2 keeps its input for backward
    #: whenever that input needs a gradient, though the weight is frozen (``ctx.tensors = (A, B)``;
    #: bitsandbytes PR #1270, July 2024, dropped it): a QLoRA base then saves what full FT saves.
    frozen_saves_input: bool = False
    #: bitsandbytes' LLM.int8 matmul (``MatMul8bitLt``) keeps the layer's own input (its FP16
    #: cast is only for quantizing), so modules reading one tensor share it.
    int8: bool = False
    #: bitsandbytes before 0.45.0: each LLM.int8 matmul whose input needs a gradient also keeps
    #: ``CAt``, an int8 copy of that input (1 byte per element), on its context.
    int8_transposed: bool = False
    #: The forward runs under ``torch.autocast`` (AMP: HF Trainer/accelerate with bf16 or fp16):
    #: a LoRA module's saved input and lora_A output are autocast copies in the compute dtype,
    #: and the FP32 adapter weights' compute-dtype casts are saved too.
    autocast: bool = False
    #: PEFT's quantized-base LoRA layers (bitsandbytes, GPTQ) skip their FP32 input cast under
    #: CUDA autocast, so the adapters read (and save) the layer's own tensor.
    lora_shares_input: bool = False
    #: FP32 norm weights over a bitsandbytes base (PEFT's ``prepare_model_for_kbit_training``,
    #: TRL): a norm's output is FP32, the 4-bit base returns its input's dtype, so the MLP's
    #: intermediates and the residual stream are FP32 (attention runs on autocast's bf16 casts).
    fp32_stream: bool = False
    #: FP32 embeddings too (``prepare_model_for_kbit_training`` alone): RoPE tables in FP32, and
    #: the FP32 lm_head's autocast copy is saved for its input's gradient.
    fp32_embeddings: bool = False
    #: LoRA's frozen base kept in FP32 under autocast (``Workload.base_dtype``): the residual
    #: stream is FP32 (the layer input a checkpoint keeps, the residual's gradients), and each
    #: base linear whose input needs a gradient saves autocast's 16-bit cast of its weight.
    #: Comes with ``fp32_embeddings`` (FP32 RoPE tables, the lm_head's saved cast).
    fp32_base: bool = False
    #: Unsloth's LoRA kernels (``Recipe.kernels``) run the layer: see
    #: :func:`planner.memory.activations._unsloth_layer`.
    unsloth: bool = False
    #: A fused RMSNorm kernel (``Recipe.kernels`` fused_rmsnorm, liger): input and rsqrt only.
    fused_norm: bool = False
    #: A fused SwiGLU kernel (``Recipe.kernels`` liger: ``LigerSiLUMulFunction``): gate and up
    #: kept, no activation output; backward writes their gradients into them.
    fused_swiglu: bool = False
    #: Transformer Engine layers (``Recipe.kernels`` transformer_engine): norms fused into the
    #: next linear, q, k and v one linear, the gated activation keeping only its input.
    te: bool = False
    #: FP8 dot-product attention (``Recipe.fp8_attention``): q, k, v and the output kept in FP8.
    fp8_attention: bool = False
    #: The gated activation keeps its input in FP8 (``Recipe.fp8_activation_store``).
    fp8_activation_store: bool = False
    #: The attention kernel is rerun in backward from its checkpointed inputs (Megatron's
    #: selective recomputation of ``core_attn``): q, k and v kept instead of what it saves.
    attention_recomputed: bool = False
    #: Selective checkpointing is Megatron's core-attention recomputation (``Recipe.selective``),
    #: not the op-level policy.
    selective_core_attention: bool = False
    #: Bytes per element of the masked scores that eager attention's ``torch.max`` clamp keeps
    #: (``ModelSpec.eager_mask_clamp``): the scores' dtype promoted with the causal mask's, which
    #: is the embeddings' (FP32 for a prepared bitsandbytes base). 0: no clamp.
    clamp_bytes: int = 0
    #: MoE experts run one at a time (``Recipe.moe_experts`` loop): the combined outputs are
    #: kept, and an expert's backward holds only its own tokens' gradients.
    moe_loop: bool = False
    #: The whole step runs in one dtype (precision ``bf16`` or ``fp32``). Under a mixed recipe
    #: (autocast runs ``pow`` and ``softmax`` in FP32 on CUDA; DeepSpeed or FSDP cast the model
    #: instead) what a written-out GELU and GPT-2's softmax keep is not modelled: their default.
    one_dtype: bool = False


@dataclass
class Inventory:
    """Named saved storages of one layer, bytes; ``split`` ones are divided by TP."""

    split: dict[str, float] = field(default_factory=dict)
    whole: dict[str, float] = field(default_factory=dict)
    #: Storages kept on an autograd context outside ``save_for_backward`` (bitsandbytes'
    #: ``ctx.tensors``): backward does not release them; they live as long as the graph.
    on_context: set[str] = field(default_factory=set)

    def add(self, name: str, n_bytes: float, *, split: bool = True) -> None:
        (self.split if split else self.whole).setdefault(name, n_bytes)

    def total(self, tp: int = 1, sp: bool = False) -> float:
        """Bytes on one GPU: TP splits the head/FFN-wide tensors; SP also the h-wide ones."""
        whole = sum(self.whole.values())
        return sum(self.split.values()) / tp + (whole / tp if sp else whole)

    def on_context_total(self, tp: int = 1, sp: bool = False) -> float:
        """Bytes on one GPU of the storages in :attr:`on_context`."""
        split = sum(v for k, v in self.split.items() if k in self.on_context)
        whole = sum(v for k, v in self.whole.items() if k in self.on_context)
        return split / tp + (whole / tp if sp else whole)
