"""Benchmark: `planner procure` on a 20-job portfolio over the full GPU catalog.

Run: python bench/portfolio_20.py [--runs 3] [--time-limit 30]
Prints, per run and as medians: the time to build every job's candidates (per GPU type and GPU
count, in processes), the CP-SAT solve time under the time limit, whether it was proven optimal or
its gap, the total cost, and the saving against the naive answer (each job's cheapest setup bought
separately) and against renting everything.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import yaml

#: (model, method, tokens, global batch or None, count) — a half-year of a mid-sized team's jobs.
JOBS = [
    ("llama-3.1-70b", "qlora", 1e9, None, 3), ("llama-3.1-8b", "full", 2e10, None, 4),
    ("qwen2.5-32b", "lora", 3e9, None, 2), ("llama-3.2-1b", "full", 5e11, 512, 1),
    ("gemma-2-27b", "lora", 1e9, None, 2), ("llama-3.1-8b", "full", 1e11, 256, 1),
    ("mistral-7b-v0.1", "lora", 5e8, None, 3), ("qwen2.5-7b", "full", 1e10, None, 2),
    ("phi-4", "lora", 2e9, None, 2), ("qwen2.5-14b", "full", 5e9, None, 1),
    ("llama-3.2-3b", "full", 1e11, 512, 1), ("mixtral-8x7b", "qlora", 1e9, None, 1),
    ("qwen2.5-72b", "qlora", 5e8, None, 2), ("gemma-2-9b", "full", 1e10, None, 2),
    ("qwen3-8b", "lora", 2e9, None, 3), ("llama-3.1-70b", "lora", 2e9, None, 1),
    ("qwen3-14b", "qlora", 1e9, None, 2), ("tinyllama-1.1b", "full", 2e11, 512, 1),
    ("qwen3-32b", "lora", 1e9, None, 2), ("llama-3.1-8b", "lora", 5e9, None, 4),
]
HORIZON_DAYS = 180
#: Token budgets above × this: enough sustained load that owning some GPUs pays off.
TOKEN_SCALE = 5


def portfolio(time_limit_s: float) -> dict:
    jobs = []
    for i, (model, method, tokens, gb, count) in enumerate(JOBS):
        start = (i * 7) % 90 * 24  # staggered releases over the first three months
        workload = {"method": method, "tokens": tokens * TOKEN_SCALE, "seq_len": 4096}
        if gb:
            workload["global_batch"] = gb
        jobs.append({"name": f"j{i:02d}-{model}-{method}", "count": count,
                     "scenario": {"model": model, "workload": workload},
                     "earliest_start_hours": start, "deadline_hours": min(HORIZON_DAYS * 24, start + 60 * 24)})
    return {"name": "bench-20", "horizon_days": HORIZON_DAYS, "time_limit_s": time_limit_s,
            "defaults": {"profile": "seed"}, "jobs": jobs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=30.0)
    args = ap.parse_args()
    from planner.report.procurement import tables
    from planner.fleet.procure import procure

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench-20.yaml"
        path.write_text(yaml.safe_dump(portfolio(args.time_limit), sort_keys=False))
        for r in range(args.runs):
            t0 = time.perf_counter()
            res = procure(path)
            s = tables(res).summary
            wall = time.perf_counter() - t0
            gap = 0.0 if s["status"] == "optimal" else (s["gap"] if s["gap"] is not None else float("nan"))
            rows.append((s["candidates_s"], s["solve_s"], gap, s["total_usd"], s["naive_usd"], s["rent_all_usd"], wall))
            print(f"run {r + 1}: candidates {s['candidates_s']:.1f} s, solve {s['solve_s']:.1f} s, {s['status']}, "
                  f"gap {100 * gap:.2f} %, total ${s['total_usd']:,.0f}, naive ${s['naive_usd']:,.0f} "
                  f"(saves {s['savings_vs_naive']['percent']:.1f} %), rent-all ${s['rent_all_usd']:,.0f}, "
                  f"{s['runs']} runs, {s['own_options']:,} own options, wall {wall:.1f} s", flush=True)
    med = [statistics.median(c) for c in zip(*rows)]
    print(f"20 jobs over the full catalog, time limit {args.time_limit:g} s: median candidates {med[0]:.1f} s, "
          f"solve {med[1]:.1f} s, gap {100 * med[2]:.2f} %, total ${med[3]:,.0f}, naive ${med[4]:,.0f} "
          f"(saves {100 * (med[4] - med[3]) / med[4]:.1f} %), rent-all ${med[5]:,.0f}, wall {med[6]:.1f} s "
          f"over {args.runs} runs")


if __name__ == "__main__":
    main()
