"""One rule each for which layouts can run, shared by pinned layouts and the search."""

from __future__ import annotations

import numpy as np

from planner import catalog
from planner.memory.breakdown import CODES, OFFLOADS, decode, decode_class
from planner.scenario import legality
from planner.scenario.resolve import resolve
from planner.search.request import build_request
from planner.search.space import build_classes


def _illegal(verdicts) -> bool:
    return not bool(legality.legal(verdicts))


def tp_model_fault(model, tp):
    return legality.first_fault([legality.tp_heads(model, tp), legality.tp_kv_heads(model, tp)])


def tp_gpu_fault(gpu, tp, pcie_model_parallel=True):
    return legality.first_fault(legality.tp_rules(None, gpu, tp, pcie_model_parallel=pcie_model_parallel))


def test_offload_rule_on_names_and_arrays_agree():
    zero = np.repeat(np.arange(4), len(OFFLOADS))
    off = np.tile(np.arange(len(OFFLOADS)), 4)
    by_code = ~legality.legal(legality.offload_rules(zero, off))
    by_name = [_illegal(legality.offload_rules(int(z), OFFLOADS[o])) for z, o in zip(zero, off)]
    assert list(by_code) == by_name
    # ZeRO-Offload: optimizer offload from stage 1; parameters only when sharded (stage 3)
    assert [_illegal(legality.offload_rules(z, "optimizer")) for z in range(4)] == [True, False, False, False]
    assert [_illegal(legality.offload_rules(z, "optimizer+params")) for z in range(4)] == [True, True, True, False]


def test_tp_and_pp_rules():
    llama = catalog.get_model("llama-3.1-8b")  # 32 heads, 8 KV heads, 32 layers
    assert tp_model_fault(llama, 8) is None and tp_model_fault(llama, 16) is None  # KV heads replicated
    assert "attention heads" in tp_model_fault(llama, 3)
    h100, l4 = catalog.get_gpu("h100"), catalog.get_gpu("l4")
    assert tp_gpu_fault(h100, 8) is None and "node" in tp_gpu_fault(h100, 16)
    if l4.nvlink_domain == 1 and l4.gpus_per_node >= 2:
        assert tp_gpu_fault(l4, 2) is None and "PCIe" in tp_gpu_fault(l4, 2, pcie_model_parallel=False)
    assert list(legality.pp_even(llama, np.array([1, 2, 3, 4, 5, 8])).legal) == [True, True, False, True, False, True]


def test_the_search_rejects_what_a_pinned_layout_may_not_have():
    raw = {"model": "llama-3.1-8b", "workload": {"method": "lora"}, "search": {"tp": [1, 3], "gpu_types": ["h100"]}}
    rejected = build_classes(build_request(resolve(raw))).rejected
    assert rejected[f"tp {tp_model_fault(catalog.get_model('llama-3.1-8b'), 3)}"] > 0


def test_one_decoder_of_codes():
    for key, values in CODES.items():
        assert [decode(key, i) for i in range(len(values))] == list(values)
    assert decode("sp", 1) is True and decode("tp", 4.0) == 4
    assert decode_class({"method": 2, "offload": 1, "tp": 2})["method"] == "qlora"


# ---------------------------------------------------------------------------------------------
# Pipeline stages: one rule (scenario.legality.pp_fault / pp_legal) for estimate, plan and checker


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.errors import InputError
from planner.search.checker import check_plan


def _pinned(model: str, pp: int, uneven: bool, profile: str = "detailed") -> dict:
    return {"profile": profile, "model": model,
            "workload": {"method": "full", "seq_len": 4096, "micro_batch": 1, "global_batch": 128,
                         "tokens": 1.0e9},
            "layout": {"gpu": "h100", "tp": 8, "pp": pp, "zero": 1, "checkpointing": "full",
                       "uneven_pp": uneven},
            "search": {"max_gpus": 8 * pp * 16}}


def _estimate_accepts_pp(raw: dict) -> bool:
    try:
        resolve(raw)
    except InputError as exc:
        assert all("layout.pp" in p for p in exc.problems), exc.problems
        return False
    return True


