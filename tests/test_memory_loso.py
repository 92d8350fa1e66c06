"""Leave-one-source-out accuracy of the detailed profile (``planner validate FILE... --loso``)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from planner.cli.main import app
from planner.memory import detailed
from planner.validate.memory_loso import FITTED, constants, loso, source_of, validate_loso
from planner.validate.score import read_rows

DATA = Path(__file__).resolve().parents[1] / "data"
CALIBRATION = DATA / "measured_calibration.csv"
MORE = DATA / "measured_calibration_more.csv"


def test_one_project_is_one_source():
    assert source_of({"source": "litgpt config_hub/finetune benchmark table (gemma-2b/full.yaml)"}) == "litgpt"
    assert source_of({"source": "lit-gpt resource tables"}) == "litgpt"
    assert source_of({"source": "PEFT docs: FSDP guide"}) == source_of({"source": "PEFT method_comparison"})
    assert source_of({"source": "Answer.AI fsdp_qlora"}) == "answer.ai"


def test_constants_are_restored():
    before = detailed.ALLOCATOR_FRAGMENTATION_SHARDED
    try:
        with constants({"ALLOCATOR_FRAGMENTATION_SHARDED": 0.9}):
            assert detailed.ALLOCATOR_FRAGMENTATION_SHARDED == 0.9
            raise RuntimeError
    except RuntimeError:
        pass
    assert detailed.ALLOCATOR_FRAGMENTATION_SHARDED == before


def test_a_held_out_source_never_informs_its_own_fit():
    """Rows whose source is held out cannot move the value it is predicted with: predicting a
    source alone (no other rows to fit on) leaves every constant at its prior."""
    rows = [r for r in read_rows(MORE) if source_of(r) == "answer.ai"]
    results, chosen = loso(rows)
    (name, (prior, _)), = FITTED.items()
    assert chosen == {"answer.ai": {name: prior}}
    assert len(results) == len(rows)


def test_calibration_file_leave_one_source_out_targets():
    """The published targets for the calibration file, every row counted: MdAPE ≤ 8 %, ≥ 70 %
    within 10 %, ≥ 95 % within 25 %."""
    got = validate_loso([CALIBRATION])
    assert got["rows"] == 105
    assert got["median_ape"] <= 0.08 and got["within_10"] >= 0.70 and got["within_25"] >= 0.95


def test_both_files_leave_one_source_out():
    """All measured peaks, sources of both files held out in turn (the README's headline)."""
    got = validate_loso([CALIBRATION, MORE])
    assert got["rows"] == 182 and len(got["by_source"]) >= 10
    assert got["median_ape"] <= 0.08 and got["within_25"] >= 0.80


def test_cli_loso_several_files_and_bad_combinations():
    out = CliRunner().invoke(app, ["validate", str(CALIBRATION), str(MORE), "--loso", "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["loso"] and set(got["refitted"]) == set(got["by_source"])
    out = CliRunner().invoke(app, ["validate", str(CALIBRATION), str(MORE)])
    assert out.exit_code == 2 and "several files only for throughput, or with --loso" in out.output
    out = CliRunner().invoke(app, ["validate", str(CALIBRATION), "--loso", "--profile", "seed"])
    assert out.exit_code == 2 and "--loso" in out.output
