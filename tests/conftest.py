from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def seed_7b() -> dict:
    """The setting of the worked examples in 000_… §五: 7B, L=32, H=4096, T=2048, B=4,
    FlashAttention + checkpointing (K = 3)."""
    return {
        "profile": "seed",
        "model": {"params_b": 7, "layers": 32, "hidden": 4096},
        "workload": {"seq_len": 2048, "micro_batch": 4},
        "layout": {"checkpointing": "full", "attention": "flash"},
    }


def one_line(output: str) -> str:
    """The one non-blank line of a command's output (an error with one problem prints one line)."""
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    return lines[0]


def pytest_sessionfinish(session, exitstatus):
    """With FUZZ_REPORT set (bench/fuzz_campaign.py), this process's fuzz runs: how many, the
    slowest, and the process's peak memory (which bounds every run's), one JSON line per process."""
    target = os.environ.get("FUZZ_REPORT")
    fuzz = sys.modules.get("test_fuzz")
    if not target or fuzz is None:
        return
    import json
    import resource

    runs = fuzz.RUN_SECONDS
    line = {"runs": len(runs), "slowest_s": max(runs, default=0.0),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "exitstatus": int(exitstatus)}
    with open(target, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
