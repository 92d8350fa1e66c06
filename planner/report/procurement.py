"""A procurement result as tables: fleet, schedule, costs, buy against rent, prices.

The figures are the result's own (planner.fleet.result: recomputed from the chosen fleet and
schedule in USD); these tables add their sources, dates and words.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

import pandas as pd

from planner.catalog.prices import is_stale_date
from planner.fleet.portfolio import HOURS_PER_MONTH
from planner.fleet.result import ProcureResult


@dataclass
class ProcureTables:
    summary: dict[str, Any]
    fleet: pd.DataFrame
    schedule: pd.DataFrame
    costs: pd.DataFrame
    compare: pd.DataFrame
    prices: pd.DataFrame
    plans: list[Any]  # one Plan per scheduled run (memory breakdown for the plot)

    def to_dict(self) -> dict[str, Any]:
        def rec(f: pd.DataFrame) -> list[dict[str, Any]]:
            return f.astype(object).where(f.notna(), None).to_dict(orient="records")

        return {"summary": self.summary, "fleet": rec(self.fleet), "schedule": rec(self.schedule),
                "costs": rec(self.costs), "buy_vs_rent": rec(self.compare), "prices": rec(self.prices)}


#: The answer's origin, in words.
SOURCES = {"solver": "the optimiser's plan",
           "greedy": "the greedy fleet (the solver found nothing cheaper in time)",
           "naive": "the naive answer, its fleet trimmed to what its schedule uses (the optimiser found "
                    "nothing cheaper in time)",
           "rent-all": "renting everything (the optimiser found nothing cheaper in time)"}


def tables(res: ProcureResult, as_of: dt.date | None = None) -> ProcureTables:
    """The report's tables of a result: what ``planner procure`` prints."""
    pr = res.problem
    p = pr.portfolio
    as_of = as_of or dt.date.today()
    sched_rows, plans = _schedule_rows(res)
    from planner.fleet.ownership import load_ownership

    own = load_ownership()
    months = p.horizon_h / HOURS_PER_MONTH
    resale = own.resale_fraction(months)
    fleet_rows, stale_units = _fleet_rows(res, as_of)
    costs = dataclasses.asdict(res.costs) if res.costs is not None else {}
    compare = _compare_rows(res)
    used = {(s["gpu"], k) for s in sched_rows for k in ("purchase", "on_demand", "spot")}
    price_rows = [r for r in pr.prices.rows(as_of, p.max_price_age_days) if (r["gpu"], r["kind"]) in used]
    stale = sorted({f"{r['gpu']} {r['kind']}" for r in price_rows if r["stale"]} | set(stale_units))
    resale_assumption = {"fraction": resale, "after_months": months, "source": own.resale_source}
    summary = _summary(res, costs, resale_assumption, stale)
    # An answer that buys nothing (renting is cheapest) still has the fleet table's columns.
    fleet = pd.DataFrame(fleet_rows) if fleet_rows else pd.DataFrame(columns=FLEET_COLUMNS)
    return ProcureTables(summary, fleet, pd.DataFrame(sched_rows),
                         pd.DataFrame([{"item": k, "usd": v} for k, v in costs.items()]),
                         pd.DataFrame(compare), pd.DataFrame(price_rows), plans)


def _schedule_rows(res: ProcureResult) -> tuple[list[dict[str, Any]], list[Any]]:
    """One row per scheduled run, and its plan."""
    sched_rows, plans = [], res.plans()
    for r, plan in zip(res.schedule, plans):
        sched_rows.append({
            "job": r.job, "run": r.run, "mode": r.mode, "gpu": r.gpu, "gpus": r.gpus,
            "layout": f"dp{plan.dp}·tp{plan.tp}·pp{plan.pp}·cp{plan.cp} zero{plan.zero} {plan.offload} "
                      f"mb{plan.micro_batch}×ga{plan.grad_accum} {plan.checkpointing}",
            "method": plan.method, "start_hours": r.start_hours, "end_hours": r.end_hours, "hours": r.hours,
            "start_date": r.start_date, "end_date": r.end_date,
            "window_hours": f"{r.release_hours:g}–{r.deadline_hours:g}",
        })
    return sched_rows, plans


