"""Fuzzing the readers of files people bring (Hypothesis): training configs given to ``--config``
(DeepSpeed, accelerate, Hugging Face TrainingArguments, PEFT, axolotl, LLaMA-Factory, torchtune,
TRL: the real corpus in tests/fixtures/configs), model ``config.json`` files given to
``--model``, price files (planner YAML and CSV, SkyPilot CSV) given to ``batch --prices``, and
plan JSON given to ``export``.

Each case is a real file changed in one to three places (an odd value, a key added, removed,
renamed, nested or retyped) or damaged as bytes. Every run must end with exit code 0, 1 or 2,
print no traceback and a bounded amount, and answer within the per-run limit of
``tests/test_fuzz.py`` (which it shares: ``check``, the strategies, ``FUZZ_SCALE``).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz import (  # noqa: F401 - command_built_once is a module fixture used here too
    _counter,
    byte_mutated,
    check,
    command_built_once,
    dump,
    fuzz_settings,
    mutated,
)

CORPUS = ROOT / "tests" / "fixtures" / "configs"
INDEX = yaml.safe_load((CORPUS / "INDEX.yaml").read_text())["configs"]
#: One config of each tool of the corpus, and the tool's own name for it.
TOOLS = sorted({c["tool"] for c in INDEX})
CONFIGS = {c["file"]: c["tool"] for c in INDEX}
MODEL_CONFIG = ROOT / "scenarios" / "configs" / "llama-3.1-8b" / "config.json"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz-readers")


def _read(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def _json_bytes(doc: Any) -> bytes:
    """JSON as Python writes it: NaN and Infinity spelled out, as a hand-edited file may hold."""
    return json.dumps(doc, ensure_ascii=False, default=str).encode("utf-8")


def _without(flags: tuple[str, ...], flag: str) -> list[str]:
    """``flags`` (pairs of flag and value) without ``flag`` and its value."""
    pairs = list(zip(flags[::2], flags[1::2]))
    return [x for f, v in pairs if f != flag for x in (f, v)]


def _put(workdir: Path, name: str, content: bytes) -> Path:
    folder = workdir / f"case-{next(_counter)}"
    folder.mkdir()
    path = folder / name
    path.write_bytes(content)
    return path


def test_the_corpus_covers_every_tool_the_readers_know():
    assert set(TOOLS) >= {"deepspeed", "accelerate", "peft", "axolotl", "llamafactory", "torchtune", "trl"}, TOOLS


# ------------------------------------------------------------------------------------------------
# --config: the real configs of each tool, changed


#: Values for what a config leaves to the command line ("give --seq-len"), so that most changed
#: configs get past that and into the estimate.
FLAG_VALUES = {"--model": "llama-3.2-1b", "--seq-len": "1024", "--attention": "flash", "--gpus": "1", "--method": "lora",
               "--precision": "bf16", "--optimizer": "adamw", "--micro-batch": "1", "--checkpointing": "none"}


@functools.cache
def flags_for(name: str) -> tuple[str, ...]:
    """The flags the unchanged config needs beside it (what its error asks for)."""
    flags: list[str] = []
    for _ in range(3):
        _, out = check(["estimate", "--config", str(CORPUS / name), "--gpu", "h100", *flags])
        asked = [f for f in re.findall(r"give (--[a-z-]+)", out) if f not in flags]
        if not asked:
            break
        flags += [x for f in asked for x in (f, FLAG_VALUES.get(f, "1"))]
    return tuple(flags)


def test_most_unchanged_configs_estimate_with_their_flags():
    """The base the mutations start from reads: the fuzz runs past the readers into the estimate."""
    codes = [check(["estimate", "--config", str(CORPUS / n), "--gpu", "h100", *flags_for(n)])[0]
             for n in sorted(CONFIGS)]
    assert codes.count(0) + codes.count(1) >= 0.75 * len(codes), codes


@fuzz_settings(60)
@given(data=st.data())
def test_mutated_training_configs(workdir, data):
    name = data.draw(st.sampled_from(sorted(CONFIGS)), label="config")
    source = CORPUS / name
    doc = _read(source)
    if data.draw(st.integers(0, 3), label="as bytes") == 0:
        content = data.draw(byte_mutated(source.read_bytes()), label="bytes")
    else:
        changed = data.draw(mutated(doc), label="document")
        content = _json_bytes(changed) if source.suffix == ".json" else dump(changed)
    path = _put(workdir, source.name, content)
    command = data.draw(st.sampled_from(["estimate", "estimate", "plan"]), label="command")
    extra = ["--gpu", "h100"] if command == "estimate" else ["--top", "1", "--time-limit", "1",
                                                             "--gpu-types", "h100,rtx-4090"]
    flags = _without(flags_for(name), "--gpus") if command == "plan" else list(flags_for(name))
    check([command, "--config", str(path), *extra, *flags], content)


# ------------------------------------------------------------------------------------------------
# --model config.json: a real one, its values changed


@fuzz_settings(60)
@given(data=st.data())
def test_mutated_model_config_json(workdir, data):
    doc = json.loads(MODEL_CONFIG.read_text())
    if data.draw(st.integers(0, 4), label="as bytes") == 0:
        content = data.draw(byte_mutated(MODEL_CONFIG.read_bytes()), label="bytes")
    else:
        content = _json_bytes(data.draw(mutated(doc), label="document"))
    path = _put(workdir, "config.json", content)
    check(["estimate", "--model", str(path), "--method", "lora", "--gpu", "h100"], content)


# ------------------------------------------------------------------------------------------------
# Price files for batch --prices

PRICE_YAML = {"prices": [
    {"gpu": "h100", "kind": "on_demand", "usd_per_gpu_hour": 2.5, "date": "2026-11-01", "source": "quote"},
    {"gpu": "rtx-4090", "kind": "spot", "usd_per_gpu_hour": 0.3, "date": "2026-11-01", "source": "quote"},
]}
SKYPILOT_HEADER = ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "Price",
                   "SpotPrice", "Region", "AvailabilityZone"]
SKYPILOT_ROWS = [["p5.48xlarge", "H100", "8", "192", "2048", "98.32", "30.1", "us-east-1", "us-east-1a"],
                 ["g6.xlarge", "L4", "1", "4", "16", "0.805", "0.3", "us-east-1", "us-east-1b"]]
ODD_CELLS = ["", "0", "-1", "abc", "inf", "-inf", "nan", "1e308", "1e-300", "8.5", "2**63", "9" * 40, "H100",
             "é", " 8 ", "NULL"]


def _skypilot_csv(rows: list[list[str]]) -> bytes:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(SKYPILOT_HEADER)
    w.writerows(rows)
    return out.getvalue().encode("utf-8")


@st.composite
def price_files(draw) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["yaml", "yaml", "skypilot", "skypilot", "csv", "bytes"]))
    if kind == "yaml":
        return "prices.yaml", dump(draw(mutated(PRICE_YAML)))
    if kind == "csv":
        rows = draw(mutated(PRICE_YAML))
        items = rows.get("prices") if isinstance(rows, dict) else rows
        items = [r for r in items if isinstance(r, dict)] if isinstance(items, list) else []
        fields = sorted({str(k) for r in items for k in r}) or ["gpu"]
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows({str(k): v for k, v in r.items()} for r in items)
        return "prices.csv", out.getvalue().encode("utf-8")
    if kind == "skypilot":
        rows = [list(r) for r in SKYPILOT_ROWS]
        for _ in range(draw(st.integers(1, 3))):
            r, c = draw(st.integers(0, len(rows) - 1)), draw(st.integers(0, len(SKYPILOT_HEADER) - 1))
            rows[r][c] = draw(st.sampled_from(ODD_CELLS) | st.text(max_size=8))
        if draw(st.booleans()):
            rows = rows * draw(st.integers(2, 50))
        return "vms.csv", _skypilot_csv(rows)
    base = draw(st.sampled_from([dump(PRICE_YAML), _skypilot_csv(SKYPILOT_ROWS)]))
    return draw(st.sampled_from(["prices.yaml", "vms.csv"])), draw(byte_mutated(base))


QUICK_SCENARIO = "name: quick\nmodel: llama-3.2-1b\nworkload: {method: lora, tokens: 1e8}\n" \
                 "search: {gpu_types: [h100, rtx-4090, l4]}\ntop: 1\ntime_limit_s: 2\n"


@fuzz_settings(40)
@given(file=price_files())
def test_price_files(workdir, file):
    name, content = file
    path = _put(workdir, name, content)
    scenario = path.parent / "s.yaml"
    scenario.write_text(QUICK_SCENARIO)
    code, out = check(["batch", str(scenario), "--prices", str(path), "--out", str(path.parent / "r.csv"),
                       "--workers", "1"], content)
    if code != 2:  # read: the result file holds the scenario
        assert (path.parent / "r.csv").exists(), out


def test_price_file_with_no_usable_row_is_refused(workdir):
    """Count 0 and price inf on every row: nothing usable, said as such (not silently the catalog)."""
    rows = [[*r[:2], "0", *r[3:5], "inf", *r[6:]] for r in SKYPILOT_ROWS]
    path = _put(workdir, "vms.csv", _skypilot_csv(rows))
    scenario = path.parent / "s.yaml"
    scenario.write_text(QUICK_SCENARIO)
    code, out = check(["batch", str(scenario), "--prices", str(path), "--out", str(path.parent / "r.csv")])
    assert code == 2 and "no usable GPU price" in out, out


# ------------------------------------------------------------------------------------------------
# export: plan JSON, changed


@pytest.fixture(scope="module")
def plan_json(workdir) -> dict[str, Any]:
    scenario = workdir / "export-source.yaml"
    scenario.write_text(QUICK_SCENARIO)
    code, out = check(["plan", str(scenario), "--json", "--top", "2"])
    assert code == 0, out
    return json.loads(out)


@fuzz_settings(50)
@given(data=st.data())
def test_mutated_plan_json_export(workdir, plan_json, data):
    if data.draw(st.integers(0, 4), label="as bytes") == 0:
        content = data.draw(byte_mutated(_json_bytes(plan_json)), label="bytes")
    else:
        content = _json_bytes(data.draw(mutated(plan_json), label="document"))
    path = _put(workdir, "plan.json", content)
    out = path.parent / "launch"
    code, text = check(["export", str(path), "--out", str(out)], content)
    if code == 0:
        assert (out / "PLAN.md").is_file(), text
    else:
        assert not out.exists() or not any(out.iterdir()), f"exit {code} left files behind: {text}"


def test_export_of_the_unchanged_plan_writes_every_bundle(workdir, plan_json):
    """The base every mutation starts from exports: the fuzz runs the readers past validation."""
    path = _put(workdir, "plan.json", _json_bytes(plan_json))
    code, out = check(["export", str(path), "--out", str(path.parent / "launch")])
    assert code == 0 and (path.parent / "launch" / "PLAN.md").is_file(), out
    assert not math.isnan(plan_json["plans"][0]["memory"]["total_bytes"])
