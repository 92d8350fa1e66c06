"""Which layouts can run at all: the one home of the layout rules, for a pinned layout (a
scenario, ``estimate``), the search's arrays of candidates (``plan``) and the plan checker alike.

Each rule is one function that returns a :class:`Verdict`: whether the layout is legal (a bool,
or a bool array where the values are arrays: the search applies a rule to 10^5 candidates at
once) and what is wrong where it is not. The message reads after the field and its value:
``layout.tp: 3`` + ``does not divide the model's 32 attention heads`` (:func:`problems`), and the
search counts the candidates each rule drops under ``tp does not divide …`` (:func:`reason`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from planner.core.codes import CHECKPOINTING, METHODS, OFFLOADS
from planner.core.entries import GpuSpec, ModelSpec, StackSpec

#: Offload codes: the schema's values in order (none, optimizer, optimizer+params).
OFFLOAD_CODES, METHOD_CODES, CHECKPOINT_CODES = OFFLOADS, METHODS, CHECKPOINTING  # planner.core.codes
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)


class Verdict(NamedTuple):
    """One rule applied to a layout (or to arrays of layouts)."""

    key: str  # the layout field the rule is about ("tp", "pp", "offload"…)
    legal: Any  # bool, or a bool array broadcast over the values
    why: str  # what is wrong where it is not legal; reads after "<key> <value> "

    def fault(self) -> str | None:
        """The message for one layout (scalar values): None where legal."""
        return None if bool(self.legal) else self.why


# --- tensor parallelism ----------------------------------------------------------------------

def tp_heads(model: ModelSpec, tp: Any) -> Verdict:
    """TP splits the attention heads."""
    heads = model.heads
    legal = True if heads is None else np.asarray(heads) % np.asarray(tp) == 0
    return Verdict("tp", legal, f"does not divide the model's {heads} attention heads")


def tp_kv_heads(model: ModelSpec, tp: Any) -> Verdict:
    """TP splits the KV heads, or replicates them when it is a multiple of their count (MLA's
    latent KV is not split by heads)."""
    kv, tp = model.kv_heads_eff, np.asarray(tp)
    legal = True if kv is None or model.mla is not None else (kv % tp == 0) | (tp % kv == 0)
    return Verdict("tp", legal, f"does not divide the model's {kv} KV heads")


def tp_node(gpu: GpuSpec, tp: Any) -> Verdict:
    """TP stays within a node."""
    return Verdict("tp", np.asarray(tp) <= gpu.gpus_per_node,
                   f"exceeds the {gpu.gpus_per_node} GPUs of a {gpu.name} node")


def tp_pcie(gpu: GpuSpec, tp: Any, *, pcie_model_parallel: bool = True) -> Verdict:
    """TP past the card's NVLink domain runs over PCIe: only where the scenario allows it."""
    tp = np.asarray(tp)
    over_pcie = (tp > 1) & (tp > gpu.nvlink_domain)
    return Verdict("tp", ~over_pcie | pcie_model_parallel,
                   "runs over PCIe, which constraints.pcie_model_parallel: false forbids")


# --- pipeline parallelism --------------------------------------------------------------------

def pp_pcie(gpu: GpuSpec, pp: Any, *, pcie_model_parallel: bool = True) -> Verdict:
    """Pipeline stages on a card with no NVLink (``nvlink_domain`` 1) pass activations over PCIe:
    only where the scenario allows model parallelism over PCIe."""
    over_pcie = (np.asarray(pp) > 1) & (gpu.nvlink_domain == 1)
    return Verdict("pp", ~over_pcie | pcie_model_parallel,
                   "runs over PCIe, which constraints.pcie_model_parallel: false forbids")


def pp_layers(model: ModelSpec, pp: Any) -> Verdict:
    """Every stage holds a layer."""
    return Verdict("pp", np.asarray(pp) <= model.layers, f"exceeds the model's {model.layers} layers")


def pp_even(model: ModelSpec, pp: Any, *, uneven: bool = False) -> Verdict:
    """The stages are equal (pp divides the layers) unless ``uneven`` stages (unequal layer
    counts, as torchtitan and Megatron's ``--decoder-first/last-pipeline-num-layers`` run them)
    are allowed."""
    divides = np.asarray(model.layers) % np.maximum(np.asarray(pp), 1) == 0
    return Verdict("pp", divides | uneven, f"does not divide the model's {model.layers} layers")


# --- context and expert parallelism ----------------------------------------------------------

def cp_sequence(seq_len: Any, cp: Any) -> Verdict:
    """Context parallelism splits the sequence evenly."""
    return Verdict("cp", np.asarray(seq_len) % np.asarray(cp) == 0,
                   f"does not divide the {seq_len}-token sequence")


