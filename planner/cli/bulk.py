"""``planner batch`` and ``planner procure``: parse, call the library, render.

Registered on the main app by :func:`register` (one line in planner.cli.main).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from planner.core.errors import MAX_LINE_CHARS, InputError, clip


def _fail(problems: list[str]) -> None:
    from planner.cli.app import fail

    fail(problems)


def _progress_bar(total_hint: str):
    """A rich progress bar on a terminal's stderr; nothing when stderr is piped."""
    if not sys.stderr.isatty():
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn(total_hint), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    task = progress.add_task(total_hint, total=None)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return progress, update


def batch(
    paths: Annotated[list[Path], typer.Argument(help="Scenario files and folders (searched recursively).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Result file: .csv, .json, .parquet, .md or .html.")],
    top: Annotated[int, typer.Option(help="Plans per scenario (best first).", min=1, max=1000)] = 1,
    workers: Annotated[int | None, typer.Option(help="Processes (default: the CPUs available).", min=1)] = None,
    prices: Annotated[list[Path] | None, typer.Option("--prices", help="Price file (SkyPilot CSV or planner "
                                                          "format), repeatable; later files win.")] = None,
    price_date: Annotated[str | None, typer.Option("--price-date", help="Date of a SkyPilot CSV "
                                                      "(default: the file's own date).")] = None,
    max_price_age: Annotated[float, typer.Option("--max-price-age-days", help="Older prices are flagged stale.")]
    = 180.0,
    plot: Annotated[Path | None, typer.Option("--plot", help="PNG: memory per GPU of each best plan.")] = None,
) -> None:
    """Plan every scenario in the files and folders given; one record per plan (or error).

    Exit code 0 when every scenario got a plan, 1 when some were infeasible or invalid (all
    results still written), 2 when nothing could be read.
    """
    if not math.isfinite(max_price_age) or max_price_age < 0:
        _fail([f"--max-price-age-days: {max_price_age:g} is not a number of days ≥ 0"])
    _check_batch_outputs(out, plot)
    run = _plan_batch(paths, top, workers, prices, price_date, max_price_age)
    _write_batch_results(run, out, plot)


def _check_batch_outputs(out: Path, plot: Path | None) -> None:
    """``--out``'s format, and that ``--out`` and ``--plot`` can be written (exit 2 if not)."""
    from planner.report.files import TABLE_FORMATS

    if out.suffix.lower() not in TABLE_FORMATS:
        _fail([f"--out: {out}: unknown format {out.suffix or '(none)'}; use one of {', '.join(TABLE_FORMATS)}"])
    # Where the results go is checked before hours of planning, not after.
    _check_writable_outputs(out, plot)


def _check_writable_outputs(out: Path | None, plot: Path | None) -> None:
    """``--out`` and ``--plot`` can be written (exit 2 if not): checked before the work whose
    answer they would hold."""
    from planner.report.files import check_writable

    unwritable = [f"{flag}: {why}" for flag, path in (("--out", out), ("--plot", plot)) if path is not None
                  for why in [check_writable(path)] if why]
    if unwritable:
        _fail(unwritable)


def _plan_batch(paths: list[Path], top: int, workers: int | None, prices: list[Path] | None,
                price_date: str | None, max_price_age: float):
    """The batch run (a progress bar on a terminal); exit 2 on unreadable input."""
    from planner.bulk.batch import PriceOptions, run_batch

    opts = PriceOptions(tuple(str(p) for p in prices or ()), price_date, max_price_age)
    try:
        if opts.files:  # read them once here, so a bad price file is one clear error
            from planner.catalog.prices import load_price_table

            load_price_table(opts.files, date=price_date)
        bar, update = _progress_bar("planning")
        if bar:
            with bar:
                return run_batch(paths, top=top, workers=workers, prices=opts, progress=update)
        return run_batch(paths, top=top, workers=workers, prices=opts)
    except InputError as exc:
        _fail(exc.problems)
        raise  # not reached: _fail exits


