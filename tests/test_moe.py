"""Mixture of experts: expert parallelism in the memory rules, the validation and the search."""

from __future__ import annotations

from pathlib import Path

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


# --- the experts' own tensor parallelism (Megatron-Core's MoE parallel folding) ------------------
# Megatron-Core's MoE README (the megatron stack's source mg-moe-folding): with MoE parallel folding
# the attention's groups are generated over tp-cp-dp-pp and the MoE layers' over tp-ep-dp-pp with
# their own TP size (--expert-tensor-parallel-size); the EP×ETP group is a sub-group of DP×CP×TP.

FOLDING = {"profile": "seed", "model": "mixtral-8x7b", "workload": {"method": "full", "seq_len": 2048},
           "overrides": {"activation_bytes": 0}}


@pytest.mark.parametrize("dp, cp, tp, ep, etp", [
    (dp, cp, tp, ep, etp) for dp in (1, 2, 4) for cp in (1, 2) for tp in (1, 2, 4) for ep in (1, 2, 4, 8)
    for etp in (None, 1, 2)])
def test_expert_tp_folds_ep_into_dp_cp_tp_one_rule_for_estimate_checker_and_lattice(dp, cp, tp, ep, etp):
    """A pinned layout is legal exactly when ep divides dp (etp unset) or ep·etp divides dp·cp·tp
    (etp set): ``estimate`` refuses the others naming ep, the checker flags the same words, and
    the smallest legal dp the search steps by is the first one a brute-force count admits."""
    from planner.scenario import legality
    from planner.search.checker import _count_problems

    want = dp % ep == 0 if etp is None else (dp * cp * tp) % (ep * etp) == 0
    assert bool(legality.ep_dp(dp, ep, tp=tp, cp=cp, etp=etp).legal) == want
    step = int(legality.expert_dp_step(tp, cp, ep, etp))
    legal_dps = [d for d in range(1, 65) if (d % ep == 0 if etp is None else (d * cp * tp) % (ep * etp) == 0)]
    assert legal_dps == list(range(step, 65, step))
    layout = {"gpu": "h100-sxm-80gb", "dp": dp, "tp": tp, "cp": cp, "ep": ep, "sp": tp > 1}
    if etp is not None:
        layout["etp"] = etp
    try:
        planner.estimate({**FOLDING, "layout": layout})
        refused = []
    except InputError as exc:
        refused = [p for p in exc.problems if p.startswith("layout.ep:")]
    assert (not refused) == want, refused
    flagged = [p for p in _count_problems(catalog.get_gpu("h100-sxm-80gb"),
                                          {"gpus": dp * tp * cp, "dp": dp, "tp": tp, "pp": 1, "cp": cp, "ep": ep,
                                           "etp": etp}) if p.startswith("ep ")]
    assert (not flagged) == want, flagged
    if not want:
        assert refused[0].removeprefix("layout.ep: ") == flagged[0].removeprefix("ep ")


def test_expert_tp_splits_each_expert_etp_ways_and_ep_still_splits_the_experts():
    """Unsharded weights (2 bytes each): the dense part tp ways, each routed expert etp ways and
    the experts ep ways: (N − N_exp)·2/tp + N_exp·2/(etp·ep)."""
    n = param_counts(catalog.get_model("mixtral-8x7b")).total
    n_exp = expert_params(catalog.get_model("mixtral-8x7b"))
    for etp in (1, 2):
        est = planner.estimate({**FOLDING, "layout": {"gpus": 8, "dp": 4, "tp": 2, "ep": 4, "etp": etp, "zero": 0}})
        assert est.components["weights"] == pytest.approx((n - n_exp) * 2 / 2 + n_exp * 2 / (etp * 4), abs=1)


def test_sharded_expert_states_spread_over_every_gpu_of_the_stage_whatever_the_expert_tp():
    """Megatron's distributed optimizer shards the expert states over the expert layers'
    data-parallel group (dp·cp·tp / (ep·etp) ranks): ep·etp·expert-dp = dp·cp·tp GPUs share each
    stage's states, so the FP32 Adam moments per GPU are 8·N / (dp·tp) for any legal etp."""
    n = param_counts(catalog.get_model("mixtral-8x7b")).total
    for etp in (None, 1, 2):
        est = planner.estimate({**FOLDING, "layout": {"gpus": 8, "dp": 4, "tp": 2, "ep": 4, "zero": 1,
                                                      **({"etp": etp} if etp else {})}})
        assert est.components["optimizer_states"] == pytest.approx(8 * n / 8, abs=2)


