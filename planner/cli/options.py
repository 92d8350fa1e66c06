"""The options people type, once: metavar, allowed values and default in every ``--help``.

Values stay strings (``1e9`` is a count; ``--zero 3``): the scenario validates them, so a bad
value is one line naming the field, as in a file. Allowed values come from the same tuples the
formulas index, and defaults from the scenario schema, so help never drifts from behaviour.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.core.specs import Layout, Scenario, Workload
from planner.core.values import DEFAULT_MAX_GPUS
from planner.memory.breakdown import ATTENTION, CHECKPOINTING, METHODS, OFFLOADS, OPTIMIZERS, PRECISIONS
from planner.memory.profiles import PROFILES

OBJECTIVES = ("gpus", "hourly", "cost", "time")
_WL, _LAY, _SC = Workload(), Layout(), Scenario.model_construct()


def _help(text: str, values: tuple | None = None, default: object = None) -> str:
    parts = [text]
    if values:
        parts.append("One of: " + " | ".join(str(v) for v in values) + ".")
    if default is not None:
        parts.append(f"Default: {default}.")
    return " ".join(parts)


def opt(*decls: str, metavar: str, help: str, values: tuple | None = None, default: object = None):
    return typer.Option(*decls, metavar=metavar, help=_help(help, values, default))


def many(*decls: str, metavar: str, help: str, values: tuple | None = None):
    """A comma-separated list restricting the search (``--micro-batch 1,2,4``)."""
    return typer.Option(*decls, metavar=f"{metavar}[,{metavar}…]",
                        help=_help(help + " Comma-separated; the search tries only these.", values,
                                   "every value the scenario allows"))


S = Optional[str]  # noqa: UP045 - the alias typer reads at run time
# workload
Model = Annotated[S, opt(metavar="NAME|CONFIG.JSON", help="Catalog name, hub-style id, or a local config.json.")]
Method = Annotated[S, opt(metavar="METHOD", help="Training method.", values=METHODS, default=_WL.method)]
Optimizer = Annotated[S, opt(metavar="OPTIMIZER", help="Optimizer.", values=OPTIMIZERS, default=_WL.optimizer)]
Precision = Annotated[S, opt(metavar="PRECISION", help="Precision recipe (mixed = FP32 master + BF16/FP16 "
                             "compute).", values=PRECISIONS, default=_WL.precision)]
SeqLen = Annotated[S, opt("--seq-len", metavar="TOKENS", help="Sequence length.", default=_WL.seq_len)]
MicroBatch = Annotated[S, opt("--micro-batch", metavar="N", help="Sequences per GPU per micro-batch.",
                              default=_WL.micro_batch)]
GradAccum = Annotated[S, opt("--grad-accum", metavar="N", help="Gradient accumulation steps.",
                             default="global batch / (micro-batch · dp)")]
GlobalBatch = Annotated[S, opt("--global-batch", metavar="SEQUENCES", help="Sequences per optimizer step.")]
Tokens = Annotated[S, opt(metavar="TOKENS", help="Token budget of the job, e.g. 1e9 (needed for time and cost).")]
LoraRank = Annotated[S, opt("--lora-rank", metavar="R", help="LoRA rank.", default=_WL.lora_rank)]
Algorithm = Annotated[S, opt(metavar="ALGORITHM", help="Training objective: supervised, DPO (each example a "
                             "chosen/rejected pair; micro-batch and global batch count pairs), or GRPO "
                             "(completions generated each step by a vLLM engine; batches count completions).",
                             values=("sft", "dpo", "grpo"), default=_WL.algorithm)]
Generations = Annotated[S, opt("--num-generations", metavar="G", help="GRPO: completions per prompt.",
                               default=_WL.num_generations)]
CompletionLen = Annotated[S, opt("--completion-len", metavar="TOKENS", help="GRPO: longest completion "
                                 "(seq-len counts prompt + completion).", default=_WL.completion_len)]
GenerationGpus = Annotated[S, opt("--generation-gpus", metavar="N", help="GRPO: GPUs serving the vLLM engine "
                                  "apart from the training GPUs (0: colocated on them).",
                                  default="0 (estimate); searched, colocated and apart (plan)")]
GenerationFraction = Annotated[S, opt("--generation-memory-fraction", metavar="F", help="GRPO: the engine's "
                                      "share of each GPU it runs on (vLLM gpu_memory_utilization).",
                                      default="0.3 colocated (TRL), 0.9 on GPUs of its own")]
GenerationTp = Annotated[S, opt("--generation-tp", metavar="N", help="GRPO: GPUs per engine (vLLM tensor "
                                "parallelism).", default=_LAY.generation_tp)]
GenerationSleep = Annotated[bool | None, typer.Option(
    "--generation-sleep/--no-generation-sleep", metavar=" ",
    help="GRPO, colocated: the engine sleeps while the step trains (vLLM sleep mode; TRL "
         "vllm_enable_sleep_mode, verl free_cache_engine). Default: the stack's (plan), off (estimate).")]
RolloutOffload = Annotated[bool | None, typer.Option(
    "--rollout-offload/--no-rollout-offload", metavar=" ",
    help="GRPO, colocated: the trainer's states go to host memory while the engine generates (verl "
         "param_offload/optimizer_offload). Default: the stack's (plan), off (estimate).")]
Reference = Annotated[S, opt(metavar="REFERENCE", help="DPO's reference policy: a frozen model, log-probs "
                             "precomputed before training, or none (ORPO, SimPO).",
                             values=("model", "precomputed", "none"), default=_WL.reference)]
# layout
Gpu = Annotated[S, opt(metavar="GPU", help="GPU type (see `planner gpus`), e.g. h100, a100-40gb, 4090.")]
Gpus = Annotated[S, opt(metavar="N", help="GPU count = dp·tp·pp·cp.", default="dp·tp·pp·cp")]
Dp = Annotated[S, opt(metavar="N", help="Data-parallel degree.", default="gpus / (tp·pp·cp)")]
Tp = Annotated[S, opt(metavar="N", help="Tensor-parallel degree.", default=_LAY.tp)]
Pp = Annotated[S, opt(metavar="N", help="Pipeline-parallel degree.", default=_LAY.pp)]
Cp = Annotated[S, opt(metavar="N", help="Context-parallel degree.", default=_LAY.cp)]
Sp = Annotated[bool | None, typer.Option("--sp/--no-sp", metavar=" ", help="Sequence parallelism (with TP). Default: off.")]
Zero = Annotated[int | None, opt(metavar="STAGE", help="ZeRO stage (3 = FSDP full shard).", values=(0, 1, 2, 3),
                        default=_LAY.zero)]
Offload = Annotated[S, opt(metavar="WHAT", help="CPU offload.", values=OFFLOADS, default=_LAY.offload)]
Checkpointing = Annotated[S, opt(metavar="KIND", help="Activation checkpointing.", values=CHECKPOINTING,
                                 default=_LAY.checkpointing)]
Attention = Annotated[S, opt(metavar="KERNEL", help="Attention kernel.", values=ATTENTION, default=_LAY.attention)]
Reserve = Annotated[S, opt(metavar="SHARE", help="Share of capacity kept free (default: the profile's fit rule).",
                           default="seed 0.10; detailed: 4 % fit margin")]
Profile = Annotated[S, opt(metavar="PROFILE", help="Memory model.", values=tuple(PROFILES), default="detailed")]
# search and constraints
Objective = Annotated[S, opt(metavar="OBJECTIVE", help="What to minimise.", values=OBJECTIVES,
                             default="cost with a token budget, else gpus")]
GpuTypes = Annotated[S, opt("--gpu-types", metavar="GPU[,GPU…]", help="Allowed GPU types.",
                            default="every type in the catalog")]
MaxGpus = Annotated[S, opt("--max-gpus", metavar="N", help="Most GPUs a plan may use.", default=DEFAULT_MAX_GPUS)]
Budget = Annotated[S, opt(metavar="USD", help="Most the job may cost.")]
Deadline = Annotated[S, opt(metavar="HOURS", help="Latest the job may finish.")]
Fleet = Annotated[S, opt(metavar="GPU=N[,GPU=N…]", help="GPUs you already have, e.g. rtx-4090=2,h100=8.")]
AllowRelax = Annotated[S, opt("--allow-relax", metavar="WHAT[,WHAT…]", help="What the search may relax, in "
                              "the documents' order.", values=("method", "seq_len"), default="nothing")]
Top = Annotated[int | None, opt(metavar="K", help="How many plans.", default=10)]
TimeLimit = Annotated[float | None, opt("--time-limit", metavar="SECONDS", help="Search time limit.",
                                           default=30)]
SearchMicroBatch = Annotated[S, many("--micro-batch", metavar="N", help="Micro-batch sizes.")]
SearchOffload = Annotated[S, many("--offload", metavar="WHAT", help="CPU offload choices.", values=OFFLOADS)]
SearchZero = Annotated[S, many("--zero", metavar="STAGE", help="ZeRO stages.", values=(0, 1, 2, 3))]
SearchCheckpointing = Annotated[S, many("--checkpointing", metavar="KIND", help="Checkpointing kinds.",
                                        values=CHECKPOINTING)]
SearchAttention = Annotated[S, many("--attention", metavar="KERNEL", help="Attention kernels.", values=ATTENTION)]
SearchTp = Annotated[S, many("--tp", metavar="N", help="Tensor-parallel degrees.")]
SearchPp = Annotated[S, many("--pp", metavar="N", help="Pipeline-parallel degrees.")]
Stack = Annotated[S, opt("--stack", metavar="STACK", help="Estimate as this training stack runs the step "
                         "(catalogs/stacks.yaml, `planner stacks`): its recipe where the scenario's "
                         "recipe: leaves a key unset.")]
Stacks = Annotated[S, opt("--stacks", metavar="STACK[,STACK…]", help="Training stacks a plan may use, in order "
                          "of preference (see catalogs/stacks.yaml).", default="every stack")]
# files and output
File = Annotated[Path | None, typer.Argument(metavar="SCENARIO.yaml",
                                                help="Scenario file (one scenario, a list, or scenarios: + defaults:).")]
Json = Annotated[bool, typer.Option("--json", metavar=" ", help="Print JSON (bytes, seconds, USD) instead of tables.")]
Gib = Annotated[bool, typer.Option("--gib", metavar=" ", help="Memory in GiB (2^30 bytes, as nvidia-smi counts) instead of "
                                   "GB (10^9).")]
Pareto = Annotated[bool, typer.Option("--pareto", metavar=" ", help="The time-versus-cost front instead of a ranking.")]


def _print_version(value: bool) -> None:
    if value:
        from planner import __version__

        typer.echo(f"planner {__version__}")
        raise typer.Exit(0)


Version = Annotated[bool, typer.Option("--version", metavar=" ", is_eager=True, callback=_print_version,
                                       help="Print the version and exit.")]
