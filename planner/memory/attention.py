"""What attention itself keeps for backward, and what it adds to a step beside the layer.

The kernels' saved tensors: Hugging Face eager attention (q, K and V repeated to every head, the
FP32 softmax and its compute-dtype copy, a soft-cap's tanh, the masked scores of a ``torch.max``
clamp), flash/SDPA (q, k, v, the output and an FP32 log-sum-exp), litgpt's attention and its
fused-QKV LoRA padding; which kernel runs (:func:`attention_is_eager`); the eager scores' backward
beyond the saved tensors, and eager attention's causal mask. Symbols as in
:mod:`planner.memory.activations`.
"""

from __future__ import annotations

from planner.core.arch import _attention_dims, _dims
from planner.core.entries import ModelSpec
from planner.memory.inventory import FP8_BYTES, FP32, Inventory, LayerRecipe


def attention_is_eager(model: ModelSpec, rec: LayerRecipe) -> bool:
    """Eager attention: asked for, or forced where litgpt soft-caps the scores ("with
    softcapping we cannot use SDPA": litgpt ``model.py`` builds the scores, tanh, mask and an FP32
    softmax itself). Hugging Face runs soft-capped attention in FlashAttention-2 (``softcap``)."""
    return rec.attention == "eager" or (model.impl == "litgpt" and model.attention_softcap)


def softmax_in_fp32(model: ModelSpec, rec: LayerRecipe) -> bool:
    """Eager attention's softmax runs in FP32 (cast back after): everywhere but transformers'
    GPT-2 code in a one-dtype step (``ModelSpec.softmax_fp32``)."""
    return model.softmax_fp32 or model.impl != "hf" or not rec.one_dtype


def attention_kernel(inv: Inventory, model: ModelSpec, rec: LayerRecipe, tokens: int, s: int,
                     *, eager: bool) -> None:
    """What Hugging Face attention keeps: eager, a contiguous q, K and V repeated to all heads,
    the FP32 softmax and its e-byte copy when e ≠ 4 (and a soft-cap's tanh output, or the masked
    scores a ``torch.max`` clamp keeps: :attr:`LayerRecipe.clamp_bytes`); flash/SDPA,
    q, k, v after RoPE, the output and the FP32 log-sum-exp (see
    :func:`planner.memory.activations.layer_saved`)."""
    e = rec.e
    a, kv, d = _attention_dims(model)
    h_q, h_kv = a * d, kv * d
    if eager:
        inv.add("attn.q", tokens * e * h_q)
        inv.add("attn.k_repeated", tokens * e * h_q)
        inv.add("attn.v_repeated", tokens * e * h_q)
        if model.attention_softcap:  # tanh(scores / cap) keeps its output
            inv.add("attn.softcap_tanh", tokens * e * a * s)
        if rec.clamp_bytes:  # torch.max(scores + mask, finfo.min) keeps both its inputs
            inv.add("attn.clamped_scores", tokens * rec.clamp_bytes * a * s)
            inv.add("attn.clamp_floor", FP32, split=False)  # the 0-d FP32 finfo.min tensor
        if softmax_in_fp32(model, rec):
            inv.add("attn.softmax_fp32", tokens * FP32 * a * s)
            if e != FP32:
                inv.add("attn.softmax_copy", tokens * e * a * s)
        else:  # the softmax in the compute dtype keeps its output, which the value matmul reads
            inv.add("attn.softmax", tokens * e * a * s)
    elif rec.fp8_attention:  # FP8 q, k, v and output; M and ZInv in FP32 per head
        inv.add("attn.q_fp8", tokens * FP8_BYTES * h_q)
        inv.add("attn.k_fp8", tokens * FP8_BYTES * h_kv)
        inv.add("attn.v_fp8", tokens * FP8_BYTES * h_kv)
        inv.add("attn.out_fp8", tokens * FP8_BYTES * h_q)
        inv.add("attn.softmax_stats", tokens * 2 * FP32 * a)
    else:
        inv.add("attn.q", tokens * e * h_q)
        inv.add("attn.k", tokens * e * h_kv)
        inv.add("attn.v", tokens * e * h_kv)
        inv.add("attn.out", tokens * e * h_q)
        inv.add("attn.lse", tokens * FP32 * a)


