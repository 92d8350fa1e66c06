"""Activation memory of one training step, from the tensors each layer saves for backward.

Every figure is bytes on one GPU. The per-layer inventory follows, op by op, what eager PyTorch
kernels save in a Hugging Face Llama-style layer (RMSNorm, gated SiLU MLP, GQA, no dropout) or a
GPT-style one (LayerNorm, plain GELU MLP), as measured byte for byte on CPU (see
``tests/truth/``; the derivation is in the docstring of :func:`layer_saved`). Each storage is
counted once even when several ops save it (q/k/v share their input, gate/up theirs).

Symbols: b micro-batch, s sequence length per GPU (after context parallelism), h hidden, h_q =
heads·head_dim, h_kv = kv_heads·head_dim, f FFN width, a heads, e bytes of the compute dtype,
c bytes of the LoRA adapters, r LoRA rank, V vocabulary.

Here: a decoder layer's saved tensors (norms, linear inputs, MLP and MoE, Unsloth's kernels), what
selective and full checkpointing keep instead, the gradients alive during a layer's backward,
the tensors shared by every layer, a returned KV cache and what the head saves. Elsewhere: the
recipe and the inventory (:mod:`planner.memory.inventory`), the attention kernels
(:mod:`planner.memory.attention`), the logits and the loss (:mod:`planner.memory.logits`).
"""

from __future__ import annotations

from dataclasses import replace

from planner.core.arch import (
    _attention_dims,
    _dims,
    attention_module_shapes,
    lora_module_shapes,
    op_policy_matmuls,
)
from planner.core.entries import ModelSpec
from planner.core.memo import by_spec
from planner.memory.attention import (
    attention_is_eager,
    attention_kernel,
    eager_scores_backward_bytes,
    litgpt_attention,
    litgpt_qkv_lora,
)
from planner.memory.inventory import (
    FP8_BYTES,
    FP32,
    INT8_ELEMENT_BYTES,
    Inventory,
    LayerRecipe,
)

#: The MLP's adapter targets.
MLP_TARGETS = frozenset({"gate", "up", "down"})
#: Linears that fuse several adapter targets into one (one LoRA adapter for all of them): a fused
#: QKV projection, and Megatron's ``linear_fc1`` (gate and up) under Transformer Engine.
FUSED_MODULES = {"qkv": {"q", "k", "v"}, "fc1": {"gate", "up"}}


def _norm(inv: Inventory, name: str, rg: bool, weight_trainable: bool, h: int, rec: LayerRecipe,
          kind: str, tokens: int, model: ModelSpec | None = None, *, groups: int = 1,
          split: bool = False) -> None:
    """A norm's saved tensors: HF RMSNorm keeps an FP32 copy of its input (4h) and rsqrt (4),
    plus y (e·h) for its weight's gradient (FP32, 4h, where the weight scales in FP32: Gemma's
    ``ModelSpec.norm_fp32_scale``); LayerNorm keeps its input (e·h), mean and rstd (8); a fused
    (compiled) RMSNorm keeps its input and rsqrt (e·h + 4). ``groups`` norms of h/groups each per
    token (QK-norm: one per head, an rsqrt each), ``split`` under TP (head-wide).

    litgpt's RMSNorm: before Oct 24, 2023 (``norm_upcast`` False; litgpt PR #606 added the
    upcast) it computes in the input dtype and keeps its input and rsqrt (e·h + e), plus the
    normalised x (e·h) for a trainable weight; since then it upcasts like HF, but multiplies the
    weight with the FP32 normalised x, so a trainable weight keeps that FP32 tensor (4h)."""
    if not (rg or weight_trainable):
        return
    litgpt = model is not None and model.impl == "litgpt"
    fp32_y = litgpt or (model is not None and model.norm_fp32_scale)
    fused = rec.fused or rec.te or (rec.fused_norm and kind == "rmsnorm")
    if kind == "rmsnorm" and not fused and model is not None and not model.norm_upcast:
        inv.add(f"{name}.input", tokens * rec.e * h, split=split)
        inv.add(f"{name}.rstd", tokens * rec.e * groups, split=split)
        if weight_trainable:
            inv.add(f"{name}.y", tokens * rec.e * h, split=split)
        return
    if kind == "layernorm":
        inv.add(f"{name}.input", tokens * rec.e * h, split=split)
        inv.add(f"{name}.stats", tokens * 2 * FP32 * groups, split=split)
    elif fused:
        inv.add(f"{name}.input", tokens * rec.e * h, split=split)
        inv.add(f"{name}.rstd", tokens * FP32 * groups, split=split)
    else:
        inv.add(f"{name}.fp32_input", tokens * FP32 * h, split=split)
        inv.add(f"{name}.rstd", tokens * FP32 * groups, split=split)
        if weight_trainable:
            inv.add(f"{name}.y", tokens * (FP32 if fp32_y else rec.e) * h, split=split)