@pytest.mark.parametrize("profile", ["seed", "detailed"])
def test_expert_tp_equal_to_tp_changes_nothing_where_ep_divides_dp(profile):
    """Megatron-Core's default expert TP is the attention's: stating it changes no byte."""
    raw = {**FOLDING, "profile": profile, "layout": {"gpus": 16, "dp": 8, "tp": 2, "ep": 4, "zero": 1, "sp": True}}
    if profile == "detailed":
        raw.pop("overrides")
    unset = planner.estimate(raw)
    same = planner.estimate({**raw, "layout": {**raw["layout"], "etp": 2}})
    assert same.total_bytes == unset.total_bytes and same.components == unset.components


def test_detailed_profile_keeps_etp_shares_of_the_experts():
    """The detailed profile's weights move by exactly the experts' bytes between etp 1 and 2
    (tp 2, ep 4, no ZeRO): N_exp·2·(1/(1·4) − 1/(2·4))."""
    raw = {"model": "mixtral-8x7b", "workload": {"method": "full", "seq_len": 2048},
           "layout": {"gpu": "h100", "gpus": 8, "dp": 4, "tp": 2, "ep": 4, "sp": True, "checkpointing": "full"}}
    one = planner.estimate({**raw, "layout": {**raw["layout"], "etp": 1}})
    two = planner.estimate({**raw, "layout": {**raw["layout"], "etp": 2}})
    n_exp = expert_params(catalog.get_model("mixtral-8x7b"))
    assert one.components["weights"] - two.components["weights"] == pytest.approx(n_exp * 2 * (1 / 4 - 1 / 8), abs=4)


@pytest.mark.parametrize("change, needle", [
    ({"model": "llama-3-8b", "ep": 1}, "layout.etp: 1 needs a mixture-of-experts model"),
    ({"etp": 3}, "layout.etp: 3 does not divide the experts' FFN width of 14336"),
    ({"etp": 2, "ep": 8, "dp": 2, "tp": 2, "gpus": 4}, "layout.ep: 8 times etp = 2 does not divide dp·cp·tp"),
])
def test_expert_tp_validation(change, needle):
    options = {"ep": 2, "dp": 2, "gpus": 2, "etp": 1}
    options.update(change)
    with pytest.raises(InputError, match=needle):
        planner.estimate(FOLDING, **options)


def test_plan_accepts_a_folded_layout_only_on_a_stack_that_folds():
    """tp 2 with ep 8 on 8 GPUs leaves dp 4: legal only with the experts' own TP of 1 (ep·etp = 8
    divides dp·tp = 8). ``plan`` finds it on Megatron (the stack that runs MoE parallel folding),
    the checker passes it, its pinned scenario carries etp, and without etp nothing is legal: the
    search finds no layout (and says why), or, every degree pinned, the scenario is refused."""
    from planner.search.checker import check_plan

    raw = {"profile": "seed", "model": "olmoe-1b-7b", "workload": {"method": "full", "seq_len": 4096, "tokens": 1e8},
           "layout": {"gpus": 8, "tp": 2, "ep": 8, "etp": 1, "sp": True},
           "search": {"gpu_types": ["h100"]}, "objective": "cost", "top": 3}
    result = planner.plan(raw)
    assert result.plans
    for p in result.plans:
        assert (p.stack, p.etp, p.ep, p.dp, p.tp) == ("megatron", 1, 8, 4, 2)
        assert p.pinned_scenario["layout"]["etp"] == 1
        assert check_plan(raw, p) == []
    unfolded = {**raw, "layout": {k: v for k, v in raw["layout"].items() if k != "etp"}}
    refused = planner.plan(unfolded)
    assert refused.status == "infeasible" and not refused.plans
    assert any("unless layout.etp folds it" in reason for reason in refused.explanation["rejected"])
    # pinned whole (dp decided), the same layout is refused before any search, as estimate does
    with pytest.raises(InputError, match="layout.ep: 8 does not divide dp = 4"):
        planner.plan({**unfolded, "layout": {**unfolded["layout"], "pp": 1, "cp": 1}})


