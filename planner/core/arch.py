"""Parameter counts from a model's architecture: the one place they are computed.

Counts are exact for the tensors they list (no rounding): embeddings, attention (MHA, GQA or
multi-head latent attention), dense or gated MLPs, mixture-of-experts layers with routers and
shared experts, norms and biases, learned positions, tied or untied LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.entries import ModelSpec
from planner.core.memo import by_spec
from planner.core.values import LORA_TARGETS


class ArchitectureIncomplete(ValueError):
    """The spec lacks a dimension the count needs (e.g. explicit dims with only params_b)."""


@dataclass(frozen=True)
class ParamCounts:
    embedding: int
    lm_head: int
    positions: int
    attention: int  # all layers
    mlp: int  # all layers, every expert counted
    norms: int  # all layers and the final norm
    active_mlp: int  # MLP parameters one token passes through (MoE: active + shared experts)

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.positions + self.attention + self.mlp + self.norms

    @property
    def active(self) -> int:
        """Parameters used per token (differs from ``total`` only for MoE models)."""
        return self.total - self.mlp + self.active_mlp

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding - self.lm_head - self.positions


def _need(spec: ModelSpec, *fields: str) -> None:
    missing = [f for f in fields if getattr(spec, f) is None]
    if missing:
        raise ArchitectureIncomplete(
            f"model {spec.id!r} lacks {', '.join(missing)}: give params_b or the full architecture"
        )


def _dims(spec: ModelSpec, *fields: str) -> tuple[int, ...]:
    """The named dimensions of a full architecture, as integers (raises as :func:`_need`)."""
    _need(spec, *fields)
    return tuple(int(getattr(spec, f)) for f in fields)


def _attention_dims(spec: ModelSpec) -> tuple[int, int, int]:
    """(heads, KV heads, head dimension) of a spec with its heads given."""
    (a,) = _dims(spec, "heads")
    kv, d = spec.kv_heads_eff, spec.head_dim_eff
    assert kv is not None and d is not None  # both follow from the heads
    return a, kv, d


def attention_params_per_layer(spec: ModelSpec) -> int:
    """Q, K, V, O projections (+ biases, + per-head q/k norms), or MLA's low-rank projections."""
    h = spec.hidden
    if spec.mla is not None:
        m, (a,) = spec.mla, _dims(spec, "heads")
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * qk  # down, norm, up
        else:
            q = h * a * qk
        kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank  # down + its norm
        kv_b = m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
        o = a * m.v_head_dim * h
        return q + kv_a + kv_b + o + (h if spec.o_bias else 0)
    a, kv, d = _attention_dims(spec)
    q_out, kv_out = a * d, kv * d
    n = h * q_out + 2 * h * kv_out + q_out * h
    if spec.qkv_bias:
        n += q_out + 2 * kv_out
    if spec.o_bias:
        n += h
    if spec.qk_norm:
        n += 2 * d
    return n


def dense_mlp_params(spec: ModelSpec, ffn: int) -> int:
    """Gated (SwiGLU/GeGLU): gate, up, down = 3·h·f; plain: up, down = 2·h·f; + biases."""
    h = spec.hidden
    if spec.gated_mlp:
        n = 3 * h * ffn
        bias = 2 * ffn + h
    else:
        n = 2 * h * ffn
        bias = ffn + h
    return n + (bias if spec.mlp_bias else 0)


def is_moe_layer(spec: ModelSpec, index: int) -> bool:
    moe = spec.moe
    if moe is None or index < moe.first_dense_layers:
        return False
    return (index - moe.first_dense_layers) % moe.moe_every == 0


def moe_layer_count(spec: ModelSpec) -> int:
    """How many of the model's layers are MoE layers (:func:`is_moe_layer`; 0 for dense models)."""
    return sum(1 for i in range(spec.layers) if is_moe_layer(spec, i))


def _mlp_params(spec: ModelSpec) -> tuple[int, int]:
    """(all MLP parameters, MLP parameters active per token), summed over layers."""
    moe = spec.moe
    moe_layers = moe_layer_count(spec)
    dense_layers = spec.layers - moe_layers
    total = active = 0
    if dense_layers:
        (ffn,) = _dims(spec, "ffn")
        per = dense_mlp_params(spec, ffn)
        total += dense_layers * per
        active += dense_layers * per
    if moe_layers:
        assert moe is not None  # MoE layers exist only with a MoE spec
        expert = dense_mlp_params(spec, moe.expert_ffn)
        shared = dense_mlp_params(spec, moe.shared_width) if moe.shared_width else 0
        router = spec.hidden * moe.experts
        total += moe_layers * (router + moe.experts * expert + shared)
        active += moe_layers * (router + moe.active * expert + shared)
    return total, active