def _linear_inputs(inv: Inventory, x_name: str, x_width: int, modules: list[str], rec: LayerRecipe,
                   tokens: int, *, split_input: bool, x_rg: bool = True,
                   x_bytes: int | None = None, layernorm_linear: bool = False) -> None:
    """Inputs that linear layers save for their weight gradients.

    A trainable base weight saves its input (FP8 with Float8 linears). A LoRA module saves the
    input of lora_A: the tensor itself when c = e, else its own cast copy (``x.to(c)``) per
    module; with dropout the dropped copy replaces it, plus a mask per module when the input
    needs a gradient (``x_rg``; not in layer 0 of LoRA). lora_A's output
    (r wide, dtype c) is saved by lora_B. Under autocast the saved copies are in the compute
    dtype: PEFT first casts x (``x_bytes`` wide per element) to the adapter dtype, a copy unless
    they match (quantized-base layers skip it under CUDA autocast), then autocast casts to e.
    """
    x_bytes = rec.e if x_bytes is None else x_bytes
    if (rec.trainable_base or rec.frozen_saves_input and x_rg) and modules:
        if rec.fp8:
            inv.add(f"{x_name}.fp8", tokens * FP8_BYTES * x_width, split=split_input)
        elif rec.trainable_base or x_bytes == rec.e or rec.int8:
            inv.add(x_name, tokens * x_bytes * x_width, split=split_input)
            if not rec.trainable_base:
                inv.on_context.add(x_name)
        else:  # bitsandbytes casts an FP32 input to its compute dtype first: a copy per module
            for m in modules:
                inv.add(f"{m}.bnb_input", tokens * rec.e * x_width, split=split_input)
                inv.on_context.add(f"{m}.bnb_input")
    if rec.int8_transposed and x_rg and not rec.trainable_base:
        for m in modules:
            inv.add(f"{m}.int8_cat", tokens * INT8_ELEMENT_BYTES * x_width, split=split_input)
            inv.on_context.add(f"{m}.int8_cat")
    copy = rec.e if rec.autocast else rec.c  # dtype of what an adapter saves
    # The tensor lora_A reads: x, cast to the adapter dtype, then by autocast to e.
    pre = x_bytes if (rec.autocast and rec.lora_shares_input) else rec.c
    saved = rec.e if rec.autocast else pre
    adapted = [m for m in modules if m in rec.lora_targets or rec.lora_targets & FUSED_MODULES.get(m, set())]
    if layernorm_linear and not rec.trainable_base and adapted:
        # Transformer Engine 2.x's LayerNormLinear asked for its norm output (NeMo's adapters
        # read it: ``return_layernorm_output``) saves that output though its weight is frozen
        # (layernorm_linear.py: the ``ln_out = None`` clearing is skipped), FP8 under FP8 linears
        if rec.fp8:
            inv.add(f"{x_name}.fp8", tokens * FP8_BYTES * x_width, split=split_input)
        else:
            inv.add(x_name, tokens * x_bytes * x_width, split=split_input)
    for m in modules:
        if m not in adapted:
            continue
        if rec.lora_dropout:
            if x_rg:
                inv.add(f"{m}.lora_dropout_mask", tokens * rec.mask_bytes * x_width, split=split_input)
            inv.add(f"{m}.lora_dropped", tokens * copy * x_width, split=split_input)
        elif pre == x_bytes and saved == x_bytes:  # no cast: the layer's own tensor
            inv.add(x_name, tokens * x_bytes * x_width, split=split_input)
        else:  # its own cast (FP32 adapters or an FP32 input), per module
            inv.add(f"{m}.lora_cast", tokens * saved * x_width, split=split_input)
        inv.add(f"{m}.lora_a_out", tokens * copy * rec.lora_rank, split=True)


