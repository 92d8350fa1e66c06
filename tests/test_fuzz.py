"""Fuzzing the command line with hostile scenario and portfolio files (Hypothesis).

Random YAML documents, and mutations of the shipped scenarios and portfolio (wrong types,
huge, negative, NaN and infinite numbers, unknown keys, deep nesting, long strings, non-UTF-8
bytes, truncation, empty files) go through ``planner estimate``, ``plan``, ``batch`` and
``procure`` in-process. Every run must end with exit code 0, 1 or 2 (never 3, an internal
error), print no traceback, and print a bounded amount.

Derandomized (the same examples on every run, whatever the clock) and sized to run in well
under 30 s on two cores; ``FUZZ_SCALE=10 pytest tests/test_fuzz.py`` runs ten times as many, and
``python bench/fuzz_campaign.py`` runs every fuzz suite as a campaign (CI runs 5,000+ cases)
with each run's time and the processes' peak memory checked.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from typer.testing import CliRunner

from planner.cli.main import app

SCALE = float(os.environ.get("FUZZ_SCALE", "1"))
#: Output larger than this is a flood (the largest honest answer, `plan` of the shipped file of
#: seven scenarios as tables, is about 130 kB).
MAX_OUTPUT_CHARS = 400_000


def fuzz_settings(examples: int):
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=False)


SCENARIO_FILES = sorted(p for p in (ROOT / "scenarios").glob("*.yaml"))
PORTFOLIO_FILE = ROOT / "scenarios" / "portfolios" / "team-h1-procurement.yaml"
#: Shipped scenarios quick to plan (under half a second each), for `plan` and `batch`.
QUICK_TO_PLAN = ["case-b-7b-full-zero3.yaml", "lora-13b-one-rtx-4090.yaml",
                 "qlora-llama-3.1-8b-from-config.yaml", "full-llama-3-70b-8xh100.yaml"]


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


SCENARIOS = {p.name: _load(p) for p in SCENARIO_FILES}


def _small_portfolio() -> dict[str, Any]:
    """The shipped portfolio, cut to two jobs over three GPU types so one solve takes a second,
    plus a job given as a scenario file."""
    doc = _load(PORTFOLIO_FILE)
    doc["jobs"] = doc["jobs"][:2] + [{"name": "from-file", "scenario": "job.yaml", "deadline_hours": 2000}]
    doc.update(gpu_types=["rtx-4090", "l4", "a100-80gb"], max_gpus_per_job=8, time_limit_s=1)
    return doc


PORTFOLIO = _small_portfolio()
JOB_FILE = "name: job\nmodel: llama-3.2-1b\nworkload: {method: lora, tokens: 1e8}\n"

runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def command_built_once():
    """typer builds the click command on every invoke (70 ms here): build it once for the module."""
    import typer.main
    import typer.testing

    command = typer.main.get_command(app)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(typer.testing, "_get_command", lambda _app: command)
        yield


#: Seconds one run may take before it counts as a hang (the slowest honest run here takes ~2 s).
EXAMPLE_TIMEOUT_S = 10
#: Every run of this process: seconds each took (bench/fuzz_campaign.py reports them).
RUN_SECONDS: list[float] = []


class Hang(Exception):
    """Raised in the run by the alarm after :data:`EXAMPLE_TIMEOUT_S`."""


def _on_alarm(signum, frame):
    raise Hang(f"no answer within {EXAMPLE_TIMEOUT_S} s")


def invoke(args: list[str]) -> tuple[int, str, BaseException | None]:
    """The CLI in-process; an exception escaping it is exit 3, as ``planner.cli.main.main`` makes
    it. A run past :data:`EXAMPLE_TIMEOUT_S` is stopped (SIGALRM) and counts as exit 3 too."""
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, EXAMPLE_TIMEOUT_S)
    t0 = time.perf_counter()
    try:
        result = runner.invoke(app, args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        RUN_SECONDS.append(time.perf_counter() - t0)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        exc = result.exception
        return 3, f"{type(exc).__name__}: {str(exc)[:2000]}\n{result.output[-2000:]}", exc
    return result.exit_code, result.output, None


def _where_raised(exc: BaseException) -> str | None:
    """``planner/…/file.py:line`` of the innermost planner frame of the exception's traceback."""
    tb, where = exc.__traceback__, None
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if "/planner/" in name and "/tests/" not in name:
            where = f"planner/{name.rsplit('/planner/', 1)[1]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def check(args: list[str], content: bytes | None = None) -> tuple[int, str]:
    code, out, exc = invoke(args)
    if code == 3 and exc is not None:  # an internal error anywhere fails, planner/fleet too
        out = f"raised at {_where_raised(exc) or ''}\n{out}\ninput:\n{(content or b'').decode('utf-8', 'replace')[:2000]}"
    assert code in (0, 1, 2), f"exit {code} for {args}:\n{out[:3000]}"
    assert "Traceback" not in out, out[:3000]
    assert len(out) <= MAX_OUTPUT_CHARS, f"{len(out):,} characters of output"
    if currently_in_test_context():
        event(f"exit {code}")
    return code, out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """Where fuzzed files are written: beside a copy of the shipped configs (relative model
    paths resolve) and the scenario file a portfolio job names."""
    d = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(ROOT / "scenarios" / "configs", d / "configs")
    (d / "job.yaml").write_text(JOB_FILE)
    return d


