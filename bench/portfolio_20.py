"""Benchmark: `planner procure` on a 20-job portfolio over the full GPU catalog (limit: 30 s).

Run: python bench/portfolio_20.py [--runs 3] [--time-limit 30] [--workers 2]
Prints, per run and as medians (bench/portfolio_bench.py): the answer's wall-clock seconds (the
time limit covers all of it: candidates, baselines, solver, checker), the candidates' and the
solver's seconds, the status with its gap, and the total cost against the naive answer (each job's
cheapest setup bought separately) and renting everything.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

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


def job(i: int, model: str, method: str, tokens: float, gb: int | None, count: int, start_h: float,
        window_h: float, horizon_h: float) -> dict:
    workload = {"method": method, "tokens": tokens, "seq_len": 4096}
    if gb:
        workload["global_batch"] = gb
    return {"name": f"j{i:02d}-{model}-{method}", "count": count, "scenario": {"model": model, "workload": workload},
            "earliest_start_hours": start_h, "deadline_hours": min(horizon_h, start_h + window_h)}


def portfolio(time_limit_s: float) -> dict:
    H = HORIZON_DAYS * 24
    jobs = [job(i, m, meth, tok * TOKEN_SCALE, gb, n, (i * 7) % 90 * 24, 60 * 24, H)  # releases over 3 months
            for i, (m, meth, tok, gb, n) in enumerate(JOBS)]
    return {"name": "bench-20", "horizon_days": HORIZON_DAYS, "time_limit_s": time_limit_s,
            "defaults": {"profile": "seed"}, "jobs": jobs}


def main() -> None:
    from portfolio_bench import run

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    run(portfolio(args.time_limit), args.runs, "20 jobs over the full catalog", args.workers)


if __name__ == "__main__":
    main()