def litgpt_attention(inv: Inventory, model: ModelSpec, rec: LayerRecipe, tokens: int,
                     s: int) -> None:
    """What SDPA keeps in litgpt's ``CausalSelfAttention``: q and k after RoPE (new tensors);
    with grouped or multi-query attention k and v are expanded and reshaped to all heads
    (copies: e·h_q each); with as many KV heads as heads, v is a view of the fused QKV output,
    so SDPA's saved v keeps that whole output alive (e·(h_q + 2·h_kv)). Plus the output and the
    FP32 log-sum-exp. Source: litgpt ``model.py`` (``qkv.split`` / ``expand`` / ``reshape``)."""
    e, (a, kv, d) = rec.e, _attention_dims(model)
    h_q, h_kv = a * d, kv * d
    if model.mqa_sdpa_math and kv == 1:
        # SDPA's math path (``_scaled_dot_product_attention_math``): the scaled q, K and V
        # broadcast to every head by ``matmul`` (copies ``bmm`` saves) and the softmax output.
        inv.add("attn.q_scaled", tokens * e * h_q)
        inv.add("attn.k_broadcast", tokens * e * h_q)
        inv.add("attn.v_broadcast", tokens * e * h_q)
        inv.add("attn.probs", tokens * e * a * s)
        return
    inv.add("attn.q", tokens * e * h_q)
    if kv == a:
        inv.add("attn.k", tokens * e * h_kv)
        inv.add("attn.qkv_out", tokens * e * (h_q + 2 * h_kv))
    else:
        inv.add("attn.k_expanded", tokens * e * h_q)
        inv.add("attn.v_expanded", tokens * e * h_q)
    inv.add("attn.out", tokens * e * h_q)
    inv.add("attn.lse", tokens * FP32 * a)


def litgpt_qkv_lora(inv: Inventory, model: ModelSpec, rec: LayerRecipe, tokens: int) -> None:
    """litgpt's ``LoRAQKVLinear`` adapts a subset of q, k, v of the fused projection by
    zero-padding the low-rank update to the fused width: ``index_copy`` keeps its source, the
    update of the enabled parts (c bytes each). Nothing extra when q, k and v are all adapted
    (``zero_pad`` returns its input). Source: litgpt ``lora.py`` ``zero_pad`` (``index_copy``;
    its derivative ``grad.index_select(dim, index).expand_as(source)`` keeps ``source``)."""
    t = rec.lora_targets
    enabled = [p for p in ("q", "k", "v") if p in t]
    if not enabled or len(enabled) == 3:
        return
    a, kv, d = _attention_dims(model)
    width = {"q": a * d, "k": kv * d, "v": kv * d}
    inv.add("qkv.lora_zero_pad_source", tokens * rec.c * sum(width[p] for p in enabled))
    # lora_A has r rows per enabled part, so its output is r·parts wide; the int64 index of
    # the padded columns is built once per forward (8 bytes per column, no token dimension).
    inv.split["qkv.lora_a_out"] = tokens * rec.c * rec.lora_rank * len(enabled)
    inv.add("qkv.lora_index", 8 * sum(width[p] for p in enabled))


def eager_scores_backward_bytes(model: ModelSpec, rec: LayerRecipe, b: int, s: int) -> float:
    """Bytes beyond a layer's saved tensors while eager attention's softmax runs backward (HF
    ``eager_attention_forward``: FP32 softmax of the scores, cast to the compute dtype, times V).
    The value matmul's backward makes the probabilities' gradient in the compute dtype and frees
    the e-byte probabilities it saved; the cast's backward turns that gradient to FP32 (4 bytes
    per score), and the softmax's backward makes the FP32 scores' gradient (4 more) beside it and
    the saved FP32 probabilities. Per score: 8 − e, or 8 in FP32 (no copy, the gradient is FP32
    already). Measured on the CPU over a whole decoder layer by ``tests/truth``."""
    (a,) = _dims(model, "heads")
    scores = b * a * s * s
    if not softmax_in_fp32(model, rec):
        # in the compute dtype: the probabilities' gradient and the scores' gradient beside
        # the saved probabilities, which are the matmul's input too
        return scores * 2 * rec.e
    copy = rec.e if rec.e != FP32 else 0
    return scores * (2 * FP32 - copy)


def eager_mask_bytes(rec: LayerRecipe, b: int, s: int) -> float:
    """Alive through the step but not saved: eager attention's causal mask (e·b·s²)."""
    return rec.e * b * s * s if rec.attention == "eager" else 0.0

