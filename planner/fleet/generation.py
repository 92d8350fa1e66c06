"""Every job's candidates within the time limit (each job's: planner.fleet.job_options): jobs that
differ only in their token budgets share one search; several jobs are searched in several
processes; jobs not started by the deadline get only their coarse candidates (powers of two).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from planner.core.errors import InputError
from planner.fleet.job_options import (
    JobOptions,
    coarse_counts,
    job_options,
    job_request,
    options_like,
    same_search,
    token_free_key,
)
from planner.fleet.portfolio import JobRun


@dataclass
class Generation:
    seconds: float
    complete: bool  # every job got its candidates at every count
    jobs_refined: int  # jobs that got every count (the others: powers of two only)


def _options_group(jobs: list[JobRun], gpu_types, max_gpus, tier: str) -> list[JobOptions | list[str]]:
    """Candidates of jobs that differ only in their token budgets: one search for each distinct
    request, the others evaluated on its plans (planner.fleet.job_options.options_like). A job's
    input problems come back in its place."""
    counts = None if tier == "all" else coarse_counts(max_gpus)
    out: list[JobOptions | list[str]] = []
    searched: list[JobOptions] = []
    for job in jobs:
        try:
            req, _ = job_request(job, gpu_types, max_gpus)
            base = next((o for o in searched if same_search(o.req, req)), None)
            if base is None:
                base = job_options(job, gpu_types, max_gpus, counts)
                searched.append(base)
                out.append(base)
            else:
                out.append(options_like(base, job, gpu_types, max_gpus))
        except InputError as exc:
            out.append(list(exc.problems))
    return out


def generate_options(runs: list[JobRun], gpu_types, max_gpus: int, *, workers: int | None = None,
                     deadline: float | None = None) -> tuple[list[JobOptions], Generation]:
    """Every job's candidates; in several processes when there are several jobs. Jobs that differ
    only in their token budgets share one search.

    With a ``deadline`` (``time.perf_counter()`` seconds), jobs not started by then get only their
    coarse candidates (powers of two: always built, even past the deadline); what was built in full
    is kept. Without one: every count of every job."""
    from planner.core.pools import MIN_SCENARIOS_FOR_PROCESSES, default_workers

    t0 = time.perf_counter()
    workers = default_workers() if workers is None else workers
    groups: dict[str, list[int]] = {}
    for k, job in enumerate(runs):
        groups.setdefault(token_free_key(job), []).append(k)
    items = list(groups.values())
    results: dict[int, tuple[str, JobOptions | list[str]]] = {}

    def keep(idx: list[int], tier: str, got: list) -> None:
        for k, o in zip(idx, got):
            results[k] = (tier, o)

    if workers <= 1 or len(items) < MIN_SCENARIOS_FOR_PROCESSES:
        for idx in items:
            tier = "all" if deadline is None or time.perf_counter() < deadline else "coarse"
            keep(idx, tier, _options_group([runs[k] for k in idx], gpu_types, max_gpus, tier))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, wait

        from planner.core.pools import ignore_interrupts, stopped_on_interrupt

        # Fork where there is one: a spawned worker first re-imports the package (3-5 s on a loaded
        # 2-core machine, most of a 30 s limit); a forked one starts with the parent's modules and
        # loaded catalogs. Nothing runs threads in the parent yet (the solver starts later).
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        ctx = multiprocessing.get_context(method)
        with ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=ctx,
                                 initializer=ignore_interrupts) as pool:
            futures = {pool.submit(_options_group, [runs[k] for k in idx], gpu_types, max_gpus, "all"): (i, "all")
                       for i, idx in enumerate(items)}
            with stopped_on_interrupt(pool):
                timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
                wait(futures, timeout=timeout)
                for f, (i, _) in list(futures.items()):
                    if not f.done() and f.cancel():  # not started in time: the coarse counts only
                        del futures[f]
                        futures[pool.submit(_options_group, [runs[k] for k in items[i]], gpu_types, max_gpus,
                                            "coarse")] = (i, "coarse")
                for f, (i, tier) in futures.items():
                    keep(items[i], tier, f.result())
    problems = [m for k in range(len(runs)) if isinstance(results[k][1], list) for m in results[k][1]]
    if problems:
        raise InputError(problems)
    out = [results[k][1] for k in range(len(runs))]
    refined = sum(1 for k in range(len(runs)) if results[k][0] == "all")
    return out, Generation(time.perf_counter() - t0, refined == len(runs), refined)