def test_search_steps_dp_by_the_folded_expert_group():
    """With etp pinned and ep searched, every plan's ep·etp divides dp·cp·tp, and the search keeps
    layouts the traditional rule refuses (ep not dividing dp)."""
    raw = {"profile": "seed", "model": "olmoe-1b-7b", "workload": {"method": "full", "seq_len": 4096, "tokens": 1e8},
           "layout": {"gpus": 8, "etp": 1},
           "search": {"gpu_types": ["h100"], "tp": [2], "ep": [4, 8, 16], "distinct": "none"},
           "objective": "time", "top": 40}
    plans = planner.plan(raw).plans
    assert plans
    assert all((p.dp * p.cp * p.tp) % (p.ep * p.etp) == 0 for p in plans)
    assert {p.ep for p in plans} == {4, 8}  # ep 16 would need dp·tp = 16
    assert any(p.dp % p.ep for p in plans)


def test_megatron_export_carries_expert_parallelism():
    from planner.launch.exporters import export_resolved
    from planner.scenario.resolve import resolve

    raw = {"profile": "seed", "model": "olmoe-1b-7b", "workload": {"method": "full", "seq_len": 4096},
           "layout": {"gpu": "h100", "gpus": 8, "tp": 2, "ep": 8, "etp": 1, "sp": True, "zero": 1}}
    args = export_resolved(resolve(raw)).files["megatron_args.txt"].splitlines()
    assert "--expert-model-parallel-size 8" in args and "--expert-tensor-parallel-size 1" in args
    plain = export_resolved(resolve({**raw, "layout": {"gpu": "h100", "gpus": 8, "tp": 2, "sp": True}}))
    assert not any(a.startswith("--expert-") for a in plain.files["megatron_args.txt"].splitlines())


@pytest.mark.parametrize("text, etp", [
    ("TP4 ETP1 EP8 (DP2)", 1), ("VP=4; EP=32; ETP=1; EDP=1", 1), ("expert_tensor_parallel_degree 1", 1),
    ("--expert-tensor-parallel-size 2", 2), ("megatron-dist-opt (expert parallel 8)", None), ("SETP 3", None),
])
def test_rows_state_the_experts_own_tp_in_the_words_runs_use(text, etp):
    from planner.validate.cells import expert_degree, expert_tensor_degree

    assert expert_tensor_degree(text) == etp
    assert expert_degree("--expert-tensor-parallel-size 2") == 1  # not an expert-parallel degree


def test_a_row_that_folds_its_experts_is_modelled_with_its_stated_expert_tp():
    """A measured row on 8 GPUs at TP 4, EP 8, ETP 1 (dp 2) was unmodelled while ep had to divide
    dp; read with its stated ETP it is estimated, its experts split 1 way and over 8 ranks."""
    from planner.validate.rows import scenario_of

    row = {"id": "x", "model": "qwen3-30b-a3b", "method": "full", "optimizer": "Megatron Adam, distributed optimizer",
           "precision": "bf16 (Megatron mixed precision)", "seq_len": "4096", "micro_batch": "1", "grad_ckpt": "yes",
           "flash_attn": "fa2", "gpus": "8", "gpu_type": "H100", "planner_gpu": "h100-sxm-80gb", "dp": "2", "tp": "4",
           "pp": "1", "cp": "1", "zero_or_fsdp": "megatron distributed optimizer, sequence parallel (TP4, EP8)",
           "cpu_offload": "no", "framework": "megatron", "measured_gb": "40", "measure_kind": "reported",
           "notes": "8 GPUs TP4 ETP1 EP8 (DP2)"}
    raw = scenario_of(row)
    assert (raw["layout"]["ep"], raw["layout"]["etp"], raw["layout"]["gpus"], raw["layout"]["tp"]) == (8, 1, 8, 4)
    assert planner.estimate(raw).layout["dp"] == 2  # legal: ep·etp = 8 divides dp·tp = 8


