"""``planner export``: a plan (from ``planner plan --json``, or a scenario and a rank) -> files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.core.errors import InputError
from planner.core.outputs import atomic_write_text
from planner.core.textfiles import parse_yaml, read_text_bounded
from planner.launch.exporters.common import BACKENDS, FORMATS, Bundle, Ctx
from planner.launch.exporters.frameworks import (
    accelerate_config,
    deepspeed_config,
    dump_json,
    dump_yaml,
    skypilot_task,
    torchrun_command,
)
from planner.launch.exporters.recipes import hf_files, megatron_args, torchtune_override
from planner.launch.exporters.rl import verl_overrides, verl_script
from planner.scenario.files import read_scenario_file
from planner.scenario.resolve import ResolvedScenario, resolve

#: Plan fields that pin a scenario (what ``plans.plan_scenario`` sets).
_WORKLOAD = ("method", "precision", "seq_len", "micro_batch", "grad_accum", "optimizer")
_LAYOUT = ("gpu", "gpus", "dp", "tp", "pp", "cp", "sp", "zero", "offload", "checkpointing", "attention")


def _read(path: Path) -> Any:
    """A plan output (JSON) or a scenario (YAML), read within the scenario loader's limits (size,
    UTF-8, nesting depth, value count): JSON is read as the YAML it also is."""
    return parse_yaml(read_text_bounded(path), str(path))


def _is_plan_output(data: Any) -> bool:
    items = data if isinstance(data, list) else [data]
    return bool(items) and all(isinstance(d, dict) and ("plans" in d or "memory" in d) for d in items)


def load_plan(path: str | Path, rank: int = 1) -> tuple[dict[str, Any], Path]:
    """The pinned scenario of plan ``rank`` in a file: ``plan --json`` output or a scenario file."""
    pinned, base_dir, _ = load_plan_and_stack(path, rank)
    return pinned, base_dir


def load_plan_and_stack(path: str | Path, rank: int = 1) -> tuple[dict[str, Any], Path, str | None]:
    """:func:`load_plan`, and the stack the plan names (None where it names none)."""
    path = Path(path)
    data = _read(path)
    if _is_plan_output(data):
        return _pinned_from_output(data, rank, path), path.parent, _stack_of(data, rank)
    from planner.search.answer import plan_raw

    raws = read_scenario_file(path)
    if len(raws) != 1:
        raise InputError([f"{path}: holds {len(raws)} scenarios; export takes one"])
    result = plan_raw(raws[0], source=str(path), base_dir=path.parent, explain_infeasible=False)
    plans = [p.model_dump(mode="json") for p in result.plans]
    return _pick(plans, rank, path), path.parent, _stack_of({"plans": plans}, rank)


def _stack_of(data: Any, rank: int) -> str | None:
    results = data if isinstance(data, list) else [data]
    plans = results[0].get("plans", [results[0]]) if results and isinstance(results[0], dict) else []
    for p in plans:
        if isinstance(p, dict) and p.get("rank", 1) == rank and isinstance(p.get("stack"), str):
            return p["stack"]
    return None


def _pinned_from_output(data: Any, rank: int, path: Path) -> dict[str, Any]:
    results = data if isinstance(data, list) else [data]
    if len(results) > 1:
        raise InputError([f"{path}: holds the plans of {len(results)} scenarios; export one"])
    plans = results[0]["plans"] if "plans" in results[0] else [results[0]]
    if not isinstance(plans, list) or not all(isinstance(p, dict) for p in plans):
        raise InputError([f"{path}: plans: must be a list of plans (`planner plan --json` output)"])
    return _pick(plans, rank, path)


def _pick(plans: list[dict[str, Any]], rank: int, path: Path) -> dict[str, Any]:
    if not plans:
        raise InputError([f"{path}: no feasible plan to export"])
    chosen = [p for p in plans if p.get("rank", 1) == rank]
    if not chosen:
        raise InputError([f"rank: {rank} is not in {path} (ranks 1–{len(plans)})"])
    plan = chosen[0]
    if plan.get("pinned_scenario"):
        return plan["pinned_scenario"]
    missing = [k for k in (*_WORKLOAD, *_LAYOUT) if k not in plan]
    if missing or not isinstance(plan.get("memory"), dict):
        raise InputError([f"{path}: plan {rank}: {k}: missing" for k in missing or ["memory"]])
    memory = plan["memory"]
    if memory.get("model") in (None, "custom"):
        raise InputError([(f"{path}: plan {rank}: model: the plan names no catalog model; export "
                          "from the scenario file instead (planner export SCENARIO --rank N)")])
    workload = {k: plan[k] for k in _WORKLOAD}
    if plan.get("lora_rank"):
        workload["lora_rank"] = plan["lora_rank"]
    return {"name": memory.get("scenario", "plan"), "profile": memory.get("profile", "seed"),
            "model": memory["model"], "workload": workload,
            "layout": {k: plan[k] for k in _LAYOUT}}


def export_plan(path: str | Path, *, rank: int = 1, formats: tuple[str, ...] = FORMATS,
                backend: str | None = None) -> tuple[ResolvedScenario, Bundle]:
    pinned, base_dir, stack = load_plan_and_stack(path, rank)
    rs = resolve(pinned, source=f"{path} plan {rank}", base_dir=base_dir)
    return rs, export_resolved(rs, formats, backend=backend, stack=stack)


def export_resolved(rs: ResolvedScenario, formats: tuple[str, ...] = FORMATS, *,
                    backend: str | None = None, stack: str | None = None) -> Bundle:
    """Every requested format's files for a pinned plan, and what the user must fill in.

    The DeepSpeed, accelerate and Hugging Face files shard with one back-end, ``backend``
    (``deepspeed`` or ``fsdp``; by default the plan's ``stack``'s, else DeepSpeed)."""
    _check_export_request(rs, formats, backend)
    ctx, out = Ctx(rs, asked_backend=backend, stack=stack), Bundle()
    _add_sharded_files(ctx, out, formats, backend, stack)
    run = torchrun_command(ctx, out, []) if ("torchrun" in formats or "skypilot" in formats) else None
    if run is not None and "torchrun" in formats:
        out.files["launch.sh"] = _launch_script(run, ctx)
    if "torchtune" in formats:
        _add_torchtune_files(ctx, out)
    if "verl" in formats and (rs.workload.algorithm == "grpo" or formats != FORMATS):
        # verl is written for GRPO plans; other plans name it as skipped only where asked for
        verl = verl_overrides(ctx, out)
        if verl is not None:
            out.files["verl_run.sh"] = verl_script(verl)
    if "megatron" in formats:
        margs = megatron_args(ctx, out)
        if margs is not None:
            out.files["megatron_args.txt"] = "\n".join(margs) + "\n"
    if "skypilot" in formats:
        task = skypilot_task(ctx, out, run)
        if task is not None:
            out.files["sky_task.yaml"] = dump_yaml(task)
    out.files["PLAN.md"] = out.readme(f"{rs.name}: {rs.model.id} {rs.workload.method} on "
                                      f"{rs.layout.gpus}× {rs.gpu.name}", decided(ctx))
    return out


def _check_export_request(rs: ResolvedScenario, formats: tuple[str, ...], backend: str | None) -> None:
    """Known formats and back-end, and a plan that names its GPU; InputError if not."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise InputError([f"format: {f!r} is not one of {', '.join(FORMATS)}" for f in unknown])
    if backend is not None and backend not in BACKENDS:
        raise InputError([f"backend: {backend!r} is not one of {', '.join(BACKENDS)}"])
    if rs.gpu is None:
        raise InputError(["layout.gpu: a plan to export names its GPU"])


