"""Time and cost of a training job: FLOPs, utilisation, pipeline bubble, communication, offload.

Pure formulas on numpy arrays or scalars (the search evaluates many layouts at once; a single
plan is the same code on scalars). Every efficiency constant is named here with its source.

Which FLOPs the utilisation prior counts: the catalog's utilisation band is read as *hardware*
FLOPs utilisation. Recomputation is charged once, as the extra FLOPs it executes (full
checkpointing re-runs the forward pass: +2N per token), never again by lowering utilisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.core.arch import has_full_architecture, is_moe_layer, param_counts, total_params
from planner.core.specs import GpuSpec, ModelSpec

# --------------------------------------------------------------------------------------------
# Named constants

#: Attention-score FLOPs per token: 12·L·s·d for forward + backward (QKᵀ and AV, 2·s·d each
#: forward, backward twice that), with d = heads·head_dim. catalog-facts §9 ("about 12·L·s·h per
#: token; 6N omits it"); Megatron-LM's MFU formula (Narayanan et al. 2021) counts it the same way.
ATTENTION_FLOPS_COEFF = 12.0
#: Weight FLOPs per parameter per token: 6 for full training (forward 2, backward 4); 4 for
#: LoRA/QLoRA, whose frozen base needs no weight gradients (catalog-facts §9); +2 with full
#: recomputation (the forward runs twice).
FULL_FLOPS_PER_PARAM = 6.0
ADAPTER_FLOPS_PER_PARAM = 4.0
RECOMPUTE_FLOPS_PER_PARAM = 2.0
#: QLoRA dequantises NF4 to 16 bits in every frozen GEMM: ×1.0 (fused kernels, unsloth #858)
#: to ×1.5 (vanilla bitsandbytes) on LoRA time (catalog-facts §9). The middle of that band.
QLORA_SLOWDOWN = 1.25
#: Tokens per micro-batch at which GEMMs lose half their speed to small shapes: a guess, in
#: the spirit of Calculon's size-dependent efficiency curves; efficiency is normalised to 1 at
#: :data:`MICROBATCH_REFERENCE_TOKENS`, the scale of the runs behind the utilisation priors.
MICROBATCH_HALF_TOKENS = 512.0
MICROBATCH_REFERENCE_TOKENS = 8192.0
#: Bandwidth assumed where the catalog has none: PCIe 4.0 x16 (~25 GB/s usable per direction)
#: inside a node, 100 Gb/s Ethernet (12.5 GB/s) between nodes.
DEFAULT_INTRA_NODE_GBPS = 25.0
DEFAULT_INTER_NODE_GBPS = 12.5
#: Host link for offload traffic: PCIe 4.0 x16, ~25 GB/s per direction (PCI-SIG spec, 2 GB/s
#: per lane raw, minus protocol overhead).
PCIE_HOST_GBPS = 25.0
#: CPU Adam throughput per GPU process: the ZeRO-Offload paper (Ren et al. 2021, §5) reports
#: DeepSpeed's CPU-Adam updating about 1 billion parameters in roughly 1 s on a server CPU
#: shared by its GPUs; 1e9 parameters per second per process is the figure used.
CPU_ADAM_PARAMS_PER_S = 1.0e9
#: Share of communication hidden behind computation. 0 = none: an upper bound on time
#: (Megatron-LM at DP 8 without overlap lost 56.0 → 54.2 % MFU; catalog-facts §9).
COMM_OVERLAP = 0.0


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


def model_flops(model: ModelSpec) -> ModelFlops:
    n = float(total_params(model))
    active = n
    if has_full_architecture(model) and model.moe is not None and model.params_b is None:
        active = float(param_counts(model).active)
    heads = model.heads or max(1, model.hidden // 128)
    head_dim = model.head_dim_eff or model.hidden // heads
    kv = model.kv_heads_eff or heads
    moe_layers = sum(1 for i in range(model.layers) if is_moe_layer(model, i))
    return ModelFlops(n, active, model.layers, model.hidden, heads * head_dim, kv * head_dim,
                      moe_layers, model.moe.active if model.moe is not None else 0)


def flops_per_token(mf: ModelFlops, *, method: Any, seq_len: Any, checkpointing: Any, n_lora: Any = 0.0) -> Any:
    """Hardware FLOPs per trained token (arrays broadcast).

    ``method`` code: 0 full, 1 LoRA, 2 QLoRA (see planner.memory.seed.METHODS); ``checkpointing``
    code: 0 none, 1 selective (recomputes the attention core), 2 full (recomputes the forward).
    """
    per_param = np.where(method == 0, FULL_FLOPS_PER_PARAM, ADAPTER_FLOPS_PER_PARAM)
    weights = per_param * mf.active_params + FULL_FLOPS_PER_PARAM * n_lora
    attention = ATTENTION_FLOPS_COEFF * mf.layers * seq_len * mf.attn_width
    recompute = np.where(
        checkpointing == 2,
        RECOMPUTE_FLOPS_PER_PARAM * mf.active_params + attention / 3.0,
        np.where(checkpointing == 1, attention / 3.0, 0.0),
    )
    return weights + attention + recompute


def microbatch_efficiency(tokens_per_microbatch: Any) -> Any:
    """GEMM efficiency of small micro-batches, 1 at and above the reference size."""
    t = np.asarray(tokens_per_microbatch, dtype=float)
    ref = MICROBATCH_REFERENCE_TOKENS / (MICROBATCH_REFERENCE_TOKENS + MICROBATCH_HALF_TOKENS)
    return np.minimum(1.0, (t / (t + MICROBATCH_HALF_TOKENS)) / ref)


@dataclass(frozen=True)
class GpuPerf:
    """What the time model needs of a GPU type (arrays over GPU types, or scalars)."""

    peak_flops: Any  # dense 16-bit FLOP/s
    utilization: Any
    intra_bps: Any  # bytes/s between GPUs of a node
    inter_bps: Any  # bytes/s between nodes
    gpus_per_node: Any
    price_usd_per_hour: Any  # per GPU; NaN if unknown

    @classmethod
    def of(cls, gpu: GpuSpec, utilization: float | None = None) -> GpuPerf:
        util = utilization if utilization is not None else (gpu.utilization_low + gpu.utilization_high) / 2
        price = gpu.price_on_demand_usd_per_hour
        return cls(
            peak_flops=(gpu.peak_tflops_16bit or 0.0) * 1e12,
            utilization=util,
            intra_bps=(gpu.intra_node_gbps or DEFAULT_INTRA_NODE_GBPS) * 1e9,
            inter_bps=(gpu.inter_node_gbps or DEFAULT_INTER_NODE_GBPS) * 1e9,
            gpus_per_node=gpu.gpus_per_node,
            price_usd_per_hour=float("nan") if price is None else price,
        )


def ring_allreduce_s(n_bytes: Any, group: Any, bps: Any) -> Any:
    """Ring all-reduce: each GPU sends and receives 2·(g−1)/g of the buffer."""
    return np.where(group > 1, 2.0 * (group - 1) / np.maximum(group, 1) * n_bytes / bps, 0.0)


def ring_allgather_s(n_bytes: Any, group: Any, bps: Any) -> Any:
    """All-gather (or reduce-scatter) of a buffer of ``n_bytes`` in total: (g−1)/g of it moves."""
    return np.where(group > 1, (group - 1) / np.maximum(group, 1) * n_bytes / bps, 0.0)


def step_time_s(mf: ModelFlops, perf: GpuPerf, **x: Any) -> Any:
    """Wall-clock seconds of one optimizer step (arrays broadcast).

    Arguments: ``method``, ``checkpointing``, ``offload``, ``zero`` (codes as in
    planner.memory.seed), ``seq_len``, ``micro_batch``, ``grad_accum``, ``tp``, ``pp``, ``cp``, ``dp``,
    ``ep`` (expert parallelism: all-to-all per MoE layer),
    ``n_lora``, ``weight_bytes`` (bytes per parameter of the stored weights).

    step = (m + pp − 1) · t_microbatch  (1F1B: m micro-batches plus the pipeline bubble;
                                         bubble share (pp−1)/(m+pp−1), Narayanan et al. 2021)
         + data-parallel gradient all-reduce (+ ZeRO-3 parameter all-gathers, 1.5× the traffic,
           ZeRO paper §7) over the slowest link of the group
         + offload: gradients down and parameters up over PCIe, and the CPU Adam step.
    t_microbatch = FLOPs / (tp·pp·cp · peak · utilisation · micro-batch efficiency)
                   (× QLoRA dequantisation) + TP all-reduces (4 per layer, 6 with full
                   recomputation; Korthikanti et al. 2022) + PP activation sends + CP ring K/V.
    Traffic between GPUs of one node uses the node's link (NVLink, or PCIe on cards without it);
    a group that spans nodes runs at the network's speed.
    """
    method, ckpt = x["method"], x["checkpointing"]
    seq, mb, ga = x["seq_len"], x["micro_batch"], x["grad_accum"]
    tp, pp, cp, dp, zero, offload = x["tp"], x["pp"], x["cp"], x["dp"], x["zero"], x["offload"]
    n_lora = x.get("n_lora", 0.0)
    # intra_only: price every group at the in-node link (a lower bound used by the search).
    node = np.inf if x.get("intra_only") else perf.gpus_per_node
    tokens_mb = mb * seq
    mp = tp * pp * cp

    flops = flops_per_token(mf, method=method, seq_len=seq, checkpointing=ckpt, n_lora=n_lora) * tokens_mb
    rate = perf.peak_flops * perf.utilization * microbatch_efficiency(tokens_mb / cp)
    compute = flops / (mp * rate)
    compute = compute * np.where(method == 2, QLORA_SLOWDOWN, 1.0)

    act_bytes = tokens_mb * mf.hidden * 2.0 / cp  # one layer's 16-bit activations
    tp_bps = np.where(tp <= node, perf.intra_bps, perf.inter_bps)
    tp_collectives = np.where(ckpt == 2, 6.0, 4.0) * mf.layers / pp
    tp_comm = tp_collectives * ring_allreduce_s(act_bytes, tp, tp_bps)
    pp_bps = np.where(tp * cp * dp * pp <= node, perf.intra_bps, perf.inter_bps)
    pp_comm = np.where(pp > 1, 2.0 * act_bytes / pp_bps, 0.0)
    cp_bps = np.where(tp * cp <= node, perf.intra_bps, perf.inter_bps)
    kv_bytes = tokens_mb / cp * 2.0 * mf.kv_width * 2.0  # K and V, 16-bit, one layer
    cp_comm = np.where(cp > 1, 3.0 * (cp - 1) * kv_bytes * mf.layers / pp / cp_bps, 0.0)
    ep = x.get("ep", 1)
    ep_bps = np.where(tp * cp * ep <= node, perf.intra_bps, perf.inter_bps)
    # Expert parallelism: each MoE layer sends every token's hidden state to its top-k experts and
    # back, forward and backward (4 all-to-alls), (ep−1)/ep of it leaving the GPU.
    a2a_bytes = tokens_mb / cp * mf.hidden * 2.0 * mf.experts_per_token * (ep - 1) / np.maximum(ep, 1)
    ep_comm = np.where(ep > 1, 4.0 * a2a_bytes * mf.moe_layers / pp / ep_bps, 0.0)
    comm_mb = (tp_comm + pp_comm + cp_comm + ep_comm) * (1.0 - COMM_OVERLAP)
    t_microbatch = compute + comm_mb
    pipeline = (ga + pp - 1) * t_microbatch

    d = dp * cp
    dp_bps = np.where(tp * cp * dp <= node, perf.intra_bps, perf.inter_bps)
    trainable = np.where(method == 0, mf.params, n_lora)
    grad_bytes = trainable * 2.0 / (tp * pp)
    dp_comm = ring_allreduce_s(grad_bytes, d, dp_bps)
    weight_bytes = mf.params * x.get("weight_bytes", 2.0) / (tp * pp)
    gathers = np.where(zero >= 3, 2.0, 0.0) * ga  # forward and backward, every micro-batch
    dp_comm = dp_comm + gathers * ring_allgather_s(weight_bytes, d, dp_bps)
    dp_comm = dp_comm * (1.0 - COMM_OVERLAP)

    shard = trainable / (tp * pp * np.maximum(d, 1))
    offload_opt = np.where(offload >= 1, shard * 4.0 / (PCIE_HOST_GBPS * 1e9) + shard / CPU_ADAM_PARAMS_PER_S, 0.0)
    offload_params = np.where(offload >= 2, 2.0 * ga * weight_bytes / np.maximum(d, 1) / (PCIE_HOST_GBPS * 1e9), 0.0)
    return pipeline + dp_comm + offload_opt + offload_params


def job_time_s(step_s: Any, *, tokens: float, seq_len: Any, micro_batch: Any, dp: Any, grad_accum: Any) -> Any:
    """Seconds to train on ``tokens`` tokens: steps × step time (a step trains mb·dp·ga·seq tokens)."""
    tokens_per_step = micro_batch * dp * grad_accum * seq_len
    return tokens / tokens_per_step * step_s


def billed_gpus(gpus: Any, gpus_per_node: Any, whole_node_only: Any) -> Any:
    """GPUs paid for: whole nodes where the type is rented only so, else the GPUs used."""
    return np.where(whole_node_only, -(-gpus // gpus_per_node) * gpus_per_node, gpus)


def job_cost_usd(time_s: Any, *, gpus: Any, price_usd_per_hour: Any) -> Any:
    return time_s / 3600.0 * gpus * price_usd_per_hour
