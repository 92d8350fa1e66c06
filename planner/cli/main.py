"""The ``planner`` command. Each command parses, calls the library, renders.

Exit codes: 0 success (the plan fits), 1 a valid request that does not fit, 2 invalid input,
3 an internal error.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from planner import catalog
from planner.core.errors import InputError
from planner.memory.estimate import estimate_resolved
from planner.launch.checks import annotate
from planner.launch.importing import CONFIG_HELP, merge_configs
from planner.report.terminal import print_estimate, print_plans, to_json
from planner.scenario.resolve import deep_merge, read_scenario_file, resolve, scenario_from_flags
from planner.cli.app import EXIT_INFEASIBLE, EXIT_OK, app
from planner.cli.app import console as _console
from planner.cli.app import fail as _fail
from planner.cli.bulk import register as _register_commands
from planner.cli.export import export as _export


def _run_each(file: Path | None, flags: dict, config: list[Path] | None, run, *, for_plan: bool = False) -> list:
    """Every scenario of FILE (or the one the flags describe), the flags merged over it, and
    ``run(merged, source, base_dir, found)`` on each; all input problems of all scenarios are
    reported together (exit 2)."""
    try:
        overlay = scenario_from_flags(**flags)
        if file is not None:
            raws = read_scenario_file(file)
            sources = [str(file) if len(raws) == 1 else f"{file}[{i}]" for i in range(len(raws))]
        else:
            if flags.get("model") is None and not config:
                raise InputError(["model: required (give a scenario FILE or --model)"])
            raws, sources = [{"name": "cli"}], [None]
        base_dir = file.parent if file is not None else None
        results, problems = [], []
        for raw, source in zip(raws, sources):
            try:
                merged, found = deep_merge(raw, overlay), None
                if config:
                    merged, found = merge_configs(raw, overlay, config, for_plan=for_plan)
                results.append(run(merged, source, base_dir, found))
            except InputError as exc:
                problems.extend(exc.problems)
        if problems:
            raise InputError(problems)
    except InputError as exc:
        _fail(exc.problems)
    return results


@app.command()
def estimate(
    file: Annotated[Optional[Path], typer.Argument(help="Scenario YAML (one scenario or a list).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Catalog name, config.json path.")] = None,
    method: Annotated[Optional[str], typer.Option(help="full | lora | qlora | inference")] = None,
    optimizer: Annotated[Optional[str], typer.Option(help="adamw | adam8bit | paged_adamw8bit | sgd")] = None,
    precision: Annotated[Optional[str], typer.Option(help="mixed | bf16 | fp16 | fp32")] = None,
    seq_len: Annotated[Optional[str], typer.Option("--seq-len")] = None,
    micro_batch: Annotated[Optional[str], typer.Option("--micro-batch")] = None,
    grad_accum: Annotated[Optional[str], typer.Option("--grad-accum")] = None,
    global_batch: Annotated[Optional[str], typer.Option("--global-batch")] = None,
    lora_rank: Annotated[Optional[str], typer.Option("--lora-rank")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="GPU name, e.g. h100, a100-40gb, 4090.")] = None,
    gpus: Annotated[Optional[str], typer.Option(help="GPU count = dp·tp·pp·cp.")] = None,
    dp: Annotated[Optional[str], typer.Option()] = None,
    tp: Annotated[Optional[str], typer.Option()] = None,
    pp: Annotated[Optional[str], typer.Option()] = None,
    cp: Annotated[Optional[str], typer.Option()] = None,
    sp: Annotated[Optional[bool], typer.Option("--sp/--no-sp", help="Sequence parallelism.")] = None,
    zero: Annotated[Optional[int], typer.Option(help="ZeRO stage 0-3 (3 = FSDP full shard).")] = None,
    offload: Annotated[Optional[str], typer.Option(help="none | optimizer | optimizer+params")] = None,
    checkpointing: Annotated[Optional[str], typer.Option(help="none | selective | full")] = None,
    attention: Annotated[Optional[str], typer.Option(help="eager | flash")] = None,
    reserve: Annotated[Optional[float], typer.Option(help="Share of capacity kept free (default 0.10).")] = None,
    profile: Annotated[Optional[str], typer.Option(help="seed | detailed")] = None,
    config: Annotated[Optional[list[Path]], typer.Option("--config", help=CONFIG_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    gib: Annotated[bool, typer.Option("--gib", help="Show GiB (2^30) as nvidia-smi does.")] = False,
) -> None:
    """Memory per GPU of a scenario: breakdown, total, capacity, headroom, fits or not.

    Options override the file's values, or describe the whole scenario without a file.
    """
    flags = {k: v for k, v in dict(
        model=model, method=method, optimizer=optimizer, precision=precision, seq_len=seq_len,
        micro_batch=micro_batch, grad_accum=grad_accum, global_batch=global_batch,
        lora_rank=lora_rank, gpu=gpu, gpus=gpus, dp=dp, tp=tp, pp=pp, cp=cp, sp=sp, zero=zero,
        offload=offload, checkpointing=checkpointing, attention=attention, reserve=reserve,
        profile=profile,
    ).items() if v is not None}
    def run(merged, source, base_dir, found):
        est = estimate_resolved(resolve(merged, source=source, base_dir=base_dir))
        return annotate(est, found) if found is not None else est

    results = _run_each(file, flags, config, run)
    if as_json:
        typer.echo(to_json(results[0] if len(results) == 1 else results))
    else:
        console = _console()
        for est in results:
            print_estimate(console, est, gib=gib)
    raise typer.Exit(EXIT_OK if all(r.fits is not False for r in results) else EXIT_INFEASIBLE)


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _fleet(value: str | None) -> dict[str, str] | None:
    """``rtx-4090=2,h100=8`` -> {"rtx-4090": "2", "h100": "8"} (counts validated later)."""
    if value is None:
        return None
    out = {}
    for item in _split(value):
        name, _, count = item.partition("=")
        out[name.strip()] = count.strip() or "1"
    return out


@app.command()
def plan(
    file: Annotated[Optional[Path], typer.Argument(help="Scenario YAML (one scenario or a list).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Catalog name or config.json path.")] = None,
    method: Annotated[Optional[str], typer.Option(help="full | lora | qlora")] = None,
    optimizer: Annotated[Optional[str], typer.Option()] = None,
    precision: Annotated[Optional[str], typer.Option()] = None,
    seq_len: Annotated[Optional[str], typer.Option("--seq-len")] = None,
    global_batch: Annotated[Optional[str], typer.Option("--global-batch", help="Sequences per step.")] = None,
    tokens: Annotated[Optional[str], typer.Option(help="Token budget of the job, e.g. 1e9.")] = None,
    lora_rank: Annotated[Optional[str], typer.Option("--lora-rank")] = None,
    objective: Annotated[Optional[str], typer.Option(help="gpus | hourly | cost | time")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="Pin the GPU type.")] = None,
    gpu_types: Annotated[Optional[str], typer.Option("--gpu-types", help="Allowed types, comma-separated.")] = None,
    max_gpus: Annotated[Optional[str], typer.Option("--max-gpus")] = None,
    budget: Annotated[Optional[str], typer.Option(help="Budget in USD.")] = None,
    deadline: Annotated[Optional[str], typer.Option(help="Deadline in hours.")] = None,
    fleet: Annotated[Optional[str], typer.Option(help="GPUs you have: rtx-4090=2,h100=8")] = None,
    allow_relax: Annotated[Optional[str], typer.Option("--allow-relax", help="method,seq_len")] = None,
    top: Annotated[Optional[int], typer.Option(help="How many plans (default 10).")] = None,
    time_limit: Annotated[Optional[float], typer.Option("--time-limit", help="Seconds (default 30).")] = None,
    profile: Annotated[Optional[str], typer.Option(help="seed | detailed")] = None,
    pareto: Annotated[bool, typer.Option("--pareto", help="The time-versus-cost front instead.")] = False,
    config: Annotated[Optional[list[Path]], typer.Option("--config", help=CONFIG_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    gib: Annotated[bool, typer.Option("--gib", help="Show GiB (2^30).")] = False,
) -> None:
    """Ranked feasible plans: GPU type and count, parallelism, ZeRO, offload, micro-batch,
    checkpointing, method; with memory, time and cost. Explains why when nothing fits."""
    from planner.search.answer import plan_raw

    flags = {k: v for k, v in dict(
        model=model, method=method, optimizer=optimizer, precision=precision, seq_len=seq_len,
        global_batch=global_batch, tokens=tokens, lora_rank=lora_rank, objective=objective, gpu=gpu,
        gpu_types=_split(gpu_types), max_gpus=max_gpus, budget_usd=budget, deadline_hours=deadline,
        fleet=_fleet(fleet), allow_relax=_split(allow_relax), top=top, time_limit_s=time_limit,
        profile=profile,
    ).items() if v is not None}
    def run(merged, source, base_dir, found):
        for note in found.notes if found is not None else ():
            typer.echo(f"note: {note}", err=True)
        return plan_raw(merged, source=source, base_dir=base_dir, pareto=pareto)

    results = _run_each(file, flags, config, run, for_plan=True)
    if as_json:
        typer.echo(to_json(results[0] if len(results) == 1 else results))
    else:
        console = _console()
        for result in results:
            print_plans(console, result, gib=gib)
    raise typer.Exit(EXIT_OK if all(r.plans for r in results) else EXIT_INFEASIBLE)


@app.command("gpus")
def list_gpus(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The GPU catalog: memory as nvidia-smi reports it, peak dense TFLOPS, prices."""
    cat = catalog.gpus()
    if as_json:
        typer.echo(json.dumps([g.model_dump(mode="json") for g in cat], indent=2))
        return
    table = Table(title=f"{len(cat)} GPU types", header_style="bold")
    for col in ("id", "memory MiB", "BF16 TFLOPS", "FA2", "node", "NVLink", "$/h on-demand"):
        table.add_column(col, justify="left" if col == "id" else "right", no_wrap=col == "id")
    for g in cat:
        table.add_row(
            g.id,
            f"{g.memory_mib:,}{'*' if g.memory_mib_kind == 'nominal' else ''}",
            "—" if g.bf16_dense_tflops is None else f"{g.bf16_dense_tflops:g}",
            "yes" if g.supports_flash_attn2 else "no",
            str(g.gpus_per_node),
            str(g.nvlink_domain),
            "—" if g.price_on_demand_usd_per_hour is None else f"{g.price_on_demand_usd_per_hour:.2f}",
        )
    table.caption = "* nominal capacity (no published nvidia-smi figure)"
    _console().print(table)


