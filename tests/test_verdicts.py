"""Fit verdicts: one rule (device bytes plus the fit margin) in estimate, search and validation,
and the published runs of data/verdicts.csv judged by it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import planner
from planner import catalog
from planner.cli.main import app
from planner.memory.estimate import FIT_MARGIN, SEED_RESERVE, usable_bytes
from planner.validate.cells import Unmodelable
from planner.validate.verdicts import capacity_of, catalog_model, judge_row, read_rows, validate_verdicts

ROOT = Path(__file__).resolve().parents[1]
VERDICTS = ROOT / "data" / "verdicts.csv"
LORA_8B = {"model": "llama-3.1-8b", "method": "lora", "seq_len": 2048, "micro_batch": 1,
           "gpu": "a100-80gb", "gpus": 1, "checkpointing": "full"}


def test_detailed_fit_rule_is_device_bytes_plus_the_margin():
    """No flat reserve under the detailed profile: usable = capacity / (1 + margin)."""
    cap = catalog.get_gpu("a100-80gb").memory_bytes
    usable = usable_bytes(cap, "detailed")
    assert usable * (1 + FIT_MARGIN) <= cap < (usable + 1) * (1 + FIT_MARGIN)
    assert usable > cap * (1 - SEED_RESERVE)  # less withheld than the seed's 10 %
    assert usable_bytes(cap, "seed") == int(cap * (1 - SEED_RESERVE))
    assert usable_bytes(cap, "detailed", 0.2) == int(cap * 0.8)  # a reserve given wins


def test_estimate_and_plan_use_the_same_fit_rule():
    est = planner.estimate(**LORA_8B)
    cap = est.capacity_bytes
    assert est.usable_bytes == usable_bytes(cap, "detailed")
    assert "fit margin" in est.fit_rule and est.reserve is None
    seed = planner.estimate(**LORA_8B, profile="seed")
    assert seed.usable_bytes == usable_bytes(cap, "seed") and "10%" in seed.fit_rule
    given = planner.estimate(**LORA_8B, reserve=0.3)
    assert given.usable_bytes == usable_bytes(cap, "detailed", 0.3) and given.reserve == 0.3


def test_capacity_is_the_catalog_card_s_or_the_stated_size():
    """``planner_gpu`` gives nvidia-smi's capacity of a catalog card; else ``capacity_gib``."""
    assert capacity_of({"planner_gpu": "a100-80gb"}) == catalog.get_gpu("a100-sxm-80gb").memory_bytes
    assert capacity_of({"planner_gpu": "", "capacity_gib": "14.75"}) == int(14.75 * 2**30)
    with pytest.raises(Unmodelable, match="neither planner_gpu nor capacity_gib"):
        capacity_of({"gpu_type": "GB200 (DGX-GB200)", "planner_gpu": "", "capacity_gib": ""})
    with pytest.raises(Unmodelable, match="planner_gpu"):
        capacity_of({"planner_gpu": "no-such-card"})


def test_every_row_names_its_card_or_its_size():
    """Every verdict row has a capacity (the GB200 one the size nvidia-smi reports), and a row
    naming a catalog card is not given a size besides."""
    rows = read_rows(VERDICTS)
    assert not [r["id"] for r in rows if not (r["planner_gpu"] or r["capacity_gib"])]
    assert not [r["id"] for r in rows if r["planner_gpu"] and r["capacity_gib"]]
    gb200 = next(r for r in rows if r["id"] == "V038")
    assert capacity_of(gb200) == int(185.03 * 2**30)  # 189,471 MiB


def test_a_model_no_hub_hosts_is_read_from_the_row_s_dimensions():
    """The ZeRO-Offload tutorial's 10B GPT-2 (launch flags: 50 layers, hidden 4096, 32 heads)
    is modelled from its columns: about 10B parameters (the tutorial's name for it)."""
    row = next(r for r in read_rows(VERDICTS) if r["id"] == "V021")
    got = judge_row(row)
    assert got.judged_fit is not None
    from planner.core.arch import param_counts
    from planner.core.entries import ModelSpec
    from planner.validate.rows import model_of

    total = param_counts(ModelSpec(**model_of(row))).total
    assert 9.9e9 < total < 10.5e9


