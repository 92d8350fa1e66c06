"""GRPO as a workload (``workload.algorithm: grpo``): completions generated each step by a vLLM
engine, then trained on as TRL's GRPOTrainer does. The engine's share of a colocated card, the
reference model only where beta > 0, the generation time, the search against its oracle and the
independent checker, the stacks that run it, and the CLI."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from oracle_helpers import assert_search_matches_oracle
from typer.testing import CliRunner

from planner.catalog.store import get_gpu
from planner.cli.main import app
from planner.core.errors import InputError
from planner.core.specs import COLOCATED_ENGINE_FRACTION, SERVED_ENGINE_FRACTION, Workload
from planner.core.units import floor_bytes
from planner.memory import generation as G
from planner.memory.estimate import FIT_MARGIN, estimate_resolved, memory_of, usable_bytes
from planner.memory.generation import ENGINE_ASLEEP_BYTES
from planner.perf import flops, hardware, timing
from planner.perf.arguments import step_arguments
from planner.scenario.resolve import resolve
from planner.search.answer import plan_raw
from planner.search.checker import check_plan

ROOT = Path(__file__).resolve().parents[1]


def scenario(model="qwen2.5-7b", layout=None, **workload):
    return {"model": model,
            "workload": {"method": "lora", "algorithm": "grpo", "seq_len": 1536, "completion_len": 1024,
                         "micro_batch": 8, "global_batch": 64, **workload},
            "layout": {"gpu": "h100", "gpus": 8, "checkpointing": "full", **(layout or {})}}


def test_trl_defaults():
    """TRL 1.16's GRPOConfig: 8 generations, completions up to 512 tokens, beta 0 (no reference
    model), vLLM colocated at 0.3 of each GPU; vLLM's own 0.9 on GPUs of its own."""
    wl = Workload(algorithm="grpo")
    assert (wl.num_generations, wl.completion_len, wl.reference) == (8, 512, "none")
    assert not wl.reference_forward and wl.generates and wl.sequences_per_sample == 1
    assert Workload(algorithm="grpo", reference="model").reference_forward
    assert Workload(algorithm="dpo").reference == "model"  # DPO keeps its own default
    assert (COLOCATED_ENGINE_FRACTION, SERVED_ENGINE_FRACTION) == (0.3, 0.9)


@pytest.mark.parametrize("workload, layout, message", [
    ({"completion_len": 1536}, {}, "workload.completion_len: 1536 leaves no prompt"),
    ({"global_batch": 60, "micro_batch": 1}, {"gpus": 4}, "not a multiple of num_generations 8"),
    ({"reference": "precomputed"}, {}, "workload.reference: GRPO scores fresh completions"),
    ({}, {"generation_tp": 3}, "layout.generation_tp: 3 does not divide the 8 training GPUs"),
])
def test_bad_grpo_settings_are_named(workload, layout, message):
    with pytest.raises(InputError) as exc:
        resolve(scenario(layout=layout, **workload))
    assert any(message in p for p in exc.value.problems), exc.value.problems


def test_generation_settings_without_grpo_are_refused():
    with pytest.raises(InputError) as exc:
        resolve({"model": "qwen2.5-7b", "layout": {"gpu": "h100", "generation_gpus": 2}})
    assert any("applies to workload.algorithm: grpo" in p for p in exc.value.problems)


def test_a_colocated_engine_takes_its_share_of_every_card():
    """The step must fit in what vLLM's gpu_memory_utilization leaves: usable = capacity · 0.7
    / (1 + fit margin); on GPUs of its own the engine leaves the training cards whole. The step's
    own memory does not depend on where the engine runs."""
    colocated = estimate_resolved(resolve(scenario()))
    served = estimate_resolved(resolve(scenario(layout={"generation_gpus": 2})))
    cap = get_gpu("h100").memory_bytes
    assert colocated.usable_bytes == floor_bytes(floor_bytes(cap * 0.7) / (1 + FIT_MARGIN))
    assert colocated.usable_bytes == usable_bytes(cap, "detailed", None, 0.3)
    assert served.usable_bytes == usable_bytes(cap, "detailed")
    assert colocated.total_bytes == served.total_bytes
    assert "generation engine" in colocated.fit_rule and "generation engine" not in served.fit_rule


def test_an_engine_that_cannot_hold_its_weights_does_not_fit():
    """72B in 16 bits is 145 GB: 0.3 of one H100 cannot hold it, so vLLM would not start; at tp 8
    the engine has 0.3 · 8 · 85.5 GB ≈ 205 GB."""
    one = estimate_resolved(resolve(scenario("qwen2.5-72b", layout={"gpus": 8, "zero": 3})))
    assert one.fits is False
    assert any("vLLM will not start" in a for a in one.assumptions)
    eight = estimate_resolved(resolve(scenario("qwen2.5-72b", layout={"gpus": 8, "zero": 3, "generation_tp": 8})))
    assert not any("vLLM will not start" in a for a in eight.assumptions)
    rs = resolve(scenario("qwen2.5-72b", layout={"gpus": 8, "zero": 3, "generation_tp": 8}))
    assert G.engine_fits(rs.model, rs.workload, rs.layout, get_gpu("h100").memory_bytes)


