"""Render results: rich tables for people, plain JSON for programs. Nothing here computes."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from planner.estimate import Estimate
from planner.units import format_bytes


def estimate_heading(est: Estimate) -> tuple[str, str]:
    """Two lines: what is estimated, and on which layout."""
    lay = est.layout
    title = f"{est.scenario}: {est.model} ({est.params / 1e9:.2f}B) {est.method}, profile {est.profile}"
    setup = (
        f"{est.gpus}× {est.gpu or 'no GPU given'}  dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} "
        f"cp={lay['cp']}{' sp' if lay['sp'] else ''} zero={lay['zero']} offload={lay['offload']}  "
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
    if est.host_bytes:
        table.add_row("offloaded to host (per GPU)", fmt(est.host_bytes))
    if est.capacity_bytes is not None:
        table.add_row("capacity", fmt(est.capacity_bytes))
        table.add_row(f"usable (after {est.reserve:.0%} reserve)", fmt(est.usable_bytes))
        headroom = est.headroom_bytes
        sign = "" if headroom >= 0 else "−"
        table.add_row("headroom", f"{sign}{fmt(abs(headroom))}")
        verdict = "[green]fits[/green]" if est.fits else "[red]does not fit[/red]"
        table.add_row("verdict", verdict)
    return table


def print_estimate(console: Console, est: Estimate, *, gib: bool = False) -> None:
    title, setup = estimate_heading(est)
    console.print(f"[bold]{title}[/bold]")
    console.print(setup)
    console.print(estimate_table(est, gib=gib))
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