@app.command("models")
def list_models(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The model catalog, with the parameter count computed from each architecture."""
    from planner.core.arch import param_counts

    cat = catalog.models()
    if as_json:
        typer.echo(json.dumps([m.model_dump(mode="json", exclude_none=True) for m in cat], indent=2))
        return
    table = Table(title=f"{len(cat)} models", header_style="bold")
    for col in ("id", "params (B)", "active (B)", "layers", "hidden", "heads/kv", "vocab"):
        table.add_column(col, justify="left" if col == "id" else "right", no_wrap=col == "id")
    for m in cat:
        counts = param_counts(m)
        table.add_row(
            m.id, f"{counts.total / 1e9:.2f}", f"{counts.active / 1e9:.2f}", str(m.layers),
            str(m.hidden), f"{m.heads}/{m.kv_heads_eff}", f"{m.vocab:,}",
        )
    _console().print(table)


@app.command()
def schema(
    kind: Annotated[str, typer.Option("--kind", help="scenario | file (one, a list, or scenarios + "
                                      "defaults) | portfolio (planner procure)")] = "scenario",
) -> None:
    """The scenario format (or a scenario file's, or a portfolio's) as JSON Schema."""
    from planner.cli.schemas import SCHEMAS

    if kind not in SCHEMAS:
        _fail([f"--kind: must be one of {', '.join(SCHEMAS)} (got {kind!r})"])
    typer.echo(json.dumps(SCHEMAS[kind](), indent=2))



app.command("export")(_export)


@app.command()
def validate(
    file: Annotated[Path, typer.Argument(help="Measured runs, CSV (columns of data/measured_calibration.csv).")],
    profile: Annotated[str, typer.Option(help="seed | detailed")] = "detailed",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Predict every measured run of a CSV and score the profile: per row and per method."""
    from planner.validate.score import render_tables, validate_file

    if profile not in ("seed", "detailed"):
        _fail([f"profile: {profile!r} is not seed or detailed"])
    try:
        result = validate_file(file, profile)
    except InputError as exc:
        _fail(exc.problems)
        return
    if as_json:
        typer.echo(json.dumps(result, indent=2, ensure_ascii=False))
        return
    console = _console()
    for table in render_tables(result):
        console.print(table)



_register_commands(app)


#: Exit code for a bug in planner itself (not the user's input): report it.
EXIT_INTERNAL = 3


def main() -> None:
    """Entry point: no traceback reaches the user unless PLANNER_DEBUG is set."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence
        if os.environ.get("PLANNER_DEBUG"):
            raise
        print(f"planner: internal error: {type(exc).__name__}: {exc} "
              "(set PLANNER_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(EXIT_INTERNAL)