def test_kv_cache_per_token():
    """Qwen2.5-7B: 28 layers, 4 KV heads of 128: a key and a value of 4·128 per layer in 16 bits
    = 28 · 2 · 512 · 2 = 57,344 bytes per token."""
    assert G.kv_bytes_per_token(resolve({"model": "qwen2.5-7b"}).model) == 28 * 2 * 4 * 128 * 2


@pytest.mark.parametrize("method, copy", [("full", True), ("lora", False)])
def test_reference_only_with_beta(method, copy):
    """beta 0 (the default): no reference at all; beta > 0: a 16-bit copy beside a fully trained
    policy (sharded like it), the base with the adapters off for LoRA."""
    layout = {"zero": 3}
    none = estimate_resolved(resolve(scenario(method=method, layout=layout)))
    ref = estimate_resolved(resolve(scenario(method=method, reference="model", layout=layout)))
    assert "reference_weights" not in none.components
    assert ("reference_weights" in ref.components) is copy


def _x(rs, **over):
    wl, lay = rs.workload, rs.layout
    x = step_arguments(rs, method=1, checkpointing=2, offload=0, zero=0, seq_len=wl.seq_len,
                       micro_batch=wl.micro_batch, grad_accum=rs.grad_accum, tp=1, pp=1, cp=1, ep=1,
                       dp=lay.dp, attention=1, fused=0)
    return {**x, **over}


def test_generation_time_as_vllm_decodes():
    """One engine per GPU when colocated: 64 completions over 8 engines = 8 each (one prompt of 8
    samples); decode 1024 steps of one batch of 8, each reading the 16-bit weights and the batch's
    KV cache at the memory bandwidth (decode is memory-bound at batch 8) plus the host's 2 ms; the
    prompt prefilled once at the GEMMs' rate; the weights copied in first."""
    rs = resolve(scenario())
    mf = flops.model_flops(rs.model)
    perf = hardware.GpuPerf.of(rs.gpu)
    x = _x(rs)
    weights, kv = G.engine_weight_bytes(rs.model), G.kv_bytes_per_token(rs.model)
    read = (weights + 8 * (512 + 512) * kv) / perf.memory_bps
    assert read > 2 * mf.active_params * 8 / (perf.peak_flops * perf.utilization)  # memory-bound
    prefill = 2 * mf.active_params * 512 * 1 / (perf.peak_flops * perf.utilization)
    expected = 2 * weights / perf.memory_bps + prefill + 1024 * (read + timing.DECODE_STEP_HOST_S)
    assert float(timing.generation_s(mf, perf, timing.FITTED, x)) == pytest.approx(expected, rel=1e-9)
    # the step is the training step plus generation
    no_gen = {k: v for k, v in x.items() if not k.startswith("gen_")}
    assert float(timing.step_time_s(mf, perf, **x)) == pytest.approx(
        float(timing.step_time_s(mf, perf, **no_gen)) + expected, rel=1e-9)
    assert float(timing.generation_s(mf, perf, timing.FITTED, no_gen)) == 0.0


def test_fewer_engines_take_longer_and_the_kv_cache_caps_the_batch():
    """Served on 2 GPUs, each engine decodes 32 completions where 8 colocated engines decode 8;
    an engine whose KV cache holds fewer sequences than it is given decodes them in waves."""
    rs = resolve(scenario())
    mf, perf = flops.model_flops(rs.model), hardware.GpuPerf.of(rs.gpu)
    colocated = float(timing.generation_s(mf, perf, timing.FITTED, _x(rs)))
    served = float(timing.generation_s(mf, perf, timing.FITTED, _x(rs, gen_gpus=2, gen_fraction=0.9)))
    assert served > colocated
    # a share whose KV cache holds 3 full sequences: 8 completions in ceil(8/3) = 3 waves
    x = _x(rs)
    weights, kv = x["gen_weight_bytes"], x["gen_kv_bytes_per_token"]
    fraction = (weights + 3.5 * 1536 * kv) / perf.memory_capacity
    waves3 = float(timing.generation_s(mf, perf, timing.FITTED, {**x, "gen_fraction": fraction}))
    read3 = (weights + 3 * 1024 * kv) / perf.memory_bps
    assert waves3 > 2.5 * 1024 * read3


def test_the_default_global_batch_holds_whole_groups():
    """64 completions by default; with 5 generations per prompt, 65 (13 whole groups)."""
    assert timing.default_global_batch("lora", 1536, 1e8, 5) == 65
    assert timing.default_global_batch("lora", 1536, 1e8, 8) == 64


GRPO_PLAN = {"model": "qwen2.5-1.5b",
             "workload": {"method": "lora", "algorithm": "grpo", "seq_len": 1024, "completion_len": 512,
                          "tokens": 2e7, "global_batch": 32},
             "search": {"gpu_types": ["l40s", "a100-80gb", "h100"], "max_gpus": 4, "micro_batch": [1, 2, 4],
                        "tp": [1], "pp": [1], "cp": [1]}, "objective": "cost", "top": 3}


@pytest.mark.parametrize("profile", ["seed", "detailed"])
def test_grpo_search_matches_its_oracle_and_the_checker(profile):
    assert_search_matches_oracle({**GRPO_PLAN, "profile": profile})


