"""The search: each CP-SAT constraint alone, the published anchors, relaxations, realism."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import planner
from planner.cli.main import app
from planner.search.checker import check_plan
from planner.search.cpsat import Limits, PlanModel, Space, top_k

# ---------------------------------------------------------------------------------------------
# Each constraint on a tiny model, three ways: trivially feasible; a forbidden plan pinned is
# infeasible; an allowed one pinned is feasible (style.md, after the CP-SAT primer). Three plans:
# plan 0 = 1× GPU type 0, plan 1 = 4× type 0, plan 2 = 8× type 1 (shapes 0, 1, 2 at dp 1, 4, 8).

def space(**over) -> Space:
    base = {
        "mp": np.array([1, 1, 1]),
        "micro_batch": np.array([1, 2, 4]),
        "k_shape": np.array([0, 1, 2]), "k_dp": np.array([1, 4, 8]),
        "k_phases": {"backward": np.array([50, 70, 90]), "optimizer step": np.array([40, 60, 80])},
        "c_gpu": np.array([0, 0, 1]), "c_k": np.array([0, 1, 2]), "c_rank": np.array([0, 1, 2]), "c_group": np.array([0, 1, 2]),
        "c_grad_accum": np.array([8, 1, 0]), "c_host_node": np.array([0, 0, 0]),
        "c_cost": np.array([100, 200, 300]), "c_time": np.array([1000, 500, 250]),
    }
    base.update(over)
    return Space(**base)


def limits(**over) -> Limits:
    base = {"usable_bytes": np.array([100, 100]), "gpu_limit": np.array([64, 64]), "gpus_per_node": np.array([8, 8]),
                "host_bytes_per_node": np.array([-1, -1]), "priced": np.array([True, True]), "max_gpus": 64}
    base.update(over)
    return Limits(**base)


CONSTRAINTS = [
    # name, limits, space changes, a plan they forbid, a plan they allow (None: none is allowed)
    ("memory", {"usable_bytes": np.array([40, 100])}, {}, 0, 2),
    ("memory, a later phase", {"usable_bytes": np.array([100, 85])}, {}, 2, 1),
    ("budget", {"budget_units": 99}, {}, 0, None),
    ("budget", {"budget_units": 250}, {}, 2, 1),
    ("deadline", {"deadline_ms": 999}, {}, 0, 1),
    ("host RAM", {"host_bytes_per_node": np.array([10, 10])}, {"c_host_node": np.array([20, 0, 0])}, 0, 2),
    ("price known", {"priced": np.array([False, True]), "need_price": True}, {}, 0, 2),
]


@pytest.mark.parametrize("name, lim, over, forbidden, allowed", CONSTRAINTS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CONSTRAINTS)])
def test_each_constraint(name, lim, over, forbidden, allowed):
    sp = space(**over)
    # Trivially feasible without the constraint: the first-ranked plan wins.
    assert PlanModel(sp, limits()).solve(5) == ("optimal", 0)
    # The forbidden plan, pinned, is infeasible.
    model = PlanModel(sp, limits(**lim))
    model.pin(forbidden)
    assert model.solve(5)[0] == "infeasible"
    if allowed is None:
        assert PlanModel(sp, limits(**lim)).solve(5)[0] == "infeasible"
    else:
        model = PlanModel(sp, limits(**lim))
        model.pin(allowed)
        assert model.solve(5) == ("optimal", allowed)


def test_no_good_cuts_give_distinct_groups_in_order():
    status, picked = top_k(space(c_group=np.array([0, 0, 1])), limits(), k=3, time_limit_s=5)
    assert status == "optimal" and picked == [0, 2]  # plan 1 shares plan 0's group


def test_rank_decides_not_plan_order():
    assert PlanModel(space(c_rank=np.array([2, 0, 1])), limits()).solve(5)[1] == 1


def test_a_hint_never_changes_the_answer():
    """Hinting a worse plan (or one that does not fit) leaves the optimum where it was."""
    for hinted in (2, 0):
        model = PlanModel(space(), limits(usable_bytes=np.array([40, 100])))
        model.hint(hinted)
        assert model.solve(5) == ("optimal", 2)


@pytest.mark.parametrize("lim, over, what", [
    ({"max_gpus": 4}, {}, "max_gpus"),  # plan 2: 8 GPUs
    ({"gpu_limit": np.array([0, 8])}, {}, "type's limit"),  # plans 0 and 1 on a type the fleet lacks
    # mb · dp · ga: 1 · 1 · 8 = 8; 2 · 4 · 1 = 8; 4 · 8 · 0 (32 sequences, no accumulation step)
    ({"global_batch": 8}, {}, "global batch"),
    ({"global_batch": 8}, {"c_grad_accum": np.array([8, 1, 1])}, "global batch"),  # 4 · 8 · 1 ≠ 8
])
def test_what_the_lattice_guarantees_is_checked_not_modelled(lim, over, what):
    """GPU count, the fleet and the global batch hold for every plan the lattice generates, so as
    CP-SAT rows they could never bind: the model checks them on its tables and refuses tables
    that break them (a bug upstream), instead of carrying rows."""
    with pytest.raises(ValueError, match=what):
        PlanModel(space(**over), limits(**lim))
    # tables that keep the guarantees build, and the first-ranked plan wins
    assert PlanModel(space(c_grad_accum=np.array([8, 1, 1]), micro_batch=np.array([1, 2, 1])),
                     limits(global_batch=8)).solve(5) == ("optimal", 0)


def test_the_lattice_guarantees_hold_on_real_searches():
    """On searches under a GPU limit, a fleet and a global batch, every plan of the region keeps
    them (the model would refuse the tables otherwise) and the chosen plans pass the checker."""
    from planner.search.answer import plan_raw

    for extra in ({"search": {"max_gpus": 4, "gpu_types": ["h100", "a100-80gb"]}},
                  {"constraints": {"fleet": {"a100-80gb": 2, "l40s": 8}}}):
        raw = {"model": "llama-3.1-8b", "workload": {"method": "full", "seq_len": 2048, "global_batch": 24,
                                                     "tokens": 1e8}, "top": 3, **extra}
        result = plan_raw(raw)
        assert result.plans and result.checker_rejected == []
        for p in result.plans:
            assert p.micro_batch * p.dp * p.grad_accum == 24 and p.gpus <= 8


# ---------------------------------------------------------------------------------------------
# Anchors from published recipes (catalog-facts §13)

def test_nvidia_lora_70b_recipe_is_feasible():
    """NeMo: LoRA Llama-3 70B, seq 4096, 8× H100, TP2 PP4, mbs 1, gbs 32."""
    raw = {"profile": "seed", "model": "llama-3-70b",
           "workload": {"method": "lora", "seq_len": 4096, "global_batch": 32, "tokens": 1e8},
           "layout": {"gpu": "h100", "gpus": 8, "tp": 2, "pp": 4, "zero": 0},
           "search": {"micro_batch": [1]}, "objective": "cost"}
    result = planner.plan(raw)
    assert result.plans and result.plans[0].tp == 2 and result.plans[0].pp == 4
    assert check_plan(raw, result.plans[0]) == []


def test_full_70b_needs_more_than_8_h100_without_offload():
    """Full SFT of a 70B model: NVIDIA uses 32 H100; without offload 8 do not suffice."""
    base = {"profile": "seed", "model": "llama-3-70b", "workload": {"method": "full", "seq_len": 4096},
            "search": {"gpu_types": ["h100"], "offload": ["none"]}, "objective": "gpus"}
    fewest = planner.plan(base).plans[0]
    assert fewest.gpus > 8 and fewest.offload == "none"
    offload = planner.plan({**base, "search": {"gpu_types": ["h100"], "max_gpus": 8}})
    assert offload.plans and offload.plans[0].gpus <= 8 and offload.plans[0].offload != "none"


def test_8b_full_ft_time_anchor():
    """catalog-facts §9: Llama-3-8B full FT on 1B tokens, 8× H100 at 40 % MFU: ≈ 4.2 h by 6N alone,
    ≈ 4.5 h with the attention term at sequence 2048. The fitted time model (its own utilisation
    is hardware-FLOPs utilisation of the tensor-core work, not MFU) lands near that anchor: 3.8 h,
    0.84 of it (45 % MFU by 6N alone), inside 0.8–1.3 of it."""
    raw = {"profile": "seed", "model": "llama-3-8b",
           "workload": {"method": "full", "seq_len": 2048, "tokens": 1e9, "global_batch": 256},
           "layout": {"gpu": "h100", "gpus": 8, "tp": 1, "pp": 1, "zero": 3, "checkpointing": "none"},
           "search": {"micro_batch": [4]}, "objective": "time"}
    p = planner.plan(raw).plans[0]
    flops_only_h = 1e9 * (6 * 8.03e9 + 12 * 32 * 2048 * 4096) / (8 * 989.4e12 * 0.40) / 3600
    assert flops_only_h == pytest.approx(4.5, abs=0.05)
    assert flops_only_h * 0.8 <= p.time_s / 3600 <= flops_only_h * 1.3


# ---------------------------------------------------------------------------------------------
# The documents' order and relaxations

def test_relaxation_follows_documents_order():
    """13B full FT on one RTX 4090 cannot fit; allowed to relax, LoRA comes before QLoRA and
    before a shorter sequence, and the plan says what it relaxed."""
    raw = {"profile": "seed", "model": "llama-2-13b",
           "workload": {"method": "full", "seq_len": 2048, "allow_relax": ["method", "seq_len"]},
           "search": {"gpu_types": ["rtx-4090"], "max_gpus": 1}, "objective": "gpus"}
    result = planner.plan(raw)
    assert result.plans[0].relaxations[0].startswith("method: full → ")
    assert all(not r.startswith("seq_len") for r in result.plans[0].relaxations)
    steps = [s["step"] for s in result.explanation["steps"]]
    assert steps[0] == "as asked" and steps[1].startswith("1.") and steps[2].startswith("2.")
    for plan in result.plans:
        assert check_plan(raw, plan) == []


def test_no_relaxation_without_permission():
    raw = {"profile": "seed", "model": "llama-2-13b", "workload": {"method": "full"},
           "search": {"gpu_types": ["rtx-4090"], "max_gpus": 1}, "objective": "gpus"}
    result = planner.plan(raw)
    assert result.status == "infeasible" and not result.plans
    ex = result.explanation
    assert "memory" in ex["binding"] and ex["suggestions"]
    assert any(s.startswith("allow_relax") for s in ex["suggestions"])


# ---------------------------------------------------------------------------------------------
# Hardware realism

def test_v100_gets_no_bf16_and_no_flashattention2():
    """No BF16 on a V100; "flash" there is PyTorch SDPA's memory-efficient kernel (same memory,
    no FlashAttention-2), and the plan's estimate says so."""
    raw = {"profile": "seed", "model": "qwen2.5-0.5b",
           "workload": {"method": "full", "precision": "bf16", "tokens": 1e8},
           "search": {"gpu_types": ["v100-16gb"], "precision": ["bf16", "fp16"]},
           "objective": "cost"}
    plans = planner.plan(raw).plans
    assert plans and all(p.gpu == "v100-16gb" for p in plans)
    for p in plans:
        if p.gpu.startswith("v100"):
            assert p.precision != "bf16"
            if p.attention == "flash":
                assert any("memory-efficient kernel" in w for w in p.memory["warnings"])