_counter = iter(range(10**9))


def put(workdir: Path, content: bytes, stem: str = "case") -> str:
    path = workdir / f"{stem}-{next(_counter)}.yaml"
    path.write_bytes(content)
    return str(path)


def run_on(workdir: Path, command: str, content: bytes, stem: str, *options: str) -> tuple[int, str]:
    return check([command, put(workdir, content, stem), *options], content)


# ------------------------------------------------------------------------------------------------
# Strategies: values, documents, mutations

KEYS = ["name", "profile", "model", "workload", "layout", "overrides", "search", "constraints", "objective",
        "top", "time_limit_s", "method", "optimizer", "precision", "seq_len", "micro_batch", "grad_accum",
        "global_batch", "tokens", "lora_rank", "gpu", "gpus", "dp", "tp", "pp", "cp", "ep", "etp", "sp", "zero",
        "offload", "checkpointing", "attention", "reserve", "params_b", "layers", "hidden", "heads",
        "gpu_types", "max_gpus", "fleet", "budget_usd", "deadline_hours", "scenarios", "defaults", "jobs",
        "count", "scenario", "horizon_days", "horizon_hours", "start_date", "deadline_date", "rent",
        "prices", "purchase_unit_gpus", "power_usd_per_gpu_hour", "lifetime_months", "moe", "experts"]

ODD_VALUES = [
    None, True, False, 0, -1, -(10**9), 10**30, 2**63, 2**64 + 1, 1e308, -1e308, 1e-300, 0.5, -0.0,
    math.nan, math.inf, -math.inf, "", " ", "1e999", "-1e999", "nan", "inf", "1e9", "1_000", "0x10", "~",
    "null", "yes", "no", "2027-13-45", "2027-01-04", [], {}, [None], {"": None}, [[[]]], "x" * 300,
    "x" * 1100, "é" * 200, "\u202e\u0000\x7f", "../../etc/passwd", "/dev/zero", "/", ".", "configs",
    "configs/llama-3.1-8b", "a/" * 100, "h100", "llama-3.1-8b", "qlora", "full", "optimizer+params",
]

scalars = st.one_of(
    st.sampled_from(ODD_VALUES),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=12), st.integers(-3, 3), st.booleans())
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=25,
)