@pytest.mark.parametrize("row_id, published", [
    ("V428", 20_554_567_680),  # GPT-NeoX-20B (Black et al. 2022): untied embed_out, biases
    ("V445", 2_775_208_960),   # Pythia-2.8B (Biderman et al. 2023, Table 1)
    ("V444", 1_011_781_632),   # Pythia-1B (same table)
    ("V435", 6_173_286_400),   # ChatGLM-6B: GELU MLP of 16,384 with biases, head tied
    ("V433", 7_000_559_616),   # Baichuan-7B (its README): LLaMA layers, 64,000-token untied head
])
def test_architecture_facts_give_the_published_parameter_counts(row_id, published):
    """A row's model is read from its catalog entry, or, where the catalog has none, from the
    row's dimensions with their family's facts, found by the model cell's first word
    (``gpt-neox-20b`` is not the tied GPT-2): both give the published counts."""
    from planner.core.arch import param_counts
    from planner.core.entries import ModelSpec
    from planner.validate.rows import model_of

    row = next(r for r in read_rows(VERDICTS) if r["id"] == row_id)
    assert param_counts(ModelSpec(**model_of(row))).total == published


def test_a_resized_model_named_after_its_family_keeps_its_own_head_width():
    """LambdaLabs' GPT-NeoX run (V902) is the 20B config at hidden 4096 with 64 heads: its
    head width is 4096 / 64 = 64, not the 96 of the 20B model its cell names."""
    from planner.core.entries import ModelSpec
    from planner.validate.rows import model_of

    row = next(r for r in read_rows(ROOT / "data" / "verdicts_unseen5.csv") if r["id"] == "V902")
    spec = ModelSpec(**model_of({**row, "model": "gpt-neox-20b"}))
    assert (spec.hidden, spec.heads) == (4096, 64)
    assert spec.head_dim in (None, 64) and catalog.get_model("gpt-neox-20b").head_dim == 96


def test_tensor_parallelism_without_sequence_parallelism_keeps_whole_norm_regions():
    """A run with TP but no sequence parallelism (ColossalAI's hybrid plugin, TP 4 · PP 2, no
    recomputation) holds its norm and dropout regions unsharded: more activation memory than the
    default reading, which assumes SP."""
    from planner.validate.rows import scenario_of

    row = next(r for r in read_rows(VERDICTS) if r["id"] == "V440")
    assert row["sequence_parallel"] == "no" and int(row["tp"]) == 4
    assert scenario_of(row)["layout"]["sp"] is False
    assert scenario_of({**row, "sequence_parallel": ""})["layout"]["sp"] is True
    with_sp = judge_row({**row, "sequence_parallel": ""})
    assert judge_row(row).predicted_bytes > 1.1 * with_sp.predicted_bytes


def test_optimizer_step_is_read_from_the_optimizer_and_the_torch_release():
    """Composer's DecoupledAdamW (llm-foundry) steps one tensor at a time, ColossalAI's HybridAdam
    and Megatron's FusedAdam in one kernel; torch's AdamW by its release (``torch`` column):
    foreach today, one tensor at a time before 2.0 and under FSDP1 on 2.0 (FlatParameter is not
    a plain Parameter), foreach with two intermediates on 2.0 otherwise."""
    from planner.validate.rows import scenario_of

    rows = {r["id"]: r for r in read_rows(VERDICTS)}

    def step(row):
        return scenario_of(row)["recipe"].get("optimizer_step", "foreach")

    assert step(rows["V382"]) == "for_loop"  # DecoupledAdamW
    assert step(rows["V441"]) == "fused"  # HybridAdam
    assert step(rows["V318"]) == "fused"  # Megatron-LM
    fsdp1 = rows["V339"]  # llama-recipes pinned torch==2.0.1+cu118
    assert fsdp1["torch"] == "2.0.1" and step(fsdp1) == "for_loop"
    assert step({**fsdp1, "torch": ""}) == "foreach"
    assert step({**fsdp1, "torch": "2.1.0"}) == "foreach"
    assert step({**fsdp1, "torch": "1.13.1"}) == step({**fsdp1, "torch": "<2.1"}) == "for_loop"
    ddp = rows["V444"]  # h2o-llmstudio pinned torch==2.0.0
    assert ddp["torch"] == "2.0.0" and step(ddp) == "foreach_torch20"
    with pytest.raises(Unmodelable, match="torch"):
        scenario_of({**ddp, "torch": "two"})


def test_a_200k_context_variant_is_read_with_its_positions_and_rotary_tables():
    """Yi-34B-200K has Yi-34B's dimensions and 200,000 positions; its 2023 code kept rotary
    tables of that length in all 60 layers. Without them the 4-GPU run that ran out of memory on
    80 GB cards is predicted to fit."""
    from planner.validate.rows import scenario_of

    row = next(r for r in read_rows(VERDICTS) if r["id"] == "V419")
    raw = scenario_of(row)
    assert raw["recipe"]["rope_cache_per_layer"] is True and raw["model"]["max_position"] == 200_000
    assert judge_row(row).judged_fit is False
    assert judge_row({**row, "rope_cache": ""}).judged_fit is True