def test_pinned_gpu_count_is_exact():
    """A layout key pins that decision: layout.gpus: 8 means eight GPUs, not at most eight."""
    raw = {"profile": "seed", "model": "llama-3-8b", "workload": {"method": "lora", "tokens": 1e8},
           "layout": {"gpu": "a100-80gb", "gpus": 8}, "objective": "cost", "top": 5}
    plans = planner.plan(raw).plans
    assert plans and all(p.gpus == 8 and p.gpu == "a100-sxm-80gb" for p in plans)
    for p in plans:
        assert check_plan(raw, p) == []


def test_pcie_model_parallel_can_be_forbidden():
    raw = {"profile": "seed", "model": "llama-2-13b", "workload": {"method": "lora", "tokens": 1e8},
           "search": {"gpu_types": ["rtx-4090"], "max_gpus": 4}, "objective": "gpus",
           "constraints": {"pcie_model_parallel": False}}
    for p in planner.plan(raw).plans:
        assert p.tp == 1 and p.pp == 1


def test_tp_never_crosses_a_node():
    raw = {"profile": "seed", "model": "llama-3.1-405b", "workload": {"method": "qlora", "tokens": 1e8},
           "search": {"gpu_types": ["h100"], "tp": [8, 16]}, "objective": "gpus"}
    for p in planner.plan(raw).plans:
        assert p.tp <= 8


