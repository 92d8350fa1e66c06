"""Benchmark: `planner batch` over 200 scenarios (target: under 2 minutes on 2 cores).

Run: python bench/batch_200.py [--runs 3] [--workers 2]
Prints each run's wall-clock seconds and the median. The 200 scenarios are written to a
temporary folder: 20 files of 10, each a model × method × sequence length × objective, searched
over the whole GPU catalog (a quarter of them restricted to consumer cards, a quarter pinned to a
card), so the batch looks like a team's real list, not 200 copies of one question.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import yaml

MODELS = ["llama-3.2-1b", "qwen2.5-1.5b", "llama-3.1-8b", "mistral-7b-v0.1", "qwen2.5-14b", "gemma-2-27b",
          "qwen2.5-32b", "llama-3.1-70b", "mixtral-8x7b", "phi-4"]
METHODS = ["full", "lora", "qlora"]
SEQS = [2048, 4096, 8192]
OBJECTIVES = ["cost", "time", "gpus"]


def scenarios(n: int = 200) -> list[dict]:
    out = []
    combos = itertools.cycle(itertools.product(MODELS, METHODS, SEQS, OBJECTIVES))
    for i in range(n):
        model, method, seq, objective = next(combos)
        s = {"name": f"s{i:03d}-{model}-{method}-{seq}", "profile": "seed", "model": model,
             "objective": objective, "top": 3,
             "workload": {"method": method, "seq_len": seq, "tokens": float(10 ** (8 + i % 3)),
                          "global_batch": 64}}
        if i % 4 == 1:
            s["search"] = {"gpu_types": ["rtx-4090", "rtx-3090", "l4", "l40s"]}
        elif i % 4 == 2:
            s["layout"] = {"gpu": ["h100", "a100-80gb", "mi300x", "l40s"][i % 16 // 4]}
        out.append(s)
    return out


def write(folder: Path, items: list[dict], per_file: int = 10) -> None:
    for f in range(0, len(items), per_file):
        (folder / f"batch-{f // per_file:02d}.yaml").write_text(
            yaml.safe_dump({"scenarios": items[f:f + per_file]}, sort_keys=False))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("-n", type=int, default=200)
    args = ap.parse_args()
    from planner.bulk.batch import run_batch

    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp), scenarios(args.n))
        times = []
        for r in range(args.runs):
            t0 = time.perf_counter()
            run = run_batch([tmp], top=3, workers=args.workers)
            times.append(time.perf_counter() - t0)
            counts = run.counts()
            print(f"run {r + 1}: {times[-1]:.1f} s  {sum(counts.values())} scenarios  {counts}", flush=True)
            errors = run.scenarios[run.scenarios["status"].isin(["invalid", "error"])]
            if not errors.empty:
                print(errors[["scenario", "error"]].to_string())
    print(f"batch of {args.n} scenarios, {args.workers} workers: median {statistics.median(times):.1f} s "
          f"over {args.runs} runs (target < 120 s)")


if __name__ == "__main__":
    main()
