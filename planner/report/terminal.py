"""Render results: rich tables for people, plain JSON for programs. Nothing here computes."""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from rich.console import Console
from rich.table import Table

from planner.core.units import format_bytes
from planner.memory.estimate import Estimate
from planner.search.explain import memory_binding
from planner.search.results import recipe_text


def experts_text(ep: int, etp: int | None, sep: str = "") -> str:
    """Expert parallelism beside the other degrees, where a layout has it: `` ep8 etp1``."""
    return (f" ep{sep}{ep}" if ep > 1 else "") + (f" etp{sep}{etp}" if etp is not None else "")


def estimate_heading(est: Estimate) -> tuple[str, str]:
    """Two lines: what is estimated, and on which layout."""
    lay = est.layout
    title = f"{est.scenario}: {est.model} ({est.params / 1e9:.2f}B) {est.method}, profile {est.profile}"
    setup = (
        f"{est.gpus}× {est.gpu or 'no GPU given'}  dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} "
        f"cp={lay['cp']}{experts_text(lay.get('ep', 1), lay.get('etp'), sep='=')}{' sp' if lay['sp'] else ''} "
        f"zero={lay['zero']} offload={lay['offload']}  "
        f"B={lay['micro_batch']} T={lay['seq_len']} ckpt={lay['checkpointing']} attn={lay['attention']}"
    )
    return title, setup


def estimate_table(est: Estimate, *, gib: bool = False) -> Table:
    def fmt(n: int | None) -> str:
        return "—" if n is None else format_bytes(n, gib=gib)

    table = Table(show_header=True, header_style="bold")
    table.add_column("per GPU")
    table.add_column("memory", justify="right")
    for name, value in est.components.items():
        table.add_row(name.replace("_", " "), fmt(value))
    table.add_section()
    table.add_row("[bold]total[/bold]", f"[bold]{fmt(est.total_bytes)}[/bold]")
    device = (est.predicted or {}).get("device_bytes")
    if device is not None and device != est.total_bytes:
        # the allocator keeps freed blocks cached while memory allows: nvidia-smi shows more
        table.add_row("nvidia-smi, memory to spare", fmt(device))
    last = (est.predicted or {}).get("last_stage_allocated_bytes")
    if last is not None:
        # a pipeline's peak is on one stage (the first holds the most micro-batches in flight);
        # the last rank, whose memory Megatron's logged scalars report, holds this much allocated
        table.add_row("last pipeline stage, allocated", fmt(last))
    if est.host_bytes:
        table.add_row("offloaded to host (per GPU)", fmt(est.host_bytes))
    if est.capacity_bytes is not None:
        table.add_row("capacity", fmt(est.capacity_bytes))
        table.add_row(f"usable ({est.fit_rule})", fmt(est.usable_bytes))
        if est.generation_bytes is not None:
            # the trainer's states at rest while the sleeping engine wakes and generates
            table.add_row("while generating: trainer's states", fmt(est.generation_bytes))
            table.add_row("  usable beside the engine", fmt(est.generation_usable_bytes))
        headroom = est.headroom_bytes
        sign = "" if headroom >= 0 else "−"
        table.add_row("headroom", f"{sign}{fmt(abs(headroom))}")
        verdict = {"fits": "[green]fits[/green]", "does_not_fit": "[red]does not fit[/red]",
                   "tight": ("[yellow]tight: fits, within the method's error of the card[/yellow]"
                             if est.within_usable else
                             "[yellow]tight: over the usable bytes by less than the method's error; "
                             "it may not fit[/yellow]")}[est.verdict]
        table.add_row("verdict", verdict)
    return table


def print_estimate(console: Console, est: Estimate, *, gib: bool = False) -> None:
    title, setup = estimate_heading(est)
    console.print(f"[bold]{title}[/bold]")
    console.print(setup)
    console.print(estimate_table(est, gib=gib))
    print_read(console, est.read_from_configs)
    for note in est.assumptions:
        console.print(f"  [dim]· {note}[/dim]")
    for warning in est.warnings:
        console.print(f"  [yellow]warning: {warning}[/yellow]")


def to_json(obj: Any) -> str:
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    elif isinstance(obj, list):
        obj = [o.model_dump(mode="json") if hasattr(o, "model_dump") else o for o in obj]
    return json.dumps(obj, indent=2, ensure_ascii=False)


