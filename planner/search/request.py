"""What a plan request may choose from: the scenario read into lists of candidate values, the
allowed GPU types and stacks, and the relaxation tiers (method, then sequence length) in the
documents' order. planner.search.space turns a request into classes of layouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner import catalog
from planner.catalog.stacks import get_stack, stacks
from planner.core.entries import GpuSpec, StackSpec
from planner.core.errors import InputError
from planner.core.values import DEFAULT_MAX_GPUS
from planner.memory.breakdown import (
    ATTENTION,
    CHECKPOINTING,
    CODES,
    OFFLOADS,
)
from planner.perf.arguments import kernel_vectors_of, selective_is_op
from planner.perf.timing import default_global_batch
from planner.scenario.resolve import ResolvedScenario

#: Candidate values when the scenario gives no list.
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
DEFAULT_TP = (1, 2, 4, 8)
DEFAULT_PP = (1, 2, 4, 8, 16)
DEFAULT_CP = (1, 2, 4, 8)
#: Expert-parallel degrees tried for mixture-of-experts models (those dividing the experts).
DEFAULT_EP = (1, 2, 4, 8, 16, 32, 64)
#: Context parallelism is only considered from this sequence length up (shorter sequences gain
#: nothing from splitting; Llama 3 used CP from 8K up, catalog-facts §9/§13).
MIN_SEQ_LEN_FOR_CP = 8192
#: Relaxing the sequence length halves it, down to this floor.
MIN_RELAXED_SEQ_LEN = 256
#: The cheaper-method ladder of 000_… §六: Full → LoRA → QLoRA.
METHOD_LADDER = ("full", "lora", "qlora")
CLASS_KEYS = (
    "gpu", "tier", "stack", "method", "precision", "optimizer", "seq_len", "micro_batch", "tp", "pp", "cp", "ep",
    "sp", "zero", "offload", "checkpointing", "attention",
)


@dataclass(frozen=True)
class Tier:
    """A relaxation step: what is trained, in the documents' order (rank 0 = as asked)."""

    rank: int
    method: str
    seq_len: int
    relaxations: tuple[str, ...]


@dataclass
class SearchRequest:
    """A plan scenario, resolved: everything the search needs, nothing it must look up."""

    rs: ResolvedScenario
    gpus: list[GpuSpec]
    tiers: list[Tier]
    lists: dict[str, tuple]
    max_gpus: int
    fleet: dict[str, int] | None
    budget_usd: float | None
    deadline_s: float | None
    objective: str
    top: int
    distinct: str
    utilization: float | None
    tokens: float | None
    global_batch: int | None
    grad_accum: int
    dp_pin: int | None
    gpus_pin: int | None
    pcie_model_parallel: bool
    #: Stacks a plan may name, in order of preference (the first that runs a class names it).
    stacks: list[StackSpec] = field(default_factory=list)
    #: Memory of layouts already evaluated (profiles without an array form), by layout row.
    memory_cache: dict = field(default_factory=dict)

    @property
    def model(self):
        return self.rs.model

    def stack_recipe(self, name: str, stack: np.ndarray) -> np.ndarray:
        """A recipe field of each row's stack (``fsdp_version``, ``fused_kernels``; a coded one such
        as ``zero_impl`` as its code), by stack index."""
        values = [getattr(st.recipe, name) for st in self.stacks]
        if name in CODES:
            values = [CODES[name].index(v) for v in values]
        return np.array(values, dtype=np.int64)[stack]

    def fused(self, stack: np.ndarray) -> np.ndarray:
        """Whether each row's element-wise work is fused (the time model's ``fused``): its stack's
        fused kernels, or torch.compile — the scenario's ``recipe.compile`` where it sets it,
        else the stack's recipe."""
        compiled = (self.stack_recipe("compile", stack) if self.stack_sets("compile")
                    else np.full(np.shape(stack), int(self.rs.recipe.compile)))
        return (self.stack_recipe("fused_kernels", stack).astype(bool) | compiled.astype(bool)).astype(np.int64)

    def kernel_vectors(self, stack: np.ndarray) -> np.ndarray:
        """The element-wise traffic each row's fused kernels save (the time model's
        ``kernel_vectors``): the scenario's ``recipe.kernels`` where it sets it or under the seed
        profile (:meth:`stack_sets`), else its stack's, as a plan pins it for the checker."""
        if not self.stack_sets("kernels"):
            return np.full(np.shape(stack), kernel_vectors_of(self.rs, self.rs.recipe.kernels))
        values = np.array([kernel_vectors_of(self.rs, st.recipe.kernels) for st in self.stacks])
        return values[stack]

    def selective_op(self, stack: np.ndarray) -> np.ndarray:
        """Whether each row's selective checkpointing is op-level (the time model's
        ``selective_op``): the scenario's ``recipe.selective`` where it sets it, else the stack's
        (Megatron's is its core-attention recomputation)."""
        if "selective" in self.rs.scenario.recipe.model_fields_set:
            return np.full(np.shape(stack), int(selective_is_op(self.rs.recipe.selective)))
        return selective_is_op(self.stack_recipe("selective", stack))

    def stack_sets(self, key: str) -> bool:
        """The stack's recipe for ``key`` decides memory: the detailed profile, and the
        scenario's ``recipe:`` does not set it."""
        return self.rs.profile != "seed" and key not in self.rs.scenario.recipe.model_fields_set


