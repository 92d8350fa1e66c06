"""The search space: what may vary, as arrays, and the metrics of every candidate.

A *class* is a candidate layout without its data-parallel degree: GPU type, relaxation tier
(method and sequence length), precision, micro-batch, TP, PP, CP, sequence parallelism, ZeRO
stage, offload, checkpointing and attention. A *column* is a class with a data-parallel degree
``dp``: a complete plan. Memory, time and cost of columns come from the same formulas as
``planner estimate`` (planner.memory.seed, planner.perf.timing), evaluated on numpy arrays.

Every class that cannot be used is counted with the reason (Calculon's habit), so an
infeasible request can say what binds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner import catalog
from planner.catalog.stacks import get_stack, stacks
from planner.core.arch import has_full_architecture
from planner.core.arrays import unique_rows
from planner.core.codes import FULL
from planner.core.errors import InputError
from planner.core.specs import DEFAULT_MAX_GPUS, GpuSpec, StackSpec
from planner.memory.breakdown import (
    ATTENTION,
    CHECKPOINTING,
    CODES,
    METHODS,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    STACK_MEMORY_RECIPE,
    STACK_WORKLOAD_RECIPE,
)
from planner.memory.estimate import usable_bytes
from planner.memory.profiles import memory_components
from planner.perf.flops import model_flops
from planner.perf.hardware import GpuPerf
from planner.perf.timing import (
    billed_gpus,
    default_global_batch,
    job_cost_usd,
    job_time_s,
    step_time_s,
)
from planner.scenario.legality import (
    offload_illegal,
    pp_gpu_fault,
    pp_legal,
    stack_runs,
    tp_gpu_fault,
    tp_model_fault,
)
from planner.scenario.resolve import ResolvedScenario, uneven_pp_allowed

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
        values = [getattr(st, name) for st in self.stacks]
        if name in CODES:
            values = [CODES[name].index(v) for v in values]
        return np.array(values, dtype=np.int64)[stack]

    def fused(self, stack: np.ndarray) -> np.ndarray:
        """Whether each row's element-wise work is fused (the time model's ``fused``): its stack's
        fused kernels, or torch.compile — the scenario's ``workload.compile`` where it sets it,
        else the stack's recipe."""
        compiled = (self.stack_recipe("compile", stack) if self.stack_sets("compile")
                    else np.full(np.shape(stack), int(self.rs.workload.compile)))
        return (self.stack_recipe("fused_kernels", stack).astype(bool) | compiled.astype(bool)).astype(np.int64)

    def stack_sets(self, key: str) -> bool:
        """The stack's recipe for a layout or workload ``key`` decides memory: the detailed
        profile, and the scenario does not set it."""
        part = self.rs.scenario.workload if key in STACK_WORKLOAD_RECIPE else self.rs.scenario.layout
        return self.rs.profile != "seed" and key not in part.model_fields_set


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
        while s >= MIN_RELAXED_SEQ_LEN:
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
    return default_global_batch(wl.method, wl.seq_len, wl.tokens)


@dataclass
class Classes:
    """Equal-length arrays, one entry per class (see :data:`CLASS_KEYS`)."""

    a: dict[str, np.ndarray]
    rejected: Counter = field(default_factory=Counter)

    def __len__(self) -> int:
        return len(self.a["gpu"])

    def take(self, idx: Any) -> Classes:
        return Classes({k: v[idx] for k, v in self.a.items()}, self.rejected)


def _gpu_max(req: SearchRequest, gpu: GpuSpec) -> int:
    limit = req.max_gpus
    if req.fleet is not None:
        limit = min(limit, req.fleet.get(gpu.id, 0))
    return limit


