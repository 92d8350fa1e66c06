"""Predict before you fit: a measured row carries the prediction recorded when it was added, and
``planner validate`` scores that "before" error beside the current one.

The rows of data/measured_gpu_h200.csv and data/measured_throughput_h200.csv were measured on one
H200 by bench/gpu_session.py; their predictions were made by the planner before the measurement
(data/gpu_h200_runs.json, ``predicted``) and, for the rows that ran otherwise than planned, for
the run as it ran before any rule changed (``predicted_as_ran``)."""

from __future__ import annotations

import csv
import importlib.util
import json
import statistics

import pytest
from conftest import ROOT
from typer.testing import CliRunner

from planner.cli.main import app
from planner.validate import before
from planner.validate.score import KIND_VIEW, read_rows, validate_file, validate_rows

MEMORY = ROOT / "data" / "measured_gpu_h200.csv"
THROUGHPUT = ROOT / "data" / "measured_throughput_h200.csv"
RUNS = ROOT / "data" / "gpu_h200_runs.json"
RESULTS = ROOT / "data" / "gpu_h200_results.jsonl"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_figures_score_only_rows_that_recorded_a_prediction():
    # measured 100 each; before 110, 80, (none); now 100, 100, 50
    out = before.figures([(100.0, 110.0, 100.0), (100.0, 80.0, 100.0), (100.0, None, 50.0)])
    assert out["rows"] == 2
    assert out["before_median_ape"] == pytest.approx(0.15)
    assert out["before_median_signed"] == pytest.approx(-0.05)
    assert out["before_within_10"] == pytest.approx(0.5) and out["before_within_25"] == 1.0
    assert out["now_median_ape"] == 0.0
    assert before.figures([(100.0, None, 90.0)]) is None
    # a row the model cannot predict now is a miss now, not dropped
    assert before.figures([(100.0, 100.0, None)])["now_median_ape"] == 1.0


def test_memory_rows_report_the_recorded_error_beside_the_current(tmp_path):
    gpu_memory = _load("gpu_memory")
    run = gpu_memory.grid(quick=True)[0]
    rows = [gpu_memory.row_of(run, i + 1, 2.0, "max_allocated", "NVIDIA H200") for i in range(2)]
    rows[0]["predicted_before_gb"] = "2.2"  # +10 %
    rows[1]["predicted_before_gb"] = ""  # added without one: not in the before figures
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    result = validate_file(path, "detailed")
    assert result["before"]["rows"] == 1
    assert result["before"]["before_median_signed"] == pytest.approx(0.10)
    now = result["results"][0]["predicted_bytes"]
    assert result["before"]["now_median_ape"] == pytest.approx(abs(now - 2e9) / 2e9)
    out = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "before any fit" in out.output and "+10.0 %" in out.output


def test_every_h200_row_recorded_its_prediction_and_is_modelled():
    rows = read_rows(MEMORY)
    assert len(rows) >= 300 and all(float(r["predicted_before_gb"]) > 0 for r in rows)
    results = validate_rows(rows, "detailed")
    assert all(r.reason is None for r in results), [r.reason for r in results if r.reason]
    # every measured row is one view of a run whose result is in the raw file
    results_raw = [json.loads(line) for line in RESULTS.read_text().splitlines()]
    views = sum(sum(k in r for k in ("max_allocated", "max_reserved", "nvidia_smi")) for r in results_raw)
    assert views == len(rows)


def test_the_before_column_is_the_prediction_recorded_for_the_run_as_it_ran():
    """Each row's ``predicted_before_gb`` is the view of its run's recorded prediction: the planned
    one, or the one for the run as it ran where it ran otherwise (a QLoRA model left in eval mode,
    where transformers skips checkpointing)."""
    session = _load("gpu_session")
    runs = {r["key"]: r for r in json.loads(RUNS.read_text())}
    view = {k: KIND_VIEW[k] for k in ("max_allocated", "max_reserved", "nvidia_smi")}
    raw = [json.loads(line) for line in RESULTS.read_text().splitlines()]
    rows = iter(read_rows(MEMORY))
    not_in_effect = 0
    for res in raw:
        run = session.as_ran(runs[res["key"]], res)
        not_in_effect += bool(run.get("ckpt_not_in_effect"))
        for kind in view:
            if kind in res:
                row = next(rows)
                assert row["grad_ckpt"] == ("yes" if run["checkpointing"] else "no")
                recorded = runs[res["key"]].get("predicted_as_ran", run["predicted"])[view[kind]]
                assert float(row["predicted_before_gb"]) == pytest.approx(recorded / 1e9, abs=5e-4)
                assert float(row["measured_gb"]) == pytest.approx(res[kind] / 1e9, abs=5e-4)
    assert not_in_effect >= 10  # the QLoRA runs that asked for checkpointing and did not get it


def test_a_qlora_run_without_training_mode_ran_without_checkpointing():
    session = _load("gpu_session")
    run = {"method": "qlora", "checkpointing": True, "predicted": {}}
    assert session.as_ran(run, {})["checkpointing"] is False
    assert session.as_ran(run, {"train_mode": True}) is run
    full = {"method": "full", "checkpointing": True, "predicted": {}}
    assert session.as_ran(full, {}) is full


def test_the_replayed_verdict_rows_ran_within_their_cards():
    """V322 (SmolLM2-1.7B full fine-tuning at 16,384 tokens without checkpointing, 8-bit AdamW)
    was reported out of memory on an 80 GB H100, and the planner judges that it fits (0.74 of the
    card). Replayed on an H200 as the planner reads the row, its peak was 62.05 GB allocated and
    64.6 GB in nvidia-smi: 0.73 and 0.76 of the reported card, within 0.1 % of the prediction.
    The report's out-of-memory error therefore came from something its row does not state. V326
    (Mistral-7B full fine-tuning at 8K, reported to have run) peaked at 0.64 of its card."""
    runs = {r["key"]: r for r in json.loads(RUNS.read_text())}
    raw = {runs[r["key"]].get("verdict_id"): r for r in map(json.loads, RESULTS.read_text().splitlines())}
    v322, v326 = raw["V322"], raw["V326"]
    cap = {v: next(r for r in runs.values() if r.get("verdict_id") == v)["capacity_bytes"] for v in ("V322", "V326")}
    assert v322["max_allocated"] / cap["V322"] == pytest.approx(0.726, abs=0.002)
    assert v322["nvidia_smi"] < cap["V322"] and v326["nvidia_smi"] < cap["V326"]
    rows = [r for r in read_rows(MEMORY) if "replays V322" in r["notes"] and r["measure_kind"] == "max_allocated"]
    assert len(rows) == 1
    result = validate_rows(rows, "detailed")[0]
    assert abs(result.signed_error) < 0.01


def test_throughput_rows_report_the_before_error_against_the_rule_of_thumb():
    out = CliRunner().invoke(app, ["validate", "--kind", "throughput", str(THROUGHPUT), "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    b = result["before"]
    assert b["rows"] == result["rows"] >= 16
    rows = list(csv.DictReader(THROUGHPUT.open()))
    apes = [abs(float(r["predicted_before_tokens_per_s"]) / float(r["tokens_per_s_per_gpu"]) - 1) for r in rows]
    assert b["before_median_ape"] == pytest.approx(statistics.median(apes))