#: Full fine-tuning with a sleeping engine at 0.6 of each card: a step may take the card, the
#: states at rest only 0.4 of it (on a 48 GB L40S at one or two GPUs the binding one).
GRPO_ASLEEP = {**GRPO_PLAN, "workload": {**GRPO_PLAN["workload"], "method": "full"},
               "layout": {"generation_memory_fraction": 0.6}, "recipe": {"generation_sleep": True}}


@pytest.mark.parametrize("profile", ["seed", "detailed"])
def test_search_with_a_sleeping_engine_matches_its_oracle_and_the_checker(profile):
    assert_search_matches_oracle({**GRPO_ASLEEP, "profile": profile})


def test_grpo_plans_name_stacks_that_run_it_and_where_they_generate():
    """Only stacks whose sources run GRPO with a colocated engine (TRL under accelerate or
    DeepSpeed) are named; each plan says where its completions are generated, and costs more than
    the same tokens trained by SFT (generation and the engine's share of the card)."""
    grpo = plan_raw(GRPO_PLAN)
    assert grpo.plans and not grpo.checker_rejected
    assert {p.stack for p in grpo.plans} <= {"hf-fsdp", "hf-deepspeed"}
    assert all(p.generation and "vLLM" in p.generation for p in grpo.plans)
    sft = plan_raw({**GRPO_PLAN, "workload": {k: v for k, v in GRPO_PLAN["workload"].items()
                                              if k not in ("algorithm", "completion_len")}})
    assert sft.plans[0].generation is None
    assert grpo.plans[0].cost_usd > sft.plans[0].cost_usd
    assert all(p.global_batch % 8 == 0 for p in grpo.plans)


def test_cli():
    runner = CliRunner()
    out = runner.invoke(app, ["plan", "--model", "qwen2.5-7b", "--method", "lora", "--algorithm", "grpo",
                              "--tokens", "1e8", "--seq-len", "1536", "--completion-len", "1024",
                              "--num-generations", "4", "--json"])
    assert out.exit_code == 0, out.output
    import json
    r = json.loads(out.output)
    assert r["plans"] and all(p["generation"].startswith("vLLM ") for p in r["plans"])
    assert all(p["global_batch"] % 4 == 0 for p in r["plans"])
    served = runner.invoke(app, ["plan", "--model", "qwen2.5-7b", "--method", "lora", "--algorithm", "grpo",
                                 "--tokens", "1e8", "--gpu", "h100"], input=None)
    assert served.exit_code == 0, served.output
    est = runner.invoke(app, ["estimate", "--model", "qwen2.5-7b", "--method", "lora", "--algorithm", "grpo",
                              "--gpu", "h100", "--gpus", "8", "--global-batch", "64"])
    assert est.exit_code == 0, est.output
    assert "generation engine" in est.output and "GRPO" in est.output


def test_a_served_engine_s_gpus_are_counted_and_billed():
    """Pinned on GPUs of its own, the engine's GPUs come out of max_gpus and are billed with the
    training GPUs for the whole step; the checker re-derives both."""
    served = plan_raw({**GRPO_PLAN, "layout": {"generation_gpus": 2}})
    assert served.plans and not served.checker_rejected
    for p in served.plans:
        assert p.generation_gpus == 2 and p.gpus + 2 <= GRPO_PLAN["search"]["max_gpus"]
        assert "on 2 GPUs of its own" in p.generation
        price = get_gpu(p.gpu).price_on_demand_usd_per_hour
        assert p.hourly_usd == pytest.approx((p.gpus + 2) * price)


def test_an_open_placement_is_the_best_of_every_placement():
    """Left open, the engine's placement is searched: colocated and each count of GPUs of its own
    (1, 2, …, below max_gpus) solved exactly, the plans ranked together, so the best plan is the
    best of the pinned searches."""
    from planner.search.answer import GENERATION_GPU_CHOICES

    open_ = plan_raw({**GRPO_PLAN, "top": 50})
    pinned = [plan_raw({**GRPO_PLAN, "layout": {"generation_gpus": k}, "top": 50})
              for k in (0, *(k for k in GENERATION_GPU_CHOICES if k < GRPO_PLAN["search"]["max_gpus"]))]
    best = min(p.cost_usd for r in pinned for p in r.plans)
    assert open_.plans[0].cost_usd == pytest.approx(best)
    costs = [p.cost_usd for p in open_.plans]
    assert costs == sorted(costs) and [p.rank for p in open_.plans] == list(range(1, len(costs) + 1))
    assert not open_.checker_rejected


@pytest.mark.parametrize("profile", ["seed", "detailed"])
def test_a_served_engine_s_search_matches_its_oracle(profile):
    assert_search_matches_oracle({**GRPO_PLAN, "profile": profile, "layout": {"generation_gpus": 1}})


