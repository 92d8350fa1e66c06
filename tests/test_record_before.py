"""``planner validate --record-before``: the prediction at the moment rows are added, written
once into each row that has none, with the planner that made it, and never overwritten."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

from typer.testing import CliRunner

from planner.cli.main import app
from planner.validate.before import MEMORY_COLUMN, THROUGHPUT_COLUMN
from planner.validate.record import SOURCE_COLUMN, VERDICT_COLUMN, record_before
from planner.validate.score import validate_file as validate_memory
from planner.validate.throughput import validate_file as validate_throughput
from planner.validate.verdicts import validate_verdicts

DATA = Path(__file__).resolve().parents[1] / "data"


def _strip(src: Path, dst: Path, column: str, keep_first: bool) -> list[dict[str, str]]:
    """A copy of ``src`` whose before column is empty (except the first row's, if kept)."""
    with src.open(newline="") as fh:
        reader = csv.DictReader(fh)
        fields, rows = list(reader.fieldnames or []), list(reader)
    for i, r in enumerate(rows):
        if not (keep_first and i == 0):
            r[column] = ""
    with dst.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return rows


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_throughput_rows_get_the_prediction_now_and_keep_a_recorded_one(tmp_path):
    path = tmp_path / "t.csv"
    original = _strip(DATA / "measured_throughput_h200_time3.csv", path, THROUGHPUT_COLUMN, keep_first=True)
    out = record_before(path, "throughput")
    assert out["recorded"] == len(original) - 1 and out["already_recorded"] == 1
    rows = _read(path)
    assert rows[0][THROUGHPUT_COLUMN] == original[0][THROUGHPUT_COLUMN]  # never overwritten
    now = {r["id"]: r["predicted"] for r in validate_throughput(path)["results"]}
    for r in rows[1:]:
        assert abs(float(r[THROUGHPUT_COLUMN]) - now[r["id"]]) < 0.06  # one decimal written
        assert r[SOURCE_COLUMN]
    again = record_before(path, "throughput")
    assert again["recorded"] == 0 and _read(path) == rows


def test_memory_rows_get_the_view_of_their_measure_kind(tmp_path):
    path = tmp_path / "m.csv"
    _strip(DATA / "measured_gpu_h200_time3.csv", path, MEMORY_COLUMN, keep_first=False)
    out = record_before(path, "memory")
    assert out["recorded"] == out["rows"] > 0
    now = {r["id"]: r["predicted_bytes"] for r in validate_memory(path, "detailed")["results"]}
    for r in _read(path):
        assert abs(float(r[MEMORY_COLUMN]) * 1e9 - now[r["id"]]) < 6e5  # three decimals of GB


def test_the_cli_records_then_scores_and_refuses_it_with_verdicts(tmp_path):
    path = tmp_path / "t.csv"
    shutil.copy(DATA / "measured_throughput_h200_time3.csv", path)
    _strip(path, path, THROUGHPUT_COLUMN, keep_first=False)
    result = CliRunner().invoke(app, ["validate", "--kind", "throughput", str(path), "--record-before"])
    assert result.exit_code == 0, result.output
    assert all(r[THROUGHPUT_COLUMN] for r in _read(path))
    bad = CliRunner().invoke(app, ["validate", "--loso", str(path), "--record-before"])
    assert bad.exit_code == 2 and "--record-before" in bad.output


def test_verdict_rows_keep_the_verdict_they_got_when_added(tmp_path):
    """A verdicts file's ``judged_before`` is the three-class verdict ``--verdicts`` gives the row
    now, written once; a recorded one (even one today's planner would not give) is kept, and the
    report counts the unseen verdicts beside today's."""
    path = tmp_path / "v.csv"
    with (DATA / "verdicts.csv").open(newline="") as fh:
        reader = csv.DictReader(fh)
        fields, rows = list(reader.fieldnames or []), list(reader)[:12]
    fields.append(VERDICT_COLUMN)
    rows[0][VERDICT_COLUMN] = "does_not_fit"  # a verdict recorded by an older planner
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows({k: r.get(k, "") for k in fields} for r in rows)
    result = CliRunner().invoke(app, ["validate", "--verdicts", str(path), "--record-before", "--json"])
    assert result.exit_code == 0, result.output
    written = _read(path)
    now = {r["id"]: r for r in validate_verdicts(path)["results"]}
    assert written[0][VERDICT_COLUMN] == "does_not_fit"
    for r in written[1:]:
        judged = now[r["id"]]
        expected = "tight" if judged["tight"] else ("fits" if judged["judged_fit"] else "does_not_fit")
        assert r[VERDICT_COLUMN] == (expected if judged["judged_fit"] is not None else "")
        assert r[SOURCE_COLUMN] or not r[VERDICT_COLUMN]
    before = validate_verdicts(path)["before"]
    ran_rows = [r for r in written if r["verdict"] == "ran" and r[VERDICT_COLUMN]]
    assert before["ran"]["rows"] == len(ran_rows)
    assert before["ran"]["before"] == sum(r[VERDICT_COLUMN] != "does_not_fit" for r in ran_rows)
    # every other row was recorded today, so only the kept old verdict can tell then from now
    first_now = now[written[0]["id"]]
    assert written[0]["verdict"] == "ran"
    assert before["ran"]["now"] - before["ran"]["before"] == int(bool(first_now["judged_fit"]))
