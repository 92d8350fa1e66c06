"""Per-GPU memory of a training or inference step: pure formulas, named components.

Profile ``seed`` reproduces the rules of the source documents exactly (``000_…`` model states,
K-factor activations, ZeRO/TP/PP/offload; ``004_…`` with its own assumptions given as
overrides). Every figure is bytes per GPU. Each component is rounded up to a whole byte before
summing, so the components always add up to the total exactly.

Symbols (as in ``000_…``): N params, L layers, H hidden, T sequence length, B micro-batch per GPU,
r LoRA rank, D = ZeRO (sharded data-parallel) degree = dp · cp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.core.arch import (
    expert_params,
    has_full_architecture,
    lora_param_counts,
    seed_lora_params,
    total_params,
)
from planner.core.codes import FULL, INFERENCE, LORA, QLORA
from planner.core.entries import ModelSpec
from planner.core.specs import Layout, Overrides, Workload
from planner.core.units import DTYPE_BYTES, expert_ways, zero_degree
from planner.memory.breakdown import (
    ATTENTION,
    CHECKPOINTING,
    OPTIMIZERS,
    PRECISIONS,
    MemoryBreakdown,
    ceil_components,
)
from planner.memory.breakdown import codes as breakdown_codes
from planner.memory.generation import GENERATION_PHASE

# ---------------------------------------------------------------------------------------------
# Named constants (each with its source)

#: K-factor of the activation rule B·T·H·L·K·b (``000_…`` §一.2): none 10–20, activation
#: checkpointing 4–6, FlashAttention + checkpointing 2–4; the worked examples use K = 3.
#: The documents give no figure for FlashAttention alone or for selective recomputation, so
#: those take the nearest documented case that does not underestimate: no checkpointing (16).
SEED_K_FACTOR: dict[tuple[str, str], float] = {
    ("none", "eager"): 16.0,
    ("none", "flash"): 16.0,
    ("selective", "eager"): 16.0,
    ("selective", "flash"): 16.0,
    ("full", "eager"): 5.0,
    ("full", "flash"): 3.0,
}

#: QLoRA base: "~(0.55–0.9)·N bytes, common setting about 0.6·N" (``000_…`` §三.3).
SEED_QLORA_BASE_BYTES_PER_PARAM = 0.6

#: Korthikanti et al. 2022 (arXiv 2205.05198), §4.2: with TP of degree t and no sequence
#: parallelism a GPT layer keeps s·b·h·(10 + 24/t) of its 34·s·b·h bytes (flash attention);
#: the 10 (LayerNorm, residual and dropout inputs) is not split. ``000_…`` only says
#: "partly", so the seed profile takes this ratio.
TP_UNSPLIT_ACTIVATION_SHARE = 10.0 / 34.0

#: Optimizer state bytes per trainable parameter. AdamW keeps m and v: FP32 (4 + 4), or in the
#: parameter dtype under pure BF16; 8-bit Adam (bitsandbytes) keeps both in 8 bits (~2 bytes,
#: ``000_…`` §三.1: "8-bit m/v ≈ 2N"); SGD with momentum keeps one buffer (``004_…``). Not in the
#: documents: Lion keeps one FP32 momentum (bitsandbytes' 32-bit Lion); Adafactor's factored
#: second moment, rows plus columns of each matrix, is taken as 0 per parameter here; Muon keeps
#: one momentum per hidden matrix, the buffer SGD with momentum keeps (the AdamW it runs on the
#: embeddings and head is left to the detailed profile).
OPTIMIZER_STATE_BYTES: dict[str, dict[str, float]] = {
    p: {"adamw": adamw, "adam8bit": 2.0, "paged_adamw8bit": 2.0, "sgd": sgd, "adafactor": 0.0, "lion": 4.0,
        "muon": sgd}
    for p, adamw, sgd in (("mixed", 8.0, 4.0), ("fp16", 8.0, 4.0), ("bf16", 4.0, 2.0), ("fp32", 8.0, 4.0))
}

#: Bytes per element of the compute copy of weights, gradients and activations.
COMPUTE_DTYPE: dict[str, str] = {"mixed": "bf16", "fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}

#: Mixed precision keeps an FP32 master copy of trainable weights (``000_…`` §一.1: 4N).
MASTER_BYTES: dict[str, float] = {"mixed": 4.0, "fp16": 4.0, "bf16": 0.0, "fp32": 0.0}


@dataclass(frozen=True)
class StateBytes:
    """Bytes per trainable parameter of each model-state part under one precision recipe."""

    weights: float
    gradients: float
    optimizer: float
    master: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.master


def state_bytes(precision: str, optimizer: str) -> StateBytes:
    """Full FT mixed + AdamW: 2 + 2 + 8 + 4 = 16 bytes (``000_…`` §一.1); 8-bit Adam: 10."""
    compute = DTYPE_BYTES[COMPUTE_DTYPE[precision]]
    return StateBytes(
        weights=compute,
        gradients=compute,
        optimizer=OPTIMIZER_STATE_BYTES[precision][optimizer],
        master=MASTER_BYTES[precision],
    )


_COMPUTE_BYTES = np.array([DTYPE_BYTES[COMPUTE_DTYPE[p]] for p in PRECISIONS])
_MASTER_BYTES = np.array([MASTER_BYTES[p] for p in PRECISIONS])
_OPTIMIZER_BYTES = np.array([[OPTIMIZER_STATE_BYTES[p][o] for o in OPTIMIZERS] for p in PRECISIONS])
_K_FACTOR = np.array([[SEED_K_FACTOR[(c, a)] for a in ATTENTION] for c in CHECKPOINTING])

#: Components each method reports (others are zero for it).
METHOD_COMPONENTS = {
    "full": ("weights", "gradients", "optimizer_states", "master_weights", "activations"),
    "lora": ("weights", "adapter_states", "activations"),
    "qlora": ("weights", "adapter_states", "activations"),
    "inference": ("weights", "kv_cache"),
}


def seed_components(model: ModelSpec, overrides: Overrides, **x: Any) -> dict[str, np.ndarray]:
    """The ``seed`` formulas on arrays: every argument broadcasts (numpy), so the search can
    evaluate millions of layouts at once and a single estimate is the same code on scalars.

    Arguments (arrays or scalars): ``method``, ``precision``, ``optimizer``, ``checkpointing``,
    ``attention``, ``offload`` as codes into :data:`METHODS` etc.; ``seq_len``, ``micro_batch``,
    ``lora_rank``, ``tp``, ``pp``, ``cp``, ``sp`` (0/1), ``zero``, ``dp``, ``grad_accum``
    (0 = unknown). Returns fractional bytes per GPU by component, and ``host`` (offloaded).

    Model states (``000_…`` §一.1 and §三): full FT 16N (mixed + AdamW) or 10N (8-bit Adam);
    LoRA 2N + c_opt·N_lora with c_opt = 16 (AdamW) or 10 (8-bit); QLoRA 0.6N + c_opt·N_lora;
    N_lora = L·18·r·H. ZeRO (§二.4, as the ZeRO paper): stage 1 shards optimizer states and the
    FP32 master copy over D = dp·cp, stage 2 also gradients, stage 3 also weights. TP and PP
    divide every model state. Offload moves optimizer states (and with ``optimizer+params`` the
    weights) to host memory. Activations B·T·H·L·K·b (§一.2) with the parallel layouts' effect
    (:func:`seed_activation_factor`). Inference: weights + KV cache B·L·2·T·H·b (§四). No
    logits, buffers or allocator overhead: the reserve on the card's capacity (§一.3) covers them.
    """
    method, prec, opt, offload = x["method"], x["precision"], x["optimizer"], x["offload"]
    sh = _shards(model, x)
    w_b = _COMPUTE_BYTES[prec]
    opt_b = _OPTIMIZER_BYTES[prec, opt]
    master_b = _MASTER_BYTES[prec]
    keep_o = np.where(offload >= 1, 0.0, 1.0)  # optimizer states stay on the GPU
    keep_w = np.where(offload >= 2, 0.0, 1.0)  # weights stay on the GPU
    is_full = method == FULL
    is_adapter = (method == LORA) | (method == QLORA)
    is_train = method != INFERENCE

    qlora_base = overrides.base_bytes_per_param or SEED_QLORA_BASE_BYTES_PER_PARAM
    inference_base = overrides.base_bytes_per_param or w_b
    base_b = np.where(method == LORA, w_b, np.where(method == QLORA, qlora_base, np.where(is_full, w_b, 0.0)))
    weights = sh.spread(base_b, 3)
    adapter_dev, adapter_host = _seed_adapters(model, overrides, x, sh, w_b, opt_b + master_b,
                                               keep_w, keep_o)

    zero_arr = 0.0 * weights
    out = {
        "weights": np.where(is_train, weights * keep_w, sh.spread(inference_base, 0)),
        "gradients": np.where(is_full, sh.spread(w_b, 2), zero_arr),
        "optimizer_states": np.where(is_full, sh.spread(opt_b, 1) * keep_o, zero_arr),
        "master_weights": np.where(is_full, sh.spread(master_b, 1) * keep_o, zero_arr),
        "adapter_states": np.where(is_adapter, adapter_dev, zero_arr),
    }
    host = np.where(is_train, weights * (1 - keep_w), zero_arr)
    if "reference" in x:  # DPO: a frozen 16-bit copy of the weights beside a fully trained policy
        ref = np.where(is_full & (np.asarray(x["reference"]) > 0), sh.spread(w_b, 3), zero_arr)
        out["reference_weights"] = ref * keep_w
        host = host + ref * (1 - keep_w)  # offloaded with the weights
    host = host + np.where(is_full, sh.spread(opt_b + master_b, 1) * (1 - keep_o), zero_arr)
    out["host"] = host + np.where(is_adapter, adapter_host, zero_arr)

    out["activations"] = np.where(is_train, _seed_activations(model, overrides, x, w_b, zero_arr),
                                  zero_arr)
    b = w_b
    kv = x["micro_batch"] * model.layers * 2 * x["seq_len"] * model.hidden * b / (sh.tp * sh.pp * sh.cp)
    out["kv_cache"] = np.where(is_train, zero_arr, kv)
    return out


@dataclass(frozen=True)
class _Shards:
    """How the parallel layout divides the model states: TP·PP (``mp``) divides all of them;
    ZeRO shards weights, gradients and optimizer states ``s_w``, ``s_g``, ``s_o`` ways."""

    tp: Any
    pp: Any
    cp: Any
    ep: Any
    etp: Any  # the experts' own tensor parallelism (None: tp)
    zero: Any
    n_dense: float
    n_exp: float
    mp: Any
    s_w: Any
    s_g: Any
    s_o: Any

    def spread(self, per_param: Any, stage: int) -> Any:
        """Bytes per GPU of ``per_param`` bytes for each model parameter, sharded from ZeRO stage
        ``stage`` on (0: never)."""
        sharded = (self.zero >= stage) & (stage > 0)
        shard = {0: 1, 1: self.s_o, 2: self.s_g, 3: self.s_w}[stage]  # 1 where not sharded
        expert_mp = self.mp if self.etp is None else self.pp * self.etp
        return (self.n_dense * per_param / (self.mp * shard)
                + self.n_exp * per_param / (expert_mp * expert_ways(self.ep, shard, sharded, tp=self.tp,
                                                                    etp=self.etp)))


def _shards(model: ModelSpec, x: dict[str, Any]) -> _Shards:
    tp, pp, cp, dp, zero = x["tp"], x["pp"], x["cp"], x["dp"], x["zero"]
    n = float(total_params(model))
    # Expert parallelism: routed experts are split over ep ranks, and ZeRO shards them over
    # the remaining D/ep replicas, so a ZeRO-sharded part is N/D either way, an unsharded one
    # (N_dense + N_experts/ep); an expert TP of its own (``etp``) splits them etp ways instead
    # of tp (:func:`~planner.core.units.expert_ways`).
    ep = x.get("ep", 1)
    n_exp = float(expert_params(model))
    n_dense = n - n_exp
    mp = tp * pp
    d = zero_degree(dp, cp)
    s_w, s_g, s_o = (np.where(zero >= stage, d, 1) for stage in (3, 2, 1))
    return _Shards(tp, pp, cp, ep, x.get("etp"), zero, n_dense, n_exp, mp, s_w, s_g, s_o)


def _seed_adapters(model: ModelSpec, overrides: Overrides, x: dict[str, Any], sh: _Shards,
                   w_b: Any, opt_master_b: Any, keep_w: Any, keep_o: Any) -> tuple[Any, Any]:
    """(device, host) bytes of the LoRA adapters' states: N_lora = L·18·r·H parameters of
    w_b-byte weights and gradients and ``opt_master_b`` bytes of optimizer states and master
    copy each, or an override's opaque bytes per parameter."""
    div_w, div_g, div_o = sh.mp * sh.s_w, sh.mp * sh.s_g, sh.mp * sh.s_o
    if overrides.lora_params is not None:
        n_lora = float(overrides.lora_params)
    else:
        n_lora = model.layers * 18.0 * x["lora_rank"] * model.hidden
    if overrides.lora_bytes_per_param is not None:
        # An opaque per-parameter figure: sharded only where everything is (ZeRO-3).
        adapter_dev = n_lora * overrides.lora_bytes_per_param / div_w
        adapter_host = 0.0
    else:
        adapter_dev = n_lora * (w_b / div_w * keep_w + w_b / div_g + opt_master_b / div_o * keep_o)
        adapter_host = n_lora * (w_b / div_w * (1 - keep_w) + opt_master_b / div_o * (1 - keep_o))
    return adapter_dev, adapter_host