def test_a_grpo_plan_exports_trl_s_grpo_config():
    """A GRPO plan's Trainer file is TRL's GRPOConfig: completions per device, the group, the
    prompt and completion caps, beta 0 unless the plan keeps a reference model, and vLLM where the
    plan put it."""
    import json

    from planner.launch.exporters import export_resolved

    base = scenario(layout={"gpus": 8}, num_generations=4, micro_batch=4)
    body = json.loads(export_resolved(resolve(base), formats=("hf",)).files["grpo_config.json"])
    assert (body["per_device_train_batch_size"], body["num_generations"]) == (4, 4)
    assert body["max_completion_length"] == 1024 and "max_prompt_length" not in body  # no such key in TRL 1.x
    assert body["beta"] == 0.0 and body["use_vllm"] is True
    assert (body["vllm_mode"], body["vllm_gpu_memory_utilization"], body["vllm_tensor_parallel_size"]) == (
        "colocate", 0.3, 1)
    ref = export_resolved(resolve(scenario(reference="model")), formats=("hf",))
    assert json.loads(ref.files["grpo_config.json"])["beta"] > 0
    served = export_resolved(resolve(scenario(layout={"generation_gpus": 2})), formats=("hf",))
    assert json.loads(served.files["grpo_config.json"])["vllm_mode"] == "server"
    assert any("trl vllm-serve" in line for line in served.notes)


def test_grpo_rows_are_read_with_their_engine():
    """A measured GRPO row is read as GRPO: its completion length, group, engine placement, share
    and TP reach the time model, a served engine's GPUs leave the training dp, and the row's
    scenario (memory and verdicts) carries the same; a row without its completion length is not
    guessed."""
    from planner.validate import throughput as T
    from planner.validate.cells import Unmodelable
    from planner.validate.rows import scenario_of
    from planner.validate.throughput_cases import case_of

    base = next(r for r in T.read_rows(ROOT / "data" / "measured_throughput_h200_time.csv") if r["method"].strip() == "lora")
    row = {**base, "algorithm": "grpo", "seq_len": "1536", "completion_len": "1024", "num_generations": "4",
           "gpus": "8", "dp": "", "tp": "1", "pp": "1", "cp": "1", "generation_gpus": "2", "generation_tp": "2",
           "generation_memory_fraction": "0.8", "reference": "model"}
    x = case_of(row).x
    assert (x["gen_completion_len"], x["gen_prompt_len"], x["gen_num_generations"]) == (1024, 512, 4)
    assert (x["gen_gpus"], x["gen_tp"], x["gen_fraction"], x["reference_forward"]) == (2, 2, 0.8, 1)
    assert x["dp"] == 6  # 8 GPUs, 2 of them serving the engine
    assert case_of(base).x["gen_completion_len"] == 0  # a supervised row generates nothing
    with pytest.raises(Unmodelable, match="completion_len"):
        case_of({**row, "completion_len": ""})
    import csv

    with open(ROOT / "data" / "measured_posttrain_memory.csv", newline="") as f:
        mem_base = next(r for r in csv.DictReader(f) if r["id"] == "3603")  # LoRA DPO on one GPU
    mem_row = {**mem_base, "algorithm": "grpo", "seq_len": "1536", "completion_len": "1024", "num_generations": "8",
               "generation_gpus": "0", "generation_memory_fraction": "0.4", "reference": "none"}
    sc = scenario_of(mem_row)
    assert sc["workload"]["algorithm"] == "grpo" and sc["workload"]["completion_len"] == 1024
    assert sc["layout"]["generation_gpus"] == 0 and sc["layout"]["generation_memory_fraction"] == 0.4


def test_a_batch_ends_with_its_longest_completion():
    """Measured runs give the mean completion and the cap apart: decoding takes at least the
    cap's steps (the batch waits for its longest sequence), while the tokens trained on are the
    mean's; a plan gives the cap alone and is timed at it."""
    rs = resolve(scenario())
    mf, perf = flops.model_flops(rs.model), hardware.GpuPerf.of(rs.gpu)
    x = _x(rs)
    at_cap = float(timing.generation_s(mf, perf, timing.FITTED, x))
    mean = float(timing.generation_s(mf, perf, timing.FITTED, {**x, "gen_completion_len": 256,
                                                               "gen_completion_cap": 1024}))
    shorter = float(timing.generation_s(mf, perf, timing.FITTED, {**x, "gen_completion_len": 256}))
    assert shorter < mean < at_cap  # the cap's steps, each over a lighter KV cache
    assert mean > 3.5 * shorter


