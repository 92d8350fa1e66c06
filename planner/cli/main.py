"""The ``planner`` command. Each command parses, calls the library, renders.

Exit codes: 0 success (the plan fits), 1 a valid request that does not fit, 2 invalid input,
3 an internal error.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from planner import catalog
from planner.cli import options as o
from planner.cli.app import EXIT_INFEASIBLE, EXIT_OK, app
from planner.cli.app import console as _console
from planner.cli.app import fail as _fail
from planner.cli.bulk import register as _register_commands
from planner.cli.export import export as _export
from planner.cli.serve import register as _register_serve
from planner.core.errors import InputError
from planner.core.units import format_bytes, mib_to_bytes
from planner.launch.importers import CONFIG_HELP, annotate, merge_configs
from planner.memory.estimate import estimate_resolved
from planner.report.terminal import print_estimate, print_plans, to_json
from planner.scenario.files import deep_merge, read_scenario_file, scenario_from_flags
from planner.scenario.resolve import resolve
from planner.search.results import with_stack_recipe


def _run_each(file: Path | None, flags: dict, config: list[Path] | None, run, *, for_plan: bool = False,
              extra: dict | None = None) -> list:
    """Every scenario of FILE (or the one the flags describe), the flags merged over it, and
    ``run(merged, source, base_dir, found)`` on each; all input problems of all scenarios are
    reported together (exit 2)."""
    try:
        overlay = deep_merge(scenario_from_flags(**flags), extra or {})
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


@app.callback()
def _root(version: o.Version = False) -> None:
    """Plan LLM training and fine-tuning: memory per GPU, hardware and configuration."""


@app.command()
def estimate(
    file: o.File = None,
    model: o.Model = None,
    method: o.Method = None,
    optimizer: o.Optimizer = None,
    precision: o.Precision = None,
    seq_len: o.SeqLen = None,
    micro_batch: o.MicroBatch = None,
    grad_accum: o.GradAccum = None,
    global_batch: o.GlobalBatch = None,
    lora_rank: o.LoraRank = None,
    algorithm: o.Algorithm = None,
    num_generations: o.Generations = None,
    completion_len: o.CompletionLen = None,
    reference: o.Reference = None,
    generation_gpus: o.GenerationGpus = None,
    generation_memory_fraction: o.GenerationFraction = None,
    generation_tp: o.GenerationTp = None,
    generation_sleep: o.GenerationSleep = None,
    rollout_offload: o.RolloutOffload = None,
    gpu: o.Gpu = None,
    gpus: o.Gpus = None,
    dp: o.Dp = None,
    tp: o.Tp = None,
    pp: o.Pp = None,
    cp: o.Cp = None,
    sp: o.Sp = None,
    zero: o.Zero = None,
    offload: o.Offload = None,
    checkpointing: o.Checkpointing = None,
    attention: o.Attention = None,
    reserve: o.Reserve = None,
    profile: o.Profile = None,
    stack: o.Stack = None,
    config: Annotated[list[Path] | None, typer.Option("--config", metavar="FILE", help=CONFIG_HELP)] = None,
    as_json: o.Json = False,
    gib: o.Gib = False,
) -> None:
    """Memory per GPU of a scenario: breakdown, total, capacity, headroom, fits or not.

    Options override the file's values, or describe the whole scenario without a file.
    """
    flags = {k: v for k, v in {
        "model": model, "method": method, "optimizer": optimizer, "precision": precision, "seq_len": seq_len,
        "micro_batch": micro_batch, "grad_accum": grad_accum, "global_batch": global_batch,
        "lora_rank": lora_rank, "algorithm": algorithm, "reference": reference,
        "num_generations": num_generations, "completion_len": completion_len,
        "generation_gpus": generation_gpus, "generation_memory_fraction": generation_memory_fraction,
        "generation_tp": generation_tp, "generation_sleep": generation_sleep, "rollout_offload": rollout_offload,
        "gpu": gpu, "gpus": gpus, "dp": dp, "tp": tp, "pp": pp,
        "cp": cp, "sp": sp, "zero": zero,
        "offload": offload, "checkpointing": checkpointing, "attention": attention, "reserve": reserve,
        "profile": profile,
    }.items() if v is not None}
    def run(merged, source, base_dir, found):
        if stack is not None:
            merged = with_stack_recipe(merged, stack)
        est = estimate_resolved(resolve(merged, source=source, base_dir=base_dir))
        return annotate(est, found) if found is not None else est

    results = _run_each(file, flags, config, run)
    _print_results(results, as_json, lambda console, est: print_estimate(console, est, gib=gib))
    raise typer.Exit(EXIT_OK if all(r.fits is not False for r in results) else EXIT_INFEASIBLE)


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _ints(value: str | None) -> list[int | str] | None:
    """``0,3`` -> [0, 3]; what is not an integer stays a string for the scenario to reject by name."""
    items = _split(value)
    return None if items is None else [int(v) if v.lstrip("-").isdigit() else v for v in items]


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
    file: o.File = None,
    model: o.Model = None,
    method: o.Method = None,
    optimizer: o.Optimizer = None,
    precision: o.Precision = None,
    seq_len: o.SeqLen = None,
    global_batch: o.GlobalBatch = None,
    tokens: o.Tokens = None,
    lora_rank: o.LoraRank = None,
    algorithm: o.Algorithm = None,
    num_generations: o.Generations = None,
    completion_len: o.CompletionLen = None,
    reference: o.Reference = None,
    generation_gpus: o.GenerationGpus = None,
    generation_memory_fraction: o.GenerationFraction = None,
    generation_tp: o.GenerationTp = None,
    generation_sleep: o.GenerationSleep = None,
    rollout_offload: o.RolloutOffload = None,
    objective: o.Objective = None,
    gpu: o.Gpu = None,
    gpu_types: o.GpuTypes = None,
    max_gpus: o.MaxGpus = None,
    micro_batch: o.SearchMicroBatch = None,
    offload: o.SearchOffload = None,
    zero: o.SearchZero = None,
    checkpointing: o.SearchCheckpointing = None,
    attention: o.SearchAttention = None,
    tp: o.SearchTp = None,
    pp: o.SearchPp = None,
    stacks: o.Stacks = None,
    budget: o.Budget = None,
    deadline: o.Deadline = None,
    fleet: o.Fleet = None,
    allow_relax: o.AllowRelax = None,
    top: o.Top = None,
    time_limit: o.TimeLimit = None,
    profile: o.Profile = None,
    pareto: o.Pareto = False,
    config: Annotated[list[Path] | None, typer.Option("--config", metavar="FILE", help=CONFIG_HELP)] = None,
    as_json: o.Json = False,
    gib: o.Gib = False,
) -> None:
    """Ranked feasible plans: GPU type and count, parallelism, ZeRO, offload, micro-batch,
    checkpointing, method; with memory, time and cost. Explains why when nothing fits."""
    from planner.search.answer import plan_raw

    flags = {k: v for k, v in {
        "model": model, "method": method, "optimizer": optimizer, "precision": precision, "seq_len": seq_len,
        "global_batch": global_batch, "tokens": tokens, "lora_rank": lora_rank, "algorithm": algorithm, "reference": reference,
        "num_generations": num_generations, "completion_len": completion_len,
        "generation_gpus": generation_gpus, "generation_memory_fraction": generation_memory_fraction,
        "generation_tp": generation_tp, "generation_sleep": generation_sleep, "rollout_offload": rollout_offload,
        "objective": objective, "gpu": gpu,
        "gpu_types": _split(gpu_types), "max_gpus": max_gpus, "budget_usd": budget, "deadline_hours": deadline,
        "fleet": _fleet(fleet), "allow_relax": _split(allow_relax), "top": top, "time_limit_s": time_limit,
        "profile": profile,
    }.items() if v is not None}
    search = {k: v for k, v in {
        "micro_batch": _split(micro_batch), "offload": _split(offload), "zero": _ints(zero), "tp": _split(tp), "pp": _split(pp),
        "checkpointing": _split(checkpointing), "attention": _split(attention), "stacks": _split(stacks),
    }.items() if v is not None}

    def run(merged, source, base_dir, found):
        return _plan_with_configs(plan_raw(merged, source=source, base_dir=base_dir, pareto=pareto), found)

    results = _run_each(file, flags, config, run, for_plan=True, extra={"search": search} if search else None)
    _print_results(results, as_json, lambda console, r: print_plans(console, r, gib=gib))
    raise typer.Exit(EXIT_OK if all(r.plans for r in results) else EXIT_INFEASIBLE)


def _plan_with_configs(result, found):
    """A plan result with what ``--config`` read and warned about (also said on stderr)."""
    if found is None:
        return result
    for note in found.notes:
        typer.echo(f"note: {note}", err=True)
    for warning in found.warnings:
        typer.echo(f"warning: {warning}", err=True)
    return result.model_copy(update={"read_from_configs": found.read(),
                                     "config_warnings": list(found.warnings)})


def _print_results(results: list, as_json: bool, show) -> None:
    """One result as a JSON object, several as a list; or each as tables."""
    if as_json:
        typer.echo(to_json(results[0] if len(results) == 1 else results))
        return
    console = _console()
    for result in results:
        show(console, result)


@app.command("gpus")
def list_gpus(as_json: o.Json = False, gib: o.Gib = False) -> None:
    """The GPU catalog: memory (nvidia-smi's MiB figure, in GB or GiB), peak dense TFLOPS, prices."""
    cat = catalog.gpus()
    if as_json:
        typer.echo(json.dumps([g.model_dump(mode="json") for g in cat], indent=2))
        return
    table = Table(title=f"{len(cat)} GPU types", header_style="bold")
    for col in ("id", "memory", "BF16 TFLOPS", "FA2", "node", "NVLink", "$/h on-demand"):
        table.add_column(col, justify="left" if col == "id" else "right", no_wrap=col == "id")
    for g in cat:
        table.add_row(
            g.id,
            f"{format_bytes(mib_to_bytes(g.memory_mib), gib=gib)}{'*' if g.memory_mib_kind == 'nominal' else ''}",
            "—" if g.bf16_dense_tflops is None else f"{g.bf16_dense_tflops:g}",
            "yes" if g.supports_flash_attn2 else "no",
            str(g.gpus_per_node),
            str(g.nvlink_domain),
            "—" if g.price_on_demand_usd_per_hour is None else f"{g.price_on_demand_usd_per_hour:.2f}",
        )
    table.caption = "* nominal capacity (no published nvidia-smi figure)"
    _console().print(table)


@app.command("models")
def list_models(as_json: o.Json = False) -> None:
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
    files: Annotated[list[Path], typer.Argument(help="Measured runs, CSV (columns of data/measured_calibration.csv, "
                                                    "of data/measured_throughput.csv with --kind throughput, or of "
                                                    "data/verdicts.csv with --verdicts); several memory files are "
                                                    "scored together.", metavar="FILE...")],
    kind: Annotated[str, typer.Option("--kind", help="memory (peak bytes) | throughput (tokens/s per GPU)")] = "memory",
    profile: Annotated[str, typer.Option(help="seed | detailed (memory)")] = "detailed",
    loso: Annotated[bool, typer.Option("--loso", help="leave one source out: predict each source with the "
                                                      "parameters fitted to measured rows refitted without it")] = False,
    verdicts: Annotated[bool, typer.Option("--verdicts", help="FILE holds runs known to have run or to have run "
                                                              "out of memory: score the fit verdicts")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    record_before: Annotated[bool, typer.Option(
        "--record-before", help="write the planner's prediction now into each row of FILE that has "
                                "none (predicted_before_gb / predicted_before_tokens_per_s, with --verdicts "
                                "judged_before, and the planner's commit), never overwriting one; run it when rows are added, "
                                "before any rule changes for them")] = False,
) -> None:
    """Predict every measured run of a CSV and score the model: memory per row and method (per
    source with --loso), throughput per source against the 6N-at-40 %-of-peak baseline, or fit
    verdicts."""
    problems = []
    if record_before and (loso or profile != "detailed"):
        problems.append("--record-before: the detailed profile, without --loso")
    if kind not in ("memory", "throughput"):
        problems.append(f"--kind: {kind!r} is not memory or throughput")
    if profile not in ("seed", "detailed"):
        problems.append(f"profile: {profile!r} is not seed or detailed")
    if loso and (verdicts or profile != "detailed"):
        problems.append("--loso: memory or throughput, with the detailed profile")
    if len(files) > 1 and (verdicts or (kind == "memory" and not loso)):
        problems.append("FILE: several files only for throughput, or with --loso on memory")
    if problems:
        _fail(problems)
    if record_before:
        from planner.validate.record import record_before as record

        done = []
        for path in files:
            try:
                done.append(record(path, "verdicts" if verdicts else kind))
            except (OSError, KeyError, ValueError) as exc:
                _fail([f"{path}: {exc}"])
        for d in done:
            typer.echo(f"{d['file']}: {d['recorded']} recorded by {d['by']}, {d['already_recorded']} kept, "
                       f"{d['not_modelled']} not modelled", err=True)
    run, render_tables = _validator(kind, profile, loso, verdicts)
    try:
        result = run(list(files) if len(files) > 1 or (loso and kind == "memory") else files[0])
    except InputError as exc:
        _fail(exc.problems)
        return
    if as_json:
        typer.echo(json.dumps(result, indent=2, ensure_ascii=False))
        return
    console = _console()
    for table in render_tables(result):
        console.print(table)


def _validator(kind: str, profile: str, loso: bool, verdicts: bool):
    """(run(file or files) -> result, render_tables(result) -> tables) for ``validate``."""
    if verdicts:
        from planner.validate import verdicts as module

        return module.validate_verdicts, module.render_tables
    if kind == "throughput":
        from planner.validate import throughput as module

        return (lambda path: module.validate_file(path, loso=loso)), module.render_tables
    if loso:
        from planner.validate import memory_loso as module

        return module.validate_loso, module.render_tables
    from planner.validate import score as module

    return (lambda path: module.validate_file(path, profile)), module.render_tables


_register_commands(app)
_register_serve(app)


#: Exit code for a bug in planner itself (not the user's input): report it.
EXIT_INTERNAL = 3


def main() -> None:
    """Entry point: no traceback reaches the user unless PLANNER_DEBUG is set."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("PLANNER_DEBUG"):
            raise
        print(f"planner: internal error: {type(exc).__name__}: {exc} "
              "(set PLANNER_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(EXIT_INTERNAL)