def test_a_clamping_stack_keeps_its_masked_scores_in_every_layer():
    """Baichuan-7B's remote code clamps the masked scores with torch.max (as transformers'
    Llama did before 4.31). Its QLoRA rows prepare the 4-bit base with peft, so the causal mask,
    and the clamped scores, are FP32: 4 bytes x 32 heads x 1024² per layer, in all 32 layers."""
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve
    from planner.validate.rows import scenario_of
    from planner.validate.verdicts import _model_cell, stated_or_least

    row = next(r for r in read_rows(VERDICTS) if r["id"] == "V433")
    assert row["mask_clamp"] == "yes" and row["flash_attn"] == "eager"

    def total(r):
        raw = scenario_of(stated_or_least({**r, "model": _model_cell(r)}))
        return raw, estimate_resolved(resolve(raw)).predicted["allocated_bytes"]

    raw, clamped = total(row)
    assert raw["model"]["eager_mask_clamp"] is True
    _, plain = total({**row, "mask_clamp": ""})
    assert clamped - plain == 32 * (4 * 32 * 1024 * 1024 + 4)


def test_a_returned_kv_cache_is_read_from_its_column():
    """Firefly's script leaves Baichuan-7B's cache on: its FP32 keys and fused-projection values
    live to the end of the forward, where the V100 run printed 30.35 GiB allocated in the loss.
    Read with the cache, the row is judged out of memory; without it, it fits."""
    from planner.validate.rows import scenario_of

    row = next(r for r in read_rows(VERDICTS) if r["id"] == "V433")
    assert scenario_of(row)["recipe"]["keeps_kv_cache"] is True
    assert judge_row(row).judged_fit is False
    assert judge_row({**row, "kv_cache": ""}).judged_fit is True


def test_model_cell_resolves_through_its_hub_id_or_variant_tags():
    assert catalog_model("Llama-2-70b-chat-hf (NousResearch)") == "llama-2-70b"
    assert catalog_model("Meta-Llama-3.1-8B-Instruct-bnb-4bit") == "llama-3.1-8b"
    with pytest.raises(Unmodelable, match="not in the catalog"):
        catalog_model("GPT-2 10B (Megatron GPT-2: 50 layers, hidden 4096, 32 heads)")


def test_unstated_checkpointing_is_read_as_the_least_memory():
    """A run that ran fits under some reading of what its source left out."""
    row = next(r for r in read_rows(VERDICTS) if r["id"] == "V016")  # checkpointing unstated
    assert not row["grad_ckpt"].strip()
    unstated = judge_row(row)
    stated_none = judge_row({**row, "grad_ckpt": "no"})
    assert unstated.predicted_bytes < stated_none.predicted_bytes


def test_eight_bit_lora_is_not_passed_off_as_16_bit():
    """An LLM.int8 LoRA row is read with 1-byte linear weights: Mistral 7B's base is about
    7.5 GB (7.0B int8 linears, 0.26B 16-bit embeddings and head), never its 14.5 GB in bf16."""
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve
    from planner.validate.rows import scenario_of
    from planner.validate.verdicts import catalog_model, stated_or_least

    row = next(r for r in read_rows(VERDICTS) if r["id"] == "V051")
    raw = scenario_of(stated_or_least({**row, "model": catalog_model(row["model"])}))
    assert (raw["workload"]["method"], raw["workload"]["quant_bits"]) == ("qlora", 8)
    rs = resolve(raw)
    from planner.memory.model_states import rope_cache_bytes

    # beside the base: the rotary tables of 2023's transformers (32 layers x 32,768 positions)
    tables = rope_cache_bytes(rs.model, rs.workload, rs.recipe)
    assert tables == 32 * 2 * 32768 * 128 * 2
    weights = estimate_resolved(rs).components["weights"] - tables
    assert 7.0e9 < weights < 8.0e9
    assert judge_row(row).reason is None