@by_spec
def param_counts(spec: ModelSpec) -> ParamCounts:
    """Exact parameter counts of a full architecture (raises if the spec is only dims)."""
    vocab, _ = _dims(spec, "vocab", "heads")
    h, layers = spec.hidden, spec.layers
    embedding = vocab * h
    lm_head = 0 if spec.tied_embeddings else vocab * h
    positions = (spec.max_position or 0) * h if spec.position == "learned" else 0
    norm_size = h * (2 if spec.norm == "layernorm" else 1)
    norms = (layers * spec.norms_per_layer + 1) * norm_size
    mlp, active_mlp = _mlp_params(spec)
    return ParamCounts(
        embedding=embedding,
        lm_head=lm_head,
        positions=positions,
        attention=layers * attention_params_per_layer(spec),
        mlp=mlp,
        norms=norms,
        active_mlp=active_mlp,
    )


def total_params(spec: ModelSpec) -> int:
    """N: the explicit ``params_b`` if given, else the count from the architecture."""
    if spec.params_b is not None:
        return round(spec.params_b * 1e9)
    return param_counts(spec).total


#: Model families whose Hugging Face model types Liger-Kernel patches whatever their shape
#: (``MODEL_TYPE_TO_APPLY_LIGER_FN``, and LLaMA-Factory's ``apply_liger_kernel``: llama, mistral,
#: mixtral, gemma 1-3, gpt_oss, smollm3; TinyLlama, Yi, SmolLM2 and DeepSeek's dense models are
#: llama-type checkpoints).
LIGER_FAMILIES = frozenset({"llama", "tinyllama", "yi", "mistral", "gemma", "smollm", "gpt-oss"})


def liger_patches(spec: ModelSpec) -> bool:
    """Whether Liger-Kernel has a patch for this model (its ``apply_liger_kernel_to_*``; the
    Trainer's ``use_liger_kernel`` and LLaMA-Factory's ``enable_liger_kernel`` apply nothing to a
    model type without one, fused loss included): the families of :data:`LIGER_FAMILIES`; Qwen's
    qwen2-type and Qwen3 models (not Qwen v1's remote code, one fused QKV; nor qwen2_moe, which
    has no patch: a Qwen MoE without q/k norms); Phi-3 and Phi-4 (RMSNorm; not Phi-1.5/2), OLMo 2
    (RMSNorm, dense; not OLMo 1 nor OLMoE), GLM-4 in transformers' glm4 (not ChatGLM's remote
    code, one fused QKV), and DeepSeek's dense llama-type models (not its MoE or MLA models).
    Other families (GPT-NeoX, OPT, BLOOM, Falcon, Baichuan, InternLM, MiniCPM, ...) have none."""
    family = spec.family or ""
    if family in LIGER_FAMILIES:
        return True
    if family == "qwen":
        return not spec.fused_qkv and (spec.moe is None or spec.qk_norm)
    if family in ("phi", "olmo"):
        return spec.norm == "rmsnorm" and spec.moe is None
    if family == "glm":
        return not spec.fused_qkv
    if family == "deepseek":
        return spec.moe is None and spec.mla is None
    return False


def liger_kernels(spec: ModelSpec) -> tuple[bool, bool, bool]:
    """Which of its RMSNorm, rotary and SwiGLU kernels Liger-Kernel's patch (``kernels: liger``)
    puts into this model: none where it has no patch (:func:`liger_patches`); the RMSNorm and
    rotary where it has one; its ``LigerSiLUMulFunction`` only for a gated MLP of a dense model or
    of linear-module experts (Mixtral's, Qwen-MoE's), not GPT-OSS's
    (``apply_liger_kernel_to_gpt_oss`` leaves SwiGLU off: its experts are fused parameters)."""
    if not liger_patches(spec):
        return False, False, False
    moe = spec.moe
    return True, True, bool(spec.gated_mlp) and (moe is None or moe.linear_experts)


def has_full_architecture(spec: ModelSpec) -> bool:
    try:
        param_counts(spec)
    except ArchitectureIncomplete:
        return False
    return True


def seed_lora_params(spec: ModelSpec, rank: int) -> int:
    """N_lora ≈ L · 18 · r · H: the documents' attention + MLP rule of thumb (000_…, §4)."""
    return spec.layers * 18 * rank * spec.hidden


