"""Search speed against the exhaustive numpy enumeration of the same space, in one run.

    python bench/bench_search.py [--runs 5] [--quick] [--grpo]

Prints the space size, the median search time per objective (proven optimal top 10) with the
CP-SAT part of it (model building and solving, the region of plans it was handed), the
enumeration's time, their ratio, that both found the same top-10 objective values, CP-SAT alone
(no hints: the whole space as its region) on a smaller space against the enumeration, and how the
search time grows with the catalog size and the maximum GPU count. Machines are shared and noisy:
medians of several runs, and the baseline measured in the same run. ``--grpo`` times only a GRPO
search with its engine colocated (TRL's engine awake, verl's asleep: two memory peaks per plan,
one CP-SAT row each) against its own enumeration.
"""

from __future__ import annotations

import argparse
import statistics
import time

from planner import catalog
from planner.scenario.resolve import resolve
from planner.search.candidates import enumerate_all, search
from planner.search.evaluate import gpu_table
from planner.search.lattice import build_lattice
from planner.search.request import build_request
from planner.search.space import build_classes

#: The full space: a 70B LoRA job at 8K tokens (so context parallelism is in play), relaxable to
#: QLoRA, over every GPU type, up to 1,024 GPUs, every layout.
FULL = {
    "profile": "seed", "model": "llama-3-70b",
    "workload": {"method": "lora", "seq_len": 8192, "tokens": 1e9, "allow_relax": ["method"]},
    "search": {"max_gpus": 1024}, "top": 10,
}


#: GRPO full fine-tuning of a 7B model with its engine on the training GPUs, where verl's sleeping
#: engine and TRL's awake one make different plans (the detailed profile, four GPU types).
GRPO = {
    "model": "qwen2.5-7b",
    "workload": {"method": "full", "algorithm": "grpo", "seq_len": 1536, "completion_len": 1024, "tokens": 1e8},
    "layout": {"generation_gpus": 0},
    "search": {"max_gpus": 64, "gpu_types": ["a100-80gb", "h100", "h200", "l40s"], "micro_batch": [1, 2, 4, 8]},
    "top": 10,
}


def grpo_bench(runs: int) -> None:
    """The GRPO search against the exhaustive enumeration of its space, per objective."""
    req = build_request(resolve(GRPO))
    n_cls, n_cols = space_size(req)
    print(f"GRPO, colocated engine, detailed profile: {n_cls:,} layouts without dp, {n_cols:,} complete plans")
    for objective in ("cost", "time"):
        raw = {**GRPO, "objective": objective}
        med, out = median_search_s(raw, runs)
        enum = []
        for _ in range(runs):
            t = time.perf_counter()
            _, e_all, top_all = enumerate_all(build_request(resolve(raw)))
            enum.append(time.perf_counter() - t)
        same = [float(out.evaluated.key[j]) for j in out.picked] == [float(e_all.key[j]) for j in top_all]
        stacks = sorted({req.stacks[int(out.cls.a["stack"][out.evaluated.cls_index[j]])].id for j in out.picked})
        print(f"  {objective:<5} search {med:.3f} s ({out.status}), enumeration {statistics.median(enum):.3f} s: "
              f"ratio {statistics.median(enum) / med:.1f}; same top 10: {same}; {cpsat_line(out)}"
              + f"; stacks {', '.join(stacks)}")


def space_size(req) -> tuple[int, int]:
    cls = build_classes(req)
    lat = build_lattice(req, gpu_table(req), cls)
    return len(cls), int(lat.count.sum())


def median_search_s(raw: dict, runs: int, hints: bool = True) -> tuple[float, object]:
    times, solves, outcome = [], [], None
    for _ in range(runs):
        req = build_request(resolve(raw))
        t = time.perf_counter()
        outcome = search(req, hints=hints, time_limit_s=600)
        times.append(time.perf_counter() - t)
        solves.append(outcome.stats.get("cpsat_solve_s", 0.0))
    outcome.stats["median_cpsat_solve_s"] = statistics.median(solves)
    return statistics.median(times), outcome