@pytest.mark.parametrize("zero, zero_degree, tp, ep, etp, expert_ways", [
    (0, 4, 1, 4, None, 4),   # no ZeRO: the optimizer steps its ep rank's experts whole
    (1, 4, 1, 4, None, 4),   # ZeRO-1 over dp 4, ep 4: expert-dp 1
    (1, 8, 2, 4, 1, 16),     # folded: each GPU's experts whole (etp 1), sharded over the 16 / 4 expert-dp ranks
])
def test_the_optimizer_steps_only_its_rank_s_share_of_the_experts(zero, zero_degree, tp, ep, etp, expert_ways):
    """The elements one GPU's optimizer steps (its foreach temporaries scale with them): its ZeRO
    share of the dense parameters, and of the experts its expert-parallel rank holds, not of
    every expert."""
    from planner.core.specs import Recipe, Workload
    from planner.memory.model_states import model_states

    spec = catalog.get_model("mixtral-8x7b")
    st = model_states(spec, Workload(method="full"), recipe=Recipe(), tp=tp, pp=1, zero_degree=zero_degree,
                      zero=zero, offload="none", adapter_bytes=2, ep=ep, etp=etp)
    n_exp = expert_params(spec) / (etp or tp)
    dense = st.trainable - n_exp
    assert st.stepped == pytest.approx(dense / (zero_degree if zero else 1) + n_exp / expert_ways, rel=1e-9)


@pytest.mark.parametrize("ep, etp", [(1, None), (4, None), (4, 1)])
def test_an_fsdp_unit_gathers_only_its_rank_s_experts(ep, etp):
    """FSDP with expert parallelism (torchtitan shards a block's experts over the ep ranks and
    gathers them over the rest): the unit a GPU gathers holds the layer's dense parameters (tp
    ways) and its rank's 1/ep of the routed experts (etp ways)."""
    from planner.core.specs import Layout, Recipe, Workload
    from planner.memory.buffers import buffer_terms
    from planner.memory.model_states import model_states

    spec = catalog.get_model("mixtral-8x7b")
    wl, tp = Workload(method="full"), 2
    lay = Layout(gpu="h100", gpus=16, dp=8, tp=tp, ep=ep, zero=3, sp=True, **({"etp": etp} if etp else {}))
    st = model_states(spec, wl, recipe=Recipe(), tp=tp, pp=1, zero_degree=8, zero=3, offload="none",
                      adapter_bytes=2, ep=ep, etp=etp)
    unit = buffer_terms(spec, wl, lay, st, recipe=Recipe())["unit"]
    counts, experts = param_counts(spec), expert_params(spec) / spec.layers
    dense = (counts.attention + counts.mlp) / spec.layers - experts
    assert unit == pytest.approx((dense / tp + experts / ((etp or tp) * ep)) * 2, rel=1e-9)


@pytest.mark.parametrize("objective, etp", [("cost", 1), ("gpus", 1), ("time", 2), ("cost", None)])
def test_search_over_expert_layouts_matches_the_enumeration(objective, etp):
    """CP-SAT against the exhaustive enumeration on a MoE space (tp, ep and ZeRO searched, the
    experts' TP pinned or not): the same top plans, each passing the independent checker, whose
    folding rule is counted from dp·cp·tp alone."""
    from oracle_helpers import assert_search_matches_oracle

    raw = {"profile": "seed", "model": "olmoe-1b-7b",
           "workload": {"method": "full", "seq_len": 2048, "tokens": 1e8, "global_batch": 32},
           "layout": {} if etp is None else {"etp": etp},
           "search": {"gpu_types": ["h100", "a100-80gb"], "max_gpus": 16, "tp": [1, 2, 4], "ep": [1, 2, 4, 8],
                      "micro_batch": [1, 2], "zero": [0, 1], "offload": ["none"], "checkpointing": ["full"]},
           "objective": objective, "top": 3}
    assert_search_matches_oracle(raw)


def test_a_plan_that_pins_ep_leaves_dp_to_the_search():
    """A search scenario pinning ep but not the GPU count: dp is the search's decision, so the
    scenario is not refused for the default dp of 1 (as an estimate of that single layout is);
    every plan's dp is a multiple of ep."""
    raw = {"profile": "seed", "model": "olmoe-1b-7b", "workload": {"method": "full", "seq_len": 2048, "tokens": 1e8},
           "layout": {"ep": 8}, "search": {"gpu_types": ["h100"], "max_gpus": 16}, "top": 3}
    with pytest.raises(InputError, match="layout.ep: 8 does not divide dp = 1"):
        planner.estimate({k: v for k, v in raw.items() if k not in ("search", "top")})
    plans = planner.plan(raw).plans
    assert plans and all(p.ep == 8 and p.dp % 8 == 0 for p in plans)


