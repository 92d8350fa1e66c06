"""Shared by bench/portfolio_20.py and bench/portfolio_80.py: run `planner procure` on a portfolio
several times under one time limit and print each run and the medians.

Per run: the wall-clock seconds of the answer (``procure()``: portfolio, prices, candidates, the
baselines, the solver, the checker) and of the report (``tables()``), the candidates' seconds and
whether every job got every GPU count, the solver's seconds and status, the answer's status, where
it came from (solver, naive or rent-all) and its gap to the proven bound, and the costs: the answer,
the naive answer and renting everything.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml


def run(portfolio: dict, runs: int, label: str, workers: int | None = None) -> list[dict]:
    from planner.fleet.procure import procure
    from planner.report.procurement import tables

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{portfolio['name']}.yaml"
        path.write_text(yaml.safe_dump(portfolio, sort_keys=False))
        for r in range(runs):
            t0 = time.perf_counter()
            res = procure(path, workers=workers)
            answer_s = time.perf_counter() - t0
            s = tables(res).summary
            wall = time.perf_counter() - t0
            row = {"load": os.getloadavg()[0], "answer_s": answer_s, "wall_s": wall, "candidates_s": s["candidates_s"],
                   "refined": s["jobs_refined"], "solve_s": s["solve_s"], "status": s["status"],
                   "from": s["answer_from"], "gap": s["gap"], "total": s["total_usd"], "naive": s["naive_usd"],
                   "rent_all": s["rent_all_usd"], "runs": s["runs"], "jobs": s["jobs"], "own": s["own_options"]}
            rows.append(row)
            rent = "n/a" if row["rent_all"] is None else f"${row['rent_all']:,.0f}"
            print(f"run {r + 1}: answer {answer_s:.1f} s (report {wall - answer_s:.1f} s more); candidates "
                  f"{row['candidates_s']:.1f} s ({row['refined']}/{row['jobs']} jobs at every count); solver "
                  f"{s['solver_status']} {row['solve_s']:.1f} s; {row['status']} from {row['from']}, gap "
                  f"{100 * row['gap']:.2f} %; total ${row['total']:,.0f}, naive ${row['naive']:,.0f}, "
                  f"rent-all {rent}; {row['runs']} runs, {row['own']:,} own options; load average "
                  f"{row['load']:.1f} on {os.cpu_count()} CPUs", flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in ("load", "answer_s", "wall_s", "candidates_s", "solve_s", "gap",
                                                               "total", "naive")}
    rents = [r["rent_all"] for r in rows if r["rent_all"] is not None]
    rent = f"${statistics.median(rents):,.0f}" if rents else "n/a"
    statuses = ", ".join(sorted({r["status"] for r in rows}))
    print(f"{label}, time limit {portfolio['time_limit_s']:g} s, {len(rows)} runs: median answer {med['answer_s']:.1f} s "
          f"(with the report {med['wall_s']:.1f} s), candidates {med['candidates_s']:.1f} s, solver {med['solve_s']:.1f} s, "
          f"gap {100 * med['gap']:.2f} % ({statuses}); total ${med['total']:,.0f}, naive ${med['naive']:,.0f} "
          f"(saves {100 * (med['naive'] - med['total']) / med['naive']:.1f} %), rent-all {rent}; load average "
          f"{med['load']:.1f}")
    return rows