def test_deepspeed_zero2_step_holds_the_fp32_gradient_partition():
    """DeepSpeed ZeRO-1/2 ``step`` (stage_1_and_2.py, v0.9.0 and v0.14.2) flattens the rank's
    16-bit gradient partition into an FP32 copy for the optimizer. V347 (LLaMA-Factory #1221,
    LLaMA-7B full fine-tuning, ZeRO-2 on 8 x V100-32GB) ran out of memory in the Adam step
    with 28.28 GiB allocated and 3.14 GiB (the FP32 partition) asked for: with the copy the
    verdict is out of memory; without it (FSDP's ZeRO-2, whose sharded gradients are the FP32
    ones) the same run would be judged to fit."""
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve
    from planner.validate.rows import scenario_of
    from planner.validate.verdicts import _model_cell, stated_or_least

    row = next(r for r in read_rows(VERDICTS) if r["id"] == "V347")
    got = judge_row(row)
    assert got.verdict == "oom" and got.judged_fit is False
    raw = scenario_of(stated_or_least({**row, "model": _model_cell(row)}))
    assert raw["recipe"]["zero_impl"] == "deepspeed"
    ds = estimate_resolved(resolve(raw))
    fsdp = estimate_resolved(resolve({**raw, "recipe": {**raw["recipe"], "zero_impl": "fsdp"}}))
    partition = 6.74e9 / 8  # LLaMA-7B over 8 data-parallel ranks
    assert ds.components["buffers"] - fsdp.components["buffers"] == pytest.approx(4 * partition, rel=0.01)
    assert fsdp.total_bytes <= got.usable_bytes < ds.total_bytes


def test_fastchat_s_fsdp_oom_is_the_unsharded_gradients():
    """V333 (FastChat #1781): Vicuna-7B's README command (FSDP full_shard, batch 2 x 2048,
    accumulation 16) on 4 x A100-40GB ran out of memory with 37.33 GiB allocated. The
    Trainer's no_sync keeps the whole model's bf16 gradients on every GPU between steps: with
    them the run needs more than the card and allocates at least what the message shows;
    without them it would be judged to fit. The same command on 8 GPUs (V331) ran."""
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve
    from planner.validate.rows import scenario_of
    from planner.validate.verdicts import _model_cell, stated_or_least

    rows = {r["id"]: r for r in read_rows(VERDICTS)}
    got = judge_row(rows["V333"])
    assert got.judged_fit is False
    raw = scenario_of(stated_or_least({**rows["V333"], "model": _model_cell(rows["V333"])}))
    assert raw["recipe"]["unsharded_grad_accumulation"] is True
    est = estimate_resolved(resolve(raw))
    assert est.predicted["allocated_bytes"] >= 37.33 * 2**30
    synced = estimate_resolved(resolve({**raw, "recipe": {**raw["recipe"], "unsharded_grad_accumulation": False}}))
    assert synced.total_bytes <= got.usable_bytes
    assert judge_row(rows["V331"]).judged_fit is True


def test_verdicts_file_scores_at_least_the_published_figures():
    """The figures the README quotes (a floor: physics that loses a verdict fails here)."""
    result = validate_verdicts(VERDICTS)
    ran, oom = result["ran"], result["oom"]
    assert ran["rows"] >= 40 and oom["rows"] >= 15
    assert ran["share_right_modelled"] >= 0.95
    assert oom["share_right_modelled"] >= 0.75
    # every row of the published benchmark tables is a verdict, each source summarised
    by_source = result["by_source"]
    assert by_source["llmfoundry"]["ran"]["rows"] == 216 and by_source["torchtitan"]["oom"]["rows"] == 2
    assert sum(s["ran"]["rows"] + s["oom"]["rows"] for s in by_source.values()) == len(result["results"])
    missed_within = [r for r in result["results"] if r["verdict"] == "ran" and r["judged_fit"] is False
                     and r["predicted_bytes"] <= r["capacity_bytes"]]
    assert result["ran_judged_oom_within_card"] == len(missed_within)
    for r in result["results"]:  # every modelled verdict is the estimate's own rule
        if r["judged_fit"] is not None:
            assert r["judged_fit"] == (r["predicted_bytes"] <= r["usable_bytes"])
            assert r["usable_bytes"] == usable_bytes(r["capacity_bytes"], "detailed")