def _seed_activations(model: ModelSpec, overrides: Overrides, x: dict[str, Any], b: Any,
                      zero_arr: Any) -> Any:
    """Activations B·T·H·L·K·b with the parallel layout's share (:func:`seed_activation_factor`),
    or an override's figure."""
    if overrides.activation_bytes is not None:
        return overrides.activation_bytes + zero_arr
    k = overrides.k_factor or _K_FACTOR[x["checkpointing"], x["attention"]]
    act = x["micro_batch"] * x.get("sequences", 1) * x["seq_len"] * model.hidden * model.layers * k * b
    return act * seed_activation_factor(tp=x["tp"], pp=x["pp"], cp=x["cp"], sp=x["sp"],
                                        grad_accum=x["grad_accum"])


def seed_activation_factor(*, tp: Any, pp: Any, cp: Any, sp: Any, grad_accum: Any) -> Any:
    """Share of the whole-model activations one GPU keeps under a parallel layout.

    - CP of degree c splits the sequence: 1/c.
    - TP of degree t: 1/t with sequence parallelism; otherwise only the 24/34 share that TP
      splits (:data:`TP_UNSPLIT_ACTIVATION_SHARE`).
    - PP of degree p: each stage holds L/p layers, but 1F1B keeps min(p, m) micro-batches in
      flight on the first stage (m = gradient-accumulation steps; p when m is unknown, code 0),
      so the figure stays near the whole model's (``000_…`` §二.3).
    """
    share = TP_UNSPLIT_ACTIVATION_SHARE
    tp_factor = np.where(tp > 1, np.where(sp, 1.0 / tp, share + (1.0 - share) / tp), 1.0)
    in_flight = np.where(grad_accum > 0, np.minimum(pp, grad_accum), pp)
    return tp_factor * in_flight / (pp * cp)