def build_tiers(rs: ResolvedScenario) -> list[Tier]:
    """As asked first; then, if allowed, cheaper methods; only last, shorter sequences."""
    wl = rs.workload
    methods = [wl.method]
    search_methods = rs.scenario.search.method
    if search_methods:
        methods = list(dict.fromkeys([wl.method, *search_methods]))
    if "method" in wl.allow_relax and wl.method in METHOD_LADDER:
        start = METHOD_LADDER.index(wl.method)
        methods = list(dict.fromkeys([*methods, *METHOD_LADDER[start + 1:]]))
    seqs = [wl.seq_len]
    if rs.scenario.search.seq_len:
        seqs = list(dict.fromkeys([wl.seq_len, *rs.scenario.search.seq_len]))
    if "seq_len" in wl.allow_relax:
        s = wl.seq_len // 2
        # GRPO's sequence is prompt + completion: a shorter one still leaves a prompt
        shortest = max(MIN_RELAXED_SEQ_LEN, wl.completion_len + 1 if wl.generates else 0)
        while s >= shortest:
            seqs.append(s)
            s //= 2
    tiers: list[Tier] = []
    for si, seq in enumerate(seqs):
        for mi, method in enumerate(methods):
            relax = []
            if mi:
                relax.append(f"method: {wl.method} → {method}")
            if si:
                relax.append(f"seq_len: {wl.seq_len} → {seq}")
            tiers.append(Tier(len(tiers), method, seq, tuple(relax)))
    return tiers


def _gpu_choices(sc, problems: list[str]) -> tuple[list[GpuSpec], dict[str, int] | None]:
    """The GPU types to search (pinned, listed, or the catalog's) and the fleet, by catalog id."""
    gpu_names = sc.search.gpu_types
    if gpu_names is not None and not gpu_names:
        problems.append("search.gpu_types: empty: name at least one GPU type, or leave it out for all")
    if "gpu" in sc.layout.model_fields_set and sc.layout.gpu:
        if gpu_names and not _same_gpu(sc.layout.gpu, gpu_names):
            problems.append(f"layout.gpu: {sc.layout.gpu} is not among search.gpu_types ({', '.join(gpu_names)})")
        gpu_names = [sc.layout.gpu]
    fleet = None
    if sc.constraints.fleet:
        fleet = {}
        for name, count in sc.constraints.fleet.items():
            try:
                fleet[catalog.get_gpu(name).id] = count
            except catalog.UnknownName as exc:
                problems.append(f"constraints.fleet: {exc}")
    gpus: list[GpuSpec] = []
    for name in gpu_names or [g.id for g in catalog.gpus()]:
        try:
            gpus.append(catalog.get_gpu(name))
        except catalog.UnknownName as exc:
            problems.append(f"search.gpu_types: {exc}")
    if fleet is not None:
        if fleet and gpus and not any(g.id in fleet for g in gpus):
            problems.append(f"constraints.fleet: none of its GPU types ({', '.join(fleet)}) is among the "
                            f"allowed ones ({', '.join(g.id for g in gpus)})")
        gpus = [g for g in gpus if g.id in fleet]
    return gpus, fleet


def _same_gpu(name: str, names: list[str]) -> bool:
    """Whether ``name`` is one of ``names`` (as catalog GPUs; unknown names compare as typed)."""
    def ident(n: str) -> str:
        try:
            return catalog.get_gpu(n).id
        except catalog.UnknownName:
            return n
    return ident(name) in {ident(n) for n in names}


def _stack_choices(sc, problems: list[str]) -> list[StackSpec]:
    """The stacks a plan may name, in the scenario's order of preference (else the catalog's)."""
    out: list[StackSpec] = []
    for name in sc.search.stacks or [st.id for st in stacks()]:
        try:
            out.append(get_stack(name))
        except catalog.UnknownName as exc:
            problems.append(f"search.stacks: {exc}")
    return out