def _write_batch_results(run, out: Path, plot: Path | None) -> None:
    """The plot and the results written (the results as CSV on stdout where the file cannot be),
    the summary and the errors printed; exits with the run's code, or 2 where an output was not
    written where asked."""
    from planner.report.files import batch_document, batch_summary, write_frame_or_fallback

    failed = []  # outputs not written where asked: the results are kept all the same
    if plot is not None and not run.scenarios.empty:
        plot = _write_batch_plot(run, plot, failed)
    written, why = write_frame_or_fallback(run.frame, out,
                                           document=lambda fmt: batch_document(run, fmt, out.parent, plot))
    typer.echo(batch_summary(run))
    if why is not None:
        failed.append(f"--out: could not write {why}; " + (f"the results are in {written} instead"
                                                           if written else "the results follow as CSV"))
        if written is None:
            typer.echo(run.frame.to_csv(index=False))
    if written is not None:
        typer.echo(f"results: {written}" + (f"; plot: {plot}" if plot else ""))
    for line in run.scenarios.loc[~run.scenarios["status"].isin(("optimal", "feasible")), "error"].dropna()[:20]:
        typer.echo(f"  {clip(line, MAX_LINE_CHARS)}", err=True)
    if failed:
        _fail(failed)
    raise typer.Exit(run.exit_code)


def _write_batch_plot(run, plot: Path, failed: list[str]) -> Path | None:
    """``plot`` once the memory picture is written there; None (and why, in ``failed``) if not."""
    from planner.report.plot import plot_batch_memory

    try:
        plot_batch_memory(run.scenarios, plot)
    except Exception as exc:  # noqa: BLE001 - a picture never costs the results
        failed.append(f"--plot: could not write {plot}: {getattr(exc, 'strerror', None) or exc}")
        return None
    return plot


def _rich_table(title: str, frame, columns: list[str] | None = None):
    from rich.table import Table

    from planner.report.files import _cell

    cols = [c for c in (columns or list(frame.columns)) if c in frame.columns]
    table = Table(title=title, header_style="bold", title_justify="left")
    for c in cols:
        table.add_column(c, no_wrap=True)
    for row in frame[cols].itertuples(index=False):
        table.add_row(*(_cell(v) for v in row))
    return table


def procure(
    portfolio: Annotated[Path, typer.Argument(help="Portfolio YAML: jobs with windows, horizon, prices.")],
    time_limit: Annotated[float | None, typer.Option("--time-limit", help="Seconds for the whole answer, candidate "
                                                        "generation included (default: the portfolio's time_limit_s, 30).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | json | md | html")] = "table",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the report here (default: stdout).")]
    = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="PNG: the fleet schedule (and FILE-memory.png: "
                                                 "memory per GPU of each job's plan).")] = None,
    workers: Annotated[int | None, typer.Option(help="Processes for the jobs' candidates.", min=1)] = None,
) -> None:
    """The fleet to buy or rent for a portfolio of jobs, each job's plan and time slot, the cost
    breakdown, and buy against rent: one CP-SAT model across all jobs, never dearer than the naive
    answer or renting everything.

    Status: optimal (proven), feasible (gap stated), timeout (nothing cheaper than the better
    baseline found in time; that baseline is the answer), infeasible (some job cannot run at all).

    Exit codes: 0 an answer (optimal, feasible or timeout); 1 infeasible: some job cannot run inside
    its window at any known price (each such job named, with why); 2 invalid input (one line per
    problem); 3 internal error: no answer passed the independent check.
    """
    from planner.report.procurement import tables

    if fmt not in ("table", "json", "md", "html"):
        _fail([f"--format: must be table, json, md or html (got {fmt!r})"])
    _check_writable_outputs(out, plot)  # before the solve: its answer must not be lost
    result = _solve_portfolio(portfolio, time_limit, workers)
    t = tables(result)
    pictures = _procurement_pictures(result, t, plot) if plot is not None and t.plans else []
    text = _procurement_text(t, fmt, out, pictures)
    if text is not None:
        _emit_procurement_text(t, text, out)
    else:
        _print_procurement_tables(t, out)
    raise typer.Exit(1 if result.status == "infeasible" else 0)


