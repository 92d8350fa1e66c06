"""Mixture of experts: expert parallelism in the memory rules, the validation and the search."""

from __future__ import annotations

import pytest

import planner
from planner import catalog
from planner.core.arch import expert_params, param_counts
from planner.core.errors import InputError

BASE = {"profile": "seed", "model": "mixtral-8x7b", "workload": {"method": "full", "seq_len": 2048},
        "overrides": {"activation_bytes": 0}}


def test_expert_params_of_mixtral():
    """Mixtral 8x7B: 32 layers × 8 experts × 3·4096·14336 = 45.1B of its 46.7B parameters."""
    spec = catalog.get_model("mixtral-8x7b")
    assert expert_params(spec) == 32 * 8 * 3 * 4096 * 14336
    assert expert_params(catalog.get_model("llama-3-8b")) == 0
    assert expert_params(spec) < param_counts(spec).total


def test_ep_divides_unsharded_experts_exactly():
    n = param_counts(catalog.get_model("mixtral-8x7b")).total
    n_exp = expert_params(catalog.get_model("mixtral-8x7b"))
    ep1 = planner.estimate(BASE, gpus=8, dp=8, ep=1, zero=0)
    ep8 = planner.estimate(BASE, gpus=8, dp=8, ep=8, zero=0)
    # Weights 2 bytes each: (N − N_exp + N_exp/8)·2 per GPU without ZeRO.
    assert ep8.components["weights"] == pytest.approx((n - n_exp + n_exp / 8) * 2, abs=1)
    assert ep1.components["weights"] == pytest.approx(n * 2, abs=1)


def test_ep_does_not_change_zero3_sharded_states():
    a = planner.estimate(BASE, gpus=8, dp=8, ep=1, zero=3)
    b = planner.estimate(BASE, gpus=8, dp=8, ep=4, zero=3)
    assert a.total_bytes == pytest.approx(b.total_bytes, abs=8)


@pytest.mark.parametrize("change, needle", [
    ({"model": "llama-3-8b"}, "layout.ep: 2 needs a mixture-of-experts model"),
    ({"ep": 3, "dp": 3, "gpus": 3}, "does not divide the model's 8 experts"),
    ({"ep": 4, "dp": 2, "gpus": 2}, "layout.ep: 4 does not divide dp = 2"),
])
def test_ep_validation(change, needle):
    options = {"ep": 2, "dp": 2, "gpus": 2}
    options.update(change)
    with pytest.raises(InputError, match=needle):
        planner.estimate(BASE, **options)


def test_search_uses_ep_only_within_dp():
    raw = {**BASE, "workload": {"method": "full", "tokens": 1e8},
           "search": {"gpu_types": ["h100"], "max_gpus": 32, "ep": [1, 2, 4, 8]}, "top": 10,
           "objective": "cost"}
    raw.pop("overrides")
    plans = planner.plan(raw).plans
    assert plans
    for p in plans:
        assert p.dp % p.ep == 0 and 8 % p.ep == 0


def test_detailed_profile_shards_experts_too():
    """The detailed profile applies the same rule: without ZeRO, ep = 8 leaves an eighth of the
    routed experts' 16-bit weights on each GPU; with ZeRO-3 over 8 ranks ep changes nothing."""
    spec = catalog.get_model("mixtral-8x7b")
    n_exp = expert_params(spec)
    base = {"profile": "detailed", "model": "mixtral-8x7b",
            "workload": {"method": "full", "precision": "bf16", "seq_len": 512}}
    ep1 = planner.estimate(base, gpus=8, dp=8, ep=1, zero=0)
    ep8 = planner.estimate(base, gpus=8, dp=8, ep=8, zero=0)
    assert ep1.components["weights"] - ep8.components["weights"] == pytest.approx(n_exp * 2 * 7 / 8, rel=1e-6)
    z1 = planner.estimate(base, gpus=8, dp=8, ep=1, zero=3)
    z8 = planner.estimate(base, gpus=8, dp=8, ep=8, zero=3)
    assert z1.components["weights"] == pytest.approx(z8.components["weights"], rel=1e-9)


def test_hidden_matrices_hold_every_decoder_weight_but_the_routers():
    """The one list of hidden matrices (Muon's FLOPs and its workspace both read it) holds every
    attention and MLP weight: all of Llama-3-8B's, and all of Mixtral 8x7B's but its routers
    (32 layers × 4096 × 8), each routed expert counted once per layer."""
    from planner.core.arch import hidden_matrices

    llama = catalog.get_model("llama-3-8b")
    counts = param_counts(llama)
    assert sum(c * a * b for c, a, b in hidden_matrices(llama)) == counts.attention + counts.mlp
    mixtral = catalog.get_model("mixtral-8x7b")
    counts = param_counts(mixtral)
    matrices = hidden_matrices(mixtral)
    assert counts.attention + counts.mlp - sum(c * a * b for c, a, b in matrices) == 32 * 4096 * 8
    assert (32 * 8, 14336, 4096) in matrices