def test_phases_that_take_turns_leave_each_the_card():
    """An engine asleep while the step trains leaves the step the card less what it keeps asleep
    (its CUDA graphs); while it generates, the trainer's states at rest (no gradients, no
    activations) must fit beside its whole share, unless they go to host memory then (verl's
    param_offload, NeMo RL colocated). Each step moves the engine's weights at sleep level 1 (and
    the trainer's states) out and back over PCIe."""
    plain = estimate_resolved(resolve(scenario()))
    turns = estimate_resolved(resolve({**scenario(), "recipe": {"generation_sleep": True, "rollout_offload": True}}))
    asleep = estimate_resolved(resolve({**scenario(), "recipe": {"generation_sleep": True}}))
    cap = get_gpu("h100").memory_bytes
    whole, beside = usable_bytes(cap, "detailed"), usable_bytes(cap, "detailed", engine_share=0.3)
    assert plain.usable_bytes == beside < whole == turns.usable_bytes == asleep.usable_bytes
    # asleep, the engine keeps its CUDA graphs' pool: a component of the step's total
    assert turns.components["engine_asleep"] == ENGINE_ASLEEP_BYTES
    assert turns.total_bytes == asleep.total_bytes == plain.total_bytes + ENGINE_ASLEEP_BYTES
    assert plain.generation_bytes is None and turns.generation_bytes is None  # nothing of the trainer's
    # the states at rest: the 16-bit base and the adapters' states, the CUDA context, no activations
    mem = memory_of(resolve(scenario()))
    at_rest = sum(v for k, v in mem.components.items() if k in ("weights", "adapter_states"))
    assert at_rest < asleep.generation_bytes < at_rest + 2 * 2**30
    assert asleep.generation_usable_bytes == beside
    assert asleep.headroom_bytes == min(whole - asleep.total_bytes, beside - asleep.generation_bytes)
    rs = resolve(scenario())
    mf, perf = flops.model_flops(rs.model), hardware.GpuPerf.of(rs.gpu)
    x = _x(rs)
    base = float(timing.generation_s(mf, perf, timing.FITTED, x))
    # level 2 (TRL 1.x, verl) drops the weights, which the load reloads anyway: no transfer; level 1
    # (NeMo RL) keeps them in host memory, out and back over PCIe each step
    assert float(timing.generation_s(mf, perf, timing.FITTED, {**x, "gen_sleep": 1})) == base
    slept = float(timing.generation_s(mf, perf, timing.FITTED, {**x, "gen_sleep": 1, "gen_sleep_level": 1}))
    pcie = timing.PCIE_HOST_GBPS * 1e9
    assert slept - base == pytest.approx(2 * x["gen_weight_bytes"] / pcie, rel=1e-9)
    offloaded = float(timing.generation_s(mf, perf, timing.FITTED, {**x, "gen_sleep": 1, "gen_sleep_level": 1,
                                                                    "gen_rollout_offload": 1}))
    # LoRA on one GPU per replica: the 16-bit base and the adapters' FP32 master and moments
    states = mf.params * x.get("weight_bytes", 2.0) + x["n_lora"] * timing.ROLLOUT_STATE_BYTES_PER_PARAM
    assert offloaded - slept == pytest.approx(2 * states / pcie, rel=1e-6)


def test_states_at_rest_beside_a_waking_engine_bind():
    """A fully trained 7B model's FP32 master weights and Adam moments (~12 bytes/param) stay
    on the card while a sleeping engine generates beside them: the step alone fits a 141 GB H200,
    the states at rest beside the engine's 75 % do not, so the layout is refused; with the states
    in host memory while it generates it fits (awake through the step, the engine leaves the
    step too little)."""
    sc = scenario(layout={"gpu": "h200", "gpus": 2, "zero": 3, "generation_memory_fraction": 0.75},
                  method="full", micro_batch=1, global_batch=8)
    awake = estimate_resolved(resolve(sc))
    asleep = estimate_resolved(resolve({**sc, "recipe": {"generation_sleep": True}}))
    turns = estimate_resolved(resolve({**sc, "recipe": {"generation_sleep": True, "rollout_offload": True}}))
    assert awake.verdict == "does_not_fit"  # the step beside the engine's 75 %
    assert asleep.total_bytes == turns.total_bytes <= asleep.usable_bytes  # the step alone fits
    # FSDP over 2 GPUs: half of the FP32 master, the moments and the 16-bit weights stay
    assert asleep.generation_bytes > 7.6e9 * (4 + 8 + 2) / 2
    assert asleep.generation_bytes > asleep.generation_usable_bytes * (1 + asleep.error_band)
    assert asleep.verdict == "does_not_fit" and turns.verdict == "fits"


def test_the_time_cost_front_spans_every_placement():
    """--pareto with the placement open: the fronts of every placement merged, no plan beaten by
    another on both time and cost, the cheapest plan of any placement on it."""
    front = plan_raw(GRPO_PLAN, pareto=True)
    assert front.objective == "pareto" and front.plans and not front.checker_rejected
    pts = [(p.time_s, p.cost_usd) for p in front.plans]
    assert pts == sorted(pts)
    assert all(b[1] < a[1] for a, b in itertools.pairwise(pts))  # faster costs more along it
    cheapest = plan_raw({**GRPO_PLAN, "top": 1}).plans[0]
    assert min(c for _, c in pts) == pytest.approx(cheapest.cost_usd)


#: Full GRPO of a 7B model on at most two H100s with no CPU offload: beside TRL's engine awake at
#: 0.3 of each card the FSDP step does not fit; verl's engine sleeps while the step trains.
VERL_ONLY = {"model": "qwen2.5-7b",
             "workload": {"method": "full", "algorithm": "grpo", "seq_len": 1536, "completion_len": 1024,
                          "tokens": 1e7, "global_batch": 64},
             "layout": {"generation_gpus": 0},
             "search": {"gpu_types": ["h100"], "max_gpus": 2, "offload": ["none"], "micro_batch": [1, 2, 4],
                        "tp": [1], "pp": [1], "cp": [1]}, "objective": "cost", "top": 3}


