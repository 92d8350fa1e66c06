"""The fuzz suites as a campaign: thousands of generated cases across every command.

    python bench/fuzz_campaign.py [--scale 50] [--workers 2] [--min-runs 0]

Runs tests/test_fuzz.py (scenario and portfolio files through estimate, plan, batch, procure),
tests/test_fuzz_readers.py (training configs, config.json, price files, plan JSON through
estimate, plan, batch, export) and tests/test_fuzz_limits.py with ``FUZZ_SCALE`` times their
usual number of examples. Every run must exit 0, 1 or 2 with no traceback (the suites assert
it); here, too, no run may take over 10 s nor any process grow past 1 GB. Prints the runs, the
slowest, the peak memory and the wall time; exits 1 if any of that fails or fewer than
``--min-runs`` ran. CI runs ``--scale 12`` (over 5,000 runs); the default is a longer one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITES = ["tests/test_fuzz.py", "tests/test_fuzz_readers.py", "tests/test_fuzz_limits.py"]
#: Limits on every run (the issue of record: no case over 10 s or 1 GB).
MAX_RUN_S = 10.0
MAX_PROCESS_BYTES = 1 << 30


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=50)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--min-runs", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "fuzz.jsonl"
        env = {**os.environ, "FUZZ_SCALE": str(args.scale), "FUZZ_REPORT": str(report)}
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *SUITES]
        if args.workers > 1:
            cmd += ["-n", str(args.workers)]
        t0 = time.perf_counter()
        tests = subprocess.run(cmd, cwd=ROOT, env=env, check=False)
        wall = time.perf_counter() - t0
        lines = [json.loads(x) for x in report.read_text().splitlines()] if report.exists() else []
    runs = sum(x["runs"] for x in lines)
    slowest = max((x["slowest_s"] for x in lines), default=0.0)
    peak = max((x["peak_rss_bytes"] for x in lines), default=0)
    print(f"fuzz campaign at scale {args.scale:g}: {runs:,} runs in {wall:.0f} s on {args.workers} workers; "
          f"slowest run {slowest:.2f} s (limit {MAX_RUN_S:g}); peak process memory {peak / 2**20:,.0f} MiB "
          f"(limit {MAX_PROCESS_BYTES / 2**20:,.0f}); suites {'passed' if tests.returncode == 0 else 'FAILED'}")
    failed = [why for bad, why in (
        (tests.returncode != 0, "a suite failed (an exit 3, a traceback, a hang or a flood)"),
        (slowest > MAX_RUN_S, f"a run took {slowest:.1f} s"),
        (peak > MAX_PROCESS_BYTES, f"a process reached {peak / 2**20:,.0f} MiB"),
        (runs < args.min_runs, f"only {runs:,} runs (at least {args.min_runs:,} asked)"),
    ) if bad]
    for why in failed:
        print(f"FAILED: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