def ep_moe(model: ModelSpec, ep: Any) -> Verdict:
    """Expert parallelism needs a mixture-of-experts model."""
    return Verdict("ep", (np.asarray(ep) <= 1) | (model.moe is not None), "needs a mixture-of-experts model")


def ep_experts(model: ModelSpec, ep: Any) -> Verdict:
    """Expert parallelism divides the experts."""
    ep = np.asarray(ep)
    experts = model.moe.experts if model.moe is not None else None
    legal = (ep <= 1) | (True if experts is None else experts % ep == 0)
    return Verdict("ep", legal, f"does not divide the model's {experts} experts")


def ep_dp(dp: Any, ep: Any, *, tp: Any = 1, cp: Any = 1, etp: Any = None) -> Verdict:
    """Where expert parallelism's ranks come from. ``etp`` unset: the experts are split within the
    data-parallel group, ep divides dp (each tensor-parallel rank keeps its share of every local
    expert; Megatron-Core's traditional ``tp-cp-ep-dp-pp`` groups, DeepSpeed-MoE, torchtitan with
    its expert TP equal to tp). ``etp`` set (Megatron-Core's MoE parallel folding, its
    ``--expert-tensor-parallel-size``): the expert layers regroup the same dp·cp·tp GPUs of a
    stage as etp × ep × expert-dp, so ep·etp divides dp·cp·tp (:func:`expert_dp_step`)."""
    ep = np.maximum(np.asarray(ep), 1)
    if etp is None:
        return Verdict("ep", (ep <= 1) | (np.asarray(dp) % ep == 0),
                       f"does not divide dp = {dp} (experts are split within dp; set layout.etp for "
                       "Megatron-Core's MoE parallel folding, where ep·etp divides dp·cp·tp)")
    group = np.asarray(dp) * np.asarray(cp) * np.asarray(tp)
    return Verdict("ep", group % (ep * np.asarray(etp)) == 0,
                   f"times etp = {etp} does not divide dp·cp·tp = {dp}·{cp}·{tp} (MoE parallel folding)")


def expert_dp_step(tp: Any, cp: Any, ep: Any, etp: Any = None) -> Any:
    """The smallest data-parallel degree, and the step between legal ones, that :func:`ep_dp`
    admits: ep (``etp`` unset), else lcm(ep·etp, cp·tp) / (cp·tp)."""
    ep = np.maximum(np.asarray(ep), 1)
    if etp is None:
        return ep
    group, experts = np.asarray(cp) * np.asarray(tp), ep * np.asarray(etp)
    return experts // np.gcd(experts, group)


def etp_rules(model: ModelSpec, etp: Any) -> list[Verdict]:
    """An expert tensor parallelism of its own needs a mixture-of-experts model, and splits each
    expert's FFN."""
    etp = np.asarray(etp)
    moe = model.moe
    return [Verdict("etp", moe is not None, "needs a mixture-of-experts model"),
            Verdict("etp", True if moe is None else moe.expert_ffn % etp == 0,
                    f"does not divide the experts' FFN width of {moe.expert_ffn if moe else 0}")]


# --- sharding and offload --------------------------------------------------------------------

def _offload_code(offload: Any) -> Any:
    return OFFLOAD_CODES.index(offload) if isinstance(offload, str) else np.asarray(offload)


def offload_sharded(zero: Any, offload: Any) -> Verdict:
    """Offload needs ZeRO/FSDP (``offload`` as a name or a code)."""
    return Verdict("offload", (_offload_code(offload) == 0) | (np.asarray(zero) != 0),
                   "needs ZeRO/FSDP (layout.zero ≥ 1)")


def offload_params(zero: Any, offload: Any) -> Verdict:
    """Offloading parameters needs them sharded (ZeRO-3)."""
    return Verdict("offload", (_offload_code(offload) != 2) | (np.asarray(zero) == 3),
                   "needs layout.zero: 3 (parameters must be sharded)")


# --- the rules of a layout, together ----------------------------------------------------------

def tp_rules(model: ModelSpec | None, gpu: GpuSpec | None, tp: Any, *,
             pcie_model_parallel: bool = True) -> list[Verdict]:
    """TP against the card (node, NVLink) and the model (heads, KV heads), in that order."""
    out = [tp_node(gpu, tp), tp_pcie(gpu, tp, pcie_model_parallel=pcie_model_parallel)] if gpu else []
    return out + ([tp_heads(model, tp), tp_kv_heads(model, tp)] if model is not None else [])