def first_stack(req: SearchRequest, gpu: GpuSpec, method: Any, **layout: Any) -> np.ndarray:
    """Index (into ``req.stacks``) of the first stack that runs each layout; -1 where none does."""
    shape = np.broadcast(*(np.asarray(v) for v in (method, *layout.values()))).shape
    chosen = np.full(shape, -1, dtype=np.int64)
    for i, st in enumerate(req.stacks):
        runs = stack_runs(st, vendor=gpu.vendor, quant_type=req.rs.workload.quant_type, method=method,
                          saved_modules=bool(req.rs.workload.modules_to_save), **layout)
        chosen = np.where((chosen < 0) & runs, i, chosen)
    return chosen


def build_classes(req: SearchRequest) -> Classes:
    """Every legal class, as arrays; illegal combinations are counted by reason."""
    rejected: Counter = Counter()
    parts: list[dict[str, np.ndarray]] = []
    for gi, gpu in enumerate(req.gpus):
        limit = _gpu_max(req, gpu)
        if limit < 1:
            rejected["fleet has none of this type"] += 1
            continue
        precisions = [p for p in req.lists["precision"] if p != "bf16" or gpu.supports_bf16]
        if not precisions:
            rejected[f"{gpu.id}: no BF16"] += 1
            continue
        tps, pps = _model_parallel_degrees(req, gpu, rejected)
        for tier in req.tiers:
            parts.append(_tier_classes(req, gi, tier, precisions, tps, pps, limit, rejected))
    if not parts:
        return Classes({k: np.zeros(0, dtype=np.int64) for k in CLASS_KEYS}, rejected)
    merged = {k: np.concatenate([p[k] for p in parts]).astype(np.int64) for k in CLASS_KEYS}
    return Classes(merged, rejected)


def _model_parallel_degrees(req: SearchRequest, gpu: GpuSpec, rejected: Counter) -> tuple[list, list]:
    """The TP and PP degrees the model and this card allow (scenario/legality.py's rules)."""
    tps = []
    for tp in req.lists["tp"]:
        fault = tp_gpu_fault(gpu, tp, pcie_model_parallel=req.pcie_model_parallel) or tp_model_fault(req.model, tp)
        if fault:
            rejected[f"tp {fault}"] += 1
        else:
            tps.append(tp)
    uneven = uneven_pp_allowed(req.rs.scenario)
    pps = [p for p in req.lists["pp"] if pp_legal(req.model, p, uneven=uneven)]
    rejected["pp does not divide the layers" if not uneven else "pp exceeds the layers"] += len(req.lists["pp"]) - len(pps)
    over_pcie = [p for p in pps if pp_gpu_fault(gpu, p, pcie_model_parallel=req.pcie_model_parallel)]
    rejected["pp over PCIe forbidden"] += len(over_pcie)
    pps = [p for p in pps if p not in over_pcie]
    return tps, pps