def test_a_stack_whose_engine_sleeps_is_offered_where_only_it_fits():
    """verl (``catalogs/stacks.yaml``: ``free_cache_engine`` True, ``param_offload`` False at
    b178a3cd) sleeps its hybrid engine while the step trains and keeps the actor's states on the
    card: the plan the TRL stacks cannot make is made with it, states and engine checked in turn,
    and says so; the search matches its oracle, and the pinned plan carries verl's recipe."""
    from planner.catalog.stacks import get_stack

    verl = get_stack("verl")
    assert verl.algorithms == ["grpo"] and verl.recipe.generation_sleep and not verl.recipe.rollout_offload
    only_trl = plan_raw({**VERL_ONLY, "search": {**VERL_ONLY["search"], "stacks": ["hf-fsdp", "hf-deepspeed"]}})
    assert not only_trl.plans
    out = plan_raw(VERL_ONLY)
    assert out.plans and {p.stack for p in out.plans} == {"verl"} and not out.checker_rejected
    for p in out.plans:
        assert p.pinned_scenario["recipe"]["generation_sleep"] is True
        assert "asleep while the step trains" in p.generation
        est = p.memory
        assert est.usable_bytes > est.generation_usable_bytes >= est.generation_bytes
        assert est.total_bytes > est.generation_usable_bytes  # the step needs more than the engine leaves
    assert_search_matches_oracle(VERL_ONLY)
    # supervised and DPO plans never name it (its sources run GRPO here)
    sft = plan_raw({**VERL_ONLY, "workload": {"method": "full", "seq_len": 1536, "tokens": 1e7}})
    assert all(p.stack != "verl" for p in sft.plans)


def test_engine_flags_on_the_command_line():
    """--generation-sleep, --rollout-offload, --generation-memory-fraction and --generation-gpus set
    the scenario's recipe and layout keys: the estimate then shows the states beside the waking
    engine, and a plan pinned to served GPUs searches that placement only."""
    runner = CliRunner()
    base = ["estimate", "--model", "qwen2.5-7b", "--method", "full", "--algorithm", "grpo", "--gpu", "h100",
            "--gpus", "2", "--zero", "3", "--micro-batch", "1", "--checkpointing", "full", "--json"]
    asleep = json.loads(runner.invoke(app, [*base, "--generation-sleep", "--generation-memory-fraction", "0.5"]).output)
    assert asleep["generation_bytes"] > asleep["generation_usable_bytes"] and asleep["verdict"] == "does_not_fit"
    assert asleep["components"]["engine_asleep"] == ENGINE_ASLEEP_BYTES
    turns = runner.invoke(app, [*base, "--generation-sleep", "--rollout-offload", "--generation-memory-fraction", "0.5"])
    assert turns.exit_code == 0 and json.loads(turns.output)["generation_bytes"] is None
    served = runner.invoke(app, ["plan", "--model", "qwen2.5-7b", "--method", "lora", "--algorithm", "grpo",
                                 "--tokens", "1e7", "--gpu", "h100", "--generation-gpus", "2", "--json"])
    assert served.exit_code == 0, served.output
    assert {p["generation_gpus"] for p in json.loads(served.output)["plans"]} == {2}


def test_verl_export_writes_the_plan_as_verl_counts_it():
    """A verl plan's bundle runs verl's trainer with the plan's overrides (keys of verl's trainer
    config at b178a3cd): batches in prompts (the global batch of completions over the group
    size), micro-batches in completions per GPU, the engine's share and TP as planned and its sleep
    as the stack's recipe; its sharding files are FSDP's. A served engine or a supervised plan is
    not verl's: asked for, it is skipped with the reason; unasked, a supervised bundle says nothing
    of it."""
    from planner.launch.exporters import export_resolved

    plan = plan_raw(VERL_ONLY).plans[0]
    rs = resolve(plan.pinned_scenario)
    bundle = export_resolved(rs, stack="verl")
    script = bundle.files["verl_run.sh"]
    args = dict(line.strip().rstrip(" \\").split("=", 1) for line in script.splitlines() if "=" in line)
    assert int(args["data.train_batch_size"]) * 8 == plan.global_batch == 64
    assert args["actor_rollout_ref.actor.ppo_mini_batch_size"] == args["data.train_batch_size"]
    assert int(args["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"]) == plan.micro_batch
    assert args["actor_rollout_ref.rollout.n"] == "8"
    assert float(args["actor_rollout_ref.rollout.gpu_memory_utilization"]) == rs.layout.engine_memory_fraction
    assert args["actor_rollout_ref.rollout.free_cache_engine"] == "True"
    assert args["actor_rollout_ref.actor.fsdp_config.param_offload"] == "False"
    assert int(args["data.max_prompt_length"]) + int(args["data.max_response_length"]) == plan.seq_len
    assert int(args["trainer.n_gpus_per_node"]) * int(args["trainer.nnodes"]) == plan.gpus
    assert "ds_config.json" not in bundle.files and "accelerate_config.yaml" in bundle.files
    assert json.loads(bundle.files["grpo_config.json"])["vllm_enable_sleep_mode"] is True
    served = export_resolved(resolve({**plan.pinned_scenario, "layout": {**plan.pinned_scenario["layout"],
                                                                         "generation_gpus": 1}}),
                             formats=("verl",))
    assert "verl_run.sh" not in served.files and "colocated" in served.skipped["verl"]
    sft = plan_raw({**VERL_ONLY, "workload": {"method": "lora", "seq_len": 1536, "tokens": 1e7}}).plans[0]
    assert "verl" not in export_resolved(resolve(sft.pinned_scenario)).skipped
    assert "GRPO" in export_resolved(resolve(sft.pinned_scenario), formats=("verl",)).skipped["verl"]


