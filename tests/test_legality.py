"""One rule each for which layouts can run, shared by pinned layouts and the search."""

from __future__ import annotations

import numpy as np

from planner import catalog
from planner.memory.breakdown import CODES, OFFLOADS, decode, decode_class
from planner.scenario.legality import offload_illegal, pp_divides, tp_gpu_fault, tp_model_fault
from planner.scenario.resolve import resolve
from planner.search.space import build_classes, build_request


def test_offload_rule_on_names_and_arrays_agree():
    zero = np.repeat(np.arange(4), len(OFFLOADS))
    off = np.tile(np.arange(len(OFFLOADS)), 4)
    by_code = offload_illegal(zero, off)
    by_name = [bool(offload_illegal(int(z), OFFLOADS[o])) for z, o in zip(zero, off)]
    assert list(by_code) == by_name
    # ZeRO-Offload: optimizer offload from stage 1; parameters only when sharded (stage 3)
    assert [bool(offload_illegal(z, "optimizer")) for z in range(4)] == [True, False, False, False]
    assert [bool(offload_illegal(z, "optimizer+params")) for z in range(4)] == [True, True, True, False]


def test_tp_and_pp_rules():
    llama = catalog.get_model("llama-3.1-8b")  # 32 heads, 8 KV heads, 32 layers
    assert tp_model_fault(llama, 8) is None and tp_model_fault(llama, 16) is None  # KV heads replicated
    assert "attention heads" in tp_model_fault(llama, 3)
    h100, l4 = catalog.get_gpu("h100"), catalog.get_gpu("l4")
    assert tp_gpu_fault(h100, 8) is None and "node" in tp_gpu_fault(h100, 16)
    if l4.nvlink_domain == 1 and l4.gpus_per_node >= 2:
        assert tp_gpu_fault(l4, 2) is None and "PCIe" in tp_gpu_fault(l4, 2, pcie_model_parallel=False)
    assert list(pp_divides(llama, np.array([1, 2, 3, 4, 5, 8]))) == [True, True, False, True, False, True]


def test_the_search_rejects_what_a_pinned_layout_may_not_have():
    raw = {"model": "llama-3.1-8b", "workload": {"method": "lora"}, "search": {"tp": [1, 3], "gpu_types": ["h100"]}}
    rejected = build_classes(build_request(resolve(raw))).rejected
    assert rejected[f"tp {tp_model_fault(catalog.get_model('llama-3.1-8b'), 3)}"] > 0


def test_one_decoder_of_codes():
    for key, values in CODES.items():
        assert [decode(key, i) for i in range(len(values))] == list(values)
    assert decode("sp", 1) is True and decode("tp", 4.0) == 4
    assert decode_class({"method": 2, "offload": 1, "tp": 2})["method"] == "qlora"