def _mlp(inv: Inventory, model: ModelSpec, f: int, rg_in: bool, rec: LayerRecipe, tokens: int,
         prefix: str = "mlp") -> bool:
    """Gated: gate·up products keep gate, up, act(gate) and the product (4e·f); fused keeps
    gate and up only. Plain: fc output and act output (2e·f; ReLU keeps its output, which is the
    act output: e·f). Returns: output requires grad."""
    t = rec.lora_targets
    e = FP32 if rec.fp32_stream else rec.e  # the base returns its (FP32) input's dtype
    trainable = rec.trainable_base
    if model.gated_mlp:
        # Megatron's dense MLP: one LayerNormLinear (fc1) reads the norm's output
        layernorm_linear = rec.te and prefix == "mlp"
        norm_out = "norm2.out" if model.norms_per_layer >= 2 else "norm1.out"
        _linear_inputs(inv, norm_out if layernorm_linear else f"{prefix}.input", model.hidden,
                       ["fc1"] if layernorm_linear else ["gate", "up"], rec, tokens, split_input=False,
                       x_bytes=e, layernorm_linear=layernorm_linear)
        gate_rg = rg_in or trainable or "gate" in t
        up_rg = rg_in or trainable or "up" in t
        if rec.te:  # Megatron's SwiGLUFunction keeps its input, the fc1 output (gate and up)
            if gate_rg or up_rg:
                act_b = FP8_BYTES if rec.fp8_activation_store else e
                inv.add(f"{prefix}.fc1_out", tokens * act_b * 2 * f)
        elif gate_rg:
            inv.add(f"{prefix}.gate_out", tokens * e * f)  # saved by act
        if rec.te:
            pass
        elif rec.fused or rec.fused_swiglu:
            if gate_rg or up_rg:
                inv.add(f"{prefix}.gate_out", tokens * e * f)
                inv.add(f"{prefix}.up_out", tokens * e * f)
        else:
            if gate_rg:
                inv.add(f"{prefix}.up_out", tokens * e * f)  # mul saves up for d(act)
            if up_rg:
                inv.add(f"{prefix}.act_out", tokens * e * f)  # mul saves act for d(up)
        prod_rg = gate_rg or up_rg
        if rec.fused and not rec.te and trainable and not rec.fp8:
            pass  # the product is recomputed from gate and up for down's weight gradient
        else:
            _linear_inputs(inv, f"{prefix}.product", f, ["down"], rec, tokens, split_input=True,
                           x_bytes=e)
        return prod_rg or trainable or "down" in t
    _linear_inputs(inv, f"{prefix}.input", model.hidden, ["up"], rec, tokens, split_input=False,
                   x_bytes=e)
    fc_rg = rg_in or trainable or "up" in t
    if fc_rg:
        if model.activation_keeps_output:  # ReLU keeps its output: the down projection's input
            inv.add(f"{prefix}.act_out", tokens * e * f)
        else:
            inv.add(f"{prefix}.fc_out", tokens * e * f)  # saved by GELU
        if not (rec.fused or rec.te) and model.impl == "hf" and rec.one_dtype:
            for i in range(model.activation_saved_copies):
                inv.add(f"{prefix}.act_part{i}", tokens * e * f)
    _linear_inputs(inv, f"{prefix}.act_out", f, ["down"], rec, tokens, split_input=True,
                   x_bytes=e)
    return fc_rg or trainable or "down" in t