def test_fixed_fleet_of_two_4090s():
    raw = {"profile": "seed", "model": "llama-3.1-8b", "workload": {"method": "qlora", "tokens": 1e8},
           "constraints": {"fleet": {"4090": 2}}, "objective": "time"}
    plans = planner.plan(raw).plans
    assert plans and all(p.gpu == "rtx-4090" and p.gpus <= 2 for p in plans)


def test_deterministic_output():
    raw = {"profile": "seed", "model": "mistral-7b", "workload": {"method": "lora", "tokens": 1e9},
           "objective": "cost", "search": {"max_gpus": 16}}
    a = planner.plan(raw).model_dump(exclude={"stats"})
    b = planner.plan(raw).model_dump(exclude={"stats"})
    assert a == b


def test_cheapest_is_job_cost_not_hourly_price():
    """Four slow cards can cost more than one fast one: the cost objective's winner is at most
    as expensive as the hourly objective's winner for the same job."""
    raw = {"profile": "seed", "model": "llama-3.1-8b", "workload": {"method": "lora", "tokens": 1e9},
           "search": {"max_gpus": 8}}
    by_cost = planner.plan({**raw, "objective": "cost"}).plans[0]
    by_hour = planner.plan({**raw, "objective": "hourly"}).plans[0]
    assert by_cost.cost_usd <= by_hour.cost_usd
    assert by_hour.hourly_usd <= by_cost.hourly_usd