def _tier_classes(req: SearchRequest, gi: int, tier: Tier, precisions: list, tps: list, pps: list,
                  limit: int, rejected: Counter) -> dict[str, np.ndarray]:
    """The legal classes of one GPU type and relaxation tier: the grid of the remaining choices,
    less what breaks a rule (offload without ZeRO, too many GPUs, a ragged global batch) or what
    no stack runs."""
    model, gpu = req.model, req.gpus[gi]
    cps = [c for c in req.lists["cp"] if tier.seq_len % c == 0
           and (c == 1 or tier.seq_len >= MIN_SEQ_LEN_FOR_CP or len(req.lists["cp"]) == 1)]
    eps = [e for e in req.lists["ep"] if model.moe is None and e == 1
           or model.moe is not None and model.moe.experts % e == 0]
    # "flash" is any fused kernel that keeps no s×s matrix: FlashAttention-2 where the card has
    # it, PyTorch SDPA's memory-efficient kernel elsewhere (V100, T4): same memory.
    grid = np.meshgrid(
        np.array([PRECISIONS.index(p) for p in precisions]),
        np.array([OPTIMIZERS.index(o) for o in req.lists["optimizer"]]),
        np.array(req.lists["micro_batch"]),
        np.array(tps or [0]), np.array(pps or [0]), np.array(cps or [0]), np.array(eps or [0]),
        np.array(req.lists["zero"]),
        np.array([OFFLOADS.index(o) for o in req.lists["offload"]]),
        np.array([CHECKPOINTING.index(c) for c in req.lists["checkpointing"]]),
        np.array([ATTENTION.index(a) for a in req.lists["attention"]]),
        indexing="ij",
    )
    prec, opt, mb, tp, pp, cp, ep, zero, off, ckpt, attn = (g.ravel() for g in grid)
    n = len(prec)
    sp_pin = req.lists["sp"][0]
    sp = (tp > 1) if sp_pin is None else np.full(n, bool(sp_pin))
    method = METHODS.index(tier.method)
    stack = first_stack(req, gpu, method, tp=tp, pp=pp, cp=cp, ep=ep, sp=sp, zero=zero, offload=off,
                        checkpointing=ckpt)
    ok = (tp > 0) & (pp > 0) & (cp > 0) & (ep > 0)
    rules = {
        "offload needs ZeRO (params: ZeRO-3)": offload_illegal(zero, off),
        "tp·pp·cp·ep exceeds the GPU limit": tp * pp * cp * ep > limit,  # dp is a multiple of ep
        "micro-batch does not divide the global batch":
            (req.global_batch % np.maximum(mb, 1) != 0) if req.global_batch else np.zeros(n, dtype=bool),
        "no stack runs this combination": stack < 0,
    }
    for reason, broken in rules.items():
        rejected[reason] += int((ok & broken).sum())
        ok &= ~broken
    part = {
        "gpu": np.full(n, gi), "tier": np.full(n, tier.rank), "stack": stack, "method": np.full(n, method),
        "precision": prec, "optimizer": opt, "seq_len": np.full(n, tier.seq_len), "micro_batch": mb,
        "tp": tp, "pp": pp, "cp": cp, "ep": ep, "sp": sp.astype(np.int64), "zero": zero, "offload": off,
        "checkpointing": ckpt, "attention": attn,
    }
    return _with_fsdp2_stacks(req, gpu, {k: v[ok] for k, v in part.items()})