def pp_rules(model: ModelSpec | None, gpu: GpuSpec | None, pp: Any, *, uneven: bool = False,
             pcie_model_parallel: bool = True) -> list[Verdict]:
    """PP against the model (layers, equal stages) and the card (PCIe)."""
    out = [pp_layers(model, pp), pp_even(model, pp, uneven=uneven)] if model is not None else []
    return out + ([pp_pcie(gpu, pp, pcie_model_parallel=pcie_model_parallel)] if gpu else [])


def offload_rules(zero: Any, offload: Any) -> list[Verdict]:
    return [offload_sharded(zero, offload), offload_params(zero, offload)]


def legal(verdicts: Iterable[Verdict]) -> Any:
    """Where every rule holds (arrays broadcast)."""
    ok: Any = True
    for v in verdicts:
        ok = ok & np.asarray(v.legal)
    return ok


def first_broken(verdicts: Iterable[Verdict]) -> Verdict | None:
    """The first rule one layout breaks, or None."""
    return next((v for v in verdicts if not bool(v.legal)), None)


def first_fault(verdicts: Iterable[Verdict]) -> str | None:
    """The first broken rule's message for one layout, or None."""
    broken = first_broken(verdicts)
    return None if broken is None else broken.why


def problems(verdicts: Iterable[Verdict], values: dict[str, Any], *, prefix: str = "layout.",
             sep: str = ": ") -> list[str]:
    """One line per broken rule of one layout: ``layout.tp: 3 does not divide …`` (names quoted).
    The checker writes them as ``tp 3 does not divide …`` (``prefix=""``, ``sep=" "``)."""
    out = []
    for v in verdicts:
        if not bool(v.legal):
            value = values[v.key]
            shown = repr(value) if isinstance(value, str) else value
            out.append(f"{prefix}{v.key}{sep}{shown} {v.why}")
    return out


def reason(v: Verdict) -> str:
    """The search's name for the candidates a rule drops: ``tp does not divide …``."""
    return f"{v.key} {v.why}"


def stack_runs(stack: StackSpec, *, vendor: str, quant_type: str, method: Any, tp: Any, pp: Any, cp: Any,
               ep: Any, sp: Any, zero: Any, offload: Any, checkpointing: Any,
               saved_modules: bool = False, algorithm: str = "sft", served: bool = False,
               etp: int | None = None) -> Any:
    """Whether ``stack`` runs each layout (arrays broadcast; categorical values as codes into the
    schema's value lists, or names). The one rule of the search, the checker and the estimate.
    ``etp``: an expert tensor parallelism of its own (MoE parallel folding), which the stack must
    run.
    ``saved_modules``: the workload trains whole modules beside LoRA (``modules_to_save``);
    ``algorithm``: the workload's objective, which the stack must run; ``served``: GRPO's engine on
    GPUs of its own, a placement the stack must offer."""
    def code(values: tuple[str, ...], x: Any) -> Any:
        return values.index(x) if isinstance(x, str) else np.asarray(x)

    def among(values: tuple, x: Any, allowed: list) -> Any:
        table = np.zeros(len(values), dtype=bool)  # a lookup, not np.isin: the search calls this
        table[[values.index(v) for v in allowed]] = True  # on grids of 10^5 layouts per stack
        return table[code(values, x)]

    m = code(METHOD_CODES, method)
    qlora = m == METHOD_CODES.index("qlora")
    placement = "served" if served else "colocated"
    generates = algorithm != "grpo" or placement in stack.generation_placements
    ok = among(METHOD_CODES, m, stack.methods) & np.asarray(vendor in stack.vendors and algorithm in stack.algorithms
                                                            and generates)
    ok &= ~qlora | (np.asarray(quant_type in stack.quant_types and vendor in stack.qlora_vendors)
                    & among(ZERO_STAGES, zero, stack.zero_with_qlora))
    ok &= among(ZERO_STAGES, zero, stack.zero) & among(OFFLOAD_CODES, offload, stack.offload)
    ok &= among(CHECKPOINT_CODES, checkpointing, stack.checkpointing)
    ok &= (np.asarray(tp) == 1) | among(METHOD_CODES, m, stack.tp_methods)
    ok &= (np.asarray(pp) == 1) | (among(METHOD_CODES, m, stack.pp_methods)
                                   & among(ZERO_STAGES, zero, stack.zero_with_pp))
    ok &= (np.asarray(cp) == 1) | stack.cp
    ok &= (np.asarray(ep) == 1) | stack.ep
    ok &= np.asarray(etp is None or stack.etp)
    ok &= ~np.asarray(sp, dtype=bool) | stack.sp
    lora_like = m != METHOD_CODES.index("full")
    ok &= ~(lora_like & bool(saved_modules)) | stack.modules_to_save
    return ok
