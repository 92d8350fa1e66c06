"""FLOPs of a trained token: the weights' FLOPs per parameter (full or adapter training, the
recomputed forward, DPO's reference forward), the attention scores, and the share routed experts
take (planner.perf.timing turns them into time).

Pure formulas on numpy arrays or scalars; every constant is named here with its source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.core.arch import (
    expert_params,
    has_full_architecture,
    hidden_matrices,
    moe_layer_count,
    op_policy_rerun_params,
    param_counts,
    routed_expert_matrices,
    total_params,
)
from planner.core.codes import FULL
from planner.core.entries import ModelSpec

#: Weight FLOPs per parameter per token: 6 for full training (forward 2, backward 4: activation
#: and weight gradients); 4 for LoRA/QLoRA, whose frozen base needs no weight gradients
#: (catalog-facts §9); +2 with full recomputation (the forward runs twice).
FULL_FLOPS_PER_PARAM = 6.0
ADAPTER_FLOPS_PER_PARAM = 4.0
RECOMPUTE_FLOPS_PER_PARAM = 2.0
#: A forward alone: 2 FLOPs per parameter and token (DPO's reference policy), and its share of a
#: training step's attention FLOPs and element-wise traffic (forward 1, backward 2).
FORWARD_FLOPS_PER_PARAM = 2.0
FORWARD_SHARE = 1.0 / 3.0
#: Attention-score FLOPs per token and layer, forward + backward, for the full s×s square:
#: 12·s·d (QKᵀ and AV, 2·s·d each forward, backward twice that; d = heads·head_dim;
#: Narayanan et al. 2021). Causal kernels (FlashAttention, SDPA, cuDNN) skip the masked half:
#: :data:`CAUSAL_SHARE` of it is executed. The forward alone is a third (recomputed once by
#: full or selective checkpointing).
ATTENTION_FLOPS_COEFF = 12.0
CAUSAL_SHARE = 0.5


#: Muon's Newton–Schulz iterations per step (``ns_steps``: 5 in torch.optim.Muon, Keller Jordan's
#: reference and Moonlight). Each orthogonalises an m×n update (m ≤ n) with A = X·Xᵀ (2·m²·n
#: FLOPs), A·A (2·m³) and (b·A + c·A²)·X (2·m²·n): :func:`newton_schulz_flops`.
MUON_NS_STEPS = 5


def newton_schulz_flops(d_in: float, d_out: float, steps: int = MUON_NS_STEPS) -> float:
    """FLOPs of Muon's Newton–Schulz orthogonalisation of one d_in×d_out matrix."""
    m, n = sorted((float(d_in), float(d_out)))
    return steps * (4.0 * m * m * n + 2.0 * m ** 3)


def muon_step_flops(model: ModelSpec, method: str, lora_rank: int = 0,
                    adapters: list[tuple[int, int, int]] | None = None) -> float:
    """Newton–Schulz FLOPs of one Muon step over the whole model (before any parallelism divides
    them): every hidden matrix of a full run (attention and MLP projections, each routed and
    shared expert's), or each LoRA adapter's two matrices (``adapters``: (count, d_in, d_out)).
    Embeddings and head are stepped by AdamW (no FLOPs of note). 0 without a full architecture."""
    if method != "full":
        return float(sum(c * (newton_schulz_flops(lora_rank, d_in) + newton_schulz_flops(d_out, lora_rank))
                         for c, d_in, d_out in (adapters or [])))
    if not has_full_architecture(model):
        return 0.0
    return float(sum(c * newton_schulz_flops(d_in, d_out) for c, d_in, d_out in hidden_matrices(model)))


def muon_expert_flops(model: ModelSpec, method: str, lora_rank: int = 0,
                      expert_adapters: list[tuple[int, int, int]] | None = None) -> float:
    """The routed experts' part of :func:`muon_step_flops`: their weight matrices in a full run
    (:func:`planner.core.arch.routed_expert_matrices`), their adapters' otherwise
    (``expert_adapters``). These are split as the experts are (over ep and the experts' own TP),
    the rest over tp. 0 for a dense model."""
    if method != "full":
        return muon_step_flops(model, "lora", lora_rank, expert_adapters or [])
    if not has_full_architecture(model):
        return 0.0
    return float(sum(c * newton_schulz_flops(d_in, d_out) for c, d_in, d_out in routed_expert_matrices(model)))