@pytest.mark.parametrize("model,pp", [("llama-3.1-405b", 16), ("llama-3.1-70b", 12)])
def test_uneven_stages_that_ran_in_production_are_planned(model, pp):
    """Llama 3.1 405B (126 layers) on 16 stages and an 80-layer 70B on 12 ran with stages of
    unequal size (torchtitan; Megatron's first/last-stage layer counts). ``estimate`` takes them
    with ``uneven_pp: true``; ``plan`` must too, and the checker must accept every plan."""
    raw = _pinned(model, pp, True)
    assert _estimate_accepts_pp(raw)
    from planner import plan

    result = plan(raw)
    assert result.plans, result.explanation
    for p in result.plans:
        assert p.pp == pp
        assert check_plan(raw, p) == []
    # without uneven_pp both refuse the same layout
    assert not _estimate_accepts_pp(_pinned(model, pp, False))
    request = build_request(resolve({**_pinned(model, 1, False), "layout": {"gpu": "h100", "uneven_pp": False},
                                     "search": {"pp": [pp], "gpu_types": ["h100"]}}))
    layers = catalog.get_model(model).layers
    assert build_classes(request).rejected[f"pp does not divide the model's {layers} layers"] == 1


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "gemma-2-9b", "smollm2-135m"]),
       pp=st.integers(1, 48), uneven=st.booleans(), profile=st.sampled_from(["detailed", "seed"]))
def test_estimate_plan_and_the_rule_agree_on_every_pipeline_degree(model, pp, uneven, profile):
    spec = catalog.get_model(model)
    allowed = uneven and profile == "detailed"
    rules = legality.pp_rules(spec, None, pp, uneven=allowed)
    legal = legality.first_fault(rules) is None
    assert legal == bool(legality.legal(rules))
    raw = _pinned(model, pp, uneven, profile)
    raw["layout"]["tp"] = 1
    assert _estimate_accepts_pp(raw) == legal
    search = {**raw, "layout": {"gpu": "h100", "uneven_pp": uneven}, "search": {"pp": [pp], "gpu_types": ["h100"]}}
    rejected = build_classes(build_request(resolve(search))).rejected
    assert (sum(v for k, v in rejected.items() if k.startswith("pp ")) == 0) == legal


#: One card of each kind the rules tell apart: (NVLink domain, GPUs per node).
CARD_KINDS = sorted({(g.nvlink_domain, g.gpus_per_node): g.id for g in catalog.gpus()}.values())


@pytest.mark.parametrize("gpu", CARD_KINDS)
@pytest.mark.parametrize("tp, pp", [(t, p) for t in (1, 2, 4, 8, 16) for p in (1, 2, 4)])
@pytest.mark.parametrize("pcie", [True, False])
def test_estimate_plan_and_the_checker_agree_on_tp_and_pp_over_a_card(gpu, tp, pp, pcie):
    """One rule for TP and PP against a card's node and NVLink domain: a pinned layout that
    ``estimate`` refuses is exactly one the search rejects and the checker flags (an H100 NVL
    pair, NVLink domain 2, takes TP 2 but not TP 4 where PCIe is forbidden)."""
    from types import SimpleNamespace

    from planner.core.specs import Scenario
    from planner.search.checker import _layout_problems

    card = catalog.get_gpu(gpu)
    tp_fault = tp_gpu_fault(card, tp, pcie_model_parallel=pcie)
    pp_fault_ = legality.first_fault(legality.pp_rules(None, card, pp, pcie_model_parallel=pcie))
    base = {"model": "llama-3.1-8b", "workload": {"method": "full"}, "constraints": {"pcie_model_parallel": pcie}}
    # estimate: a pinned layout
    pinned = {**base, "layout": {"gpu": gpu, "tp": tp, "pp": pp, "zero": 0}}
    try:
        resolve(pinned)
        refused = []
    except InputError as exc:
        refused = [p for p in exc.problems if p.startswith(("layout.tp", "layout.pp"))]
    assert bool(refused) == bool(tp_fault or pp_fault_), refused
    # the search: the same degrees as its only choice
    request = build_request(resolve({**base, "search": {"tp": [tp], "pp": [pp], "gpu_types": [gpu]}}))
    rejected = build_classes(request).rejected
    assert (rejected[f"tp {tp_fault}"] > 0) == bool(tp_fault)
    assert (rejected[f"pp {pp_fault_}"] > 0) == bool(pp_fault_)
    # the checker, on a plan of that layout (memory and the rest taken as valid)
    plan = {"gpus": tp * pp, "dp": 1, "tp": tp, "pp": pp, "cp": 1, "ep": 1, "seq_len": 4096, "zero": 0,
            "offload": "none", "precision": "mixed"}
    sc = Scenario.model_validate(base)
    flagged = _layout_problems(sc, SimpleNamespace(gpu=card, model=catalog.get_model("llama-3.1-8b"), scenario=sc),
                               plan)
    assert any(m.startswith("tp ") for m in flagged) == bool(tp_fault), flagged
    assert any(m.startswith("pp ") for m in flagged) == bool(pp_fault_), flagged


# ---------------------------------------------------------------------------------------------
# Every layout rule at once: estimate, plan and the checker agree on random pinned layouts


_MODELS = ["llama-3.1-8b", "qwen2.5-7b", "gemma-2-9b", "smollm2-135m", "mixtral-8x7b", "qwen1.5-moe-a2.7b"]
_LAYOUT_KEYS = ("tp", "pp", "cp", "ep", "offload")


