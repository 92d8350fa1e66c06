"""The command line: happy paths, JSON contract, exit codes, and every kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, one_line
from typer.testing import CliRunner

from planner.cli.main import app

runner = CliRunner()
CASE_B = str(ROOT / "scenarios" / "case-b-7b-full-zero3.yaml")


def run(*args: str):
    return runner.invoke(app, list(args))


def test_estimate_file_table():
    result = run("estimate", CASE_B)
    assert result.exit_code == 0, result.output
    assert "20.44 GB" in result.output and "fits" in result.output


def test_estimate_json_contract():
    result = run("estimate", CASE_B, "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    for key in ("total_bytes", "capacity_bytes", "usable_bytes", "fits", "profile", "components"):
        assert key in data
    assert data["profile"] == "seed"
    assert data["fits"] is True
    assert data["capacity_bytes"] == 40960 * 2**20
    assert sum(data["components"].values()) == data["total_bytes"]
    assert set(data["components"]) == {"weights", "gradients", "optimizer_states", "master_weights",
                                       "activations"}


def test_estimate_gib():
    result = run("estimate", CASE_B, "--gib")
    assert result.exit_code == 0
    assert f"{20_442_450_944 / 2**30:.2f} GiB" in result.output


def test_flags_override_the_file():
    """Case B on one card instead of eight: 118.4 GB does not fit -> exit 1."""
    result = run("estimate", CASE_B, "--gpus", "1", "--dp", "1", "--json")
    assert result.exit_code == 1
    assert json.loads(result.output)["fits"] is False


def test_quick_flags_without_file():
    result = run("estimate", "--model", "llama-3.1-8b", "--method", "qlora", "--gpu", "4090",
                 "--seq-len", "2048", "--micro-batch", "1", "--checkpointing", "full", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["gpu"] == "rtx-4090" and data["model"] == "llama-3.1-8b" and data["fits"]


def test_count_given_as_1e3_string():
    """YAML reads 1e3 as a string; counts accept it."""
    result = run("estimate", "--model", "llama-3.1-8b", "--seq-len", "1e3", "--method", "lora", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["layout"]["seq_len"] == 1000


def test_multi_scenario_file_with_defaults(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(
        "defaults:\n  profile: seed\n  model: {params_b: 7, layers: 32, hidden: 4096}\n"
        "  layout: {gpu: a100-40gb}\n"
        "scenarios:\n  - {name: fits, workload: {method: qlora}}\n"
        "  - {name: too-big, workload: {method: full}}\n"
    )
    result = run("estimate", str(path), "--json")
    assert result.exit_code == 1  # one of the two does not fit
    data = json.loads(result.output)
    assert [d["scenario"] for d in data] == ["fits", "too-big"]
    assert [d["fits"] for d in data] == [True, False]


def test_catalog_listings():
    gpus = run("gpus", "--json")
    assert gpus.exit_code == 0 and len(json.loads(gpus.output)) >= 24
    models = run("models")
    assert models.exit_code == 0 and "llama-3.1-405b" in models.output


def test_schema_is_json_schema():
    result = run("schema")
    schema = json.loads(result.output)
    assert {"model", "workload", "layout", "overrides"} <= set(schema["properties"])


def write(tmp_path, text: str) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return str(path)


BASE = "profile: seed\nmodel: llama-3.1-8b\nlayout: {gpu: h100}\n"

BAD_INPUTS = [
    ("unknown gpu", BASE.replace("h100", "h1000"), "layout.gpu: unknown gpu 'h1000'; did you mean"),
    ("unknown model", "model: llama-9b\n", "model: unknown model 'llama-9b'"),
    ("typo'd key", BASE + "workload: {methd: lora}\n", "workload.methd: unknown key; did you mean 'method'?"),
    ("typo'd section", BASE + "layuot: {tp: 2}\n", "layuot: unknown key; did you mean 'layout'?"),
    ("negative count", BASE + "workload: {micro_batch: -4}\n", "workload.micro_batch:"),
    ("fractional count", BASE + "workload: {seq_len: 2048.5}\n", "workload.seq_len: must be a whole number"),
    ("bad enum", BASE + "workload: {method: dora}\n", "workload.method:"),
    ("absurd gpus", BASE.replace("{gpu: h100}", "{gpu: h100, gpus: 1e12}"), "layout.gpus:"),
    ("tp vs heads", BASE.replace("{gpu: h100}", "{gpu: h100, tp: 3, gpus: 3}"),
     "layout.tp: 3 does not divide the model's 32 attention heads"),
    ("tp vs kv heads", BASE.replace("{gpu: h100}", "{gpu: h100, tp: 16, gpus: 16}"),
     "layout.tp: 16 exceeds the 8 GPUs"),
    ("pp vs layers", BASE.replace("{gpu: h100}", "{gpu: h100, pp: 5, gpus: 5}"),
     "layout.pp: 5 does not divide the model's 32 layers"),
    ("pp vs layers, default profile", "model: llama-3.1-8b\nlayout: {gpu: h100, pp: 5, gpus: 5}\n",
     "layout.pp: 5 does not divide the model's 32 layers (set layout.uneven_pp: true"),
    ("product", BASE.replace("{gpu: h100}", "{gpu: h100, gpus: 8, dp: 2, tp: 2}"),
     "layout.gpus: 8 ≠ dp·tp·pp·cp = 2·2·1·1 = 4"),
    ("malformed yaml", "model: [llama\nlayout: {gpu: h100\n", "malformed YAML: line"),
    ("not a mapping", "- 1\n- 2\n", "a scenario must be a mapping"),
    ("detailed without architecture", "profile: detailed\nmodel: {params_b: 7, layers: 32, hidden: 4096}\n",
     "profile: 'detailed' needs the full architecture"),
    ("offload without zero", BASE.replace("{gpu: h100}", "{gpu: h100, offload: optimizer}"), "layout.offload:"),
    ("global batch", BASE + "workload: {micro_batch: 3, global_batch: 16}\n",
     "workload.global_batch: 16 is not a multiple of micro_batch·dp = 3·1 = 3"),
    ("reserve", BASE + "overrides: {reserve: 1.5}\n", "overrides.reserve:"),
]


@pytest.mark.parametrize("label, text, needle", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_one_line_per_problem_exit_2(tmp_path, label, text, needle):
    result = run("estimate", write(tmp_path, text))
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output


def test_every_problem_reported_at_once(tmp_path):
    text = "model: llama-3.1-8b\nworkload: {methd: lora, seq_len: -1}\nlayout: {gpu: h1000, pp: 5, gpus: 5}\n"
    result = run("estimate", write(tmp_path, text))
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 2  # schema errors first: the typo and the negative count
    text = "profile: seed\nmodel: llama-3.1-8b\nlayout: {gpu: h1000, pp: 5, gpus: 5}\n"
    result = run("estimate", write(tmp_path, text))
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 2 and "layout.gpu" in lines[0] and "layout.pp" in lines[1]


@pytest.mark.parametrize("section, key, place", [
    ("workload", "loss", "recipe.loss"),
    ("layout", "fsdp_version", "recipe.fsdp_version"),
    ("layout", "zero3_impl", "recipe.zero_impl"),
])
def test_a_recipe_key_written_in_its_old_section_says_where_it_belongs(tmp_path, section, key, place):
    """The stack's recipe keys live in ``recipe:``; one still written under ``workload:`` or
    ``layout:`` is one line naming the key and its place (exit 2), not an unknown key."""
    value = {"loss": "chunked", "fsdp_version": 2, "zero3_impl": "deepspeed"}[key]
    text = f"model: llama-3.1-8b\n{section}: {{{key}: {value}}}\n"
    result = run("estimate", write(tmp_path, text))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    assert f"{section}.{key}: this key belongs in the recipe: section ({place})" in lines[0]
    assert "Traceback" not in result.output
    moved = f"model: llama-3.1-8b\nrecipe: {{{key}: {value}}}\n"
    assert run("estimate", write(tmp_path, moved)).exit_code == 0


def test_every_recipe_key_is_named_in_its_old_section():
    """Each ``recipe:`` key was a workload or layout key once (or, for Transformer Engine's FP8
    storage keys, is written beside the workload's ``fp8`` by habit): written there, it is named
    with its place (none is left to read as an unknown key)."""
    from planner.core.specs import MOVED_KEYS, Recipe

    places = {place for moved in MOVED_KEYS.values() for place in moved.values()}
    # post-training keys and later recipe keys, which never lived elsewhere
    born_there = {"generation_sleep", "sleep_level", "rollout_offload", "logprob_forward", "async_generation",
                  "reference_offload", "zero3_stock_linear"}
    assert places == {f"recipe.{k}" for k in Recipe.model_fields if k not in born_there}


def test_missing_file_and_missing_model():
    assert "no such file" in run("estimate", "nope.yaml").output
    assert run("estimate", "nope.yaml").exit_code == 2
    result = run("estimate", "--method", "lora")
    assert result.exit_code == 2 and "model: required" in result.output


def test_console_script_never_prints_a_traceback(tmp_path):
    """End to end through `python -m planner`, as a user runs it."""
    bad = write(tmp_path, "model: llama-3.1-8b\nlayout: {gpu: h100, tp: abc}\n")
    proc = subprocess.run([sys.executable, "-m", "planner", "estimate", bad],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 2
    assert "layout.tp:" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    ok = subprocess.run([sys.executable, "-m", "planner", "estimate", CASE_B, "--json"],
                        capture_output=True, text=True, cwd=ROOT, check=False)
    assert ok.returncode == 0 and json.loads(ok.stdout)["fits"] is True


@pytest.mark.parametrize("args, field", [
    (["--gpu", "h100", "--gpu-types", "a10g"], "layout.gpu: h100 is not among search.gpu_types"),
    (["--fleet", "h100=8", "--gpu-types", "a10g"], "constraints.fleet: none of its GPU types"),
    (["--gpu-types", ""], "search.gpu_types: empty"),
    (["--tokens", "1e300"], "workload.tokens"),
])
def test_conflicting_or_absurd_plan_requests_are_input_errors_not_infeasible(args, field):
    """Flags that contradict each other, or a token budget no run has come near, are bad input
    (exit 2, one line naming the field), not a search that finds nothing (exit 1)."""
    out = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--method", "lora", "--tokens", "1e9", *args])
    assert out.exit_code == 2, out.output
    assert field in one_line(out.output), out.output


def test_a_pinned_gpu_listed_among_the_allowed_types_under_another_name_is_no_conflict():
    out = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--method", "lora", "--tokens", "1e9",
                                   "--gpu", "h100", "--gpu-types", "h100-sxm-80gb,a10g", "--json"])
    assert out.exit_code == 0, out.output
    assert {p["gpu"] for p in json.loads(out.output)["plans"]} == {"h100-sxm-80gb"}


def test_pareto_with_an_objective_it_does_not_trade_is_an_input_error():
    """``--pareto`` trades time against cost; with ``--objective gpus`` it answered a time–cost front
    as if the objective were not there."""
    out = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--method", "lora", "--tokens", "1e9",
                                   "--pareto", "--objective", "gpus"])
    assert out.exit_code == 2 and "objective:" in out.output and "--pareto" in out.output


def test_the_public_api_imports_as_listed():
    """Every name in ``planner.__all__`` imports (``from planner import *`` too), ``Plan`` and
    ``PlanResult`` included, while ``import planner`` alone leaves the search unloaded."""
    import subprocess
    import sys

    code = ("import sys, planner\n"
            "assert 'planner.search.results' not in sys.modules\n"
            "ns = {}\n"
            "exec('from planner import *', ns)\n"
            "assert set(planner.__all__) <= set(ns), set(planner.__all__) - set(ns)\n"
            "from planner import Plan, PlanResult\n"
            "assert PlanResult.model_fields['plans'] and Plan.model_fields['memory']\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