@by_spec
def layer_saved(model: ModelSpec, rec: LayerRecipe, b: int, s: int) -> Inventory:
    """Storages one decoder layer saves for backward (no checkpointing).

    HF Llama, full fine-tuning, flash/SDPA, per token: 2 norms × (4h + 4 + e·h y + e·h output)
    + q, k, v after RoPE (e·h_q + 2e·h_kv) + attention output (e·h_q) + FP32 lse (4a) + MLP 4e·f
    = 8h + 8 + 4e·h + 2e·h_q + 2e·h_kv + 4e·f + 4a. Eager attention instead saves a contiguous q,
    K and V repeated to all a heads (GQA saves nothing there), the FP32 softmax (4·a·s per
    token), its e-byte copy when e ≠ 4, and the output: 4e·h_q + a·s·(4 + e·[e≠4]).
    A frozen base (LoRA) saves only what gradients flowing to earlier adapters need. Sources:
    ``../shared/design/cpu-ground-truth.md`` §4–5, re-measured by ``tests/truth``; Korthikanti
    et al. 2022 for the GPT layer's structure. Excludes: dropout other than LoRA's (none in
    these models), the causal mask and RoPE tables (shared by all layers: :func:`shared_saved`).
    """
    inv = Inventory()
    tokens = b * s
    if unsloth_runs(model, rec):
        _unsloth_layer(inv, model, rec, tokens)
        return inv
    h1_rg = _attention_block(inv, model, rec, tokens, s)
    _mlp_block(inv, model, rec, tokens, h1_rg)
    if rec.autocast and rec.c != rec.e:
        _autocast_weight_casts(inv, model, rec)
    if rec.fp32_base and rec.autocast:
        _base_weight_casts(inv, model, rec, h1_rg)
    return inv


def unsloth_runs(model: ModelSpec, rec: LayerRecipe) -> bool:
    """Unsloth's kernels replace the layer: a LoRA run of a Llama-style decoder (two RMSNorms,
    gated MLP, no experts) with flash/SDPA attention and no LoRA dropout (Unsloth patches its
    fast LoRA path only then: ``patch_peft_model`` in unsloth/models/llama.py)."""
    return (rec.unsloth and not rec.trainable_base and model.gated_mlp and model.moe is None
            and model.norm == "rmsnorm" and model.norms_per_layer == 2 and model.impl != "litgpt"
            and not rec.lora_dropout and not attention_is_eager(model, rec))


def _unsloth_layer(inv: Inventory, model: ModelSpec, rec: LayerRecipe, tokens: int) -> None:
    """What a decoder layer keeps under Unsloth's kernels (unsloth/kernels at d9ed4bef, 2024-12):
    each RMSNorm its input and rsqrt (``Fast_RMS_Layernorm``); ``LoRA_QKV`` and ``LoRA_W`` their
    input X only (lora_A's output is recomputed from X in backward, the adapters are cast to
    the input's dtype on the fly); the attention kernel q, k, v, its output and FP32 lse;
    ``LoRA_MLP`` X, the gate output e and the up output g (``save_for_backward(..., X, e, g)``),
    the SwiGLU product being recomputed in backward. Checkpointing is assumed (Unsloth's own,
    which re-enters the layer with its input requiring a gradient)."""
    h, e = model.hidden, rec.e
    _norm(inv, "norm1", True, False, h, replace(rec, fused=True), "rmsnorm", tokens, model)
    inv.add("norm1.out", tokens * e * h, split=False)
    attention_kernel(inv, model, rec, tokens, 0, eager=False)
    _norm(inv, "norm2", True, False, h, replace(rec, fused=True), "rmsnorm", tokens, model)
    inv.add("norm2.out", tokens * e * h, split=False)
    (ffn,) = _dims(model, "ffn")
    inv.add("mlp.gate_out", tokens * e * ffn)
    inv.add("mlp.up_out", tokens * e * ffn)