def build_request(rs: ResolvedScenario) -> SearchRequest:
    """Candidate lists from the scenario's ``search`` block and ``layout`` pins."""
    sc, wl, model = rs.scenario, rs.workload, rs.model
    problems: list[str] = []
    objective = sc.objective or ("cost" if wl.tokens is not None else "gpus")
    if wl.method == "inference":
        problems.append("workload.method: plan searches training layouts; use `planner estimate` for inference")
    if objective in ("cost", "time") and wl.tokens is None:
        problems.append(f"workload.tokens: required for objective {objective!r} (the job's token budget)")
    if (sc.constraints.budget_usd or sc.constraints.deadline_hours) and wl.tokens is None:
        problems.append("workload.tokens: required with a budget or a deadline")
    gpus, fleet = _gpu_choices(sc, problems)
    stack_list = _stack_choices(sc, problems)
    if problems:
        raise InputError(problems)
    pinned = sc.layout.model_fields_set

    def pick(key: str, search_value, default) -> tuple:
        if key in pinned:
            return (getattr(sc.layout, key),)
        return tuple(search_value) if search_value else tuple(default)

    s = sc.search
    precisions = (wl.precision,) if not s.precision else tuple(dict.fromkeys(s.precision))
    lists = {
        "precision": precisions,
        "optimizer": tuple(dict.fromkeys(s.optimizer)) if s.optimizer else (wl.optimizer,),
        "micro_batch": tuple(s.micro_batch) if s.micro_batch else DEFAULT_MICRO_BATCHES,
        "tp": pick("tp", s.tp, DEFAULT_TP),
        "pp": pick("pp", s.pp, DEFAULT_PP),
        "cp": pick("cp", s.cp, DEFAULT_CP),
        "ep": pick("ep", s.ep, DEFAULT_EP) if model.moe is not None else (1,),
        "zero": pick("zero", s.zero, (0, 1, 2, 3)),
        "offload": pick("offload", s.offload, OFFLOADS),
        "checkpointing": pick("checkpointing", s.checkpointing, CHECKPOINTING),
        "attention": pick("attention", s.attention, ATTENTION),
        "sp": (sc.layout.sp,) if "sp" in pinned else (None,),
    }
    max_gpus = s.max_gpus or DEFAULT_MAX_GPUS
    dp_pin = sc.layout.dp if "dp" in pinned else None
    gpus_pin = sc.layout.gpus if "gpus" in pinned else None
    if gpus_pin:
        max_gpus = min(max_gpus, gpus_pin)
    return SearchRequest(
        rs=rs, gpus=gpus, tiers=build_tiers(rs), lists=lists, max_gpus=max_gpus, fleet=fleet,
        budget_usd=sc.constraints.budget_usd,
        deadline_s=None if sc.constraints.deadline_hours is None else sc.constraints.deadline_hours * 3600,
        objective=objective, top=sc.top, distinct=s.distinct, utilization=s.utilization,
        tokens=wl.tokens, global_batch=wl.global_batch or _default_global_batch(rs), grad_accum=wl.grad_accum or 1,
        dp_pin=dp_pin, gpus_pin=gpus_pin, pcie_model_parallel=sc.constraints.pcie_model_parallel,
        stacks=stack_list,
    )


def _default_global_batch(rs: ResolvedScenario) -> int | None:
    """planner.perf.timing.default_global_batch where the scenario fixes neither the batch
    (global_batch, grad_accum) nor the GPU count (layout.gpus, layout.dp). A fleet bounds the
    count without fixing it: its plans train with the same default batch as any other (without
    one, each plan's batch would be whatever micro-batch · dp it happened to pick)."""
    wl, pinned = rs.workload, rs.scenario.layout.model_fields_set
    if wl.grad_accum is not None or {"gpus", "dp"} & pinned or wl.method not in METHOD_LADDER:
        return None
    return default_global_batch(wl.method, wl.seq_len, wl.tokens, wl.num_generations if wl.generates else 1)


def gpu_limit(req: SearchRequest, gpu: GpuSpec) -> int:
    """The most GPUs of this type a plan may train on: max_gpus, and the fleet's count, less the
    GPUs a GRPO engine served apart takes (of the same type)."""
    limit = req.max_gpus
    if req.fleet is not None:
        limit = min(limit, req.fleet.get(gpu.id, 0))
    return limit - req.rs.layout.generation_gpus