@pytest.mark.parametrize("layout, groups", [
    ({"dp": 4, "tp": 2}, 2),                       # dense: dp, tp
    ({"dp": 4, "tp": 2, "ep": 4}, 3),              # + ep; experts' dp = 4·2 / (4·2) = 1: none
    ({"dp": 8, "tp": 2, "ep": 4}, 4),              # + ep, + experts' dp of 2
    ({"dp": 4, "tp": 2, "ep": 8, "etp": 1}, 3),    # folded: ep 8 over dp·tp = 8, experts' TP 1: no group
    ({"dp": 8, "tp": 4, "ep": 4, "etp": 2}, 5),    # + ep, + experts' dp of 4, + expert TP of 2
])
def test_every_expert_group_is_a_communicator_of_its_own(layout, groups):
    """NCCL buffers are counted per communicator a GPU joins; expert parallelism adds the ep
    group, the experts' data-parallel group where it has more than one rank, and an expert TP
    group where the experts' TP differs from tp (Megatron-Core's parallel_state)."""
    from planner.core.specs import Layout
    from planner.memory.detailed import _comm_groups

    assert _comm_groups(Layout(**layout)) == groups


def test_the_shipped_folding_example_says_what_it_shows():
    """scenarios/moe-qwen3-30b-megatron-folding.yaml: EP 8 at the experts' TP 1 and EP 4 at TP 2
    hold the same bytes per GPU (1/8 of the experts' weights each, every state sharded over the 8
    GPUs), and both fit an 80 GB card; without etp the first is refused."""
    from pathlib import Path

    from planner.scenario.files import read_scenario_file

    example = Path(__file__).resolve().parents[1] / "scenarios" / "moe-qwen3-30b-megatron-folding.yaml"
    raws = read_scenario_file(example)
    folded, split = (planner.estimate(raw) for raw in raws)
    assert folded.total_bytes == split.total_bytes and folded.fits and split.fits
    assert folded.components == split.components
    unfolded = {**raws[0], "layout": {k: v for k, v in raws[0]["layout"].items() if k != "etp"}}
    with pytest.raises(InputError, match="layout.ep: 8 does not divide dp = 4"):
        planner.estimate(unfolded)


def test_lora_adapts_every_routed_expert_where_the_experts_are_linear_modules():
    """PEFT's MLP targets adapt each expert's gate, up and down where the experts are linear
    modules (transformers' Qwen3-MoE and Qwen-MoE), the shared experts as one MLP, and nothing on
    the MoE layers where the experts are fused parameters (transformers' GPT-OSS): Qwen3-30B-A3B's
    48 layers of 128 experts 2,048 × 768 (its config.json), Qwen1.5-MoE-A2.7B's 24 layers of 60
    experts 2,048 × 1,408 and a shared MLP of 5,632."""
    from planner.core.arch import exact_lora_params, lora_adapter_groups, lora_param_counts

    every = ("q", "k", "v", "o", "gate", "up", "down")
    qwen3 = catalog.get_model("qwen3-30b-a3b")
    dense, experts = lora_adapter_groups(qwen3, every)
    assert sorted(experts) == sorted([(48 * 128, 2048, 768)] * 2 + [(48 * 128, 768, 2048)])
    assert all(d_in != 6144 and d_out != 6144 for _, d_in, d_out in dense)  # no dense MLP exists
    n_exp = 48 * 128 * 3 * 8 * (2048 + 768)
    n_attn = sum(n * 8 * (d_in + d_out) for n, d_in, d_out in dense)
    assert exact_lora_params(qwen3, 8, every) == n_attn + n_exp
    assert lora_param_counts(qwen3, 8, every).active == pytest.approx(n_attn + n_exp * 8 / 128)

    qwen15 = catalog.get_model("qwen1.5-moe-a2.7b")
    dense, experts = lora_adapter_groups(qwen15, ("gate", "up", "down"))
    assert sorted(experts) == sorted([(24 * 60, 2048, 1408)] * 2 + [(24 * 60, 1408, 2048)])
    assert sorted(dense) == sorted([(24, 2048, 5632)] * 2 + [(24, 5632, 2048)])

    gpt_oss = catalog.get_model("gpt-oss-20b")
    dense, experts = lora_adapter_groups(gpt_oss, every)
    assert experts == [] and len(dense) == 4  # q, k, v, o only

    # DeepSeek-V2-Lite: one dense layer (MLP 10,944), then 26 MoE layers of 64 experts of 1,408
    # and two shared experts as one MLP of 2,816
    lite = catalog.get_model("deepseek-v2-lite")
    dense, experts = lora_adapter_groups(lite, ("gate", "up", "down"))
    assert sorted(dense) == sorted([(1, 2048, 10944)] * 2 + [(1, 10944, 2048)]
                                   + [(26, 2048, 2816)] * 2 + [(26, 2816, 2048)])
    assert sorted(experts) == sorted([(26 * 64, 2048, 1408)] * 2 + [(26 * 64, 1408, 2048)])
    # a model of MoE layers alone needs no dense MLP width
    no_ffn = qwen3.model_copy(update={"ffn": None})
    assert lora_adapter_groups(no_ffn, every)[1] == lora_adapter_groups(qwen3, every)[1]


