"""planner batch: every scenario planned, bad ones recorded not fatal, atomic output, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT
from typer.testing import CliRunner

import planner
from planner.bulk.batch import run_batch
from planner.cli.main import app
from planner.report.files import atomic_write_text, write_frame

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


# ------------------------------------------------------------------------------------------------
# Files that cannot be read, and outputs that cannot be written: recorded or refused, never lost.

import os
import stat

from planner.core.errors import MAX_LINE_CHARS

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _by_scenario(run):
    return {r.scenario: r for r in run.scenarios.itertuples()}


@pytest.mark.skipif(IS_ROOT, reason="root reads a chmod 000 file")
def test_unreadable_file_is_a_record_not_the_end_of_the_batch(folder):
    bad = folder / "secret.yaml"
    bad.write_text(INFEASIBLE.replace("too-big", "secret"))
    bad.chmod(0)
    try:
        run = run_batch([folder], workers=1)
    finally:
        bad.chmod(0o644)
    by = _by_scenario(run)
    assert by["secret"].status == "invalid" and "cannot read" in by["secret"].error
    assert by["lora-8b"].status == "optimal" and run.exit_code == 1


def test_unreadable_file_simulated_is_a_record(folder, monkeypatch):
    """The same as root runs it: opening the file is refused."""
    bad = folder / "secret.yaml"
    bad.write_text(INFEASIBLE)
    real_open = os.open

    def refuse(path, *args, **kwargs):
        if str(path).endswith("secret.yaml"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    run = run_batch([folder], workers=1)
    by = _by_scenario(run)
    assert by["secret"].status == "invalid" and "cannot read: Permission denied" in by["secret"].error
    assert by["lora-8b"].status == "optimal" and by["qlora-8b"].status == "optimal"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes")
def test_fifos_link_loops_and_broken_links_are_records_with_a_reason(folder):
    os.mkfifo(folder / "pipe.yaml")
    (folder / "loop-a.yaml").symlink_to("loop-b.yaml")
    (folder / "loop-b.yaml").symlink_to("loop-a.yaml")
    (folder / "gone.yml").symlink_to("nowhere.yml")
    (folder / "sub" / "up").symlink_to("..")  # a folder link back up: not followed, noted
    run = run_batch([folder], workers=1)  # returns: the pipe is never opened for reading
    by = _by_scenario(run)
    assert "not a regular file (a named pipe)" in by["pipe"].error
    assert "link loop" in by["loop-a"].error and "link loop" in by["loop-b"].error
    assert "broken symbolic link" in by["gone"].error
    assert {by[k].status for k in ("pipe", "loop-a", "loop-b", "gone")} == {"invalid"}
    assert by["lora-8b"].status == "optimal"
    assert any("not followed" in s for s in run.skipped)
    # given by name, a pipe is a record too (it was silently dropped)
    named = run_batch([folder / "pipe.yaml", folder / "good.yaml"], workers=1)
    assert _by_scenario(named)["pipe"].status == "invalid" and len(named.scenarios) == 3


def test_error_records_are_bounded(folder):
    (folder / "many.yaml").write_text("".join(f"k{i}: {i}\n" for i in range(500)))
    run = run_batch([folder / "many.yaml"], workers=1)
    error = run.scenarios.iloc[0]["error"]
    assert "more problems" in error and len(error) < 60 * MAX_LINE_CHARS


def _invoke_batch(folder, out, *extra):
    return CliRunner().invoke(app, ["batch", str(folder / "good.yaml"), "--out", str(out), "--workers", "1",
                                    *extra])


@pytest.fixture
def no_planning(monkeypatch):
    """Fails the test if planning starts: the output checks come first."""
    from planner.bulk import batch

    def boom(*args, **kwargs):
        raise AssertionError("planned before checking --out")

    monkeypatch.setattr(batch, "run_batch", boom)


def test_out_that_is_a_folder_is_refused_before_planning(folder, tmp_path, no_planning):
    (tmp_path / "r.csv").mkdir()
    result = _invoke_batch(folder, tmp_path / "r.csv")
    assert result.exit_code == 2 and "--out:" in result.output and "is a folder" in result.output
    assert "Traceback" not in result.output


def test_out_under_a_file_is_refused_before_planning(folder, tmp_path, no_planning):
    (tmp_path / "file").write_text("x")
    result = _invoke_batch(folder, tmp_path / "file" / "r.csv")
    assert result.exit_code == 2 and "--out:" in result.output and "not a folder" in result.output


def test_plot_that_is_a_folder_is_refused_before_planning(folder, tmp_path, no_planning):
    (tmp_path / "m.png").mkdir()
    result = _invoke_batch(folder, tmp_path / "r.csv", "--plot", str(tmp_path / "m.png"))
    assert result.exit_code == 2 and "--plot:" in result.output


@pytest.mark.skipif(IS_ROOT, reason="root writes into read-only folders")
def test_out_in_a_read_only_folder_is_refused_before_planning(folder, tmp_path, no_planning):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        result = _invoke_batch(folder, ro / "r.csv")
    finally:
        ro.chmod(0o755)
    assert result.exit_code == 2 and "--out:" in result.output and "cannot write in" in result.output


@pytest.mark.skipif(IS_ROOT, reason="root writes read-only files")
def test_read_only_out_file_is_refused_before_planning(folder, tmp_path, no_planning):
    out = tmp_path / "r.csv"
    out.write_text("keep\n")
    out.chmod(0o444)
    result = _invoke_batch(folder, out)
    assert result.exit_code == 2 and "read-only" in result.output and out.read_text() == "keep\n"


def test_read_only_folder_simulated_is_refused_before_planning(folder, tmp_path, no_planning, monkeypatch):
    real_open = os.open

    def refuse(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and str(tmp_path) in str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    result = _invoke_batch(folder, tmp_path / "r.csv")
    assert result.exit_code == 2 and "--out: cannot write in" in result.output and "Permission denied" in result.output


def test_results_survive_an_out_that_fails_after_the_run(folder, tmp_path, monkeypatch):
    """The folder turns read-only during the run: the results land beside --out, and it says where."""
    from planner.report import files

    real = files.write_frame
    out = tmp_path / "r.json"

    def fails_at_out(frame, path, **kwargs):
        if Path(path) == out:
            raise PermissionError(13, "Permission denied")
        return real(frame, path, **kwargs)

    monkeypatch.setattr(files, "write_frame", fails_at_out)
    result = _invoke_batch(folder, out)
    assert result.exit_code == 2 and "--out: could not write" in result.output
    saved = [p for p in tmp_path.iterdir() if p.name.startswith("r.recovered-")]
    assert len(saved) == 1 and str(saved[0]) in result.output
    assert [r["scenario"] for r in json.loads(saved[0].read_text())] == ["lora-8b", "qlora-8b"]


def test_results_survive_when_no_file_can_be_written(folder, tmp_path, monkeypatch):
    from planner.report import files

    def never(frame, path, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "write_frame", never)
    result = _invoke_batch(folder, tmp_path / "r.csv")
    assert result.exit_code == 2 and "the results follow as CSV" in result.output
    assert "lora-8b" in result.output and "qlora-8b" in result.output


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_output_files_get_the_mode_open_would_give(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = atomic_write_text(tmp_path / "r.csv", "x\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_rewriting_a_file_keeps_its_mode(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("old\n")
    path.chmod(0o640)
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n" and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_cli_batch_result_file_is_world_readable_under_umask_022(folder, tmp_path):
    old = os.umask(0o022)
    try:
        out = tmp_path / "r.csv"
        assert _invoke_batch(folder, out).exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_batch_from_a_plain_script_with_worker_processes(tmp_path):
    """A script that calls planner.batch at top level, with no ``if __name__ == "__main__"``
    guard: spawned workers must not re-run it (they would start the batch again, and Python
    refuses with a bootstrapping error); every scenario is planned."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "plain.py"
    script.write_text("import planner\n"
                      f"frame = planner.batch({str(root / 'scenarios' / 'seed-000-cases.yaml')!r}, workers=2)\n"
                      "print('ROWS', len(frame), sorted(set(frame['status'])))\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "bootstrapping" not in run.stderr and "Traceback" not in run.stderr
    assert "ROWS 4 ['optimal']" in run.stdout


def test_a_batch_larger_than_its_bound_is_refused_before_planning(tmp_path, monkeypatch):
    """Files and scenarios are counted before any is planned: over the bound is exit 2 naming it."""
    from planner.bulk import batch as batch_module

    def boom(*args, **kwargs):
        raise AssertionError("planned before counting")

    monkeypatch.setattr(batch_module, "run_items", boom)
    runner = CliRunner()

    for i in range(3):
        (tmp_path / f"s{i}.yaml").write_text("model: llama-3.2-1b\n")
    monkeypatch.setattr(batch_module, "MAX_BATCH_FILES", 2)
    result = runner.invoke(app, ["batch", str(tmp_path), "--out", str(tmp_path / "r.csv")])
    assert result.exit_code == 2 and "more than the 2 a batch takes" in result.output, result.output
    monkeypatch.setattr(batch_module, "MAX_BATCH_FILES", 10)
    monkeypatch.setattr(batch_module, "MAX_BATCH_SCENARIOS", 2)
    result = runner.invoke(app, ["batch", str(tmp_path), "--out", str(tmp_path / "r.csv")])
    assert result.exit_code == 2 and "3 scenarios is more than the 2" in result.output, result.output
    assert not (tmp_path / "r.csv").exists()