def seed_memory(
    model: ModelSpec,
    workload: Workload,
    layout: Layout,
    overrides: Overrides,
    *,
    dp: int,
    grad_accum: int | None = None,
) -> MemoryBreakdown:
    """The ``seed`` profile for one scenario: :func:`seed_components` on scalars, plus notes."""
    raw = seed_components(model, overrides, **breakdown_codes(workload, layout, dp=dp, grad_accum=grad_accum))
    names = METHOD_COMPONENTS[workload.method] + (("reference_weights",) if workload.reference_copy else ())
    ints = ceil_components(raw, (*names, "host"))
    components = {k: int(ints[k]) for k in names}
    phases = None
    if workload.generates and not layout.generation_gpus:
        phases = {"step": sum(components.values()), GENERATION_PHASE: _at_rest(components)}
    return MemoryBreakdown(
        components=components,
        host_bytes=int(ints["host"]),
        assumptions=tuple(_seed_notes(model, workload, layout, overrides)),
        phase_bytes=phases,
    )


#: What a step makes and frees: the states at rest between steps are the rest.
STEP_ONLY = ("gradients", "activations")


def _at_rest(components: dict[str, Any]) -> Any:
    """The trainer's states at rest between steps (while a colocated engine generates)."""
    return sum(v for k, v in components.items() if k not in STEP_ONLY)