@dataclass(frozen=True)
class ModelFlops:
    """Per-token FLOP counts and sizes of one model (scalars)."""

    params: float  # N (total)
    active_params: float  # N used per token (MoE: active experts only)
    layers: int
    hidden: int
    attn_width: int  # heads · head_dim
    kv_width: int  # kv_heads · head_dim
    moe_layers: int = 0  # layers with routed experts
    experts_per_token: int = 0  # top-k routing
    expert_params: float = 0.0  # routed-expert parameters (what expert parallelism shards)
    experts: int = 0  # routed experts per MoE layer
    heads: int = 1
    #: Parameters of the matmuls op-level selective checkpointing recomputes (every second one in
    #: forward order: k, o and up for a gated MLP, k, o and down otherwise), all layers
    op_recompute_params: float = 0.0
    #: Widths the GEMMs' shapes need (0 where the architecture is unknown): the dense MLP's inner
    #: width, a routed expert's, the shared experts' together, and 1 for a gated MLP (3 matrices)
    ffn: int = 0
    expert_ffn: int = 0
    shared_width: int = 0
    gated: int = 1
    vocab: int = 0


def model_flops(model: ModelSpec) -> ModelFlops:
    n = float(total_params(model))
    active = n
    if has_full_architecture(model) and model.moe is not None and model.params_b is None:
        active = float(param_counts(model).active)
    heads = model.heads or max(1, model.hidden // 128)
    head_dim = model.head_dim_eff or model.hidden // heads
    kv = model.kv_heads_eff or heads
    moe_layers = moe_layer_count(model)
    return ModelFlops(n, active, model.layers, model.hidden, heads * head_dim, kv * head_dim,
                      moe_layers, model.moe.active if model.moe is not None else 0,
                      float(expert_params(model)), model.moe.experts if model.moe is not None else 0, heads,
                      op_recompute_params(model), *_widths(model))


def _widths(model: ModelSpec) -> tuple[int, int, int, int, int]:
    """The dense MLP's, a routed expert's and the shared experts' inner widths, whether the MLP
    is gated, and the vocabulary (0 where unknown)."""
    if not has_full_architecture(model):
        return 0, 0, 0, 1, 0
    moe = model.moe
    shared = moe.shared_width if moe is not None else 0
    return (model.ffn or 0, moe.expert_ffn if moe is not None else 0, shared, int(bool(model.gated_mlp)),
            model.vocab or 0)


def gemm_width_efficiency(mf: ModelFlops, tp: Any, expert_tp: Any, half: float) -> tuple[Any, Any]:
    """Speed of the layers' GEMMs relative to large ones from their weights' widths, d/(d + d½)
    for each of a GEMM's two weight dimensions (the tensor-parallel split one divided by its TP
    degree): the dense layers' (attention projections with Q, K and V fused, the dense and shared
    MLPs, the LM head split over the vocabulary) as the harmonic mean weighted by FLOPs, and a
    routed expert's (1 for a dense model).
    Where the architecture is incomplete the MLP's widths are 0 and the attention projections
    decide."""
    def f(d: Any) -> Any:
        d = np.asarray(d, dtype=float)
        return np.where(d > 0, d / (d + half), 1.0)
    h = np.asarray(mf.hidden, dtype=float)
    mats = np.where(np.asarray(mf.gated) > 0, 3.0, 2.0)
    qkv = mf.attn_width + 2.0 * mf.kv_width
    dense_layers = mf.layers - mf.moe_layers
    parts = [  # (FLOPs per token, 1/speed)
        (h * qkv * mf.layers, 1.0 / (f(h) * f(qkv / tp))),
        (h * mf.attn_width * mf.layers, 1.0 / (f(mf.attn_width / tp) * f(h))),
        (mats * h * mf.ffn * dense_layers, 1.0 / (f(h) * f(mf.ffn / tp))),
        (mats * h * mf.shared_width * mf.moe_layers, 1.0 / (f(h) * f(mf.shared_width / tp))),
        (h * mf.vocab, 1.0 / (f(h) * f(mf.vocab / tp))),
    ]
    weight = sum(w for w, _ in parts)
    slow = sum(w * s for w, s in parts)
    dense = np.where((weight > 0) & (h > 0), weight / np.maximum(slow, 1e-30), 1.0)
    expert = np.where((mf.expert_ffn > 0) & (h > 0), f(h) * f(mf.expert_ffn / np.maximum(expert_tp, 1)), 1.0)
    return dense, expert


#: Share of a dense model's parameters op-level selective checkpointing reruns where its shapes
#: are unknown (a model given by its parameter count): Llama 3.1 8B's k, o and up projections
#: are 0.32 of its parameters (Llama 2 70B's 0.36).
OP_RERUN_SHARE = 0.32


def op_recompute_params(model: ModelSpec) -> float:
    """Parameters, over all layers, of the matmuls op-level selective checkpointing reruns
    (:func:`planner.core.arch.op_policy_rerun_params`); :data:`OP_RERUN_SHARE` of the active
    parameters where the shapes are unknown."""
    if not has_full_architecture(model):
        return OP_RERUN_SHARE * float(total_params(model))
    return op_policy_rerun_params(model)


def linear_flops_per_token(mf: ModelFlops, *, method: Any, checkpointing: Any, n_lora: Any = 0.0,
                           saved_head: Any = 0.0, selective_op: Any = 0) -> Any:
    """FLOPs of the linear layers per trained token (weights, adapters, recomputed forward).
    ``saved_head``: parameters of an LM head a LoRA run trains in full (``modules_to_save``),
    which adds its weight gradient; a trained embedding's gradient is a scatter, no GEMM.
    ``selective_op``: selective checkpointing is op-level (torchtitan), which reruns every second
    matmul (:func:`op_recompute_params`); else it is Megatron's, which reruns the attention core
    only (:func:`attention_flops_per_token`)."""
    per_param = np.where(method == FULL, FULL_FLOPS_PER_PARAM, ADAPTER_FLOPS_PER_PARAM)
    op = (checkpointing == 1) & (np.asarray(selective_op) > 0)
    recompute = np.where(checkpointing == 2, RECOMPUTE_FLOPS_PER_PARAM * mf.active_params,
                         np.where(op, RECOMPUTE_FLOPS_PER_PARAM * mf.op_recompute_params, 0.0))
    head_grad = np.where(method == FULL, 0.0, (FULL_FLOPS_PER_PARAM - ADAPTER_FLOPS_PER_PARAM) * saved_head)
    return per_param * mf.active_params + FULL_FLOPS_PER_PARAM * n_lora + head_grad + recompute


def attention_flops_per_token(mf: ModelFlops, *, seq_len: Any, checkpointing: Any, selective_op: Any = 0) -> Any:
    """Executed attention-score FLOPs per token (causal), with the recomputed forward (full
    checkpointing, and Megatron's selective recomputation; op-level selective checkpointing
    keeps the attention kernel's output)."""
    full = ATTENTION_FLOPS_COEFF * CAUSAL_SHARE * mf.layers * seq_len * mf.attn_width
    reruns = (checkpointing == 2) | ((checkpointing == 1) & ~(np.asarray(selective_op) > 0))
    return full * np.where(reruns, 4.0 / 3.0, 1.0)


def expert_active_share(mf: ModelFlops) -> Any:
    """Share of the active parameters that sit in routed experts (0 for dense models)."""
    routed = mf.expert_params * mf.experts_per_token / np.maximum(mf.experts, 1)
    return np.where(mf.experts > 0, routed / np.maximum(mf.active_params, 1.0), 0.0)


def flops_per_token(mf: ModelFlops, *, method: Any, seq_len: Any, checkpointing: Any, n_lora: Any = 0.0) -> Any:
    """Hardware FLOPs per trained token (arrays broadcast).

    ``method`` code: 0 full, 1 LoRA, 2 QLoRA (see planner.memory.seed.METHODS); ``checkpointing``
    code: 0 none, 1 selective (recomputes the attention core), 2 full (recomputes the forward).
    """
    return (linear_flops_per_token(mf, method=method, checkpointing=checkpointing, n_lora=n_lora)
            + attention_flops_per_token(mf, seq_len=seq_len, checkpointing=checkpointing))
