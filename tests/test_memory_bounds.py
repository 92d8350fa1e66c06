"""Overrides and counts are bounded: an absurd figure is refused (exit 2, naming the field), and
no arithmetic on valid input overflows the int64 byte counts into a negative total that "fits"."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.cli.main import app
from planner.core.specs import MAX_BYTES_PER_GPU

runner = CliRunner()
BASE = ("profile: seed\nmodel: llama-2-7b\nworkload: {method: full, seq_len: 2048, micro_batch: 1}\n"
        "layout: {gpu: h100, gpus: 8, zero: 3}\n")


def _estimate(tmp_path, text, *args):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return runner.invoke(app, ["estimate", str(path), *args])


@pytest.mark.parametrize("field, value", [
    ("activation_bytes", "1e19"),  # overflowed int64 into a negative total that "fit"
    ("activation_bytes", "1.000001e15"),
    ("activation_bytes", ".inf"),
    ("activation_bytes", ".nan"),
    ("activation_bytes", "-1"),
    ("k_factor", "1e9"),
    ("lora_params", "1e19"),
    ("lora_bytes_per_param", "1e6"),
    ("base_bytes_per_param", "1e6"),
])
def test_out_of_bounds_override_exits_2_naming_the_field(tmp_path, field, value):
    result = _estimate(tmp_path, BASE + f"overrides: {{{field}: {value}}}\n")
    assert result.exit_code == 2, result.output
    assert f"overrides.{field}" in result.output
    assert "Traceback" not in result.output


def test_the_largest_override_is_counted_exactly_and_does_not_fit(tmp_path):
    result = _estimate(tmp_path, BASE + f"overrides: {{activation_bytes: {MAX_BYTES_PER_GPU}}}\n", "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["components"]["activations"] == MAX_BYTES_PER_GPU
    assert data["total_bytes"] > MAX_BYTES_PER_GPU and data["fits"] is False


@pytest.mark.parametrize("profile", ["seed", "detailed"])
def test_the_largest_counts_do_not_overflow(tmp_path, profile):
    """A million sequences of 16M tokens per micro-batch: valid counts, an absurd demand. The
    seed arrays are int64: without a cap B·T·H·L·K·2 ≈ 1e25 wraps around."""
    text = (f"profile: {profile}\nmodel: llama-3.1-70b\n"
            "workload: {method: full, seq_len: 16777216, micro_batch: 1000000}\n"
            "layout: {gpu: h100, gpus: 8, zero: 3}\n")
    result = _estimate(tmp_path, text, "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["fits"] is False and data["total_bytes"] > 10**15
    assert all(v >= 0 for v in data["components"].values())
    assert sum(data["components"].values()) == data["total_bytes"]


def test_seed_arrays_cap_instead_of_wrapping():
    from planner.memory.breakdown import COMPONENT_CEILING, ceil_components

    out = ceil_components({"a": np.array([1e25, np.inf, np.nan, 5.2])}, ("a",))["a"]
    assert out.dtype == np.int64
    assert list(out) == [COMPONENT_CEILING, COMPONENT_CEILING, COMPONENT_CEILING, 6]
    assert int(out.sum()) > 0
