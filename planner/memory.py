"""Per-GPU memory of a training or inference step: pure formulas, named components.

Profile ``seed`` reproduces the rules of the source documents exactly (``000_…`` model states,
K-factor activations, ZeRO/TP/PP/offload; ``004_…`` with its own assumptions given as
overrides). Every figure is bytes per GPU. Each component is rounded up to a whole byte before
summing, so the components always add up to the total exactly.

Symbols (as in ``000_…``): N params, L layers, H hidden, T sequence length, B micro-batch per GPU,
r LoRA rank, D = ZeRO (sharded data-parallel) degree = dp · cp.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.arch import seed_lora_params, total_params
from planner.specs import Layout, ModelSpec, Overrides, Workload
from planner.units import DTYPE_BYTES, ceil_bytes

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
#: ``000_…`` §三.1: "8-bit m/v ≈ 2N"); SGD with momentum keeps one buffer (``004_…``).
OPTIMIZER_STATE_BYTES: dict[str, dict[str, float]] = {
    # precision ->     adamw  adam8bit  paged_adamw8bit  sgd
    "mixed": {"adamw": 8.0, "adam8bit": 2.0, "paged_adamw8bit": 2.0, "sgd": 4.0},
    "fp16": {"adamw": 8.0, "adam8bit": 2.0, "paged_adamw8bit": 2.0, "sgd": 4.0},
    "bf16": {"adamw": 4.0, "adam8bit": 2.0, "paged_adamw8bit": 2.0, "sgd": 2.0},
    "fp32": {"adamw": 8.0, "adam8bit": 2.0, "paged_adamw8bit": 2.0, "sgd": 4.0},
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


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU device bytes by component; ``host_bytes`` is what offload keeps in CPU memory."""

    components: dict[str, int]
    host_bytes: int = 0
    assumptions: tuple[str, ...] = field(default=())

    @property
    def total_bytes(self) -> int:
        return sum(self.components.values())


@dataclass(frozen=True)
class Sharding:
    """Divisors of each part of the model states on one GPU."""

    model_parallel: int  # tp · pp: every part of the model states
    zero_degree: int  # D = dp · cp
    zero_stage: int
    offload: str

    def divisor(self, part: str) -> int:
        """``part`` in weights | gradients | optimizer (optimizer includes the FP32 master)."""
        stage_needed = {"optimizer": 1, "gradients": 2, "weights": 3}[part]
        d = self.zero_degree if self.zero_stage >= stage_needed else 1
        return self.model_parallel * d

    def on_host(self, part: str) -> bool:
        if part == "optimizer":
            return self.offload in ("optimizer", "optimizer+params")
        if part == "weights":
            return self.offload == "optimizer+params"
        return False


def _sharding(layout: Layout, dp: int) -> Sharding:
    return Sharding(
        model_parallel=layout.tp * layout.pp,
        zero_degree=dp * layout.cp,
        zero_stage=layout.zero,
        offload=layout.offload,
    )


class _Accumulator:
    """Collects device and host bytes per component; fractional bytes are rounded up once."""

    def __init__(self) -> None:
        self.device: dict[str, float] = {}
        self.host = 0.0

    def add(self, name: str, n_bytes: float, *, on_host: bool = False) -> None:
        self.device.setdefault(name, 0.0)
        if on_host:
            self.host += n_bytes
        else:
            self.device[name] += n_bytes

    def breakdown(self, assumptions: list[str]) -> MemoryBreakdown:
        return MemoryBreakdown(
            components={k: ceil_bytes(v) for k, v in self.device.items()},
            host_bytes=ceil_bytes(self.host),
            assumptions=tuple(assumptions),
        )


def seed_activation_bytes(
    model: ModelSpec, workload: Workload, layout: Layout, *, grad_accum: int | None, k_factor: float
) -> float:
    """B·T·H·L·K·b(16-bit) per GPU (``000_…`` §一.2), then the parallel layouts' effect.

    - CP of degree c splits the sequence: / c.
    - TP of degree t: / t with sequence parallelism; otherwise only the 24/34 share that TP
      splits (:data:`TP_UNSPLIT_ACTIVATION_SHARE`).
    - PP of degree p: each stage holds L/p layers, but 1F1B keeps min(p, m) micro-batches in
      flight on the first stage (m = gradient-accumulation steps; p when m is unknown), so
      the figure stays near the whole model's (``000_…`` §二.3).
    """
    b = DTYPE_BYTES[COMPUTE_DTYPE[workload.precision]]
    act = workload.micro_batch * workload.seq_len * model.hidden * model.layers * k_factor * b
    act /= layout.cp
    if layout.tp > 1:
        if layout.sp:
            act /= layout.tp
        else:
            share = TP_UNSPLIT_ACTIVATION_SHARE
            act *= share + (1.0 - share) / layout.tp
    if layout.pp > 1:
        in_flight = layout.pp if grad_accum is None else min(layout.pp, grad_accum)
        act *= in_flight / layout.pp
    return act