def _attention_block(inv: Inventory, model: ModelSpec, rec: LayerRecipe, tokens: int,
                     s: int) -> bool:
    """The attention block's saved tensors (see :func:`layer_saved`): norm1, the inputs of q, k,
    v and o and what the attention kernel keeps. Returns: the block's output requires grad."""
    h, e = model.hidden, rec.e
    a, kv, d = _attention_dims(model)
    h_q = a * d
    t = rec.lora_targets
    rg_in = rec.input_requires_grad
    _norm(inv, "norm1", rg_in, rec.trainable_base, h, rec, model.norm, tokens, model)
    out1_rg = rg_in or rec.trainable_base
    fused_qkv = model.fused_qkv or rec.te  # Megatron's linear_qkv: one linear, one adapter
    qkv = ["qkv"] if fused_qkv else ["q", "k", "v"]
    _linear_inputs(inv, "norm1.out", h, qkv, rec, tokens, split_input=False, x_rg=out1_rg,
                   x_bytes=FP32 if rec.fp32_stream else e, layernorm_linear=rec.te)
    qkv_rg = out1_rg or bool(t & {"q", "k", "v"})
    if model.qk_norm and not model.fused_qkv:  # (TE: TENorm over each head of q and k)
        # RMSNorm over each head of q and of k (Qwen3, Gemma 3) before RoPE: what any norm
        # keeps, per head, for the projections' outputs that need a gradient (OLMo 2 normalises
        # the whole projection: one rsqrt per token, counted here per head).
        for m, n_heads in (("q", a), ("k", kv)):
            _norm(inv, f"{m}_norm", out1_rg or m in t, rec.trainable_base, n_heads * d, rec,
                  "rmsnorm", tokens, model, groups=n_heads, split=True)
    if model.impl == "litgpt" and model.fused_qkv:
        litgpt_qkv_lora(inv, model, rec, tokens)
    eager = attention_is_eager(model, rec)
    if qkv_rg and model.impl == "litgpt" and not eager:
        litgpt_attention(inv, model, rec, tokens, s)
    elif qkv_rg and rec.attention_recomputed:
        # Megatron's selective recomputation (core attention): the checkpoint keeps the
        # kernel's inputs, q, k and v in the compute dtype, and reruns it in backward
        inv.add("attn.q", tokens * e * h_q)
        inv.add("attn.k", tokens * e * kv * d)
        inv.add("attn.v", tokens * e * kv * d)
    elif qkv_rg:
        attention_kernel(inv, model, rec, tokens, s, eager=eager)
    name_o = "attn.out" if not eager else "attn.out_contiguous"  # (FP8 attention: "attn.out_fp8")
    _linear_inputs(inv, name_o, h_q, ["o"], rec, tokens, split_input=True)
    return rg_in or qkv_rg or rec.trainable_base or "o" in t


def _mlp_block(inv: Inventory, model: ModelSpec, rec: LayerRecipe, tokens: int,
               h1_rg: bool) -> None:
    """The MLP block's saved tensors: its norms, then the dense MLP or the MoE layer. ``h1_rg``:
    the attention block's output requires grad."""
    h, norm = model.hidden, model.norm
    # --- MLP block (with one norm per layer, a parallel block: the MLP reads norm1's output)
    if model.norms_per_layer >= 2:
        _norm(inv, "norm2", h1_rg, rec.trainable_base, h, rec, norm, tokens, model)
    if model.norms_per_layer > 2:  # Gemma 2: post-attention and post-MLP norms
        _norm(inv, "norm3", h1_rg, rec.trainable_base, h, rec, norm, tokens, model)
        _norm(inv, "norm4", h1_rg, rec.trainable_base, h, rec, norm, tokens, model)
    mlp_rg_in = h1_rg or rec.trainable_base
    moe = model.moe
    if moe is None:
        (ffn,) = _dims(model, "ffn")
        _mlp(inv, model, ffn, mlp_rg_in, rec, tokens)
    else:
        _moe(inv, model, mlp_rg_in, rec, tokens)


def _autocast_weight_casts(inv: Inventory, model: ModelSpec, rec: LayerRecipe) -> None:
    """Under autocast each FP32 adapter weight is cast to the compute dtype, and F.linear saves
    that copy for its input's gradient: r·d_out·e for lora_B, r·d_in·e for lora_A when the
    module's input needs a gradient (not q, k, v in layer 0 of LoRA); no token factor. With
    ``fused_qkv`` q, k and v are one adapted linear (as :func:`planner.core.arch.lora_adapters`).
    A MoE layer's MLP adapters are every expert's that runs (all of them, as
    :func:`_base_weight_casts` counts) and the shared experts'; none on experts stored as fused
    parameters."""
    moe = model.moe
    shapes = attention_module_shapes(model) if moe is not None else lora_module_shapes(model)
    if moe is not None:  # per MLP module: r·(h + f) for each expert that runs and the shared MLP
        routed = moe.experts * (model.hidden + moe.expert_ffn) if moe.linear_experts else 0
        shared = model.hidden + moe.shared_width if moe.shared_width else 0
        for m in (MLP_TARGETS & rec.lora_targets) - ({"gate"} if not model.gated_mlp else set()):
            inv.add(f"{m}.lora_weight_casts", rec.lora_rank * (routed + shared) * rec.e)
    adapted = [m for m in shapes if m in rec.lora_targets]
    qkv = [m for m in adapted if m in ("q", "k", "v")]
    groups = [[m] for m in adapted if m not in qkv]
    groups += [qkv] if model.fused_qkv and qkv else [[m] for m in qkv]
    qkv_input_rg = rec.input_requires_grad or rec.trainable_base
    for group in groups:
        d_in = shapes[group[0]][0] if group[0] not in qkv or qkv_input_rg else 0
        d_out = sum(shapes[m][1] for m in group)
        inv.add(f"{group[0]}.lora_weight_casts", rec.lora_rank * (d_in + d_out) * rec.e)