def _add_sharded_files(ctx: Ctx, out: Bundle, formats: tuple[str, ...], backend: str | None,
                       stack: str | None) -> None:
    """ds_config.json, accelerate_config.yaml and the Hugging Face files: one back-end for all."""
    if backend is not None and ctx.backend not in (None, backend):
        out.note("sharding", f"{backend} was asked, but FSDP has no "
                 + ("optimizer-only sharding (ZeRO-1)" if ctx.lay.zero == 1 else "optimizer-only offload")
                 + ": the bundle shards with DeepSpeed")
    uses_ds = ctx.backend == "deepspeed"
    want_ds = "deepspeed" in formats and ctx.backend != "fsdp"
    if "deepspeed" in formats and ctx.backend == "fsdp":
        out.skipped["deepspeed"] = (f"the bundle shards with FSDP (ZeRO-{ctx.lay.zero} as FSDP"
                                    + (f", the plan's stack {stack}" if stack else "")
                                    + "); one bundle points at one back-end: export with "
                                    "--backend deepspeed for DeepSpeed files")
    ds = deepspeed_config(ctx, out) if (want_ds or (uses_ds and ("hf" in formats or "accelerate" in formats))) \
        else None
    ds_name = "ds_config.json" if ds is not None else None
    if ds is not None and (want_ds or uses_ds):
        out.files["ds_config.json"] = dump_json(ds)
    if "accelerate" in formats:
        acc = accelerate_config(ctx, out, ds_name if uses_ds else None)
        if acc is not None:
            out.files["accelerate_config.yaml"] = dump_yaml(acc)
    if "hf" in formats:
        # The Trainer reads a DeepSpeed config only for ZeRO; without it none is named.
        for name, body in hf_files(ctx, out, ds_name if uses_ds else None).items():
            out.files[name] = dump_json(body)