def _nodes(doc: Any, path: tuple = ()) -> list[tuple]:
    """Every path into ``doc`` (the root included), depth first."""
    out = [path]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _nodes(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _nodes(v, path + (i,))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _nest(value: Any, depth: int, as_list: bool) -> Any:
    for _ in range(depth):
        value = [value] if as_list else {"x": value}
    return value


ODD_NUMBERS = [0, -1, 1, 2, 3, 5, 7, 64, 10**6, 10**9, 10**12, 10**30, 2**63, -(10**9), 1e308, -1e308, 1e-300,
               0.5, 1.5, -0.0, math.nan, math.inf, -math.inf, "1e999", "1e9", "-0", "0x10", None, True, "3"]
ODD_TEXT = ["", " ", "x" * 300, "x" * 1100, "é" * 200, "h100", "a100-80gb", "rtx-4090", "t4", "v100-16gb",
            "mi300x", "llama-3.1-405b", "mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b", "gpt2", "smollm2-135m",
            "inference", "qlora", "full", "adam8bit", "sgd", "fp16", "fp32", "bf16", "eager", "selective",
            "optimizer+params", "2027-13-45", "2027-01-04", "../x", "/dev/zero", "configs/llama-3.1-8b", "~",
            None, 3, [], {}]


def _is_leaf(value: Any) -> bool:
    return not isinstance(value, (dict, list))


@st.composite
def mutated(draw, base: Any) -> Any:
    """``base`` changed in one place (mostly) to three: a leaf given an odd value of its kind (so the
    rest stays valid and the deeper checks run), or anything put, removed, renamed, nested, retyped."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        paths = _nodes(doc)
        op = draw(st.sampled_from(["leaf", "leaf", "leaf", "replace", "delete", "add_key", "nest", "rename",
                                   "retype"]))
        if op == "leaf":
            leaves = [p for p in paths if p and _is_leaf(_get(doc, p))]
            if not leaves:
                continue
            path = draw(st.sampled_from(leaves))
            old = _get(doc, path)
            pool = ODD_NUMBERS if isinstance(old, (int, float)) and not isinstance(old, bool) else ODD_TEXT
            _get(doc, path[:-1])[path[-1]] = draw(st.sampled_from(pool) | scalars)
            continue
        path = draw(st.sampled_from(paths))
        if not path:  # the whole document
            doc = draw(values) if op in ("replace", "retype") else _nest(doc, draw(st.integers(1, 40)),
                                                                           draw(st.booleans()))
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        old = parent[key]
        if op == "replace":
            parent[key] = draw(values)
        elif op == "delete":
            del parent[key]
        elif op == "add_key":
            target = old if isinstance(old, dict) else parent if isinstance(parent, dict) else None
            if target is not None:
                target[draw(keys)] = draw(values)
        elif op == "nest":
            parent[key] = _nest(old, draw(st.integers(1, 60)), draw(st.booleans()))
        elif op == "rename" and isinstance(parent, dict):
            parent[str(key) + draw(st.sampled_from(["_", "s", "x", " ", "É"]))] = parent.pop(key)
        elif op == "retype":
            parent[key] = (list(old.values()) if isinstance(old, dict) else
                           {str(i): v for i, v in enumerate(old)} if isinstance(old, list) else [old])
    return doc


def dump(doc: Any) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False, width=10**6).encode("utf-8")


@st.composite
def byte_mutated(draw, text: bytes) -> bytes:
    """A file's bytes damaged: cut, spliced with arbitrary bytes, a line doubled, re-encoded."""
    op = draw(st.sampled_from(["cut", "splice", "double_line", "empty", "utf16", "bom", "flip", "huge_line"]))
    at = draw(st.integers(0, len(text)))
    if op == "cut":
        return text[:at]
    if op == "splice":
        return text[:at] + draw(st.binary(min_size=1, max_size=20)) + text[at:]
    if op == "double_line":
        lines = text.splitlines(keepends=True) or [b""]
        i = draw(st.integers(0, len(lines) - 1))
        return b"".join(lines[: i + 1] + [lines[i]] + lines[i + 1:])
    if op == "empty":
        return draw(st.sampled_from([b"", b"\n", b"---\n", b"...\n", b"# nothing\n", b"~\n", b"[]\n", b"{}\n"]))
    if op == "utf16":
        return text.decode("utf-8").encode("utf-16")
    if op == "bom":
        return b"\xef\xbb\xbf" + text
    if op == "flip":
        return text[:at] + bytes([draw(st.integers(0, 255))]) + text[at + 1:] if text else b"\xff"
    return text[:at] + b"x" * draw(st.sampled_from([1_025, 70_000])) + text[at:]


# ------------------------------------------------------------------------------------------------
# Scenario files


@fuzz_settings(80)
@given(data=st.data())
def test_mutated_shipped_scenarios_estimate(workdir, data):
    name = data.draw(st.sampled_from(sorted(SCENARIOS)), label="file")
    doc = data.draw(mutated(SCENARIOS[name]), label="document")
    run_on(workdir, "estimate", dump(doc), Path(name).stem)


@fuzz_settings(40)
@given(data=st.data())
def test_damaged_scenario_bytes_estimate(workdir, data):
    name = data.draw(st.sampled_from(sorted(SCENARIOS)), label="file")
    raw = (ROOT / "scenarios" / name).read_bytes()
    run_on(workdir, "estimate", data.draw(byte_mutated(raw), label="bytes"), Path(name).stem)


@fuzz_settings(60)
@given(doc=values)
def test_random_yaml_documents_estimate(workdir, doc):
    run_on(workdir, "estimate", dump(doc), "random")


@fuzz_settings(12)
@given(data=st.data())
def test_mutated_shipped_scenarios_plan(workdir, data):
    name = data.draw(st.sampled_from(QUICK_TO_PLAN), label="file")
    doc = data.draw(mutated(SCENARIOS[name]), label="document")
    run_on(workdir, "plan", dump(doc), Path(name).stem, "--top", "2", "--time-limit", "1")


@fuzz_settings(4)
@given(data=st.data())
def test_batch_keeps_every_file_whatever_they_hold(workdir, data):
    folder = workdir / f"batch-{next(_counter)}"
    folder.mkdir()
    (folder / "configs").symlink_to(workdir / "configs")
    n = data.draw(st.integers(1, 3), label="files")
    for i in range(n):
        name = data.draw(st.sampled_from(QUICK_TO_PLAN[:2]), label="file")
        doc = data.draw(mutated(SCENARIOS[name]), label="document")
        content = dump(doc) if data.draw(st.booleans(), label="as YAML") else data.draw(
            byte_mutated(dump(doc)), label="bytes")
        (folder / f"f{i}.yaml").write_bytes(content)
    out = folder / "out" / "r.csv"
    _code, text = check(["batch", str(folder), "--out", str(out), "--workers", "1"])
    import pandas as pd

    frame = pd.read_csv(out)
    assert set(frame["file"].map(lambda f: Path(f).name)) == {f"f{i}.yaml" for i in range(n)}, text
    assert not (frame["status"] == "error").any(), frame["error"].dropna().tolist()


# ------------------------------------------------------------------------------------------------
# Portfolio files


def procure(workdir: Path, content: bytes) -> tuple[int, str]:
    return run_on(workdir, "procure", content, "portfolio", "--time-limit", "1", "--workers", "1",
                  "--format", "json")


def test_fuzz_base_portfolio_is_valid_and_quick(workdir):
    code, out = procure(workdir, dump(PORTFOLIO))
    assert code == 0, out


@fuzz_settings(15)
@given(doc=mutated(PORTFOLIO))
def test_mutated_portfolio_procure(workdir, doc):
    procure(workdir, dump(doc))


@fuzz_settings(15)
@given(data=st.data())
def test_damaged_portfolio_bytes_procure(workdir, data):
    procure(workdir, data.draw(byte_mutated(dump(PORTFOLIO)), label="bytes"))


@fuzz_settings(25)
@given(doc=values)
def test_random_yaml_documents_procure(workdir, doc):
    if isinstance(doc, dict):
        doc.setdefault("jobs", [{"name": "j", "scenario": doc.get("scenario", {})}])
    procure(workdir, dump(doc))