@settings(max_examples=100, deadline=None)
@given(model=st.sampled_from(_MODELS), gpu=st.sampled_from(CARD_KINDS), tp=st.sampled_from([1, 1, 2, 3, 4, 8, 16]),
       pp=st.sampled_from([1, 1, 2, 4, 3, 6, 12, 33]), cp=st.sampled_from([1, 1, 2, 3, 4]),
       ep=st.sampled_from([1, 2, 4, 8]), zero=st.integers(0, 3),
       offload=st.sampled_from(["none", "none", *OFFLOADS]), pcie=st.booleans(), uneven=st.booleans(),
       seq_len=st.sampled_from([4096, 6144]))
def test_estimate_plan_and_the_checker_agree_on_random_layouts(model, gpu, tp, pp, cp, ep, zero, offload, pcie,
                                                               uneven, seq_len):
    """A pinned layout ``estimate`` refuses for its TP, PP, CP, EP or offload is exactly one the
    search drops under a rule of planner.scenario.legality and one the checker flags; one it
    takes, neither drops (the rules' one home, applied to scalars and to the search's arrays)."""
    from types import SimpleNamespace

    from planner.core.specs import Scenario
    from planner.search.checker import _layout_problems

    spec, card = catalog.get_model(model), catalog.get_gpu(gpu)
    ep = ep if spec.moe is not None else 1  # the search offers EP only to mixture-of-experts models
    base = {"model": model, "workload": {"method": "full", "seq_len": seq_len, "micro_batch": 1},
            "constraints": {"pcie_model_parallel": pcie}}
    layout = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "zero": zero, "offload": offload}
    rules = [*legality.tp_rules(spec, card, tp, pcie_model_parallel=pcie),
             *legality.pp_rules(spec, card, pp, uneven=uneven, pcie_model_parallel=pcie),
             legality.cp_sequence(seq_len, cp), legality.ep_moe(spec, ep), legality.ep_experts(spec, ep),
             *legality.offload_rules(zero, offload)]
    legal = bool(legality.legal(rules))
    # estimate: the pinned layout (dp 8: every EP degree divides it)
    try:
        resolve({**base, "layout": {"gpu": gpu, "dp": 8, "uneven_pp": uneven, **layout}})
        refused = []
    except InputError as exc:
        refused = [p for p in exc.problems if p.startswith(tuple(f"layout.{k}:" for k in _LAYOUT_KEYS))]
    assert (not refused) == legal, (refused, rules)
    # the search: those values as its only choices
    search = {**base, "layout": {"gpu": gpu, "uneven_pp": uneven},
              "search": {"gpu_types": [gpu], **{k: [v] for k, v in layout.items()}}}
    rejected = build_classes(build_request(resolve(search))).rejected
    reasons = {legality.reason(v) for v in rules}
    assert (not any(rejected[r] for r in reasons)) == legal, dict(rejected)
    # the checker, on a plan of that layout
    sc = Scenario.model_validate({**base, "layout": {"uneven_pp": uneven}})
    plan = {**layout, "seq_len": seq_len, "precision": "mixed"}
    flagged = _layout_problems(sc, SimpleNamespace(gpu=card, model=spec, scenario=sc), plan)
    assert (not flagged) == legal, flagged


@pytest.mark.parametrize("dp", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_expert_parallelism_within_dp_is_one_rule_for_estimate_and_the_checker(dp, ep):
    """EP splits the experts inside the data-parallel group: a pinned layout whose ep does not
    divide dp is refused by ``estimate`` and flagged by the checker, with the same words, and one
    whose ep divides dp passes both (legality.ep_dp, the rule the search's lattice applies too)."""
    from planner.search.checker import _count_problems

    legal = bool(legality.ep_dp(dp, ep).legal)
    assert legal == (dp % ep == 0)
    raw = {"model": "mixtral-8x7b", "workload": {"method": "full", "seq_len": 4096, "micro_batch": 1},
           "layout": {"gpu": "h100-sxm-80gb", "dp": dp, "ep": ep, "zero": 3}}
    try:
        resolve(raw)
        refused = []
    except InputError as exc:
        refused = [p for p in exc.problems if p.startswith("layout.ep:")]
    assert (not refused) == legal, refused
    card = catalog.get_gpu("h100-sxm-80gb")
    flagged = [p for p in _count_problems(card, {"gpus": dp, "dp": dp, "tp": 1, "pp": 1, "cp": 1, "ep": ep})
               if p.startswith("ep ")]
    assert (not flagged) == legal, flagged
    if not legal:
        assert refused[0].removeprefix("layout.ep: ") == flagged[0].removeprefix("ep ")
