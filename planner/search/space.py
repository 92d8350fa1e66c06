"""The search space: every legal class of layouts, as arrays.

A *class* is a candidate layout without its data-parallel degree: GPU type, relaxation tier
(method and sequence length), precision, micro-batch, TP, PP, CP, sequence parallelism, ZeRO
stage, offload, checkpointing and attention. A *column* is a class with a data-parallel degree
``dp``: a complete plan, whose memory, time and cost planner.search.evaluate computes.

Every class that cannot be used is counted with the reason (Calculon's habit), so an
infeasible request can say what binds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.core.entries import GpuSpec
from planner.memory.breakdown import (
    ATTENTION,
    CHECKPOINTING,
    METHODS,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
)
from planner.scenario import legality
from planner.scenario.legality import stack_runs
from planner.scenario.resolve import uneven_pp_allowed
from planner.search.request import CLASS_KEYS, MIN_SEQ_LEN_FOR_CP, SearchRequest, Tier, gpu_limit


@dataclass
class Classes:
    """Equal-length arrays, one entry per class (see :data:`CLASS_KEYS`)."""

    a: dict[str, np.ndarray]
    rejected: Counter = field(default_factory=Counter)

    def __len__(self) -> int:
        return len(self.a["gpu"])

    def take(self, idx: Any) -> Classes:
        return Classes({k: v[idx] for k, v in self.a.items()}, self.rejected)


def first_stack(req: SearchRequest, gpu: GpuSpec, method: Any, **layout: Any) -> np.ndarray:
    """Index (into ``req.stacks``) of the first stack that runs each layout; -1 where none does."""
    shape = np.broadcast(*(np.asarray(v) for v in (method, *layout.values()))).shape
    chosen = np.full(shape, -1, dtype=np.int64)
    for i, st in enumerate(req.stacks):
        runs = stack_runs(st, vendor=gpu.vendor, quant_type=req.rs.workload.quant_type, method=method,
                          saved_modules=bool(req.rs.workload.modules_to_save),
                          algorithm=req.rs.workload.algorithm, served=req.rs.layout.generation_gpus > 0,
                          etp=req.rs.layout.etp, **layout)
        chosen = np.where((chosen < 0) & runs, i, chosen)
    return chosen


def build_classes(req: SearchRequest) -> Classes:
    """Every legal class, as arrays; illegal combinations are counted by reason."""
    rejected: Counter = Counter()
    parts: list[dict[str, np.ndarray]] = []
    for gi, gpu in enumerate(req.gpus):
        limit = gpu_limit(req, gpu)
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
    pcie = req.pcie_model_parallel
    tps = _legal_values(req.lists["tp"], lambda tp: legality.tp_rules(req.model, gpu, tp, pcie_model_parallel=pcie),
                        rejected)
    uneven = uneven_pp_allowed(req.rs.scenario)
    pps = _legal_values(req.lists["pp"], lambda pp: legality.pp_rules(req.model, gpu, pp, uneven=uneven,
                                                                      pcie_model_parallel=pcie), rejected)
    return tps, pps


def _legal_values(values: Sequence[Any], rules_of: Any, rejected: Counter) -> list:
    """The values every rule of ``rules_of(value)`` allows; each other one counted under the first
    rule it breaks."""
    out = []
    for value in values:
        fault = legality.first_broken(rules_of(value))
        if fault is None:
            out.append(value)
        else:
            rejected[legality.reason(fault)] += 1
    return out


def _tier_classes(req: SearchRequest, gi: int, tier: Tier, precisions: list, tps: list, pps: list,
                  limit: int, rejected: Counter) -> dict[str, np.ndarray]:
    """The legal classes of one GPU type and relaxation tier: the grid of the remaining choices,
    less what breaks a rule (offload without ZeRO, too many GPUs, a ragged global batch) or what
    no stack runs."""
    model, gpu = req.model, req.gpus[gi]
    cps = [c for c in _legal_values(req.lists["cp"], lambda c: [legality.cp_sequence(tier.seq_len, c)], rejected)
           if (c == 1 or tier.seq_len >= MIN_SEQ_LEN_FOR_CP or len(req.lists["cp"]) == 1)]
    eps = _legal_values(req.lists["ep"], lambda e: [legality.ep_moe(model, e), legality.ep_experts(model, e)], rejected)
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
        **{legality.reason(v): ~v.legal for v in legality.offload_rules(zero, off)},
        # dp is a multiple of ep (of lcm(ep·etp, cp·tp) / (cp·tp) under MoE parallel folding)
        "tp·pp·cp·ep exceeds the GPU limit (ep divides dp, unless layout.etp folds it into cp·tp)":
            tp * pp * cp * legality.expert_dp_step(tp, cp, ep, req.rs.layout.etp) > limit,
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
    memory; ``StackRecipe.fsdp_version``); a GRPO class whose first stack keeps its colocated
    engine awake through the step, again with the first stack whose engine sleeps meanwhile
    (``StackRecipe.generation_sleep``: the step has the card, the states at rest must fit beside
    the engine). Where both fit, the earlier row (the preferred stack) wins the tie."""
    if req.stack_sets("fsdp_version") and len(part["zero"]):
        versions = req.stack_recipe("fsdp_version", np.arange(len(req.stacks)))
        part = _offer_again(req, gpu, part, versions == 2, part["zero"] == 3)
    wl = req.rs.workload
    if wl.generates and not req.rs.layout.generation_gpus and req.stack_sets("generation_sleep"):
        sleeps = req.stack_recipe("generation_sleep", np.arange(len(req.stacks))) == 1
        part = _offer_again(req, gpu, part, sleeps, np.ones(len(part["zero"]), dtype=bool))
    return part


def _offer_again(req: SearchRequest, gpu: GpuSpec, part: dict[str, np.ndarray], better: np.ndarray,
                 wanted: np.ndarray) -> dict[str, np.ndarray]:
    """``part``'s ``wanted`` rows whose stack is not ``better`` (a flag per stack), offered again
    with the first ``better`` stack that runs them."""
    if not len(wanted) or not better.any():
        return part
    wanted = wanted & ~better[part["stack"]]
    alt = np.full(len(wanted), -1, dtype=np.int64)
    layout = {k: part[k] for k in ("tp", "pp", "cp", "ep", "zero", "offload", "checkpointing")}
    for i in np.flatnonzero(better):
        runs = stack_runs(req.stacks[i], vendor=gpu.vendor, quant_type=req.rs.workload.quant_type,
                          method=part["method"], sp=part["sp"].astype(bool),
                          saved_modules=bool(req.rs.workload.modules_to_save),
                          algorithm=req.rs.workload.algorithm, served=req.rs.layout.generation_gpus > 0,
                          etp=req.rs.layout.etp, **layout)
        alt = np.where((alt < 0) & wanted & runs, i, alt)
    extra = alt >= 0
    if not extra.any():
        return part
    return {k: np.concatenate([v, alt[extra] if k == "stack" else v[extra]]) for k, v in part.items()}