def _solve_portfolio(portfolio: Path, time_limit: float | None, workers: int | None):
    """The procurement answer; exit 2 on invalid input, 3 when no answer passed the check."""
    from planner.fleet.answer import CheckFailed
    from planner.fleet.procure import procure as run_procure

    try:
        return run_procure(portfolio, time_limit_s=time_limit, workers=workers)
    except InputError as exc:
        _fail(exc.problems)
        raise  # not reached: _fail exits
    except CheckFailed as exc:
        typer.echo(f"internal error: {exc}", err=True)
        raise typer.Exit(3) from None


def _procurement_pictures(result, t, plot: Path) -> list[tuple[str, Path]]:
    """The fleet schedule at ``plot`` and each job's memory per GPU beside it, named for the report."""
    from planner.report.plot import memory_bars, plot_schedule

    slots = [{**r, "lane": f"{r['gpu']} ({'bought' if r['mode'] == 'buy' else 'rented'})"}
             for r in t.schedule.to_dict(orient="records")]
    plot_schedule(slots, result.problem.portfolio.horizon_h, plot, title=f"Fleet schedule: {t.summary['portfolio']}")
    mem_png = plot.with_name(plot.stem + "-memory.png")
    first = {}
    for row, plan in zip(t.schedule.itertuples(), t.plans):
        first.setdefault(row.job, plan)
    memory_bars([f"{j}\n{p.gpu}×{p.gpus}" for j, p in first.items()],
                [p.memory["components"] for p in first.values()],
                [p.memory["usable_bytes"] for p in first.values()], mem_png)
    return [("fleet schedule", plot), ("memory per GPU", mem_png)]


def _procurement_text(t, fmt: str, out: Path | None, pictures) -> str | None:
    """The report as JSON, Markdown or HTML; None for the terminal tables."""
    from planner.report.procurement import document

    if fmt == "json":
        from planner.report.terminal import to_json

        return to_json(t.to_dict())
    if fmt in ("md", "html"):
        return document(t, fmt, out.parent if out else Path("."), pictures)
    return None


def _emit_procurement_text(t, text: str, out: Path | None) -> None:
    """The report to ``out`` (and the summary on stdout), or to stdout."""
    from planner.report.files import atomic_write_text
    from planner.report.procurement import summary_text

    if out is not None:
        atomic_write_text(out, text)
        typer.echo(summary_text(t))
        typer.echo(f"report: {out}")
    else:
        typer.echo(text)


def _print_procurement_tables(t, out: Path | None) -> None:
    """The summary and the tables on the terminal; the summary to ``out`` too, if given."""
    from planner.cli.app import console as _console
    from planner.report.files import atomic_write_text
    from planner.report.procurement import FLEET_COLUMNS, SCHEDULE_COLUMNS, summary_text

    console = _console()
    console.print(summary_text(t), markup=False)
    if not t.fleet.empty:
        console.print(_rich_table("Fleet to buy", t.fleet, FLEET_COLUMNS))
    if not t.schedule.empty:
        console.print(_rich_table("Jobs: plan and time slot", t.schedule,
                                  [c for c in SCHEDULE_COLUMNS if t.schedule[c].notna().any()]))
        console.print(_rich_table("Cost breakdown", t.costs))
        console.print(_rich_table("Buy against rent", t.compare))
    if out is not None:
        atomic_write_text(out, summary_text(t) + "\n")


def register(app: typer.Typer) -> None:
    app.command()(batch)
    app.command()(procure)