def test_a_verdict_carries_the_estimate_s_tight_warning():
    """A verdict of "fits" within the method's error band of the card is marked tight, as the
    estimate of the same scenario on that card marks it: the warning a user would have had.
    V353 (Qwen2.5-3B full fine-tuning, DeepSpeed ZeRO-2 on four RTX 3090s, reported out of
    memory) is predicted at 0.95 of its card; V001 (Llama-2-70B LoRA on H100s) at 0.69."""
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve
    from planner.validate.rows import scenario_of
    from planner.validate.verdicts import _model_cell, stated_or_least

    rows = {r["id"]: r for r in read_rows(VERDICTS)}
    for row_id, tight in (("V353", True), ("V001", False)):
        row = rows[row_id]
        got = judge_row(row)
        assert got.judged_fit is True and got.tight is tight
        raw = scenario_of(stated_or_least({**row, "model": _model_cell(row)}))
        raw["layout"]["gpu"] = row["planner_gpu"]
        est = estimate_resolved(resolve(raw))
        assert est.total_bytes == got.predicted_bytes and est.capacity_bytes == got.capacity_bytes
        assert est.tight is tight
    result = validate_verdicts(VERDICTS)
    for verdict in ("ran", "oom"):
        marked = [r for r in result["results"] if r["verdict"] == verdict and r["judged_fit"] and r["tight"]]
        assert result[verdict]["tight"] == len(marked)
    from planner.memory.detailed import ERROR_BANDS

    over = [r for r in result["results"] if r["tight"] and not r["judged_fit"]]
    assert over  # tight on the far side of the line too
    for r in over:  # ... only within the method's error band of it
        assert r["usable_bytes"] < r["predicted_bytes"] <= r["usable_bytes"] * (1 + ERROR_BANDS[r["method"]])


def test_a_prediction_just_over_the_line_is_tight_not_a_refusal():
    """V048 (Llama-3.3-70B QLoRA on one 80 GB card, which ran) is predicted 1.8 % over the usable
    bytes, well inside QLoRA's 22 % error band: the estimate cannot tell, so its verdict is
    ``tight`` (``fits`` true, exit 0, said to be over the line), while a plan is still held to
    the line itself (``within_usable`` false)."""
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve
    from planner.validate.rows import scenario_of
    from planner.validate.verdicts import _model_cell, stated_or_least

    row = {r["id"]: r for r in read_rows(VERDICTS)}["V048"]
    got = judge_row(row)
    assert got.judged_fit is False and got.tight is True and got.judged == "tight"
    raw = scenario_of(stated_or_least({**row, "model": _model_cell(row)}))
    raw["layout"]["gpu"] = row["planner_gpu"]
    est = estimate_resolved(resolve(raw))
    assert (est.verdict, est.fits, est.within_usable) == ("tight", True, False)
    assert 1.0 < est.total_bytes / est.usable_bytes < 1.0 + est.error_band
    far = estimate_resolved(resolve({**raw, "workload": {**raw["workload"], "micro_batch": 16}}))
    assert far.verdict == "does_not_fit" and far.fits is False


def test_the_reserve_trade_off_holds_the_verdicts_to_each_reserve():
    """The trade-off table's first line is the fit rule's own score; keeping more of the card free
    can only call more runs out of memory (fewer ``ran`` right, no fewer ``oom`` right); with no
    reserve a run is judged to fit exactly when it is predicted within its card."""
    result = validate_verdicts(VERDICTS)
    trade = result["reserve_trade_off"]
    assert trade[0]["reserve"] is None
    for verdict in ("ran", "oom"):
        assert trade[0][verdict]["right"] == result[verdict]["right"]
    reserves = trade[1:]
    assert [t["reserve"] for t in reserves] == sorted(t["reserve"] for t in reserves)
    for lower, higher in itertools.pairwise(reserves):
        assert higher["ran"]["right"] <= lower["ran"]["right"]
        assert higher["oom"]["right"] >= lower["oom"]["right"]
    none = next(t for t in reserves if t["reserve"] == 0.0)
    within = [r for r in result["results"] if r["predicted_bytes"] is not None
              and r["predicted_bytes"] <= r["capacity_bytes"]]
    assert none["ran"]["right"] == sum(r["verdict"] == "ran" for r in within)
    assert none["oom"]["right"] == sum(r["verdict"] == "oom" and r["predicted_bytes"] is not None
                                       for r in result["results"]) - sum(r["verdict"] == "oom" for r in within)


def test_validate_verdicts_cli(tmp_path):
    out = CliRunner().invoke(app, ["validate", "--verdicts", str(VERDICTS), "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["fit_margin"] == FIT_MARGIN and len(got["results"]) == got["ran"]["rows"] + got["oom"]["rows"]
    bad = tmp_path / "v.csv"
    bad.write_text("id,model\nx,llama-2-7b\n")
    out = CliRunner().invoke(app, ["validate", "--verdicts", str(bad)])
    assert out.exit_code == 2 and "missing column verdict" in out.output
