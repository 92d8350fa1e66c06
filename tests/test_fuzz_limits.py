"""Hostile input found by fuzzing: each case exits 2 quickly with one bounded line naming the
field, never 3, never a traceback, never output that grows with the (expanded) input."""

from __future__ import annotations

import time

import pytest
from conftest import ROOT
from typer.testing import CliRunner

from planner.cli.main import app
from planner.core.errors import EXCERPT_CHARS, MAX_LINE_CHARS, MAX_SHOWN_PROBLEMS, excerpt
from planner.core.textfiles import MAX_DEPTH, MAX_INPUT_BYTES, MAX_TEXT_CHARS, MAX_VALUES, load_yaml

runner = CliRunner()


def invoke(*args: str):
    """The CLI in-process; an exception escaping it is exit 3, as ``planner.cli.main.main`` makes it."""
    result = runner.invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return 3, f"{type(result.exception).__name__}: {result.exception}\n{result.output}"
    return result.exit_code, result.output


def write(tmp_path, text: str | bytes, name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(path)


def laughs(levels: int = 9, target: str = "workload: {method: *l%d}") -> str:
    """The 'billion laughs': each level nine aliases of the one before (9^levels strings)."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\nmodel: llama-3.1-8b\n" + (target % (levels - 1)) + "\n"


def assert_bounded_refusal(code: int, output: str, needle: str, max_chars: int = 2_000) -> None:
    assert code == 2, output[:2000]
    assert needle in output, output[:2000]
    assert "Traceback" not in output and len(output) <= max_chars, len(output)


def test_billion_laughs_is_refused_fast_and_small(tmp_path):
    text = laughs()
    assert len(text) < 700
    t0 = time.perf_counter()
    code, out = invoke("estimate", write(tmp_path, text))
    assert time.perf_counter() - t0 < 5
    assert_bounded_refusal(code, out, f"more than {MAX_VALUES:,} values (aliases expanded)")


def test_aliases_that_expand_a_little_still_echo_only_an_excerpt(tmp_path):
    """Three levels (729 strings) is within the limits: the error quotes ≤ 80 characters of it."""
    code, out = invoke("estimate", write(tmp_path, laughs(3).replace("l0: &l0", "l0: &l0", 1)))
    assert code == 2 and "workload.method:" in out and "…" in out
    line = next(line for line in out.splitlines() if "workload.method" in line)
    assert len(line) < 400


def test_billion_laughs_in_a_portfolio_is_refused(tmp_path):
    text = laughs(9, "jobs: *l%d")
    code, out = invoke("procure", write(tmp_path, text))
    assert_bounded_refusal(code, out, "aliases expanded")


def test_recursive_alias_is_refused(tmp_path):
    code, out = invoke("estimate", write(tmp_path, "model: llama-3.1-8b\nworkload: &w {x: *w}\n"))
    assert_bounded_refusal(code, out, "workload.x: alias *w refers to a value that contains it")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 500, 100_000])
def test_deep_nesting_is_exit_2_naming_the_field(tmp_path, depth):
    code, out = invoke("estimate", write(tmp_path, "model: " + "[" * depth + "]" * depth + "\n"))
    assert code == 2 and "Traceback" not in out and len(out) < 1_000, out[:1000]
    # the field where the loader stops it; past 1,000 levels newer libyaml stops first, at a line
    assert "model[0]" in out or f"nested deeper than {MAX_DEPTH} levels" in out


def test_nesting_at_the_limit_is_read(tmp_path):
    data = load_yaml(write(tmp_path, "a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"))
    assert isinstance(data["a"], list)


def test_deep_nesting_through_an_alias_is_refused(tmp_path):
    deep = "[" * 20 + "]" * 20
    text = f"a: &a {deep}\nmodel: llama-3.1-8b\nworkload: {{x: [[[[[[[[[[[[[[*a]]]]]]]]]]]]]]}}\n"
    code, out = invoke("estimate", write(tmp_path, text))
    assert_bounded_refusal(code, out, "nested deeper than")


@pytest.mark.parametrize("field, text", [
    ("model", "model: {name}\n"),
    ("layout.gpu", "model: llama-3.1-8b\nlayout: {{gpu: {name}}}\n"),
    ("name", "name: {name}\nmodel: llama-3.1-8b\n"),
    ("workload.method", "model: llama-3.1-8b\nworkload: {{method: {name}}}\n"),
])
def test_5000_character_names_are_exit_2_with_the_field_and_an_excerpt(tmp_path, field, text):
    code, out = invoke("estimate", write(tmp_path, text.format(name="x" * 5_000)))
    assert_bounded_refusal(code, out, f"{field}: text of 5,000 characters is longer than the "
                                      f"{MAX_TEXT_CHARS:,} allowed")
    assert "x" * EXCERPT_CHARS not in out and "…" in out


def test_a_long_key_is_refused_with_an_excerpt(tmp_path):
    code, out = invoke("estimate", write(tmp_path, "? " + "k" * 5_000 + "\n: 1\n"))
    assert_bounded_refusal(code, out, "(a key): text of 5,000 characters")


@pytest.mark.parametrize("length", [300, MAX_TEXT_CHARS])
def test_model_names_too_long_for_a_path_are_exit_2(tmp_path, length):
    """Under the text limit but longer than a file name may be: not a catalog name, not a path."""
    code, out = invoke("estimate", write(tmp_path, f"model: {'m' * length}\n"))
    assert code == 2 and "model:" in out and "Traceback" not in out and len(out) < 1_000, out


def test_model_name_too_long_for_a_path_in_a_batch(tmp_path):
    write(tmp_path, f"name: long\nmodel: {'m' * 300}\n", "long.yaml")
    write(tmp_path, "name: ok\nprofile: seed\nmodel: llama-3.1-8b\nworkload: {method: qlora}\n"
                    "search: {gpu_types: [l4]}\n", "ok.yaml")
    code, out = invoke("batch", str(tmp_path), "--out", str(tmp_path / "r.csv"), "--workers", "1")
    assert code == 1 and "1 invalid, 1 optimal" in out, out


@pytest.mark.parametrize("text, key, line", [
    ("model: llama-3.1-8b\nmodel: llama-2-7b\n", "'model'", 2),
    ("model: llama-3.1-8b\nworkload:\n  method: lora\n  seq_len: 512\n  method: full\n", "'method'", 5),
    ("scenarios:\n  - {name: a, model: llama-3.1-8b, name: b}\n", "'name'", 2),
])
def test_duplicate_keys_are_exit_2_naming_the_key_and_line(tmp_path, text, key, line):
    code, out = invoke("estimate", write(tmp_path, text))
    assert_bounded_refusal(code, out, f"line {line}")
    assert f"duplicate key {key}" in out


def test_duplicate_keys_in_a_portfolio_are_refused(tmp_path):
    text = (ROOT / "scenarios" / "portfolios" / "team-h1-procurement.yaml").read_text()
    code, out = invoke("procure", write(tmp_path, text + "horizon_days: 30\n"))
    assert_bounded_refusal(code, out, "duplicate key 'horizon_days'")


def test_yaml_merge_keys_still_override(tmp_path):
    text = ("base: &b {method: lora, seq_len: 512}\n"
            "scenarios:\n  - {name: a, model: llama-3.1-8b, workload: {<<: *b, method: qlora}}\n")
    data = load_yaml(write(tmp_path, text))
    assert data["scenarios"][0]["workload"] == {"method": "qlora", "seq_len": 512}


def test_files_over_the_size_limit_are_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "w") as f:
        f.write("model: llama-3.1-8b\n# " + "x" * MAX_INPUT_BYTES + "\n")
    code, out = invoke("estimate", str(path))
    assert_bounded_refusal(code, out, f"is larger than the {MAX_INPUT_BYTES:,} allowed")


@pytest.mark.parametrize("label, content, needle", [
    ("empty", b"", "expected a scenario mapping"),
    ("not utf-8", b"model: llama-3.1-8b\nname: \xff\xfe\n", "not a UTF-8 text file"),
    ("NUL byte", b"model: llama-3.1-8b\x00\n", "malformed YAML"),
    ("bad date", b"model: llama-3.1-8b\nname: 2027-13-45\n", "malformed YAML: line 2"),
    ("python tag", b"model: !!python/object/apply:os.system [echo hi]\n", "malformed YAML"),
    ("two documents", b"model: a\n---\nmodel: b\n", "malformed YAML"),
    ("undefined alias", b"model: *nope\n", "found undefined alias"),
    ("huge integer", b"model: llama-3.1-8b\nworkload: {seq_len: " + b"9" * 1000 + b"}\n", "workload.seq_len"),
])
def test_odd_bytes_are_exit_2(tmp_path, label, content, needle):
    code, out = invoke("estimate", write(tmp_path, content))
    assert_bounded_refusal(code, out, needle)


def test_thousands_of_problems_show_a_bounded_list(tmp_path):
    text = "scenarios:\n" + "".join(f"  - {{model: llama-3.1-8b, bad{i}: 1}}\n" for i in range(2_000))
    code, out = invoke("estimate", write(tmp_path, text))
    lines = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == MAX_SHOWN_PROBLEMS + 1 and "more problems" in lines[-1]


def test_excerpt_is_bounded_for_any_value():
    big = [["lol"] * 1000] * 1000  # shared rows, as YAML aliases build them
    for value in ("x" * 10_000, big, {str(i): big for i in range(100)}, 10 ** 1000 if False else 1e308):
        assert len(excerpt(value)) <= EXCERPT_CHARS
    assert excerpt("abc") == "'abc'"
    assert len(excerpt("y" * 10_000)) == EXCERPT_CHARS and excerpt("y" * 10_000).endswith("…")


def test_problem_lines_are_bounded():
    from planner.core.errors import InputError

    exc = InputError(["a: " + "z" * 10_000])
    assert len(exc.problems[0]) == MAX_LINE_CHARS and exc.problems[0].endswith("…")


def test_explicit_nulls_where_bounded_numbers_belong_are_exit_2_naming_each(tmp_path):
    text = "model: llama-3.1-8b\nlayout: {dp: null, gpus: ~, zero: null}\nworkload: {seq_len: null}\n"
    code, out = invoke("estimate", write(tmp_path, text))
    assert code == 2 and "Traceback" not in out, out
    for field in ("layout.dp: null is not a value here", "layout.gpus: null is not a value here",
                  "layout.zero:", "workload.seq_len:"):
        assert field in out, out


@pytest.mark.parametrize("text, needle", [
    ("name: []\ndims: []\nmodel: llama-3.1-8b\n", "dims: unknown key"),
    ("name: []\nmodel: llama-3.1-8b\n", "name: Input should be a valid string"),
    ("model: {params_b: 7, layers: 2, hidden: 8, name: [1]}\n", "model.name: Input should be a valid string"),
    ("model: {params_b: 7, layers: 2, hidden: 8, dims: 1}\n", "model.dims: unknown key"),
])
def test_fields_named_like_the_model_union_tags_are_named(tmp_path, text, needle):
    """"name" and "dims" tag the model union in pydantic's error locations; elsewhere they are fields."""
    code, out = invoke("estimate", write(tmp_path, text))
    assert code == 2 and needle in out, out


def test_an_unknown_model_name_is_quoted_as_an_excerpt():
    """A 300-character name that is no path and no catalog name: the message quotes at most an
    excerpt of it, not all of it."""
    name = "m" * 300
    code, out = invoke("estimate", "--model", name)
    assert code == 2 and "unknown model" in out
    assert name not in out and excerpt(name) in out