def _fleet_rows(res: ProcureResult, as_of: dt.date) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per GPU type bought, and the servers whose price is stale."""
    pr = res.problem
    fleet_rows, stale_units = [], []
    for f in res.fleet:
        offer = pr.offers[f.gpu]
        age = None if offer.unit_date is None else (as_of - offer.unit_date).days
        if offer.unit_gpus > 1 and is_stale_date(offer.unit_date, as_of, pr.portfolio.max_price_age_days):
            stale_units.append(f"{f.gpu} server")  # a card's: prices
        fleet_rows.append({
            "gpu": f.gpu, "units": f.units, "gpus_per_unit": f.gpus_per_unit, "gpus": f.gpus,
            "unit_usd": f.unit_usd, "unit_price": offer.unit_note,
            "unit_price_date": None if offer.unit_date is None else offer.unit_date.isoformat(),
            "unit_price_age_days": age, "hosts": f.hosts, "host_usd": f.host_usd if f.hosts else None,
            "host_price": offer.host_note if f.hosts else None,
            "cash_outlay_usd": f.cash_outlay_usd, "amortised_usd": f.amortised_usd, "hosting_usd": f.hosting_usd,
            "unamortised_at_end_usd": f.unamortised_at_end_usd, "resale_at_end_usd": f.resale_at_end_usd,
            "busy_gpu_hours": f.busy_gpu_hours, "utilisation": f.utilisation,
        })
    return fleet_rows, stale_units


def _compare_rows(res: ProcureResult) -> list[dict[str, Any]]:
    """Buy against rent: this answer, the naive one and renting everything, each against this answer."""
    answer, b = res.answer, res.buy_vs_rent
    label = "this answer" + ("" if answer is None else f": {SOURCES[answer.source]}")
    compare = [{"answer": label, "total_usd": b.answer_usd, "cash_outlay_usd": b.answer_cash_outlay_usd},
               {"answer": "naive: each job's cheapest setup bought separately", "total_usd": b.naive_usd,
                "cash_outlay_usd": b.naive_cash_outlay_usd},
               {"answer": "rent everything (cheapest rental per run)", "total_usd": b.rent_all_usd,
                "cash_outlay_usd": 0.0}]
    for row in compare:
        tot = row["total_usd"]
        row["vs_answer_usd"] = None if tot is None or b.answer_usd is None else tot - b.answer_usd
    return compare


def _summary(res: ProcureResult, costs: dict[str, float], resale_assumption: dict[str, Any],
             stale_prices: list[str]) -> dict[str, Any]:
    """The summary: status and bound, the solver and candidates, costs against both baselines, resale."""
    pr, answer, gen, p, b = res.problem, res.answer, res.generation, res.problem.portfolio, res.buy_vs_rent
    savings = None
    if b.answer_usd is not None and b.naive_usd is not None:
        savings = {"usd": b.naive_usd - b.answer_usd,
                   "percent": 100.0 * (b.naive_usd - b.answer_usd) / b.naive_usd}
    return {
        "portfolio": p.name, "status": res.status, "gap": res.gap,
        "answer_from": None if answer is None else answer.source,
        "bound_usd": res.bound_usd,
        "solve_s": None if answer is None or answer.solver is None else answer.solver.wall_s,
        "solver_status": None if answer is None or answer.solver is None else answer.solver.status,
        "limit": {"wall_s": res.limit.wall_s, "deterministic": res.limit.deterministic},
        "candidates_s": gen.seconds, "candidates_complete": gen.complete, "jobs_refined": gen.jobs_refined,
        "horizon_hours": p.horizon_h, "lifetime_months": p.lifetime_months,
        "jobs": len(pr.runs), "runs": len(pr.inst.runs),
        "own_options": sum(len(r.own) for r in pr.inst.runs), "total_usd": b.answer_usd,
        "naive_usd": b.naive_usd, "rent_all_usd": b.rent_all_usd, "savings_vs_naive": savings,
        "cash_outlay_usd": costs.get("cash_outlay_usd"),
        "unamortised_at_end_usd": costs.get("unamortised_at_end_usd"),
        "resale_at_end_usd": costs.get("resale_at_end_usd"),
        "resale_assumption": resale_assumption,
        "stale_prices": stale_prices,
        "problems": res.problems, "naive_notes": res.naive_notes,
        "check_findings": [] if answer is None else answer.findings,
    }


#: What each status means, for the summary line.
STATUS_TEXT = {
    "optimal": "proven optimal",
    "feasible": "cheaper than both baselines, not proven optimal",
    "timeout": "the optimiser found nothing cheaper than the better baseline in the time limit; "
               "that baseline is the answer",
}


def summary_text(t: ProcureTables) -> str:
    s = t.summary
    lines = [(f"{s['portfolio']}: {s['jobs']} jobs ({s['runs']} runs), horizon {s['horizon_hours']:,.0f} h, "
             f"lifetime {s['lifetime_months']:g} months")]
    if s["problems"]:
        return "\n".join(lines + ["status: infeasible (some job cannot run at all)"]
                         + [f"cannot run: {m}" for m in s["problems"]])
    gap = "" if s["gap"] is None or s["status"] == "optimal" else f", gap {100 * s['gap']:.2f} % to the bound ${s['bound_usd']:,.0f}"
    lines.append(f"status: {s['status']} ({STATUS_TEXT[s['status']]}{gap})")
    cand = "" if s["candidates_complete"] else f", {s['jobs_refined']} of {s['jobs']} jobs at every GPU count (the rest at powers of two)"
    lim = s["limit"]
    limit = (f"deterministic limit {lim['deterministic']:g}" if lim["deterministic"] is not None
             else f"limit {lim['wall_s']:.2f} s: what candidates and the report left of the time limit")
    lines.append(f"solver: {s['solver_status']} in {s['solve_s']:.1f} s ({limit}); candidates: "
                 f"{s['candidates_s']:.1f} s, {s['own_options']:,} own-hardware options{cand}")
    lines.append(f"total over the horizon: ${s['total_usd']:,.0f}")
    if s["naive_usd"] is not None:
        sv = s["savings_vs_naive"]
        lines.append(f"naive (each job's cheapest setup bought separately): ${s['naive_usd']:,.0f}; "
                     f"this answer saves ${sv['usd']:,.0f} ({sv['percent']:.1f} %)")
    if s["rent_all_usd"] is not None:
        lines.append(f"renting everything: ${s['rent_all_usd']:,.0f}")
    if s["cash_outlay_usd"]:
        ra = s["resale_assumption"]
        lines.append(f"owning: ${s['cash_outlay_usd']:,.0f} paid up front; ${s['unamortised_at_end_usd']:,.0f} not yet "
                     f"amortised at the horizon's end (book value, linear over {s['lifetime_months']:g} months); "
                     f"resale assumption {100 * ra['fraction']:.0f} % after {ra['after_months']:.1f} months: "
                     f"${s['resale_at_end_usd']:,.0f}")
    lines += [f"note: {n}" for n in s["naive_notes"]]
    lines += [f"check: {n}" for n in s["check_findings"]]
    if s["stale_prices"]:
        lines.append("stale prices: " + ", ".join(s["stale_prices"]))
    return "\n".join(lines)


FLEET_COLUMNS = ["gpu", "units", "gpus_per_unit", "gpus", "unit_usd", "unit_price_date", "hosts", "host_usd",
                 "cash_outlay_usd", "amortised_usd", "hosting_usd", "unamortised_at_end_usd", "resale_at_end_usd",
                 "busy_gpu_hours", "utilisation"]
SCHEDULE_COLUMNS = ["job", "run", "mode", "gpu", "gpus", "layout", "method", "start_hours", "end_hours",
                    "start_date", "end_date", "window_hours"]


def document(t: ProcureTables, fmt: str, out_dir, pictures) -> str:
    from planner.report.files import document as doc

    sched_cols = [c for c in SCHEDULE_COLUMNS if c in t.schedule.columns and t.schedule[c].notna().any()]
    sections = [("Summary", summary_text(t), None), ("Fleet to buy", t.fleet, FLEET_COLUMNS),
                ("Jobs: plan and time slot", t.schedule, sched_cols), ("Cost breakdown", t.costs, None),
                ("Buy against rent", t.compare, None), ("Prices used", t.prices, None)]
    return doc(fmt, f"planner procure: {t.summary['portfolio']}", sections, out_dir, pictures)