def test_expert_adapters_split_over_ep_ranks_as_the_experts_do():
    """A MoE LoRA run's routed-expert adapters (weights, gradients, AdamW states: 4 + 4 + 8 B per
    FP32 parameter) sit 1/ep on each rank; the attention adapters stay whole on every rank."""
    def adapters(ep):
        raw = {"model": "qwen3-30b-a3b",
               "workload": {"method": "lora", "lora_rank": 8, "lora_targets": ["all"], "seq_len": 1024,
                            "micro_batch": 1, "adapter_dtype": "fp32"},
               "layout": {"gpus": 4, "dp": 4, "ep": ep, "checkpointing": "full"}}
        return planner.estimate(raw).components["adapter_states"]

    n_exp = 48 * 128 * 3 * 8 * (2048 + 768)
    assert adapters(1) - adapters(4) == pytest.approx(n_exp * 16 * (1 - 1 / 4), rel=1e-9)
    assert adapters(2) - adapters(4) == pytest.approx(n_exp * 16 * (1 / 2 - 1 / 4), rel=1e-9)


def test_expert_adapters_follow_the_experts_own_tp_and_zero_sharding():
    """Under MoE parallel folding each expert's adapters split etp ways as the expert does; with
    ZeRO-1 their optimizer states spread over the experts' data-parallel group too, and the
    optimizer steps this GPU's share of them: at tp 2, etp 1, ep 2 on 4 GPUs the dense adapters
    are halved by tp and their states by the ZeRO degree 2, the experts' states by ep·expert-dp
    = dp·tp / etp = 4."""
    from planner.core.arch import exact_lora_params, lora_param_counts
    from planner.memory.model_states import model_states
    from planner.scenario.resolve import resolve

    raw = {"model": "qwen3-30b-a3b",
           "workload": {"method": "lora", "lora_rank": 8, "lora_targets": ["all"], "seq_len": 1024,
                        "micro_batch": 1, "adapter_dtype": "fp32"},
           "layout": {"gpus": 4, "dp": 2, "tp": 2, "ep": 2, "etp": 1, "zero": 1, "checkpointing": "full"}}
    rs = resolve(raw)
    every = rs.workload.lora_target_set
    n_exp = lora_param_counts(rs.model, 8, every).experts
    n_dense = exact_lora_params(rs.model, 8, every) - n_exp
    parts = model_states(rs.model, rs.workload, recipe=rs.recipe, tp=2, pp=1, zero_degree=2, zero=1,
                         offload="none", adapter_bytes=4, ep=2, etp=1)
    # weights and gradients 4 + 4 B where they sit (dense: 1/tp; experts: 1/(etp·ep)), AdamW's
    # 8 B over the sharded group (dense: 1/(tp·ZeRO degree); experts: 1/(etp·ep·expert-dp))
    want = n_dense / 2 * (4 + 4 + 8 / 2) + n_exp / 2 * (4 + 4) + n_exp * 8 / 4
    assert parts.device["adapter_states"] == pytest.approx(want, rel=1e-9)
    assert parts.stepped == pytest.approx(n_dense / 2 / 2 + n_exp / 4, rel=1e-9)


