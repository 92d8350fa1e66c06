"""Every shipped scenario loads, validates and estimates; each says what it answers and how to run it."""

from __future__ import annotations

import pytest
from conftest import ROOT

from planner.memory.estimate import estimate_resolved
from planner.scenario.resolve import load_scenarios

SHIPPED = sorted((ROOT / "scenarios").glob("*.yaml"))


def test_there_are_shipped_scenarios():
    assert len(SHIPPED) >= 4


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_scenario_loads_and_estimates(path):
    text = path.read_text()
    assert text.startswith("#"), "a scenario opens with a comment saying what it answers"
    assert f"planner estimate scenarios/{path.name}" in text or "planner plan" in text
    for rs in load_scenarios(path):
        est = estimate_resolved(rs)
        assert est.total_bytes > 0 and (est.fits is not None or rs.gpu is None)  # a plan picks the GPU


def test_seed_cases_file_verdicts():
    """000_… §五: A no, B yes, C yes, D yes."""
    verdicts = {rs.name: estimate_resolved(rs).fits for rs in load_scenarios(ROOT / "scenarios" / "seed-000-cases.yaml")}
    assert verdicts == {"case-a-full-1gpu": False, "case-b-full-zero3-8gpu": True,
                        "case-c-lora-4090": True, "case-d-qlora-12gb": True}


def test_70b_full_needs_offload_on_one_node():
    """catalog-facts §13: full FT of a 70B model without offload needs more than 8× H100."""
    by_name = {rs.name: estimate_resolved(rs) for rs in load_scenarios(ROOT / "scenarios" / "full-llama-3-70b-8xh100.yaml")}
    assert by_name["zero3-no-offload"].fits is False
    assert by_name["zero3-offload"].fits is True
    assert by_name["zero3-offload"].host_bytes > 0


def test_default_profile_falls_back_to_seed_for_dims_only_models():
    """A model given only as params_b/layers/hidden cannot be modelled layer by layer: without an
    explicit profile the documents' rules are used, and the answer says so; asked for explicitly,
    the detailed profile is an input error."""
    import planner
    from planner.core.errors import InputError

    dims = {"params_b": 7, "layers": 32, "hidden": 4096}
    est = planner.estimate({"model": dims, "workload": {"micro_batch": 4},
                            "layout": {"checkpointing": "full", "attention": "flash"}})
    assert est.profile == "seed" and any("seed profile" in w for w in est.warnings)
    assert est.total_bytes == pytest.approx(118.44e9, rel=0.005)  # case A of 000_… §五
    with pytest.raises(InputError, match="profile: 'detailed' needs the full architecture"):
        planner.estimate({"profile": "detailed", "model": dims})


def test_uneven_pipeline_stages_only_when_asked():
    """pp must divide the layers, unless the run splits them unevenly (layout.uneven_pp, detailed
    profile): then the heaviest stage (ceil(126/8) = 16 layers of Llama 3.1 405B) is sized and the
    answer warns."""
    import planner
    from planner.core.errors import InputError

    raw = {"model": "llama-3.1-405b", "workload": {"method": "full", "precision": "bf16"},
           "layout": {"gpu": "h100", "gpus": 8, "pp": 8, "zero": 0}}
    with pytest.raises(InputError, match="layout.pp: 8 does not divide the model's 126 layers"):
        planner.estimate(raw)
    est = planner.estimate(raw, uneven_pp=True)
    assert any("heaviest stage holds 16" in w for w in est.warnings)
    with pytest.raises(InputError, match="layout.pp"):
        planner.estimate({**raw, "profile": "seed"}, uneven_pp=True)
