"""The independent checker runs on every plan `planner plan` returns, not only in tests."""

from __future__ import annotations

from planner.search import answer
from planner.search.answer import checked, plan_raw

RAW = {"model": "llama-3.1-8b", "workload": {"method": "lora", "seq_len": 2048, "global_batch": 16,
                                              "tokens": 1e8},
       "search": {"gpu_types": ["a100-80gb", "h100"]}, "top": 3}


def test_every_returned_plan_passes_the_checker_and_none_is_dropped():
    result = plan_raw(RAW)
    assert result.plans and result.checker_rejected == []


def test_a_plan_with_a_wrong_number_is_dropped_and_reported():
    plans = plan_raw(RAW).plans
    bad = plans[0].model_copy(update={"time_s": plans[0].time_s * 0.5})
    kept, rejected = checked(RAW, [bad, *plans[1:]])
    assert bad not in kept and len(kept) == len(plans) - 1
    assert any("time" in line for line in rejected)


def test_plan_raw_drops_what_the_checker_rejects(monkeypatch):
    real = answer.check_plan
    calls = []

    def reject_first(raw, plan):
        calls.append(plan)
        return ["memory: invented problem"] if len(calls) == 1 else real(raw, plan)

    monkeypatch.setattr(answer, "check_plan", reject_first)
    result = plan_raw(RAW)
    assert len(calls) == 3 and len(result.plans) == 2
    assert result.checker_rejected and "invented problem" in result.checker_rejected[0]


def test_one_host_ram_rule():
    from planner import catalog
    from planner.core.values import HOST_RAM_USABLE_SHARE

    h100 = catalog.get_gpu("h100")
    assert h100.host_ram_budget_bytes == h100.host_ram_per_node_gib * 2**30 * HOST_RAM_USABLE_SHARE
    assert h100.model_copy(update={"host_ram_per_node_gib": None}).host_ram_budget_bytes == float("inf")