def _base_weight_casts(inv: Inventory, model: ModelSpec, rec: LayerRecipe, h1_rg: bool) -> None:
    """An FP32 frozen base under autocast (``LayerRecipe.fp32_base``): autocast caches casts of
    trainable leaves only, so each frozen weight is cast to the compute dtype at every use and
    F.linear saves the copy for its input's gradient: d_in·d_out·e per linear whose input needs
    a gradient (q, k and v not in layer 0 of LoRA; o once attention's inputs need one; the MLP's
    once the residual does). A MoE layer casts every expert that runs (all of them, at any
    real batch). Measured on the CPU (``tests/truth``): exactly these bytes beyond a 16-bit base."""
    shapes = lora_module_shapes(model)
    t = rec.lora_targets
    qkv_rg = rec.input_requires_grad
    o_rg = qkv_rg or bool(t & {"q", "k", "v"})
    mlp_in = [m for m in ("gate", "up") if m in shapes]
    down_rg = h1_rg or bool(t & set(mlp_in))
    rg = {"q": qkv_rg, "k": qkv_rg, "v": qkv_rg, "o": o_rg, "down": down_rg}
    rg.update({m: h1_rg for m in mlp_in})
    attention = sum(d_in * d_out for m, (d_in, d_out) in shapes.items()
                    if m in ("q", "k", "v", "o") and rg[m])
    inv.add("base.attention_weight_casts", attention * rec.e)
    moe = model.moe
    mlp_modules = [m for m in shapes if m not in ("q", "k", "v", "o") and rg[m]]
    if moe is None:
        mlp = sum(shapes[m][0] * shapes[m][1] for m in mlp_modules)
    else:  # every routed expert and the shared ones, (d_in·d_out per module scaled to their width)
        width = moe.expert_ffn * moe.experts + moe.shared_width
        mlp = len(mlp_modules) * model.hidden * width
    inv.add("base.mlp_weight_casts", mlp * rec.e)


def _moe(inv: Inventory, model: ModelSpec, rg_in: bool, rec: LayerRecipe, tokens: int) -> None:
    """A MoE layer: each token goes through ``active`` experts plus the shared experts. The
    router keeps FP32 probabilities (4·E per token) and, with a trainable router, its input (the
    norm's output, e·h); each routed token's copy is the experts' input (their MLP's), and each
    expert output is kept by the multiply with its routing weight (e·h per routed token); in
    transformers' expert loop ``index_add_`` keeps the weighted output too (e·h per routed token).
    Routing imbalance is not modelled: the mean load is assumed."""
    moe = model.moe
    assert moe is not None  # called for a MoE model only (:func:`_mlp_block`)
    routed = tokens * moe.active
    inv.add("moe.router_logits", tokens * FP32 * moe.experts)
    if rec.trainable_base:
        inv.add("moe.router_input", tokens * rec.e * model.hidden, split=False)
    inv.add("moe.expert_out", routed * rec.e * model.hidden)
    if rec.moe_loop:
        inv.add("moe.combined", routed * rec.e * model.hidden)
    sub = Inventory()
    # experts stored as fused parameters carry no adapters (``MoESpec.linear_experts``)
    expert_rec = rec if moe.linear_experts else replace(rec, lora_targets=rec.lora_targets - MLP_TARGETS)
    _mlp(sub, model, moe.expert_ffn, rg_in, expert_rec, routed, prefix="experts")
    if moe.shared_width:
        _mlp(sub, model, moe.shared_width, rg_in, rec, tokens, prefix="shared")
    for k, v in sub.split.items():
        inv.add(k, v)
    for k, v in sub.whole.items():
        inv.add(k, v, split=False)