def test_a_token_passes_through_its_active_experts_adapters_only():
    """The time model's adapter FLOPs and side-path traffic count the adapters a token passes
    through (its 8 of 128 experts' in Qwen3-30B-A3B); the optimizer steps all of them."""
    from planner.core.arch import exact_lora_params, lora_param_counts
    from planner.perf.arguments import step_arguments
    from planner.perf.timing import adapter_bytes_per_token
    from planner.scenario.resolve import resolve

    raw = {"model": "qwen3-30b-a3b", "workload": {"method": "lora", "lora_rank": 8, "lora_targets": ["all"],
                                                   "seq_len": 2048, "micro_batch": 1},
           "layout": {"gpu": "h100", "gpus": 8}}
    rs = resolve(raw)
    x = step_arguments(rs, method=1, checkpointing=2, offload=0, zero=0, seq_len=2048, micro_batch=1,
                       grad_accum=1, tp=1, pp=1, cp=1, ep=1, dp=8, attention=1, fused=0)
    every = rs.workload.lora_target_set
    active = lora_param_counts(rs.model, 8, every).active
    assert float(x["n_lora"]) == exact_lora_params(rs.model, 8, every) > 10 * active
    assert float(x["n_lora_active"]) == pytest.approx(active)
    assert x["adapter_bytes"] == pytest.approx(adapter_bytes_per_token(active, 8, rs.workload.adapter_dtype))


def test_the_time_model_counts_the_adapters_a_token_passes_through():
    """Adapter FLOPs follow ``n_lora_active`` (the active experts'), not the trainable count;
    the optimizer steps every adapter on the rank: the routed experts' 1/ep of them."""
    from planner.perf import flops, timing

    mf = flops.model_flops(catalog.get_model("qwen3-30b-a3b"))
    x = {"method": 1, "checkpointing": 0, "seq_len": 2048}
    lin_all = timing.executed_flops_per_token(mf, {**x, "n_lora": 4e8})[0]
    lin_active = timing.executed_flops_per_token(mf, {**x, "n_lora": 4e8, "n_lora_active": 4e7})[0]
    assert float(lin_all - lin_active) == pytest.approx(flops.FULL_FLOPS_PER_PARAM * (4e8 - 4e7))
    base = {"method": 1, "tp": 1, "pp": 1, "zero": 0, "dp": 8, "cp": 1, "n_lora": 4e8, "n_lora_experts": 3.6e8}
    for ep in (1, 8):
        trainable = timing._parameters_on_gpu(mf, {**base, "ep": ep})[1]
        assert float(trainable) == pytest.approx(4e7 + 3.6e8 / ep)


def test_fused_experts_keep_no_adapter_activations():
    """GPT-OSS's experts are fused parameters that module targets never reach: LoRA on every
    linear keeps what LoRA on the attention keeps (its router is not an adapted target), with and
    without FP32 adapters under autocast; on Qwen3-30B-A3B, whose experts are linear modules, the
    MLP targets keep their adapters' inputs and casts."""
    def activations(model, targets, dtype="fp32"):
        raw = {"model": model, "workload": {"method": "lora", "lora_targets": targets, "seq_len": 2048,
                                            "micro_batch": 1, "adapter_dtype": dtype, "precision": "mixed"},
               "layout": {"gpu": "h100", "gpus": 1, "checkpointing": "none"}}
        return planner.estimate(raw).components["activations"]

    for dtype in ("fp32", "compute"):
        assert activations("gpt-oss-20b", ["all"], dtype) == activations("gpt-oss-20b", ["q", "k", "v", "o"], dtype)
    assert activations("qwen3-30b-a3b", ["all"]) > activations("qwen3-30b-a3b", ["q", "k", "v", "o"])


