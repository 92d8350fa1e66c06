"""The time model against the 414 measured runs it is fitted on: 124 published runs
(data/measured_throughput.csv), 113 measured on an H200 (data/measured_throughput_h200*.csv) and
177 published runs added with their predictions recorded first
(data/measured_throughput_published2.csv, data/measured_throughput_fms.csv).

Pins the README's figures loosely: in-sample and leave-one-source-out (each source predicted by
the parameters refitted without it) MdAPE, band coverage, and the 6N-at-40 %-of-peak baseline
beaten overall and on every source."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli.main import app
from planner.perf import timing
from planner.validate import throughput as T
from planner.validate import throughput_cases as C

DATA = Path(__file__).resolve().parents[1] / "data" / "measured_throughput.csv"
H200 = [DATA.with_name("measured_throughput_h200.csv"), DATA.with_name("measured_throughput_h200_time.csv")]
LATER = [DATA.with_name(f"measured_throughput_{n}.csv")
         for n in ("h200_time2", "h200_time3", "h200_time4", "published2", "fms")]
ALL = [DATA, *H200, *LATER]
#: Sources the model does not beat 6N at 40 % of the peak on when they are left out of the fit
#: (data/README.md, "Figures now"): the Megatron-LM README's H100 table (10.8 % against 8.9 %,
#: nine rows).
LOSO_NOT_BEATEN = {"megatron-lm-readme-h100-2024"}


@pytest.fixture(scope="module")
def batch() -> T.Batch:
    cases, unmodelled = T.cases_of([row for path in ALL for row in T.read_rows(path)])
    assert not unmodelled and len(cases) == 124 + 16 + 52 + 17 + 16 + 12 + 92 + 85
    return T.Batch.of(cases)


@pytest.fixture(scope="module")
def loso(batch):
    results, fitted = T.loso_results(batch)
    return T.report(results, [], timing.PRIOR, loso=True, fitted=fitted)


def test_in_sample_figures(batch):
    r = T.report(T.results_of(batch, timing.FITTED), [], timing.FITTED, loso=False)
    assert r["median_ape"] <= 0.115
    assert r["within_25"] >= 0.78
    assert r["band_coverage"] >= 0.85
    assert r["baseline_median_ape"] >= 0.20  # 6N at 40 % of peak on the same rows


def test_leave_one_source_out_figures(loso):
    assert loso["median_ape"] <= 0.13 and loso["median_ape"] < loso["baseline_median_ape"]
    assert loso["band_coverage"] >= 0.80
    not_beaten = {source for source, s in loso["by_source"].items()
                  if s["median_ape"] >= s["baseline_median_ape"]}
    assert not_beaten <= LOSO_NOT_BEATEN
    assert len(loso["by_source"]) - len(not_beaten) >= 18


def test_size_bands_split_every_row():
    """Bands by total parameters, upper bound exclusive: a 3B model is in the middle band."""
    assert [T.size_band(n) for n in (1.1e9, 2.999e9, 3e9, 29.9e9, 30e9, 405e9)] == \
        ["< 3B", "< 3B", "3–30B", "3–30B", "> 30B", "> 30B"]
    assert T.size_band(None) == "" and T.size_band(0.0) == ""


def test_leave_one_source_out_by_model_size(loso):
    """Every size band is scored, together they hold every row, and in each the model beats 6N at
    40 % of peak when each source is left out of the fit, and each is within 15 % (< 3B: 14.7 % vs
    61.0 %, 3–30B: 8.6 % vs 21.1 %, > 30B: 10.7 % vs 21.0 % on the 414 rows)."""
    bands = loso["by_size"]
    assert list(bands) == ["< 3B", "3–30B", "> 30B"]
    assert sum(b["rows"] for b in bands.values()) == loso["rows"]
    for name, b in bands.items():
        assert b["median_ape"] < b["baseline_median_ape"], name
        assert b["median_ape"] <= 0.15, name


def test_shipped_constants_are_the_fit(batch):
    """Refitting on every row from the shipped constants stays on them (the fit is deterministic;
    they are its optimum), each inside its documented physical range, as the prior is."""
    refit = T.fit(batch, start=timing.FITTED)
    for name, (lo, hi) in T.FIT_BOUNDS.items():
        assert getattr(refit, name) == pytest.approx(getattr(timing.FITTED, name), rel=0.05), name
        assert lo <= getattr(timing.FITTED, name) <= hi and lo <= getattr(timing.PRIOR, name) <= hi, name
    # The unfused element-wise count within the range the H200 kernel profiles measured (440-490
    # hidden vectors at 1B and 8B) widened to 250-600, not the 584 an unbounded fit once reached.
    assert T.FIT_BOUNDS["elementwise_vectors"] == (250.0, 600.0)


def test_h200_rows_before_and_now():
    """The H200 rows were predicted before they ran (``predicted_before_tokens_per_s``): the model
    of that day missed them by a median 56-77 %, too fast on every row (data/README.md). Read as
    they ran (not compiled; torch's foreach AdamW; PEFT's FP32 or cast BF16 adapters) the shipped
    model is within 12 % on each file."""
    for path in H200:
        r = T.validate_file(path)
        assert r["before"]["before_median_ape"] >= 0.5 and r["before"]["before_median_signed"] > 0
        assert r["median_ape"] <= 0.12, path.name


def test_h200_rows_read_as_they_ran():
    rows = {r["id"]: r for r in T.read_rows(H200[1])}
    full, fp32, bf16 = (C.case_of(rows[i]) for i in ("G101", "G102", "G103"))
    # "no compile" is not torch.compile
    assert full.x["fused"] == 0 and fp32.x["fused"] == 0
    # torch's foreach AdamW over BF16 states: 20 passes of 2 bytes at the measured bandwidth share
    assert full.x["optimizer_bytes"] == pytest.approx(20 * 2 / timing.FOREACH_BANDWIDTH_SHARE)
    # the adapters' traffic: n_lora / rank of adapted width at 76 (FP32) or 19 (BF16) bytes
    width = fp32.x["n_lora"] / 16
    assert fp32.x["adapter_bytes"] == pytest.approx(width * 76.0)
    assert bf16.x["adapter_bytes"] == pytest.approx(width * 19.0)
    # a published row that states nothing keeps the fused FP32 step and 16-bit adapters
    pub = {r["id"]: r for r in T.read_rows(DATA)}
    lora = C.case_of(pub["78"])
    assert lora.x["optimizer_bytes"] == timing.OPTIMIZER_BYTES_PER_PARAM
    assert lora.x["adapter_bytes"] == pytest.approx(lora.x["n_lora"] / 16 * 19.0)


@pytest.mark.parametrize("text, fused", [("no compile, standard loss", False), ("compile=no", False),
                                         ("compile: off", False), ("without torch.compile", False),
                                         ("torch.compile on", True), ("+packed +compile", True)])
def test_compile_read_with_its_negations(text, fused):
    assert C._fused({"source": "x", "precision": "bf16", "notes": text}) is fused


def test_fp8_read_with_its_negations():
    """DGX Cloud's NeMo GPT-3 175B BF16 row says ``model.fp8=False`` (data/measured_throughput_published5.csv
    5730): not an FP8 run; its FP8 twin (5735) is; and userbuffers' TP overlap, a Transformer
    Engine feature, names a fusing stack."""
    rows = {r["id"]: r for r in T.read_rows(DATA.parent / "measured_throughput_published5.csv")}
    bf16, fp8 = C.case_of(rows["5730"]), C.case_of(rows["5735"])
    assert "fp8=false" in rows["5730"]["precision"].lower()
    assert (bf16.x["fp8"], fp8.x["fp8"]) == (0, 1)
    assert bf16.x["fused"] == fp8.x["fused"] == 1
    for text in ("bf16, no fp8", "bf16 (fp8: off)", "bf16, without FP8", "bf16 (trainer precision bf16, fp8 false)",
                 "bf16; fp8 off.", "bf16 (fp8 false. TE layers)"):
        assert C.case_of({**rows["5735"], "precision": text}).x["fp8"] == 0
    # a number after "fp8" is not a negation: an FP8 run with a 0.5 scale is FP8
    assert C.case_of({**rows["5735"], "precision": "fp8 0.5 amax scale (TE)"}).x["fp8"] == 1
    # DGX Cloud's NeMo 24.09 Llama 3.1 8B BF16 table says "fp8 false" with neither "=" nor ":"
    # (data/measured_throughput_published12.csv 7944-7948): BF16 GEMMs, still Transformer Engine layers
    newer = {r["id"]: r for r in T.read_rows(DATA.parent / "measured_throughput_published12.csv")}
    te_bf16 = C.case_of(newer["7944"])
    assert "fp8 false" in newer["7944"]["precision"] and (te_bf16.x["fp8"], te_bf16.x["fused"]) == (0, 1)


def test_rows_read_as_their_recipes():
    rows = {r["id"]: r for r in T.read_rows(DATA)}
    mb = C.case_of(rows["66"])  # Megatron-Bridge 405B: distributed optimizer, not FSDP; VP 8
    assert mb.x["zero"] == 1 and mb.x["vp"] == 8 and mb.x["fp8"] == 1 and mb.x["fused"] == 1
    auto = C.case_of(rows["74"])  # AutoModel: local batch 8 of micro-batches of 1; EP 64
    assert auto.x["micro_batch"] == 1 and auto.x["grad_accum"] == 32 and auto.x["ep"] == 64
    old = C.case_of(rows["121"])  # Megatron-LM 2021 on V100: no fused attention
    assert old.x["attention"] == 0
    assert C.case_of(rows["43"]).x["quant"] == 1  # GPTQ base: dequantised like NF4
    # Megatron-LM on A100s in 2021 (Narayanan et al.), before FlashAttention reached it: the card
    # has FlashAttention-2, the run did not; a 2024 Megatron-LM README run on H100 did
    pub2 = {r["id"]: r for r in T.read_rows(DATA.parent / "measured_throughput_published2.csv")}
    assert pub2["2201"]["source"] == "megatron-narayanan-2021" and "a100" in pub2["2201"]["planner_gpu"]
    assert C.case_of(pub2["2201"]).x["attention"] == 0
    later = next(r for r in pub2.values() if r["source"] == "megatron-lm-readme-h100-2024")
    assert C.case_of(later).x["attention"] == 1


def test_cli_throughput_json():
    out = CliRunner().invoke(app, ["validate", "--kind", "throughput", str(DATA), "--json"])
    assert out.exit_code == 0, out.output
    r = json.loads(out.output)
    assert r["mode"] == "in-sample" and r["rows"] == 124 and set(r["by_source"]) >= {"torchtitan", "flagperf"}
    bad = CliRunner().invoke(app, ["validate", "--kind", "speed", str(DATA)])
    assert bad.exit_code == 2


def test_second_h200_session_was_predicted_before_it_ran():
    """17 settings the first session did not measure, predicted by the model its profiles led to
    and recorded before they ran (data/gpu_h200_time2_runs.json, committed first): their before
    error beats 6N at 40 % of the peak. Their before recorded, they are fitted since."""
    path = DATA.with_name("measured_throughput_h200_time2.csv")
    r = T.validate_file(path)
    before = r["before"]
    assert before["rows"] == 17 and before["before_median_ape"] <= 0.10
    assert before["before_median_ape"] < before["baseline_median_ape"]
    assert path in ALL


def test_attention_rate_by_generation_and_kernel():
    """Fused attention runs at ``attention_efficiency`` of the GEMMs' rate on an A100 whatever the
    kernel; on an H100 at 0.6 of that for a portable FlashAttention-2-class kernel (35 % of an
    H100's peak) and 0.85 for Hopper's own (FlashAttention-3, cuDNN: 1.5-2x FlashAttention-2;
    Shah et al. 2024); on a B200 at 0.25 for FlashAttention-2 (259-346 TFLOPS forward + backward,
    flash-attention issue #1589) and 0.8 for cuDNN's (about 1,060 TFLOPS forward + backward); a
    consumer Blackwell card (RTX 5090, compute capability 12.0) has no measurement and keeps 1.
    Only the attention term moves."""
    from planner.catalog.store import get_gpu
    from planner.perf import flops, hardware
    from planner.scenario.resolve import resolve

    mf = flops.model_flops(resolve({"model": "llama-3.1-8b"}).model)
    x = {"method": 0, "checkpointing": 0, "offload": 0, "zero": 0, "seq_len": 32768, "micro_batch": 1,
         "grad_accum": 1, "tp": 1, "pp": 1, "cp": 1, "dp": 1, "ep": 1, "n_lora": 0.0}
    assert hardware.PORTABLE_ATTENTION_SHARE == {"hopper": 0.6, "blackwell": 0.25}
    assert hardware.NATIVE_ATTENTION_SHARE == {"hopper": 0.85, "blackwell": 0.8}
    for gpu, portable, native in (("h100-sxm-80gb", 0.6, 0.85), ("a100-sxm-80gb", 1.0, 1.0),
                                  ("b200", 0.25, 0.8), ("rtx-5090", 1.0, 1.0)):
        perf = hardware.GpuPerf.of(get_gpu(gpu))
        eff = float(timing.microbatch_efficiency(32768))
        ideal = (float(flops.attention_flops_per_token(mf, seq_len=32768, checkpointing=0)) * 32768
                 / (perf.peak_flops * perf.utilization * timing.FITTED.attention_efficiency) / eff)
        t_native = float(timing.step_time_s(mf, perf, **x, native_attention=1))
        t_portable = float(timing.step_time_s(mf, perf, **x))
        assert t_portable - t_native == pytest.approx(ideal * (1 / portable - 1 / native), rel=1e-9, abs=1e-12)


def test_stacks_read_with_their_attention_kernels():
    """Transformer Engine stacks (Megatron-Core, NeMo, Megatron-Bridge) run Hopper's own fused
    attention; Hugging Face, torchtitan and NeMo AutoModel's Hugging Face code a portable one."""
    rows = T.read_rows(DATA) + T.read_rows(DATA.with_name("measured_throughput_longctx.csv"))
    first = {}
    for row in rows:
        first.setdefault(row["source"].strip(), row)
    for source in ("nemo-perf-summary", "megatron-bridge-perf-summary", "nemo-long-sequence-perf"):
        assert C.case_of(first[source]).x["native_attention"] == 1, source
    for source in ("torchtitan", "nemo-automodel-perf-summary", "torchtune-readme", "alst-paper-2025"):
        assert C.case_of(first[source]).x["native_attention"] == 0, source
    from planner.catalog.stacks import get_stack
    assert get_stack("megatron").recipe.native_attention
    assert not any(get_stack(s).recipe.native_attention for s in ("hf-fsdp", "torchtitan", "torchtune"))


def test_a_row_faster_than_its_card_allows_is_named():
    """Above 1 × the card's dense peak for the FLOPs the coded configuration must execute, a row
    cannot be what it codes. torchtune's README (@1814feb, "Memory and training speed") gives Llama
    3.1 8B on one RTX A6000 (154.8 dense BF16 TFLOPS) at 2,579 tokens/s for full fine-tuning and
    4,699 for LoRA, with the recipes' activation checkpointing: 111 % and 153 % of the peak. Every
    other row of the throughput files stays below it; a new row above it must be looked at."""
    import numpy as np

    rows = [row for path in sorted(DATA.parent.glob("measured_throughput*.csv")) for row in T.read_rows(path)]
    cases, _ = T.cases_of(rows)
    share = {c.id: T.implied_peak_share(c) for c in cases}
    assert {i for i, s in share.items() if s > 1.0} == {"101", "103"}
    assert share["101"] == pytest.approx(1.106, abs=0.005) and share["103"] == pytest.approx(1.531, abs=0.005)
    # The share is measured tokens/s × FLOPs per token / peak: linear in the measurement, and for full
    # fine-tuning with full recomputation about 8 N per token (attention adds a little at 2K).
    full = next(c for c in cases if c.id == "101")
    eight_n = full.measured * 8 * full.mf.params / 154.8e12
    assert eight_n < share["101"] < 1.1 * eight_n
    halved = T.implied_peak_share(dataclasses.replace(full, measured=full.measured / 2))
    assert halved == pytest.approx(share["101"] / 2)
    # reported in the JSON of a plain validation, and printed as a table
    result = T.validate_file(DATA)
    assert [r["id"] for r in result["above_peak"]] == ["101", "103"]
    assert np.all([r["implied_peak_share"] > 1 for r in result["above_peak"]])


def test_rows_that_name_fused_kernels_are_timed_with_them():
    """A row's fused norm, rotary and SwiGLU kernels are read from what it says of its stack
    (``throughput_cases.KERNEL_WORDS``): fms-acceleration's foak rows name Unsloth-derived
    ``fast_rms_layernorm`` and ``fast_rope_embeddings`` (Mistral 7B: 121 + 20 · (4096 + 1024)/4096),
    its plain rows none, TinyLlama's README all three (its 2048-wide model: 121 + 20 · 2304/2048 +
    6 · 5632/2048); a row that states a flag's value (FlagPerf's ``use_fused_rms_norm = 1`` beside a
    README saying false) or only Liger's loss names none, one with Liger's kernels on all three
    (as a plan's ``kernels: liger``)."""
    rows = {r["id"]: r for f in ("measured_throughput_fms.csv", "measured_throughput_published2.csv",
                                 "measured_throughput_published8.csv", "measured_throughput_longctx.csv")
            for r in T.read_rows(DATA.parent / f)}
    vectors = {i: C.case_of(rows[i]).x["kernel_vectors"] for i in ("4550", "4501", "2419", "7417", "2637", "2638")}
    assert vectors["4550"] == pytest.approx(121 + 20 * 5120 / 4096)
    assert vectors["4501"] == 0.0
    assert vectors["2419"] == pytest.approx(121 + 20 * 2304 / 2048 + 6 * 5632 / 2048)
    assert vectors["7417"] == 0.0 and vectors["2637"] == 0.0
    assert vectors["2638"] == pytest.approx(121 + 20 * 5120 / 4096 + 6 * 14336 / 4096)


def test_each_card_runs_its_gemms_at_its_measured_matmul_efficiency():
    """Bekman's maximum-achievable-matmul table (ml-engineering, BF16): A100 SXM 271.2 of 312
    TFLOPS (86.9 %), H100 SXM 794.5 of 989 (80.3 %, "H200 is the same"), B200 1,745 of 2,250
    (77.6 %). The fitted GEMM utilisation stands for the H100's efficiency; another card's GEMMs
    run at its own over it, a card without a measurement at 1x, and attention does not move."""
    from dataclasses import replace

    from planner.catalog.store import get_gpu
    from planner.perf import flops, hardware
    from planner.scenario.resolve import resolve

    assert hardware.REFERENCE_MATMUL_EFFICIENCY == 0.803
    for gpu, scale in (("a100-sxm-80gb", 0.869 / 0.803), ("h100-sxm-80gb", 1.0), ("h200-sxm-141gb", 1.0),
                       ("b200", 0.776 / 0.803), ("rtx-4090", 1.0), ("mi300x", 1.0)):
        assert hardware.GpuPerf.of(get_gpu(gpu)).matmul_scale == pytest.approx(scale), gpu
    mf = flops.model_flops(resolve({"model": "llama-3.1-8b"}).model)
    x = {"method": 0, "checkpointing": 0, "offload": 0, "zero": 0, "seq_len": 4096, "micro_batch": 4,
         "grad_accum": 1, "tp": 1, "pp": 1, "cp": 1, "dp": 1, "ep": 1, "n_lora": 0.0}
    a100 = hardware.GpuPerf.of(get_gpu("a100-sxm-80gb"))
    plain = replace(a100, matmul_scale=1.0)
    t_own, t_plain = (float(timing.step_time_s(mf, p, **x)) for p in (a100, plain))
    assert t_own < t_plain < t_own * a100.matmul_scale  # only the GEMMs (not attention, not memory) speed up