def _seed_notes(model: ModelSpec, workload: Workload, layout: Layout, overrides: Overrides) -> list[str]:
    sb = state_bytes(workload.precision, workload.optimizer)
    notes: list[str] = []
    if workload.method == "full":
        notes.append(f"model states {sb.total:g} bytes/param ({workload.precision}, {workload.optimizer})")
    elif workload.method in ("lora", "qlora"):
        if overrides.lora_params is None:
            notes.append(f"N_lora = L·18·r·H = {seed_lora_params(model, workload.lora_rank):,}")
            experts = (lora_param_counts(model, workload.lora_rank, workload.lora_target_set).experts
                       if model.moe is not None and has_full_architecture(model) else 0)
            if experts:  # the rule knows one MLP per layer; MoE adapters sit on every routed expert
                notes.append(f"the rule counts one MLP per layer: the adapters on every routed expert, "
                             f"{experts:,} parameters, are left out (the detailed profile counts them)")
        if overrides.lora_bytes_per_param is not None:
            notes.append(f"adapter states {overrides.lora_bytes_per_param:g} bytes/param (override)")
        else:
            notes.append(f"adapter states c_opt = {sb.total:g} bytes/param")
        base = sb.weights if workload.method == "lora" else (
            overrides.base_bytes_per_param or SEED_QLORA_BASE_BYTES_PER_PARAM)
        notes.append(f"frozen base {base:g} bytes/param")
    else:
        notes.append("KV cache B·L·2·T·H·b (000_… §四)")
        return notes
    if overrides.activation_bytes is not None:
        notes.append("activations given as an override")
    else:
        k = overrides.k_factor or SEED_K_FACTOR[(layout.checkpointing, layout.attention)]
        notes.append(f"activations B·T·H·L·K·b with K = {k:g}")
    notes.append("seed profile: no logits, buffers or allocator overhead (the reserve covers them)")
    return notes


def seed_array_memory(model: ModelSpec, overrides: Overrides, *, at_rest: bool = False,
                      **x: Any) -> dict[str, Any]:
    """The seed profile over broadcast arrays: ``total`` (device bytes, summed exactly as an
    estimate sums its components), ``host`` (offloaded bytes) and ``phases`` (one: the step; with
    ``at_rest``, the trainer's states between steps too, beside a colocated generation engine)."""
    raw = seed_components(model, overrides, **x)
    names = tuple(k for k in raw if k != "host")
    ints = ceil_components(raw, (*names, "host"))
    total = sum(ints[k] for k in names)
    # The documents sum one step's components: a single phase.
    phases = {"step": total}
    if at_rest:
        phases[GENERATION_PHASE] = _at_rest({k: ints[k] for k in names})
    return {"total": total, "host": ints["host"], "phases": phases}