def seed_memory(
    model: ModelSpec,
    workload: Workload,
    layout: Layout,
    overrides: Overrides,
    *,
    dp: int,
    grad_accum: int | None = None,
) -> MemoryBreakdown:
    """The ``seed`` profile: the documents' rules, per GPU.

    Model states (``000_…`` §一.1 and §三): full FT 16N (mixed + AdamW) or 10N (8-bit Adam);
    LoRA 2N + c_opt·N_lora with c_opt = 16 (AdamW) or 10 (8-bit); QLoRA 0.6N + c_opt·N_lora;
    N_lora = L·18·r·H. ZeRO (§二.4, as the ZeRO paper): stage 1 shards optimizer states and
    the FP32 master copy over D, stage 2 also gradients, stage 3 also weights. TP and PP divide
    every model state. Offload moves optimizer states (and with ``optimizer+params`` the
    weights) to host memory. No logits, buffers or allocator overhead: the reserve on the
    card's capacity (default 10 %, §一.3) stands for them.
    """
    acc = _Accumulator()
    notes: list[str] = []
    shard = _sharding(layout, dp)
    n_params = total_params(model)
    sb = state_bytes(workload.precision, workload.optimizer)

    def add_states(name_by_part: dict[str, str], n: float, per: StateBytes) -> None:
        for part, per_param in (
            ("weights", per.weights),
            ("gradients", per.gradients),
            ("optimizer", per.optimizer),
            ("master", per.master),
        ):
            sharding_part = "optimizer" if part == "master" else part
            acc.add(
                name_by_part[part],
                n * per_param / shard.divisor(sharding_part),
                on_host=shard.on_host(sharding_part),
            )

    if workload.method == "full":
        add_states(
            {"weights": "weights", "gradients": "gradients",
             "optimizer": "optimizer_states", "master": "master_weights"},
            n_params, sb,
        )
        notes.append(f"model states {sb.total:g} bytes/param ({workload.precision}, {workload.optimizer})")
    elif workload.method in ("lora", "qlora"):
        if workload.method == "lora":
            base_per_param = sb.weights
        else:
            base_per_param = overrides.base_bytes_per_param or SEED_QLORA_BASE_BYTES_PER_PARAM
        acc.add("weights", n_params * base_per_param / shard.divisor("weights"),
                on_host=shard.on_host("weights"))
        n_lora = overrides.lora_params
        if n_lora is None:
            n_lora = seed_lora_params(model, workload.lora_rank)
            notes.append(f"N_lora = L·18·r·H = {n_lora:,}")
        if overrides.lora_bytes_per_param is not None:
            # An opaque per-parameter figure: sharded only where everything is (ZeRO-3).
            acc.add("adapter_states", n_lora * overrides.lora_bytes_per_param / shard.divisor("weights"))
            notes.append(f"adapter states {overrides.lora_bytes_per_param:g} bytes/param (override)")
        else:
            name = "adapter_states"
            add_states({p: name for p in ("weights", "gradients", "optimizer", "master")}, n_lora, sb)
            notes.append(f"adapter states c_opt = {sb.total:g} bytes/param")
        notes.append(f"frozen base {base_per_param:g} bytes/param")
    else:  # inference
        base_per_param = overrides.base_bytes_per_param or sb.weights
        acc.add("weights", n_params * base_per_param / (layout.tp * layout.pp))
        b = DTYPE_BYTES[COMPUTE_DTYPE[workload.precision]]
        kv = workload.micro_batch * model.layers * 2 * workload.seq_len * model.hidden * b
        acc.add("kv_cache", kv / (layout.tp * layout.pp * layout.cp))
        notes.append("KV cache B·L·2·T·H·b (000_… §四)")
        return acc.breakdown(notes)

    if overrides.activation_bytes is not None:
        acc.add("activations", overrides.activation_bytes)
        notes.append("activations given as an override")
    else:
        k = overrides.k_factor or SEED_K_FACTOR[(layout.checkpointing, layout.attention)]
        acc.add("activations",
                seed_activation_bytes(model, workload, layout, grad_accum=grad_accum, k_factor=k))
        notes.append(f"activations B·T·H·L·K·b with K = {k:g}")
    notes.append("seed profile: no logits, buffers or allocator overhead (the reserve covers them)")
    return acc.breakdown(notes)
