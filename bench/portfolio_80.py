"""Benchmark: `planner procure` on an 80-job, 160-run portfolio over the full GPU catalog
(limit: 60 s for the whole answer on 2 cores).

Run: python bench/portfolio_80.py [--runs 3] [--time-limit 60] [--workers 2]
The jobs are bench/portfolio_20.py's twenty recipes, each run four times over a year at 0.5×, 1×,
1.5× and 2× its token budget (a team repeating its recipes), with 1–3 runs each (160 in all) and
two-month windows. Prints per run and as medians what bench/portfolio_bench.py prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from portfolio_20 import JOBS, TOKEN_SCALE, job

HORIZON_DAYS = 360
VARIANTS = (0.5, 1.0, 1.5, 2.0)
#: Runs per job, cycled: 2, 1, 3, 2 — 2 on average, 160 for 80 jobs.
COUNTS = (2, 1, 3, 2)


def portfolio(time_limit_s: float) -> dict:
    H = HORIZON_DAYS * 24
    jobs = []
    for v, scale in enumerate(VARIANTS):
        for k, (m, meth, tok, gb, _) in enumerate(JOBS):
            i = v * len(JOBS) + k
            start = ((i * 11) % 300) * 24  # releases over ten months
            jobs.append(job(i, m, meth, tok * TOKEN_SCALE * scale, gb, COUNTS[i % len(COUNTS)], start, 60 * 24, H))
    assert len(jobs) == 80 and sum(j["count"] for j in jobs) == 160
    return {"name": "bench-80", "horizon_days": HORIZON_DAYS, "time_limit_s": time_limit_s,
            "defaults": {"profile": "seed"}, "jobs": jobs}


def main() -> None:
    from portfolio_bench import run

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    run(portfolio(args.time_limit), args.runs, "80 jobs / 160 runs over the full catalog", args.workers)


if __name__ == "__main__":
    main()
