"""planner batch: every scenario planned, bad ones recorded not fatal, atomic output, exit codes."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

import planner
from planner.search.batch import run_batch
from planner.cli.main import app
from planner.report.files import atomic_write_text, write_frame

from conftest import ROOT

GOOD = """\
scenarios:
  - {name: lora-8b, model: llama-3.1-8b, workload: {method: lora, tokens: 1e8}}
  - {name: qlora-8b, model: llama-3.1-8b, workload: {method: qlora, tokens: 1e8}}
defaults:
  profile: seed
  search: {gpu_types: [rtx-4090, l4]}
"""
INFEASIBLE = """\
name: too-big
profile: seed
model: llama-3.1-405b
workload: {method: full, tokens: 1e9}
layout: {gpu: rtx-4090, gpus: 1}
"""


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "typo.yaml").write_text("name: typo\nmodel: llama-3.1-8b\nworkload: {methd: lora}\n")
    (tmp_path / "sub" / "broken.yml").write_text("name: [\n")
    (tmp_path / "big.yaml").write_text(INFEASIBLE)
    (tmp_path / "portfolio.yaml").write_text("jobs: []\n")
    (tmp_path / "notes.txt").write_text("not a scenario")
    return tmp_path


def test_bad_scenarios_never_lose_the_others(folder):
    run = run_batch([folder], workers=1)
    by = {r.scenario: r for r in run.scenarios.itertuples()}
    assert set(by) == {"lora-8b", "qlora-8b", "typo", "broken", "too-big"}
    assert by["lora-8b"].status == "optimal" and by["lora-8b"].gpu in ("rtx-4090", "l4")
    assert by["qlora-8b"].status == "optimal"
    assert by["typo"].status == "invalid" and "workload.methd: unknown key" in by["typo"].error
    assert by["broken"].status == "invalid" and "malformed YAML" in by["broken"].error
    assert by["too-big"].status == "infeasible" and by["too-big"].error.startswith("no feasible plan")
    assert run.skipped and "portfolio" in run.skipped[0]
    assert run.exit_code == 1


def test_top_k_gives_k_records_per_scenario(folder):
    run = run_batch([folder / "good.yaml"], top=3, workers=1)
    assert list(run.frame["rank"]) == [1, 2, 3, 1, 2, 3]
    costs = run.frame[run.frame["scenario"] == "lora-8b"]["cost_usd"].tolist()
    assert costs == sorted(costs)  # objective cost: best first
    assert run.exit_code == 0


def test_nothing_readable_is_exit_2(tmp_path):
    (tmp_path / "a.yaml").write_text("name: [\n")
    assert run_batch([tmp_path], workers=1).exit_code == 2
    assert run_batch([tmp_path / "missing.yaml"], workers=1).exit_code == 2


def test_processes_give_the_same_records_as_one(folder):
    cols = ["scenario", "status", "gpu", "gpus", "dp", "tp", "zero", "micro_batch", "cost_usd", "error"]
    one = run_batch([folder], workers=1).frame[cols]
    two = run_batch([folder], workers=2).frame[cols]
    pd.testing.assert_frame_equal(one, two)


@pytest.mark.parametrize("suffix", [".csv", ".json", ".parquet", ".md", ".html"])
def test_output_formats_round_trip(folder, tmp_path, suffix):
    frame = run_batch([folder / "good.yaml"], workers=1).frame
    out = write_frame(frame, tmp_path / f"r{suffix}")
    if suffix == ".csv":
        back = pd.read_csv(out)
    elif suffix == ".json":
        back = pd.DataFrame(json.loads(out.read_text()))
    elif suffix == ".parquet":
        back = pd.read_parquet(out)
    else:
        text = out.read_text()
        assert "lora-8b" in text and "qlora-8b" in text
        return
    assert list(back["scenario"]) == ["lora-8b", "qlora-8b"]
    assert back["memory_bytes"].tolist() == frame["memory_bytes"].astype(int).tolist()


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "r.csv"
    atomic_write_text(path, "old\n")

    class Boom(Exception):
        pass

    def fail(tmp):
        tmp.write_text("half")
        raise Boom

    from planner.report.files import atomic_write

    with pytest.raises(Boom):
        atomic_write(path, fail)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.csv"]  # no temporary left behind


def test_cli_batch_writes_results_summary_and_exit_code(folder, tmp_path):
    out = tmp_path / "out" / "results.csv"
    png = tmp_path / "mem.png"
    result = CliRunner().invoke(app, ["batch", str(folder), "--out", str(out), "--workers", "1",
                                      "--plot", str(png)])
    assert result.exit_code == 1, result.output
    assert "5 scenarios from 5 files" in result.output and "2 invalid" in result.output
    assert "\x1b[" not in result.output  # no progress bar or colours when not on a terminal
    assert len(pd.read_csv(out)) == 5
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_batch_rejects_an_unknown_output_format(folder, tmp_path):
    result = CliRunner().invoke(app, ["batch", str(folder), "--out", str(tmp_path / "r.xlsx")])
    assert result.exit_code == 2 and "--out" in result.output


def test_python_api_returns_a_dataframe(folder):
    frame = planner.batch(folder / "good.yaml", workers=1)
    assert isinstance(frame, pd.DataFrame) and list(frame["scenario"]) == ["lora-8b", "qlora-8b"]


def test_shipped_scenarios_folder_plans_every_scenario():
    """`planner batch scenarios/`: the portfolio is skipped, every scenario gets a record."""
    run = run_batch([ROOT / "scenarios"], workers=1)
    assert run.skipped and all("portfolio" in s for s in run.skipped)
    assert not (run.scenarios["status"].isin(["invalid", "error"])).any(), run.scenarios["error"].dropna().tolist()