def _duration(seconds: float | None, unit: tuple[str, float] | None = None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    name, size = unit or _unit_of(seconds)
    return f"{seconds / size:.1f} {name}"


def _unit_of(seconds: float) -> tuple[str, float]:
    if seconds < 2 * 3600:
        return "min", 60.0
    if seconds < 72 * 3600:
        return "h", 3600.0
    return "d", 86400.0


def _band(value: float | None, low: float | None, high: float | None, fmt) -> str:
    if value is None:
        return "—"
    return f"{fmt(value)} [{fmt(low)}–{fmt(high)}]"


def _usd(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}"


def status_words(result: Any) -> str:
    """The search's status as a reader needs it: proven, or cut short by the time limit (with how
    far the best may be from the optimum), or nothing found in time (not proven infeasible)."""
    gap = (getattr(result, "stats", None) or {}).get("gap")
    if result.status == "feasible":
        return ("feasible: the time limit ended the search; " +
                ("the best is the optimum" if gap == 0 else
                 f"the optimum may be up to {gap:.0%} lower" if gap is not None else "not proven optimal"))
    if result.status == "unknown":
        return "no plan found within the time limit (unknown: not proven infeasible; raise --time-limit)"
    if not result.plans:
        return f"no feasible plan ({result.status})"
    return result.status


def plans_table(result: Any, *, gib: bool = False) -> Table:
    wl = ((result.plans[0].pinned_scenario or {}).get("workload") or {}) if result.plans else {}
    dpo = (" (DPO: mb counts pairs of sequences"
           + ("; time includes the reference forward)" if wl.get("reference", "model") == "model" else ")")
           if wl.get("algorithm") == "dpo" else "")
    if result.plans and result.plans[0].generation:
        placements = {p.generation for p in result.plans}
        where = result.plans[0].generation if len(placements) == 1 else "vLLM, colocated unless a plan shows + N gen GPUs"
        dpo = f" (GRPO: mb counts completions; generation: {where})"
    table = Table(header_style="bold", title=f"{result.scenario}: {len(result.plans)} plans, "
                  f"objective {result.objective}, {status_words(result)}{dpo}")
    for col in ("#", "stack", "GPU × n", "dp·tp·pp·cp", "zero/offload", "mb×ga", "ckpt/attn", "method/seq",
                "mem/GPU", "headroom", "time [band]", "cost [band]", "$/h"):
        table.add_column(col, justify="right" if col in ("#", "mem/GPU", "headroom", "$/h") else "left",
                         no_wrap=True)
    for p in result.plans:
        mem = p.memory
        unit = _unit_of(p.time_s) if p.time_s is not None else None
        t = _band(p.time_s, p.time_s_band.low, p.time_s_band.high, lambda v, unit=unit: _duration(v, unit))
        table.add_row(
            str(p.rank), p.stack + (f" ({text})" if (text := recipe_text(p.recipe, p.checkpointing)) else ""),
            f"{p.gpu} × {p.gpus}" + (f" + {p.generation_gpus} gen" if p.generation_gpus else ""),
            f"{p.dp}·{p.tp}·{p.pp}·{p.cp}" + experts_text(p.ep, p.etp) + (" sp" if p.sp else ""),
            f"{p.zero}/{p.offload}", f"{p.micro_batch}×{p.grad_accum}", f"{p.checkpointing}/{p.attention}",
            f"{p.method}/{p.seq_len}" + (" *" if p.relaxations else ""),
            format_bytes(mem["total_bytes"], gib=gib),
            format_bytes(mem["headroom_bytes"], gib=gib) + (" [yellow]tight[/yellow]" if mem.get("tight") else ""), t,
            _band(p.cost_usd, p.cost_usd_band.low, p.cost_usd_band.high, _usd), _usd(p.hourly_usd),
        )
    captions = []
    if any(p.relaxations for p in result.plans):
        captions.append("* relaxed: " + "; ".join(sorted({r for p in result.plans for r in p.relaxations})))
    if any(p.memory.get("tight") for p in result.plans):
        captions.append("tight: the headroom lies inside the error that validation measured for this method, "
                        "or the plan fits only as the allocator gives back its cache at the card's limit")
    if captions:
        table.caption = "\n".join(captions)
    return table


def price_notes(result: Any, as_of: dt.date | None = None) -> list[tuple[str, bool]]:
    """One line per GPU type of the plans: its on-demand price, the price's date and source, and
    whether it is stale (older than planner.catalog.prices.DEFAULT_MAX_AGE_DAYS, or undated); a
    spot price above on-demand is named (the plans use on-demand)."""
    from planner import catalog
    from planner.catalog.prices import DEFAULT_MAX_AGE_DAYS, catalog_price_date, is_stale_date

    as_of = as_of or dt.date.today()
    out: list[tuple[str, bool]] = []
    for gid in dict.fromkeys(p.gpu for p in result.plans):
        try:
            g = catalog.get_gpu(gid)
        except Exception:  # noqa: BLE001, S112 - a plan's GPU always comes from the catalog
            continue
        price = g.price_on_demand_usd_per_hour
        if price is None:
            out.append((f"{gid}: no on-demand price in the catalog", True))
            continue
        date = catalog_price_date(g)
        age = None if date is None else (as_of - date).days
        stale = is_stale_date(date, as_of)
        when = "undated" if date is None else f"{date.isoformat()} ({age} days old)"
        source = " ".join((g.price_on_demand_source or "source not given").split())
        line = f"{gid}: ${price:.2f}/GPU-h on-demand, {when}; {source}"
        if stale:
            line += f" — STALE (older than {DEFAULT_MAX_AGE_DAYS:.0f} days): check it before relying on the ranking"
        spot = g.price_spot_usd_per_hour
        if spot is not None and spot > price:
            line += f"; the listed spot price ${spot:.2f} is above on-demand, so it is not used"
        out.append((line, stale))
    return out


def print_read(console: Console, read: list[dict[str, Any]] | None) -> None:
    """What ``--config`` read: each scenario key, its value and the config key it came from."""
    if not read:
        return
    console.print("[bold]Read from your configs:[/bold]")
    width = max(len(r["key"]) for r in read)
    for r in read:
        console.print(f"  {r['key']:<{width}}  {r['value']!s:<16} [dim]{r['from']}[/dim]", highlight=False)


def print_plans(console: Console, result: Any, *, gib: bool = False) -> None:
    print_read(console, getattr(result, "read_from_configs", None))
    if result.plans:
        console.print(plans_table(result, gib=gib))
        console.print("[bold]Prices used:[/bold]")
        for line, stale in price_notes(result):
            console.print(f"  [yellow]warning: {line}[/yellow]" if stale else f"  [dim]{line}[/dim]")
    else:
        console.print(f"[bold red]{result.scenario}: {status_words(result)}[/bold red]")
    ex = result.explanation or {}
    if ex.get("binding"):
        closest = ex.get("closest") or {}
        short = closest.get("memory_bytes", 0) - closest.get("usable_bytes", 0)
        binding = memory_binding(closest, gib=gib) + ex.get("peak_note", "") if short > 0 else ex["binding"]
        console.print(f"[bold]Why:[/bold] {binding}")
    if ex.get("steps"):
        console.print("[bold]The documents' order, on the closest layout:[/bold]" if not result.plans
                      else "[bold]Why the request did not fit as asked (the documents' order):[/bold]")
        for s in ex["steps"]:
            mark = "fits" if s["fits"] else "does not fit"
            allowed = "" if s["allowed"] else " [dim](not allowed: see workload.allow_relax)[/dim]"
            console.print(f"  {s['step']}: {format_bytes(s['memory_bytes'], gib=gib)} of "
                          f"{format_bytes(s['usable_bytes'], gib=gib)} usable — {mark}{allowed}")
    if ex.get("rejected"):
        counts = ", ".join(f"{k}: {v:,}" for k, v in sorted(ex["rejected"].items(), key=lambda kv: -kv[1]))
        console.print(f"[dim]Rejected candidates — {counts}[/dim]")
    for s in ex.get("suggestions", []):
        console.print(f"[green]Would fit with {s}[/green]")
    for line in getattr(result, "checker_rejected", []):
        console.print(f"[yellow]warning: a plan the checker rejected was dropped — {line}[/yellow]")