@by_spec
def backward_temporaries(model: ModelSpec, rec: LayerRecipe, b: int, s: int) -> Inventory:
    """Gradients that exist, beside the saved tensors, while one layer runs backward: those of the
    MLP's intermediates (gate, up and their product: 3·e·f; plain MLP: 2·e·f) and of the layer's
    input and output (2·e·h) per token. Not visible in a saved-tensor count; derived from the
    order in which autograd frees them (each is released once consumed)."""
    inv = Inventory()
    tokens, e = b * s, FP32 if rec.fp32_stream else rec.e
    f = _dims(model, "ffn")[0] if model.moe is None else _moe_backward_ffn(model, rec)
    # Unsloth's LoRA_MLP backward makes one f-wide gradient (dY·W_downᵀ) and writes the SwiGLU
    # product and the gate and up gradients into it and the saved e and g (``swiglu.py``); Liger's
    # SwiGLU writes the gate and up gradients into the saved gate and up.
    in_place = unsloth_runs(model, rec) or (rec.fused_swiglu and model.gated_mlp)
    mlp_grads = 1 if in_place else (3 if model.gated_mlp else 2)
    inv.add("grad.mlp", tokens * e * f * mlp_grads)
    inv.add("grad.residual", tokens * _stream_bytes(rec) * 2 * model.hidden, split=False)
    if attention_is_eager(model, rec):
        # The attention's backward runs after the MLP's, whose saved tensors and gradients are
        # freed by then: the scores' gradients cost only what exceeds them.
        mlp_saved = _mlp_block_split_saved(model, rec, b, s)
        inv.add("grad.attention_scores",
                max(0.0, eager_scores_backward_bytes(model, rec, b, s) - mlp_saved
                    - inv.split["grad.mlp"]))
    return inv


def _moe_backward_ffn(model: ModelSpec, rec: LayerRecipe) -> float:
    """FFN width per token whose intermediates' gradients a MoE layer's backward holds at once:
    every routed token's (``active`` experts each) in a grouped GEMM; in transformers' expert
    loop one expert's tokens at a time (``active / experts`` of them at the mean load), or the
    shared experts', run on every token, whichever is wider."""
    moe = model.moe
    assert moe is not None  # called for a MoE model only (:func:`backward_temporaries`)
    if not rec.moe_loop:
        return moe.expert_ffn * moe.active
    return max(moe.expert_ffn * moe.active / moe.experts, moe.shared_width)


def _mlp_block_split_saved(model: ModelSpec, rec: LayerRecipe, b: int, s: int) -> float:
    """Bytes of the head- or FFN-wide tensors a layer saves outside its attention block (the MLP
    block's, freed before the attention's backward runs); the h-wide ones are left in."""
    attention = Inventory()
    _attention_block(attention, model, rec, b * s, s)
    return sum(v for k, v in layer_saved(model, rec, b, s).split.items() if k not in attention.split)


@by_spec
def selective_saved(model: ModelSpec, rec: LayerRecipe, b: int, s: int) -> Inventory:
    """Op-level selective checkpointing (torchtitan's ``selective_ac_option: op``, the common
    PyTorch policy): keep the layer input, the attention kernel's outputs (out + FP32 lse) and
    every other matmul output in forward order (Llama: q, v, gate, down); recompute the rest.
    Source: torchtitan ``_save_list`` / ``_custom_policy`` ("save all compute-intensive ops
    except every second mm"). With eager attention nothing s²-sized is kept (Korthikanti's
    selective recomputation).

    Megatron's ``--recompute-granularity selective`` (``Recipe.selective`` core_attention;
    ``recompute_modules`` default ``core_attn``): the layer keeps everything but the attention
    kernel's own tensors, whose inputs q, k and v the checkpoint keeps instead."""
    if rec.selective_core_attention:
        return layer_saved(model, replace(rec, attention_recomputed=True), b, s)
    inv = Inventory()
    tokens, e = b * s, rec.e
    h, (a, _, d) = model.hidden, _attention_dims(model)
    h_q = a * d
    inv.add("layer_input", tokens * _stream_bytes(rec) * h, split=False)
    for name, _, width in op_policy_matmuls(model, moe_layer=model.moe is not None)[::2]:
        inv.add(f"mm.{name}", tokens * e * width, split=name not in ("o", "down"))
    inv.add("attn.out", tokens * e * h_q)
    if not attention_is_eager(model, rec):
        inv.add("attn.lse", tokens * FP32 * a)
    return inv