def test_old_log_probs_and_off_policy_overlap_in_time():
    """Two stack behaviours read from their sources: a stack that scores its completions with one
    more forward (verl's hybrid engine recomputes the old log-probs; NeMo RL's previous log-probs)
    pays a forward without gradients per token, as a reference forward costs; an engine on GPUs
    of its own that generates the next step's completions meanwhile (one-step off-policy) makes a
    step the longer of training and generating, plus the weights' transfer. A colocated engine
    cannot overlap."""
    rs = resolve(scenario())
    mf, perf = flops.model_flops(rs.model), hardware.GpuPerf.of(rs.gpu)
    x = _x(rs)
    base = float(timing.step_time_s(mf, perf, None, **x))
    one = float(timing.step_time_s(mf, perf, None, **{**x, "reference_forward": 1}))
    two = float(timing.step_time_s(mf, perf, None, **{**x, "reference_forward": 2}))
    assert base < one < two and two - one == pytest.approx(one - base, rel=1e-6)
    scored = resolve({**scenario(), "recipe": {"logprob_forward": True}})
    assert _x(scored)["reference_forward"] == 1 and "reference_forward" not in x
    both = resolve({**scenario(reference="model"), "recipe": {"logprob_forward": True}})
    assert _x(both)["reference_forward"] == 2
    served = resolve({**scenario(layout={"generation_gpus": 8}), "recipe": {"async_generation": True}})
    xs = _x(served)
    assert xs["gen_async"] == 1
    load, work = timing._generation_parts(mf, perf, timing.FITTED, xs)
    sync = float(timing.step_time_s(mf, perf, None, **{**xs, "gen_async": 0}))
    overlapped = float(timing.step_time_s(mf, perf, None, **xs))
    train = sync - float(load) - float(work)
    assert overlapped == pytest.approx(max(train, float(work)) + float(load), rel=1e-9) and overlapped < sync
    colocated = resolve({**scenario(), "recipe": {"async_generation": True}})
    assert _x(colocated)["gen_async"] == 0  # nothing to overlap on the training GPUs


def test_verl_plans_are_timed_with_their_old_log_prob_forward():
    """A verl plan's time counts its old-log-prob forward: the search's figure is the checker's
    (the plan passes it), and above the same layout timed as TRL runs it (no such forward)."""
    plan = plan_raw(VERL_ONLY).plans[0]
    assert plan.pinned_scenario["recipe"]["logprob_forward"] is True and check_plan(VERL_ONLY, plan) == []
    trl = {**plan.pinned_scenario, "recipe": {**plan.pinned_scenario["recipe"], "logprob_forward": False}}
    rs_v, rs_t = resolve(plan.pinned_scenario), resolve(trl)
    mf, perf = flops.model_flops(rs_v.model), hardware.GpuPerf.of(rs_v.gpu)
    args = {"method": 0, "checkpointing": 0, "offload": 0, "zero": 3, "seq_len": plan.seq_len,
            "micro_batch": plan.micro_batch, "grad_accum": plan.grad_accum, "tp": 1, "pp": 1, "cp": 1, "ep": 1,
            "dp": plan.dp, "attention": 1, "fused": 0}
    t_v = float(timing.step_time_s(mf, perf, None, **step_arguments(rs_v, **args)))
    t_t = float(timing.step_time_s(mf, perf, None, **step_arguments(rs_t, **args)))
    assert t_v > t_t


def test_a_reference_kept_in_host_memory_leaves_the_card():
    """verl's reference worker keeps its FSDP parameters on the CPU (``reference_offload``): a full
    fine-tuning's frozen 16-bit copy leaves the card for host memory, byte for byte."""
    sc = scenario(method="full", micro_batch=1, reference="model", layout={"gpu": "h200", "zero": 3})
    on_card = estimate_resolved(resolve(sc))
    in_host = estimate_resolved(resolve({**sc, "recipe": {"reference_offload": True}}))
    ref = on_card.components["reference_weights"]
    assert ref == pytest.approx(7.6e9 * 2 / 8, rel=0.01)  # the 16-bit copy over 8 FSDP ranks
    assert "reference_weights" not in in_host.components
    assert in_host.host_bytes - on_card.host_bytes == pytest.approx(ref, abs=1)
    assert in_host.total_bytes < on_card.total_bytes


def test_a_colocated_only_stack_is_never_named_for_an_engine_apart():
    """verl's hybrid engine runs on the training GPUs only (``generation_placements``): with verl
    the only stack, every plan is colocated, and the checker refuses a verl plan whose engine has
    GPUs of its own."""
    raw = {**VERL_ONLY, "layout": {}, "search": {**VERL_ONLY["search"], "max_gpus": 4, "stacks": ["verl"]}}
    out = plan_raw(raw)
    assert out.plans and {p.generation_gpus for p in out.plans} == {0} and not out.checker_rejected
    planted = out.plans[0].model_copy(update={"generation_gpus": 1})
    assert any("does not run" in problem for problem in check_plan(raw, planted))