def test_the_seed_profile_says_what_its_lora_rule_leaves_out_of_a_moe_model():
    """The documents' N_lora = L·18·r·H knows one MLP per layer; on Qwen3-30B-A3B at rank 16 the
    adapters on its 48 × 128 routed experts (3 · 16 · (2,048 + 768) each) are named as left out,
    and no such note is made for a dense model."""
    def notes(model):
        raw = {"profile": "seed", "model": model, "workload": {"method": "lora", "lora_rank": 16,
                                                                "lora_targets": ["all"], "seq_len": 2048,
                                                                "micro_batch": 1},
               "layout": {"gpu": "h100", "gpus": 1}}
        return [n for n in planner.estimate(raw).assumptions if "routed expert" in n]

    want = (f"the rule counts one MLP per layer: the adapters on every routed expert, "
            f"{48 * 128 * 3 * 16 * (2048 + 768):,} parameters, are left out (the detailed profile counts them)")
    assert notes("qwen3-30b-a3b") == [want]
    assert notes("llama-3-8b") == []


def test_expert_all_to_all_overlap_is_a_recipe_key_that_plans_time_and_export():
    """``recipe.ep_overlap`` reaches the time model's arguments and the Megatron export
    (``--overlap-moe-expert-parallel-comm --delay-wgrad-compute``); rows read it where their
    preset's overlap is stated."""
    from planner.launch.exporters import export_resolved
    from planner.perf.arguments import step_arguments
    from planner.scenario.resolve import resolve
    from planner.validate import throughput as T
    from planner.validate.throughput_cases import case_of

    raw = {"profile": "seed", "model": "olmoe-1b-7b", "workload": {"method": "full", "seq_len": 4096},
           "layout": {"gpu": "h100", "gpus": 8, "ep": 8, "zero": 1}, "recipe": {"ep_overlap": True}}
    rs = resolve(raw)
    x = step_arguments(rs, method=0, checkpointing=0, offload=0, zero=1, seq_len=4096, micro_batch=1,
                       grad_accum=1, tp=1, pp=1, cp=1, ep=8, dp=8, attention=1, fused=0)
    assert x["ep_overlap"] == 1
    args = export_resolved(rs).files["megatron_args.txt"].splitlines()
    assert "--overlap-moe-expert-parallel-comm" in args and "--delay-wgrad-compute" in args
    plain = export_resolved(resolve({**raw, "recipe": {}})).files["megatron_args.txt"].splitlines()
    assert "--overlap-moe-expert-parallel-comm" not in plain
    rows = {r["id"]: r for r in T.read_rows(Path(__file__).resolve().parents[1] / "data" / "measured_throughput_published4.csv")}
    assert case_of(rows["5213"]).x["ep_overlap"] == 1  # 26.04.01 preset: moe_a2a_overlap=True
    assert case_of(rows["5247"]).x["ep_overlap"] == 0  # 25.09: off


@pytest.mark.parametrize("method", ["full", "lora"])
def test_two_shared_experts_cost_what_one_twice_as_wide_costs(method):
    """DeepSeek's shared experts run on every token side by side, one MLP as wide as all of them
    (``MoESpec.shared_width``): Qwen1.5-MoE-A2.7B's one shared expert of 5,632 and two of 2,816
    give the same parameters, adapters, FLOPs and memory, and a shared width of 0 drops them."""
    from planner.core.arch import lora_param_counts
    from planner.perf.flops import model_flops

    one = catalog.get_model("qwen1.5-moe-a2.7b")
    assert one.moe is not None and one.moe.shared_width == 5632
    two = one.model_copy(update={"moe": one.moe.model_copy(update={"shared_experts": 2, "shared_ffn": 2816})})
    none = one.model_copy(update={"moe": one.moe.model_copy(update={"shared_experts": 0})})
    assert param_counts(two) == param_counts(one)
    assert param_counts(one).total - param_counts(none).total == 24 * 3 * 2048 * 5632
    assert model_flops(two) == model_flops(one)  # the time model's inputs
    every = ("q", "k", "v", "o", "gate", "up", "down")
    assert lora_param_counts(two, 8, every) == lora_param_counts(one, 8, every)
    scenario = {"profile": "detailed", "layout": {"gpu": "h100", "gpus": 8, "dp": 8, "zero": 3},
                "workload": {"method": method, "seq_len": 2048, "micro_batch": 1,
                             **({"lora_targets": ["q", "k", "v", "o", "gate", "up", "down"]}
                                if method == "lora" else {})}}
    a = planner.estimate({**scenario, "model": one.model_dump(exclude_none=True)})
    b = planner.estimate({**scenario, "model": two.model_dump(exclude_none=True)})
    assert a.components == b.components and a.total_bytes == b.total_bytes