def cpsat_line(out) -> str:
    st = out.stats
    return (f"CP-SAT: {int(st['region_plans']):>7,} plans, build {st.get('cpsat_build_s', 0):.3f} s, "
            f"solve {st['median_cpsat_solve_s']:.3f} s ({int(st.get('cpsat_solves', 0))} solves)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="skip the (slow) enumeration")
    ap.add_argument("--grpo", action="store_true", help="time the GRPO search only")
    args = ap.parse_args()
    if args.grpo:
        grpo_bench(args.runs)
        return

    req = build_request(resolve(FULL))
    n_cls, n_cols = space_size(req)
    print(f"space: {len(req.gpus)} GPU types, {n_cls:,} layouts without dp, {n_cols:,} complete plans")
    print(f"{'objective':<8} {'search median s':>16} {'status':>9}")
    medians = {}
    for objective in ("cost", "gpus", "time", "hourly"):
        raw = {**FULL, "objective": objective}
        med, out = median_search_s(raw, args.runs)
        medians[objective] = (med, out)
        print(f"{objective:<8} {med:>16.3f} {out.status:>9}   {cpsat_line(out)}")
    if not args.quick:
        for objective in ("cost", "time"):
            req = build_request(resolve({**FULL, "objective": objective}))
            t = time.perf_counter()
            _, e_all, top_all = enumerate_all(req)
            enum_s = time.perf_counter() - t
            med, out = medians[objective]
            same = [float(out.evaluated.key[j]) for j in out.picked] == [float(e_all.key[j]) for j in top_all]
            print(f"enumeration ({objective}): {enum_s:.1f} s for {n_cols:,} plans "
                  f"({n_cols / enum_s:,.0f} plans/s); search is {enum_s / med:.0f}× faster; "
                  f"same top 10: {same}")
    print("\nthe detailed profile (the default; no array form, so no full enumeration baseline):")
    for objective in ("cost", "gpus", "time", "hourly"):
        med, out = median_search_s({**FULL, "profile": "detailed", "objective": objective}, args.runs)
        print(f"  {objective:<8} {med:>8.3f} s  {out.status:>9}   {cpsat_line(out)}")
    names = [g.id for g in catalog.gpus()]
    small = {**FULL, "search": {"max_gpus": 64, "gpu_types": ["a100-80gb", "h100", "l40s", "rtx-4090"],
                                "micro_batch": [1, 2, 4], "pp": [1, 2, 4]}}
    print("\nCP-SAT alone (no hints: the whole space is its region), 4 GPU types, ≤ 64 GPUs:")
    for objective in ("cost", "gpus", "time", "hourly"):
        raw = {**small, "objective": objective}
        med, out = median_search_s(raw, args.runs, hints=False)
        req = build_request(resolve(raw))
        t = time.perf_counter()
        _, e_all, top_all = enumerate_all(req)
        enum_s = time.perf_counter() - t
        same = [float(out.evaluated.key[j]) for j in out.picked] == [float(e_all.key[j]) for j in top_all]
        print(f"  {objective:<8} {med:>8.3f} s  {out.status:>9}   {cpsat_line(out)}; enumeration "
              f"{enum_s:.3f} s; same top 10: {same}")
    print("\nscaling (objective cost, median s):")
    for n_types in (4, 8, 16, len(names)):
        raw = {**FULL, "objective": "cost", "search": {"max_gpus": 1024, "gpu_types": names[:n_types]}}
        med, _ = median_search_s(raw, args.runs)
        print(f"  {n_types:>2} GPU types, ≤ 1024 GPUs: {med:.3f}")
    for max_gpus in (64, 256, 1024):
        raw = {**FULL, "objective": "cost", "search": {"max_gpus": max_gpus}}
        med, _ = median_search_s(raw, args.runs)
        print(f"  all types, ≤ {max_gpus:>4} GPUs: {med:.3f}")


if __name__ == "__main__":
    main()
