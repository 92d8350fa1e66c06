"""What people see first: --version, --help that lists real metavars, allowed values and
defaults, search flags on `plan`, and one memory unit per output."""

from __future__ import annotations

import json
import re
from importlib.metadata import version

from typer.testing import CliRunner

from planner.cli.main import app
from planner.memory.breakdown import CHECKPOINTING, METHODS, OFFLOADS

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_version_is_the_installed_distributions():
    result = run("--version")
    assert result.exit_code == 0
    assert result.output.strip() == f"planner {version('planner')}"


def test_plan_help_names_metavars_values_and_defaults():
    out = run("plan", "--help").output
    assert "<str>" not in out and "<list" not in out  # python types are not metavars
    for metavar in ("METHOD", "TOKENS", "USD", "HOURS", "GPU=N[,GPU=N…]", "N[,N…]", "SECONDS"):
        assert metavar in out, metavar
    assert " | ".join(METHODS) in out and " | ".join(OFFLOADS) in out and " | ".join(CHECKPOINTING) in out
    assert "Default: full." in out and "Default: 10." in out


def test_estimate_help_has_the_same_options_as_the_scenario_defaults():
    out = run("estimate", "--help").output
    assert "Default: 2048." in out and "Default: flash." in out and "Default: 0." in out


def _plans(*flags: str) -> list[dict]:
    result = run("plan", "--model", "llama-3.1-8b", "--method", "lora", "--global-batch", "16",
                 "--tokens", "1e8", "--gpu-types", "h100", "--profile", "seed", "--top", "4", "--json", *flags)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["plans"]


def test_plan_search_flags_restrict_the_search():
    free = _plans()
    assert {p["micro_batch"] for p in free} != {2} or {p["zero"] for p in free} != {3}
    plans = _plans("--micro-batch", "2", "--zero", "3", "--offload", "none", "--checkpointing", "full,selective")
    assert plans
    assert all(p["micro_batch"] == 2 and p["zero"] == 3 and p["offload"] == "none" for p in plans)
    assert all(p["checkpointing"] in ("full", "selective") for p in plans)


def test_plan_search_flag_with_a_bad_value_names_the_field():
    result = run("plan", "--model", "llama-3.1-8b", "--zero", "0,7")
    assert result.exit_code == 2
    assert "search.zero" in result.output and "Traceback" not in result.output


def test_gpus_table_shows_one_memory_unit():
    gb, gib = run("gpus").output, run("gpus", "--gib").output
    assert re.search(r"\d GB", gb) and "GiB" not in gb and "MiB" not in gb
    assert re.search(r"\d GiB", gib) and not re.search(r"\d GB", gib) and "MiB" not in gib


def test_no_fit_explanation_shows_one_memory_unit(tmp_path):
    """The 'why nothing fits' lines use the table's unit: GB by default, GiB with --gib."""
    path = tmp_path / "nofit.yaml"
    path.write_text("name: nofit\nmodel: llama-3.1-70b\n"
                    "workload: {method: full, seq_len: 4096, micro_batch: 1, global_batch: 8}\n"
                    "layout: {gpu: rtx-4090, gpus: 1, offload: none}\n")
    gb, gib = run("plan", str(path)), run("plan", str(path), "--gib")
    assert gb.exit_code == 1 and gib.exit_code == 1
    assert "Why: memory" in gb.output and "GiB" not in gb.output and re.search(r"\d GB", gb.output)
    assert "Why: memory" in gib.output and not re.search(r"\d GB\b", gib.output)
