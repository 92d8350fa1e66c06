"""The time model against 124 published measured runs (data/measured_throughput.csv).

Pins the README's figures loosely: in-sample and leave-one-source-out (each source predicted by
the parameters refitted without it) MdAPE, band coverage, and the 6N-at-40 %-of-peak baseline
beaten overall and on every source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli.main import app
from planner.perf import timing
from planner.validate import throughput as T

DATA = Path(__file__).resolve().parents[1] / "data" / "measured_throughput.csv"


@pytest.fixture(scope="module")
def batch() -> T.Batch:
    cases, unmodelled = T.cases_of(T.read_rows(DATA))
    assert not unmodelled and len(cases) == 124
    return T.Batch.of(cases)


@pytest.fixture(scope="module")
def loso(batch):
    results, fitted = T.loso_results(batch)
    return T.report(results, [], timing.PRIOR, loso=True, fitted=fitted)


def test_in_sample_figures(batch):
    r = T.report(T.results_of(batch, timing.FITTED), [], timing.FITTED, loso=False)
    assert r["median_ape"] <= 0.11
    assert r["within_25"] >= 0.70
    assert r["band_coverage"] >= 0.80
    assert r["baseline_median_ape"] >= 0.25  # 6N at 40 % of peak on the same rows


def test_leave_one_source_out_figures(loso):
    assert loso["median_ape"] <= 0.15
    assert loso["band_coverage"] >= 0.80
    for source, s in loso["by_source"].items():
        assert s["median_ape"] < s["baseline_median_ape"], source


def test_shipped_constants_are_the_fit(batch):
    """Refitting on every row lands on the shipped constants (the fit is deterministic)."""
    refit = T.fit(batch)
    for name in T.FIT_BOUNDS:
        assert getattr(refit, name) == pytest.approx(getattr(timing.FITTED, name), rel=0.15), name


def test_rows_read_as_their_recipes():
    rows = {r["id"]: r for r in T.read_rows(DATA)}
    mb = T.case_of(rows["66"])  # Megatron-Bridge 405B: distributed optimizer, not FSDP; VP 8
    assert mb.x["zero"] == 1 and mb.x["vp"] == 8 and mb.x["fp8"] == 1 and mb.x["fused"] == 1
    auto = T.case_of(rows["74"])  # AutoModel: local batch 8 of micro-batches of 1; EP 64
    assert auto.x["micro_batch"] == 1 and auto.x["grad_accum"] == 32 and auto.x["ep"] == 64
    old = T.case_of(rows["121"])  # Megatron-LM 2021 on V100: no fused attention
    assert old.x["attention"] == 0
    assert T.case_of(rows["43"]).x["quant"] == 1  # GPTQ base: dequantised like NF4


def test_cli_throughput_json():
    out = CliRunner().invoke(app, ["validate", "--kind", "throughput", str(DATA), "--json"])
    assert out.exit_code == 0, out.output
    r = json.loads(out.output)
    assert r["mode"] == "in-sample" and r["rows"] == 124 and set(r["by_source"]) >= {"torchtitan", "flagperf"}
    bad = CliRunner().invoke(app, ["validate", "--kind", "speed", str(DATA)])
    assert bad.exit_code == 2
