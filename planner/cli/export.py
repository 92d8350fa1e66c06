"""``planner export``: the command (parse, call :mod:`planner.launch.exporters`, render)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from planner.core.errors import InputError
from planner.launch.exporters import BACKENDS, FORMATS


def export(
    source: Annotated[Path, typer.Argument(help="`planner plan --json` output, or a scenario YAML.")],
    rank: Annotated[int, typer.Option(help="Which plan (1 = the best).")] = 1,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write the files to.")] = Path("launch"),
    formats: Annotated[str | None, typer.Option(
        "--format", help=f"Comma-separated subset of: {', '.join(FORMATS)} (default all).")] = None,
    backend: Annotated[str | None, typer.Option(
        "--backend", metavar="|".join(BACKENDS),
        help="Sharding back-end of the DeepSpeed/accelerate/HF files: one per bundle (default: the "
             "plan's stack's, else deepspeed; ZeRO-1 and optimizer-only offload are DeepSpeed's).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the files as JSON; write nothing.")] = False,
) -> None:
    """Write the configs that run a plan: DeepSpeed, accelerate, torchrun, HF Trainer + PEFT +
    bitsandbytes (TRL for DPO and GRPO), torchtune, Megatron-LM, SkyPilot, verl (GRPO); and PLAN.md with
    what you must fill in."""
    from planner.cli.app import fail as _fail
    from planner.launch.exporters import export_plan, write_bundle

    chosen = FORMATS if formats is None else tuple(f.strip() for f in formats.split(",") if f.strip())
    try:
        if rank < 1:
            raise InputError([f"rank: must be ≥ 1 (got {rank})"])
        if not as_json:
            _check_out_dir(out)  # before any work: a target that cannot be written is bad input
        _, bundle = export_plan(source, rank=rank, formats=chosen, backend=backend)
    except InputError as exc:
        _fail(exc.problems)
        return
    if as_json:
        typer.echo(json.dumps({"files": bundle.files, "fill_in": bundle.fill_in, "notes": bundle.notes,
                               "skipped": bundle.skipped}, indent=2, ensure_ascii=False))
        return
    try:
        written = write_bundle(bundle, out)
    except OSError as exc:
        _fail([f"--out: cannot write to {out} ({exc.strerror or exc})"])
        return
    for path in written:
        typer.echo(f"wrote {path}")
    for fmt, why in bundle.skipped.items():
        typer.echo(f"not written: {fmt}: {why}")
    typer.echo(f"fill in: see {out / 'PLAN.md'} ({len(bundle.fill_in)} items beyond the usual)")


def _check_out_dir(out: Path) -> None:
    """``--out`` is a folder that exists and takes files, or one that can be made (the result
    files' writability check, for the bundle's PLAN.md)."""
    from planner.report.files import check_writable

    if out.exists() and not out.is_dir():
        raise InputError([f"--out: {out} is a file, not a folder"])
    why = check_writable(out / "PLAN.md")
    if why:
        raise InputError([f"--out: {why}"])