def test_pareto_front_is_non_dominated():
    raw = {"profile": "seed", "model": "llama-3.1-8b", "workload": {"method": "lora", "tokens": 1e9},
           "search": {"max_gpus": 16, "gpu_types": ["h100", "a100-80gb", "rtx-4090", "l40s"]}}
    front = planner.plan(raw, pareto=True).plans
    assert len(front) >= 2
    times = [p.time_s for p in front]
    costs = [p.cost_usd for p in front]
    assert times == sorted(times) and costs == sorted(costs, reverse=True)


# ---------------------------------------------------------------------------------------------
# The command

runner = CliRunner()


def test_cli_plan_json_contract():
    result = runner.invoke(app, ["plan", "--model", "llama-3.1-70b", "--method", "qlora", "--objective",
                                 "cost", "--tokens", "1e9", "--top", "3", "--profile", "seed", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["status"] in ("optimal", "feasible") and len(data["plans"]) == 3
    keys = {"gpu", "gpus", "nodes", "dp", "tp", "pp", "cp", "sp", "zero", "offload", "micro_batch",
            "grad_accum", "seq_len", "method", "optimizer", "precision", "attention", "checkpointing",
            "lora_rank", "memory", "hourly_usd", "time_s", "cost_usd", "time_s_band", "cost_usd_band",
            "relaxations"}
    assert keys <= set(data["plans"][0])
    costs = [p["cost_usd"] for p in data["plans"]]
    assert costs == sorted(costs)


def test_cli_plan_infeasible_exit_1_and_invalid_exit_2():
    infeasible = runner.invoke(app, ["plan", "--model", "llama-3.1-405b", "--method", "full",
                                     "--gpu-types", "rtx-4090", "--max-gpus", "2", "--profile", "seed"])
    assert infeasible.exit_code == 1 and "Why:" in infeasible.output
    invalid = runner.invoke(app, ["plan", "--model", "llama-3.1-70b", "--objective", "cost"])
    assert invalid.exit_code == 2 and "workload.tokens: required" in invalid.output


def test_optimizer_list_is_searched():
    """search.optimizer: the search may pick any listed optimizer; 8-bit Adam's smaller states
    let a 7B full fine-tune fit where AdamW needs more sharding."""
    raw = {"profile": "seed", "model": "mistral-7b", "workload": {"method": "full", "tokens": 1e8},
           "search": {"optimizer": ["adamw", "adam8bit"], "gpu_types": ["a100-80gb"], "offload": ["none"],
                      "zero": [0]},
           "objective": "gpus", "top": 3}
    plans = planner.plan(raw).plans
    assert plans and plans[0].optimizer == "adam8bit"
    assert {p.optimizer for p in plans} <= {"adamw", "adam8bit"}
    for p in plans:
        assert check_plan(raw, p) == []


def test_equal_objective_ties_go_to_the_cheaper_hour():
    """Fewest GPUs: one GPU of any of four types fits; the ranking among these equals is by
    price per hour, cheapest first (not the catalog's order, which lists the H100 first)."""
    raw = {"name": "tie", "model": "llama-3.2-1b",
           "workload": {"method": "lora", "seq_len": 2048, "micro_batch": 1, "global_batch": 8},
           "search": {"gpu_types": ["h100", "a100-80gb", "l40s", "rtx-4090"]}, "objective": "gpus", "top": 10}
    got = planner.plan(raw)
    assert got.plans and all(p.gpus == 1 for p in got.plans)
    hourly = [p.hourly_usd for p in got.plans]
    assert hourly == sorted(hourly) and hourly[0] < hourly[-1]
    assert got.plans[0].gpu == "rtx-4090"
    assert all(check_plan(raw, p) == [] for p in got.plans)


def test_plans_that_do_not_fit_reach_cpsat_and_it_rejects_them():
    """The best-first only hints and bounds: with hints on, the plans CP-SAT is given include
    plans ranked ahead of its answer that do not fit (8B full fine-tuning on one RTX 4090 is
    cheaper per hour than anything that fits), and CP-SAT's memory constraints turn them down."""
    from planner.scenario.resolve import resolve
    from planner.search.candidates import decision_space, plan_ranks, search
    from planner.search.evaluate import gpu_table
    from planner.search.request import build_request

    raw = {"profile": "detailed", "model": "llama-3.1-8b",
           "workload": {"method": "full", "seq_len": 2048, "tokens": 1e8},
           "search": {"gpu_types": ["rtx-4090", "a100-80gb"], "max_gpus": 8}, "objective": "hourly", "top": 3}
    req = build_request(resolve(raw))
    out = search(req)
    e = out.evaluated
    rank = plan_ranks(req, {k: v[e.cls_index] for k, v in out.cls.a.items()}, e)
    first = rank[out.picked[0]]
    ahead_not_fitting = (rank < first) & ~e.ev["fits"]
    assert ahead_not_fitting.sum() > 0
    assert all(e.ev["fits"][j] for j in out.picked)
    # The same plans in the model's tables: every phase's bytes, one of them above the card.
    space, limits = decision_space(req, gpu_table(req), out.cls, e)
    c = int(np.flatnonzero(ahead_not_fitting)[0])
    k, g = space.c_k[c], space.c_gpu[c]
    assert max(v[k] for v in space.k_phases.values()) > limits.usable_bytes[g]
    model = PlanModel(space, limits)
    model.pin(c)
    assert model.solve(5)[0] == "infeasible"


def _brute_force_top_k(sp: Space, lim: Limits, k: int) -> list[int]:
    """The oracle for the model alone: every plan checked against every constraint in Python,
    then the best plan of each group, k groups in rank order."""
    k_of, g_of = sp.c_k, sp.c_gpu
    gpus = sp.k_dp[k_of] * sp.mp[sp.k_shape[k_of]]
    ok = np.ones(len(g_of), dtype=bool)
    for table in sp.k_phases.values():
        ok &= table[k_of] <= lim.usable_bytes[g_of]
    ok &= (gpus <= lim.max_gpus) & (gpus <= lim.gpu_limit[g_of])
    ok &= (lim.host_bytes_per_node[g_of] < 0) | (sp.c_host_node <= lim.host_bytes_per_node[g_of])
    if lim.budget_units is not None:
        ok &= sp.c_cost <= lim.budget_units
    best: dict[int, int] = {}
    for c in np.flatnonzero(ok)[np.argsort(sp.c_rank[ok], kind="stable")]:
        best.setdefault(int(sp.c_group[c]), int(c))
    return sorted(best.values(), key=lambda c: sp.c_rank[c])[:k]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.booleans())
def test_the_model_against_brute_force_with_and_without_hints(seed, k, use_hints):
    """Random tables (memory per phase, degrees, host bytes, costs, groups, ranks): CP-SAT's top k
    equals the brute-force top k, and feasible hints of distinct groups never change it."""
    rng = np.random.default_rng(seed)
    n_k, n_c = 40, 150
    sp = Space(
        mp=rng.choice([1, 2, 4], 20), micro_batch=rng.choice([1, 2], 20),
        k_shape=rng.integers(0, 20, n_k), k_dp=rng.choice([1, 2, 4, 8], n_k),
        k_phases={"a": rng.integers(10, 120, n_k), "b": rng.integers(10, 120, n_k)},
        c_gpu=rng.integers(0, 3, n_c), c_k=rng.integers(0, n_k, n_c), c_rank=rng.permutation(n_c),
        c_group=rng.integers(0, 25, n_c), c_grad_accum=np.ones(n_c, dtype=np.int64),
        c_host_node=rng.integers(0, 50, n_c), c_cost=rng.integers(1, 1000, n_c),
    )
    lim = Limits(usable_bytes=np.array([60, 90, 110]), gpu_limit=np.array([16, 8, 32]),
                 gpus_per_node=np.array([8, 8, 8]), host_bytes_per_node=np.array([-1, 40, 30]),
                 priced=np.array([True, True, True]), max_gpus=24, budget_units=800)
    gpus = sp.k_dp[sp.c_k] * sp.mp[sp.k_shape[sp.c_k]]
    sp = sp.take(np.flatnonzero((gpus <= lim.max_gpus) & (gpus <= lim.gpu_limit[sp.c_gpu])))  # as the lattice makes them
    want = _brute_force_top_k(sp, lim, k)
    hints = _brute_force_top_k(sp, lim, 2 * k)[::-1][:k] if use_hints else None  # worse ones, shuffled
    status, got = top_k(sp, lim, k, time_limit_s=20, hints=hints)
    assert got == want
    assert status == ("optimal" if want else "infeasible")


def test_a_hint_that_does_not_fit_never_hides_the_answer():
    """top_k takes its hints as feasible plans; one that is not (plan 0 needs 50 bytes of a
    40-byte card) bounds nothing: the answer is still plan 2."""
    status, got = top_k(space(), limits(usable_bytes=np.array([40, 100])), k=1, time_limit_s=5, hints=[0])
    assert (status, got) == ("optimal", [2])


def test_modules_trained_in_full_cost_time_memory_and_are_checked():
    """A LoRA plan that also trains the embeddings and LM head (``modules_to_save``) pins the same
    layout at more memory (their states) and more time (their gradients to reduce, their optimizer
    step, the head's weight-gradient GEMM); the independent checker agrees on every figure."""
    raw = {"model": "llama-3.1-8b",
           "workload": {"method": "lora", "seq_len": 2048, "global_batch": 32, "tokens": 1e8},
           "layout": {"gpu": "h100", "gpus": 4, "zero": 0, "checkpointing": "full"},
           "search": {"micro_batch": [2]}, "objective": "time"}
    saved = {**raw, "workload": {**raw["workload"], "modules_to_save": ["embed_tokens", "lm_head"]}}
    plain, trained = planner.plan(raw).plans[0], planner.plan(saved).plans[0]
    assert (plain.gpus, plain.micro_batch) == (trained.gpus, trained.micro_batch)
    assert trained.memory["total_bytes"] > plain.memory["total_bytes"]
    assert trained.time_s > plain.time_s
    assert check_plan(saved, trained) == []
    assert check_plan(raw, trained) != []  # the same figures do not pass for the plain workload


#: The stacks that run the Hugging Face Trainer, whose evaluation batch ``eval_micro_batch`` is
#: (its standard loss builds the whole logits of an evaluation batch).
HF_TRAINER_STACKS = ["hf-fsdp", "hf-deepspeed"]


def test_an_evaluation_batch_is_a_memory_constraint_of_the_search():
    """A LoRA run under the Trainer that evaluates between steps needs room for that forward's
    logits, which no GPU count shards: the search sizes every plan's evaluation phase (never less
    memory than the same plan without it, the checker agreeing), and at a batch whose logits
    leave no room on a 24 GB card (6 × 2,048 tokens of a 152k vocabulary) nothing is planned."""
    raw = {"model": "qwen2-7b", "workload": {"method": "lora", "seq_len": 2048, "global_batch": 16},
           "search": {"gpu_types": ["rtx-4090"], "max_gpus": 8, "stacks": HF_TRAINER_STACKS},
           "objective": "gpus", "top": 3}
    evals = {**raw, "workload": {**raw["workload"], "eval_micro_batch": 4}}
    plain, with_eval = planner.plan(raw).plans, planner.plan(evals).plans
    assert plain and with_eval
    for p in with_eval:
        assert p.memory["total_bytes"] <= p.memory["usable_bytes"] and check_plan(evals, p) == []
        same = planner.plan({**raw, "layout": {k: getattr(p, k) for k in ("gpu", "gpus", "zero", "offload",
                                                                           "checkpointing")},
                             "workload": {**raw["workload"], "micro_batch": p.micro_batch},
                             "search": {"stacks": [p.stack]}}).plans
        assert same and p.memory["total_bytes"] >= same[0].memory["total_bytes"]
    too_big = {**raw, "workload": {**raw["workload"], "eval_micro_batch": 6}}
    assert not planner.plan(too_big).plans

def test_when_the_evaluation_pass_binds_the_explanation_says_so_and_what_would_fit():
    raw = {"model": "qwen2-7b", "workload": {"method": "lora", "seq_len": 2048, "global_batch": 16,
                                             "eval_micro_batch": 8},
           "layout": {"gpu": "rtx-4090", "gpus": 1}, "search": {"stacks": HF_TRAINER_STACKS}}
    result = planner.plan(raw)
    assert not result.plans
    ex = result.explanation
    assert "evaluation pass at workload.eval_micro_batch 8" in ex["binding"]
    assert any(s.startswith("evaluation at batch 1") and "1× rtx-4090" in s for s in ex["suggestions"])