def _with_fsdp2_stacks(req: SearchRequest, gpu: GpuSpec, part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stack is a decision where it changes memory: a ZeRO-3 class whose first stack frees
    gathers FSDP1-style is offered again with the first FSDP2 stack that runs it (less reserved
    memory; ``StackSpec.fsdp_version``). Where both fit, the earlier row (the preferred stack)
    wins the tie."""
    versions = req.stack_recipe("fsdp_version", np.arange(len(req.stacks)))
    if not req.stack_sets("fsdp_version") or not len(part["zero"]) or not (versions == 2).any():
        return part
    wanted = (part["zero"] == 3) & (versions[part["stack"]] == 1)
    alt = np.full(len(wanted), -1, dtype=np.int64)
    layout = {k: part[k] for k in ("tp", "pp", "cp", "ep", "zero", "offload", "checkpointing")}
    for i in np.flatnonzero(versions == 2):
        runs = stack_runs(req.stacks[i], vendor=gpu.vendor, quant_type=req.rs.workload.quant_type,
                          method=part["method"], sp=part["sp"].astype(bool),
                          saved_modules=bool(req.rs.workload.modules_to_save), **layout)
        alt = np.where((alt < 0) & wanted & runs, i, alt)
    extra = alt >= 0
    if not extra.any():
        return part
    return {k: np.concatenate([v, alt[extra] if k == "stack" else v[extra]]) for k, v in part.items()}


@dataclass
class GpuTable:
    """Per GPU type arrays (indexed by the class's ``gpu``)."""

    usable_bytes: np.ndarray
    host_bytes_per_node: np.ndarray  # inf where unknown
    gpus_per_node: np.ndarray
    whole_node: np.ndarray
    limit: np.ndarray
    perf: GpuPerf
    perf_low: GpuPerf  # utilisation at the catalog's low prior
    perf_high: GpuPerf


def gpu_table(req: SearchRequest) -> GpuTable:
    reserve = req.rs.overrides.reserve

    def perf(which: str) -> GpuPerf:
        rows = []
        for g in req.gpus:
            util = {"mid": req.utilization, "low": g.utilization_low, "high": g.utilization_high}[which]
            rows.append(GpuPerf.of(g, util))
        return GpuPerf(*(np.array([getattr(r, f) for r in rows], dtype=float)
                         for f in GpuPerf.__dataclass_fields__))

    return GpuTable(
        usable_bytes=np.array([usable_bytes(g.memory_bytes, req.rs.profile, reserve) for g in req.gpus], dtype=np.int64),
        host_bytes_per_node=np.array([g.host_ram_budget_bytes for g in req.gpus]),
        gpus_per_node=np.array([g.gpus_per_node for g in req.gpus], dtype=np.int64),
        whole_node=np.array([g.whole_node_only for g in req.gpus]),
        limit=np.array([_gpu_max(req, g) for g in req.gpus], dtype=np.int64),
        perf=perf("mid"), perf_low=perf("low"), perf_high=perf("high"),
    )


def perf_rows(perf: GpuPerf, gpu_idx: np.ndarray) -> GpuPerf:
    return GpuPerf(*(np.asarray(getattr(perf, f))[gpu_idx] for f in GpuPerf.__dataclass_fields__))


def grad_accum_of(req: SearchRequest, micro_batch: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """Gradient-accumulation steps: global_batch / (micro_batch · dp), or the scenario's value."""
    if req.global_batch:
        return req.global_batch // (micro_batch * dp)
    return np.full(np.shape(dp), req.grad_accum, dtype=np.int64)


def memory_total(req: SearchRequest, c: dict[str, np.ndarray], dp: np.ndarray, ga: np.ndarray) -> tuple:
    """(bytes per GPU a plan must fit, host bytes per GPU), exactly as ``planner estimate`` sums them."""
    mem = memory_of(req, c, dp, ga)
    return mem["total"], mem["host"]


def memory_of(req: SearchRequest, c: dict[str, np.ndarray], dp: np.ndarray, ga: np.ndarray) -> dict[str, Any]:
    """``total`` and ``host`` bytes per GPU, and ``phases``: the bytes each phase of a step must
    fit (the search's one memory constraint per phase; the largest is ``total``).

    The seed profile is evaluated on the arrays directly. Other profiles evaluate each distinct
    layout once per search (the GPU type does not change memory, so rows repeat across types and
    across the bisection's probes): results are kept in ``req.memory_cache``."""
    x = {k: c[k] for k in CLASS_KEYS if k not in ("gpu", "tier", "stack") and (k != "ep" or req.model.moe is not None)}
    x.update(lora_rank=np.full(np.shape(dp), req.rs.workload.lora_rank), dp=dp, grad_accum=ga)
    # the stack's recipe where memory depends on it
    for key in (*STACK_MEMORY_RECIPE, *STACK_WORKLOAD_RECIPE):
        if req.stack_sets(key):
            x[key] = req.stack_recipe(key, c["stack"])

    def run(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        return memory_components(req.rs.profile, req.model, req.rs.overrides,
                                 base=(req.rs.workload, req.rs.layout), **arrays)

    if req.rs.profile == "seed":
        comps = run(x)
        shape = np.shape(dp)
        return {"total": np.broadcast_to(comps["total"], shape), "host": np.broadcast_to(comps["host"], shape),
                "phases": {k: np.broadcast_to(v, shape) for k, v in comps["phases"].items()}}
    keys = sorted(x)
    stacked = np.stack([np.broadcast_to(np.asarray(x[k], dtype=np.int64), np.shape(dp)) for k in keys], axis=1)
    uniq, inverse = unique_rows(stacked)
    rows = [tuple(r) for r in uniq.tolist()]
    cache = req.memory_cache
    missing = [i for i, r in enumerate(rows) if r not in cache]
    if missing:
        comps = run({k: uniq[missing, j] for j, k in enumerate(keys)})
        for n, i in enumerate(missing):
            cache[rows[i]] = (int(comps["total"][n]), int(comps["host"][n]),
                              {k: int(v[n]) for k, v in comps["phases"].items() if v[n] > 0})
    hits = [cache[r] for r in rows]
    inverse = inverse.reshape(-1)
    names = sorted({name for h in hits for name in h[2]})
    return {"total": np.array([h[0] for h in hits], dtype=np.int64)[inverse],
            "host": np.array([h[1] for h in hits], dtype=np.int64)[inverse],
            "phases": {n: np.array([h[2].get(n, 0) for h in hits], dtype=np.int64)[inverse] for n in names}}


def n_lora_of(rs: ResolvedScenario) -> float:
    """Trainable adapter parameters: the override, the exact count (detailed profile), or L·18·r·H."""
    from planner.core.arch import exact_lora_params, seed_lora_params

    wl, ov = rs.workload, rs.overrides
    if ov.lora_params is not None:
        return float(ov.lora_params)
    if rs.profile != "seed" and has_full_architecture(rs.model) and rs.model.moe is None:
        return float(exact_lora_params(rs.model, wl.lora_rank, wl.lora_target_set))
    return float(seed_lora_params(rs.model, wl.lora_rank))


def saved_modules_of(rs: ResolvedScenario) -> dict[str, float]:
    """``n_saved`` and ``saved_head``: parameters of the modules a LoRA run trains in full
    (``Workload.modules_to_save``) and of the LM head among them, as the time model takes them
    (0 without a full architecture to count them)."""
    from planner.memory.model_states import saved_module_params

    wl = rs.workload
    if not wl.modules_to_save or not has_full_architecture(rs.model):
        return {"n_saved": 0.0, "saved_head": 0.0}
    sizes = saved_module_params(rs.model, wl.modules_to_save)
    return {"n_saved": float(sum(sizes.values())), "saved_head": float(sizes.get("lm_head", 0))}


def adapter_traffic_of(rs: ResolvedScenario) -> dict[str, float]:
    """``adapter_bytes``: LoRA's side-path memory traffic per token as the time model takes it,
    from the adapted width (n_lora / rank) and the adapters' dtype (the time model charges it to
    LoRA and QLoRA columns only)."""
    from planner.perf.timing import adapter_bytes_per_token

    wl = rs.workload
    return {"adapter_bytes": adapter_bytes_per_token(n_lora_of(rs), wl.lora_rank, wl.adapter_dtype)}


def step_args(req: SearchRequest, c: dict[str, np.ndarray], *, dp: Any, grad_accum: Any,
              offload: Any = None, zero: Any = None, intra_only: bool = False) -> dict[str, Any]:
    """The time model's arguments for columns ``c`` (planner.perf.timing.step_time_s): the one
    builder of them for the search and its best-first bound. ``offload``/``zero`` replace the
    columns' own (the bound takes none); ``intra_only`` prices every group at the in-node link."""
    rs = req.rs
    x = dict(method=c["method"], checkpointing=c["checkpointing"],
             offload=c["offload"] if offload is None else offload, zero=c["zero"] if zero is None else zero,
             seq_len=c["seq_len"], micro_batch=c["micro_batch"] * rs.workload.sequences_per_sample,
             grad_accum=grad_accum, tp=c["tp"], pp=c["pp"],
             cp=c["cp"], ep=c["ep"], dp=dp, n_lora=np.where(c["method"] == FULL, 0.0, n_lora_of(rs)),
             **saved_modules_of(rs), **adapter_traffic_of(rs),
             attention=c["attention"], fp8=int(bool(rs.workload.fp8)), fused=req.fused(c["stack"]),
             vp=rs.layout.pp_virtual_stages if rs.layout.pp_schedule == "interleaved" else 1)
    if rs.workload.reference_forward:
        x["reference_forward"] = 1
    if intra_only:
        x["intra_only"] = True
    return x


def evaluate(req: SearchRequest, table: GpuTable, c: dict[str, np.ndarray], dp: np.ndarray,
             *, known_to_fit: bool = False, host_upper: np.ndarray | None = None,
             memory: bool = True) -> dict[str, np.ndarray]:
    """Every metric and constraint flag of columns (classes ``c`` at data-parallel degree ``dp``).

    ``known_to_fit``: the caller has established that every column fits in memory (the search
    starts each class at its smallest fitting degree); profiles without an array form then skip
    the per-column memory (marked −1, filled in for the few columns that become candidates) and
    take the offloaded host bytes from ``host_upper`` (their value at a smaller degree: host
    bytes per GPU never rise with dp), computing them exactly only where that bound fails the
    node's host RAM. ``memory=False`` skips memory altogether (−1; the flags say nothing fits)."""
    g = c["gpu"]
    ga = grad_accum_of(req, c["micro_batch"], dp)
    mp = c["tp"] * c["pp"] * c["cp"]
    gpus = dp * mp
    node = table.gpus_per_node[g]
    billed = billed_gpus(gpus, node, table.whole_node[g])
    host_exact = True
    if not memory:  # the caller fills memory in for the columns it keeps (planner.search.candidates)
        mem = host = np.full(np.shape(dp), -1, dtype=np.int64)
    elif known_to_fit and req.rs.profile != "seed":
        mem = np.full(np.shape(dp), -1, dtype=np.int64)
        host = np.zeros(np.shape(dp), dtype=np.int64) if host_upper is None else host_upper.copy()
        host_exact = False
        # The bound times a full node is within the node's RAM: every column passes as it is.
        over = np.flatnonzero(host * node > table.host_bytes_per_node[g])
        if len(over):
            host[over] = memory_total(req, {k: v[over] for k, v in c.items()}, dp[over], ga[over])[1]
    else:
        mem, host = memory_total(req, c, dp, ga)
    mf = model_flops(req.model)
    x = step_args(req, c, dp=dp, grad_accum=ga)
    out = {"dp": dp, "grad_accum": ga, "gpus": gpus, "billed_gpus": billed, "memory_bytes": mem,
           "host_bytes": host if host_exact else np.full(np.shape(dp), -1, dtype=np.int64)}
    sequences = x["micro_batch"]  # per micro-batch, as the time model counts them (a DPO pair: 2)
    tokens_per_step = sequences * dp * ga * c["seq_len"]
    for label, perf in (("", table.perf), ("_slow", table.perf_low), ("_fast", table.perf_high)):
        rows = perf_rows(perf, g)
        step = step_time_s(mf, rows, **x)
        out["step_s" + label] = step
        if req.tokens is not None:
            t = job_time_s(step, tokens=req.tokens, seq_len=c["seq_len"], micro_batch=sequences,
                           dp=dp, grad_accum=ga)
            out["time_s" + label] = t
            out["cost_usd" + label] = job_cost_usd(t, gpus=billed, price_usd_per_hour=rows.price_usd_per_hour)
    out["tokens_per_s"] = tokens_per_step / out["step_s"]
    out["hourly_usd"] = billed * perf_rows(table.perf, g).price_usd_per_hour
    out["fits"], out["host_ok"] = memory_flags(table, g, gpus, mem, host)
    out["ga_ok"] = ga >= 1
    return out


def host_bytes_per_node(table: GpuTable, g: np.ndarray, gpus: np.ndarray, host: np.ndarray) -> np.ndarray:
    """Offloaded bytes of the GPUs a plan puts on one node (each GPU's ``host`` bytes)."""
    return host * np.minimum(gpus, table.gpus_per_node[g])


def memory_flags(table: GpuTable, g: np.ndarray, gpus: np.ndarray, mem: np.ndarray,
                 host: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fits on the card, offloaded bytes of a node's GPUs fit its host RAM) of each column."""
    return (mem <= table.usable_bytes[g],
            host_bytes_per_node(table, g, gpus, host) <= table.host_bytes_per_node[g])