def attention_module_shapes(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of the attention's q, k, v and o projections."""
    h, (a, kv, d) = spec.hidden, _attention_dims(spec)
    return {"q": (h, a * d), "k": (h, kv * d), "v": (h, kv * d), "o": (a * d, h)}


def lora_module_shapes(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each linear layer LoRA can adapt, in one dense layer."""
    (ffn,) = _dims(spec, "ffn")
    shapes = attention_module_shapes(spec)
    h = spec.hidden
    shapes["up"] = (h, ffn)
    shapes["down"] = (ffn, h)
    if spec.gated_mlp:
        shapes["gate"] = (h, ffn)
    return shapes


def hidden_matrices(spec: ModelSpec, *, routed: bool = True) -> list[tuple[int, int, int]]:
    """(count, d_in, d_out) of every weight matrix in the decoder layers of the whole model: each
    layer's attention projections, the dense MLP's on dense layers, and on MoE layers each routed
    expert's (:func:`routed_expert_matrices`; left out with ``routed`` false) and the shared
    experts' (one MLP as wide as all of them, as HF's DeepSeek and Qwen-MoE build it). Embeddings,
    head, norms and routers are not among them (Muon steps these matrices; AdamW the rest)."""
    shapes = lora_module_shapes(spec)
    mlp_names = ("gate", "up", "down") if spec.gated_mlp else ("up", "down")
    moe = spec.moe
    moe_layers = moe_layer_count(spec)
    dense_layers = spec.layers - moe_layers
    out = [(spec.layers, *shapes[k]) for k in ("q", "k", "v", "o")]
    if dense_layers:
        out += [(dense_layers, *shapes[k]) for k in mlp_names]
    if routed:
        out += routed_expert_matrices(spec)
    if moe is not None and moe_layers and (f := moe.shared_width):
        h, mats = spec.hidden, len(mlp_names)
        out += [(moe_layers, h, f)] * (mats - 1) + [(moe_layers, f, h)]
    return out


def routed_expert_matrices(spec: ModelSpec) -> list[tuple[int, int, int]]:
    """(count, d_in, d_out) of the routed experts' weight matrices in the whole model: gate and
    up (h × expert_ffn; up alone without a gated MLP) and down, one of each per expert per MoE
    layer. None in a dense model."""
    moe, moe_layers = spec.moe, moe_layer_count(spec)
    if moe is None or not moe_layers:
        return []
    h, n = spec.hidden, moe_layers * moe.experts
    return [(n, h, moe.expert_ffn)] * (2 if spec.gated_mlp else 1) + [(n, moe.expert_ffn, h)]


def op_policy_matmuls(spec: ModelSpec, moe_layer: bool) -> list[tuple[str, int, int]]:
    """(name, d_in, d_out) of the matmuls torchtitan's op-level selective checkpointing counts in
    a layer's forward order, every second one saved (``_save_list``, ``_custom_policy``: "save
    all compute-intensive ops except every second mm"): q, k, v (one qkv when fused), o, then the
    dense MLP, or a MoE layer's shared experts. A MoE layer's routed experts run as grouped
    matmuls the list does not hold and its router is forced to recompute: none of them is saved
    (:func:`op_policy_rerun_params`)."""
    shapes = lora_module_shapes(spec)
    attn = ([("qkv", spec.hidden, shapes["q"][1] + shapes["k"][1] + shapes["v"][1])] if spec.fused_qkv
            else [(m, *shapes[m]) for m in ("q", "k", "v")])
    attn.append(("o", *shapes["o"]))
    moe = spec.moe
    if moe_layer and moe is not None:
        f = moe.shared_width
        mlp = [("gate", spec.hidden, f), ("up", spec.hidden, f), ("down", f, spec.hidden)] if f else []
    else:
        mlp = [(m, *shapes[m]) for m in (("gate", "up", "down") if spec.gated_mlp else ("up", "down"))]
    return attn + mlp


def op_policy_rerun_params(spec: ModelSpec) -> float:
    """Parameters, over all layers, of the matmuls op-level selective checkpointing reruns per
    token: every second one of :func:`op_policy_matmuls`, and in MoE layers the active routed
    experts' three matmuls and the router."""
    total = 0.0
    for i in range(spec.layers):
        moe_layer = is_moe_layer(spec, i)
        total += sum(d_in * d_out for _, d_in, d_out in op_policy_matmuls(spec, moe_layer)[1::2])
        if moe_layer and spec.moe is not None:
            moe = spec.moe
            mats = 3 if spec.gated_mlp else 2
            total += mats * spec.hidden * moe.expert_ffn * moe.active + spec.hidden * moe.experts
    return total


def lora_adapters(spec: ModelSpec, targets: tuple[str, ...] = LORA_TARGETS) -> list[tuple[int, int, int]]:
    """(count, d_in, d_out) of each adapted linear layer: :func:`lora_adapter_groups`' dense
    adapters and its routed experts' together."""
    dense, experts = lora_adapter_groups(spec, targets)
    return dense + experts


def lora_adapter_groups(spec: ModelSpec, targets: tuple[str, ...] = LORA_TARGETS
                        ) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """(count, d_in, d_out) of each adapted linear layer, the routed experts' apart (what expert
    parallelism shards). With ``fused_qkv`` the targeted q/k/v projections are one linear
    (d_out = the sum of their widths, as PEFT adapts Qwen's c_attn); ``lm_head`` adapts the
    output layer once. The MLP's targets adapt the dense layers' MLP and, on MoE layers, every
    routed expert's (its ``expert_ffn`` wide) and the shared experts' (one MLP as wide as all of
    them), where the experts are linear modules (``MoESpec.linear_experts``); a MoE layer whose
    experts are fused parameters gets none on its routed experts."""
    moe, moe_layers = spec.moe, moe_layer_count(spec)
    mlp_names = ("gate", "up", "down") if spec.gated_mlp else ("up", "down")
    mlp = [t for t in targets if t in mlp_names]
    # the dense MLP's widths only where dense layers exist (a model of MoE layers alone needs none)
    shapes = lora_module_shapes(spec) if spec.layers > moe_layers else attention_module_shapes(spec)
    per_layer = [t for t in targets if t in ("q", "k", "v", "o")]
    dense: list[tuple[int, int, int]] = []
    qkv = [t for t in per_layer if t in ("q", "k", "v")]
    if spec.fused_qkv and qkv:
        dense.append((spec.layers, spec.hidden, sum(shapes[t][1] for t in qkv)))
        per_layer = [t for t in per_layer if t not in qkv]
    dense += [(spec.layers, *shapes[t]) for t in per_layer]
    dense += [(spec.layers - moe_layers, *shapes[t]) for t in mlp if spec.layers > moe_layers]
    experts: list[tuple[int, int, int]] = []
    if moe is not None and moe_layers and moe.linear_experts:
        h = spec.hidden

        def widths(t: str, f: int) -> tuple[int, int]:
            return (f, h) if t == "down" else (h, f)
        experts = [(moe_layers * moe.experts, *widths(t, moe.expert_ffn)) for t in mlp]
        if moe.shared_width:
            dense += [(moe_layers, *widths(t, moe.shared_width)) for t in mlp]
    if "lm_head" in targets:
        (vocab,) = _dims(spec, "vocab")
        dense.append((1, spec.hidden, vocab))
    return dense, experts


def exact_lora_params(spec: ModelSpec, rank: int, targets: tuple[str, ...] = LORA_TARGETS) -> int:
    """Σ r·(d_in + d_out) over the adapted linear layers (see :func:`lora_adapters`)."""
    return sum(n * rank * (d_in + d_out) for n, d_in, d_out in lora_adapters(spec, targets))


@dataclass(frozen=True)
class LoraCounts:
    """Adapter parameters of a model (:func:`lora_param_counts`)."""

    total: int  # every adapter: what the optimizer steps
    active: float  # those a token passes through: of the routed experts', its active ones'
    experts: int  # the routed experts' (what expert parallelism divides)


def lora_param_counts(spec: ModelSpec, rank: int, targets: tuple[str, ...] = LORA_TARGETS) -> LoraCounts:
    """Σ r·(d_in + d_out) over :func:`lora_adapter_groups`' adapters, all of them, those a token
    passes through, and the routed experts'."""
    dense, experts = (sum(n * rank * (d_in + d_out) for n, d_in, d_out in group)
                      for group in lora_adapter_groups(spec, targets))
    share = spec.moe.active / spec.moe.experts if spec.moe is not None else 0.0
    return LoraCounts(dense + experts, dense + experts * share, experts)


def expert_params(spec: ModelSpec) -> int:
    """Routed-expert MLP parameters of all MoE layers (what expert parallelism shards); 0 for
    dense models. Routers and shared experts stay on every expert-parallel rank."""
    if spec.moe is None or spec.params_b is not None and not has_full_architecture(spec):
        return 0
    moe_layers = moe_layer_count(spec)
    return moe_layers * spec.moe.experts * dense_mlp_params(spec, spec.moe.expert_ffn)