@by_spec
def checkpoint_saved(model: ModelSpec, rec: LayerRecipe, b: int, s: int) -> Inventory:
    """Full checkpointing (HF ``gradient_checkpointing``, non-reentrant): only the layer input,
    e·b·s·h, is kept per layer."""
    inv = Inventory()
    inv.add("layer_input", b * s * _stream_bytes(rec) * model.hidden, split=False)
    return inv


def _stream_bytes(rec: LayerRecipe) -> int:
    """Bytes per element of the residual stream: FP32 over FP32 norms of a bitsandbytes base
    (``fp32_stream``) or an FP32 LoRA base (``fp32_base``: the embeddings are FP32, and the
    residual additions promote the 16-bit outputs to FP32), else the compute dtype."""
    return FP32 if rec.fp32_stream or rec.fp32_base else rec.e


@by_spec
def shared_saved(model: ModelSpec, rec: LayerRecipe, b: int, s: int) -> float:
    """Tensors made once per forward and saved by every layer: the RoPE cos/sin tables
    (2·s·d·e, no batch dimension)."""
    e = FP32 if rec.fp32_embeddings else rec.e  # made in the embeddings' dtype
    return 2 * s * _attention_dims(model)[2] * e if model.position == "rope" else 0.0


@by_spec
def kv_cache_bytes(model: ModelSpec, rec: LayerRecipe, b: int, s: int, *,
                   checkpointed: bool = False) -> Inventory:
    """The keys and values one layer puts in the KV cache a training forward returns
    (``Recipe.keeps_kv_cache``), where they are not the tensors saved for backward: with FP32
    norms over a bitsandbytes base (``fp32_stream``) K and V come out of the projections in FP32
    and attention saves autocast's 16-bit copies, and eager attention with grouped KV heads saves
    K and V repeated to every head, so the cache holds its own (4 or e bytes, 2·h_kv per token).
    A fused QKV projection's V is a view that keeps the whole projection output (h_q + 2·h_kv).
    Otherwise the cache holds the saved K and V themselves: nothing more. A ``checkpointed`` layer
    (wrapped by a checkpoint that transformers' own flag did not set, which would have turned the
    cache off: FSDP's ``apply_activation_checkpointing``) saves nothing inside it, so the cache
    holds every K and V of its own. Measured on the CPU (``tests/truth``)."""
    inv = Inventory()
    if model.impl != "hf":
        return inv
    a, kv, d = _attention_dims(model)
    grouped_eager = attention_is_eager(model, rec) and kv < a
    if not (rec.fp32_stream or grouped_eager or checkpointed):
        return inv
    tokens = b * s
    h_q, h_kv = a * d, kv * d
    n = FP32 if rec.fp32_stream else rec.e
    inv.add("cache.k", tokens * n * h_kv)
    inv.add("cache.v", tokens * n * (h_q + 2 * h_kv if model.fused_qkv else h_kv))
    return inv


@by_spec
def head_saved(model: ModelSpec, rec: LayerRecipe, b: int, s: int, *, lm_head_trainable: bool,
               embedding_trainable: bool) -> float:
    """Outside the layers, saved for backward (loss excluded, see
    :func:`planner.memory.logits.loss_bytes`): the final norm (as any norm), lm_head's input (e·h)
    when lm_head is trained, the shifted labels (int64, 8 per token) and the input ids when the
    embedding is trained (8 per token)."""
    inv = Inventory()
    tokens = b * s
    _norm(inv, "final_norm", True, rec.trainable_base, model.hidden, rec, model.norm, tokens, model)
    if lm_head_trainable:
        inv.add("lm_head.input", tokens * rec.e * model.hidden, split=False)
    if rec.fp32_embeddings and rec.autocast:  # the FP32 lm_head's bf16 copy (input gradient)
        (vocab,) = _dims(model, "vocab")
        inv.add("lm_head.weight_cast", vocab * model.hidden * rec.e)
    n = inv.total() + 8 * tokens
    if embedding_trainable:
        n += 8 * tokens
    return n