def _add_torchtune_files(ctx: Ctx, out: Bundle) -> None:
    """torchtune_override.yaml (the overrides, the command in its header) and torchtune_run.sh."""
    tt = torchtune_override(ctx, out)
    if tt is None:
        return
    cfg, command = tt
    out.files["torchtune_override.yaml"] = (
        "# The plan's settings for torchtune. `tune run` takes one --config (a second replaces\n"
        "# the first), so they go on the command line as key=value overrides of your base\n"
        "# config: run torchtune_run.sh, which is:\n"
        + "".join(f"#   {line}\n" for line in command.splitlines()) + dump_yaml(cfg))
    out.files["torchtune_run.sh"] = _torchtune_script(command, ctx)


def _torchtune_script(command: str, ctx: Ctx) -> str:
    lines = ["#!/usr/bin/env bash", "set -euo pipefail",
             ': "${BASE_CONFIG:?set BASE_CONFIG to your model\'s torchtune config (tune ls)}"']
    return "\n".join([*lines, command, ""])


def decided(ctx: Ctx) -> list[str]:
    wl, lay = ctx.wl, ctx.lay
    sharding = {None: "none (no ZeRO)", "deepspeed": "DeepSpeed ZeRO (ds_config.json)",
                "fsdp": "FSDP (accelerate_config.yaml)"}[ctx.backend]
    items = [
        f"GPU {ctx.gpu.name} × {lay.gpus} on {ctx.nodes} node(s)",
        f"dp {lay.dp}, tp {lay.tp}, pp {lay.pp}, cp {lay.cp}, sequence parallel {'on' if lay.sp else 'off'}",
        f"ZeRO stage {lay.zero}, offload {lay.offload}; sharding back-end {sharding}"
        + (f", stack {ctx.stack}" if ctx.stack else ""),
        (f"micro-batch {wl.micro_batch}, gradient accumulation {ctx.grad_accum}, "
        f"global batch {ctx.global_batch} sequences of {wl.seq_len} tokens"),
        (f"method {wl.method}, optimizer {wl.optimizer}, precision {wl.precision} "
        f"(16-bit compute: {ctx.half or 'none, FP32'})"),
        f"activation checkpointing {lay.checkpointing}, attention {lay.attention} ({ctx.hf_attention})",
    ]
    if ctx.lora:
        items.append(f"LoRA rank {wl.lora_rank}, alpha {wl.lora_alpha if wl.lora_alpha else 'not set'}, "
                     f"targets {', '.join(wl.lora_targets)}")
    if wl.method == "qlora":
        items.append(f"{wl.quant_bits}-bit base, double quantisation {'on' if wl.double_quant else 'off'}")
    return items


def _launch_script(run: str, ctx: Ctx) -> str:
    lines = ["#!/usr/bin/env bash",
             f"# {ctx.lay.gpus}× {ctx.gpu.name}: {ctx.nodes} node(s) × {ctx.per_node} GPU(s)",
             "set -euo pipefail",
             ': "${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your training script}"']
    if ctx.nodes > 1:
        lines += [': "${NODE_RANK:?set NODE_RANK (0 on the first node)}"',
                  ': "${MASTER_ADDR:?set MASTER_ADDR to the first node}"']
    return "\n".join([*lines, run, ""])


def write_bundle(bundle: Bundle, out_dir: Path) -> list[Path]:
    """Every file of the bundle (all made before the first is written), each atomically: a crash
    or Ctrl-C leaves each file whole, old or new, never half-written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in bundle.files.items():
        target = atomic_write_text(out_dir / name, text)
        if name.endswith(".sh"):  # launch.sh, torchtune_run.sh
            target.chmod(target.stat().st_mode | 0o111)
        written.append(target)
    return written