def test_an_engine_apart_swaps_nothing_between_phases():
    """Sleep and the trainer's offload between phases are a colocated engine's: an engine on GPUs of
    its own is timed the same with or without them, as memory treats it."""
    rs = resolve(scenario(layout={"generation_gpus": 8}))
    mf, perf = flops.model_flops(rs.model), hardware.GpuPerf.of(rs.gpu)
    x = _x(rs)
    plain = float(timing.step_time_s(mf, perf, None, **x))
    for flags in ({"gen_sleep": 1, "gen_sleep_level": 1}, {"gen_rollout_offload": 1}):
        assert float(timing.step_time_s(mf, perf, None, **{**x, **flags})) == plain


def test_nothing_fits_is_explained_with_the_closest_stack_s_engine_phases():
    """With verl the only stack and nothing fitting, the explanation judges its layouts as verl runs
    them: the closest layout names verl, and its steps are estimated with the engine asleep (the
    step against the whole card less its residue, not less the engine's share)."""
    raw = {**VERL_ONLY, "search": {**VERL_ONLY["search"], "max_gpus": 2, "stacks": ["verl"], "micro_batch": [8],
                                   "checkpointing": ["none"]}}
    out = plan_raw(raw)
    assert not out.plans
    closest = out.explanation["closest"]
    assert closest["stack"] == "verl"
    cap = get_gpu("h100").memory_bytes
    whole, beside = usable_bytes(cap, "detailed"), usable_bytes(cap, "detailed", engine_share=0.3)
    assert closest["usable_bytes"] in (whole, beside)
    steps = out.explanation["steps"]
    assert steps and all(s["usable_bytes"] in (whole, beside) for s in steps)
    assert any(s["usable_bytes"] == whole for s in steps)  # a step's own peak, held to the card


def test_verl_export_targets_the_plan_s_lora_modules():
    """The verl command's LoRA targets are the plan's (what memory and time were sized for), named
    as the PEFT file names them."""
    from planner.launch.exporters import export_resolved

    sc = scenario(lora_targets=["q", "v"], lora_alpha=16, layout={"gpu": "h100", "gpus": 2, "zero": 3})
    bundle = export_resolved(resolve(sc), formats=("verl", "hf"))
    peft = json.loads(bundle.files["lora_config.json"])["target_modules"]
    assert peft == ["q_proj", "v_proj"]
    assert "actor_rollout_ref.model.target_modules=[q_proj,v_proj]" in bundle.files["verl_run.sh"]


def test_a_relaxed_grpo_sequence_keeps_a_prompt():
    """GRPO's sequence is prompt + completion: allowed to shorten it, the search never goes down to
    the completion's length (which would leave no prompt)."""
    from planner.search.request import build_tiers

    rs = resolve({**scenario(), "workload": {**scenario()["workload"], "allow_relax": ["seq_len"]}})
    seqs = {t.seq_len for t in build_tiers(rs)}
    assert min(seqs) > rs.workload.completion_len and rs.workload.seq_len in seqs


def test_estimate_as_a_stack_runs_it():
    """``estimate --stack`` takes the stack's recipe where the scenario leaves a key unset, as a plan
    naming the stack pins it; a key the user sets wins; an unknown stack is one line, exit 2."""
    runner = CliRunner()
    base = ["estimate", "--model", "qwen2.5-7b", "--method", "full", "--algorithm", "grpo", "--gpu", "h100",
            "--gpus", "2", "--zero", "3", "--micro-batch", "1", "--checkpointing", "full", "--json"]
    verl = json.loads(runner.invoke(app, [*base, "--stack", "verl"]).output)
    awake = json.loads(runner.invoke(app, base).output)
    asleep = json.loads(runner.invoke(app, [*base, "--generation-sleep", "--json"]).output)
    assert verl["generation_bytes"] == asleep["generation_bytes"] is not None and awake["generation_bytes"] is None
    assert verl["usable_bytes"] == asleep["usable_bytes"] > awake["usable_bytes"]
    mine = json.loads(runner.invoke(app, [*base, "--stack", "verl", "--no-generation-sleep"]).output)
    assert mine["usable_bytes"] == awake["usable_bytes"] and mine["generation_bytes"] is None
    bad = runner.invoke(app, [*base, "--stack", "verll"])
    assert bad.exit_code == 2 and "stack: unknown stack 'verll'" in bad.output and "Traceback" not in bad.output


def test_every_pipeline_stage_s_states_wait_beside_the_engine():
    """Under pipeline parallelism each stage holds its own states at rest while the engine
    generates: one generation check, the largest stage's, and no stage's left as a step phase."""
    sc = {**scenario(method="full", micro_batch=1, layout={"gpu": "h100", "gpus": 4, "pp": 2}),
          "recipe": {"generation_sleep": True}}
    mem = memory_of(resolve(sc))
    names = set(mem.phase_bytes)
    assert "generation" in names and not any(n.startswith("generation (") for n in names)
    assert all(n.endswith(" (engine asleep)") for n in names - {"generation"})
    one_stage = memory_of(resolve({**sc, "layout": {**sc["layout"], "gpus": 2, "pp": 1}}))
    # two stages split the weights: each holds less at rest than the whole model on one
    assert mem.phase_bytes["generation"] < one_stage.phase_bytes["generation"]
