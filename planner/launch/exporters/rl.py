"""verl's command line for a GRPO plan: ``python3 -m verl.trainer.main_ppo`` with Hydra overrides.

The keys are those of verl's trainer config at b178a3cd (2026-01-29; ``verl/trainer/config``:
``ppo_trainer.yaml`` composing the actor, rollout, reference, model and data sub-configs). verl
counts its batches in prompts (``data.train_batch_size``, ``actor.ppo_mini_batch_size``; each
prompt's ``rollout.n`` completions follow it) and its micro-batches in completions per GPU
(``ppo_micro_batch_size_per_gpu``), so a plan's global batch of completions is written as prompts
and its micro-batch as it is. One optimizer step per generation batch, as the plan times it.
"""

from __future__ import annotations

import shlex

from planner.launch.exporters.common import Bundle, Ctx
from planner.launch.exporters.recipes import lora_target_modules

FMT = "verl"


def verl_unsupported(ctx: Ctx) -> str | None:
    """Why verl's FSDP trainer cannot run the plan as planned, or None."""
    wl, lay = ctx.wl, ctx.lay
    if wl.algorithm != "grpo":
        return "verl's trainer is exported for GRPO plans only (its PPO trainer with a rollout engine)"
    if lay.generation_gpus:
        return ("the plan serves its engine on GPUs of its own; verl's hybrid engine is colocated on the "
                "training GPUs")
    if wl.method == "qlora":
        return "verl trains no 4-bit base (QLoRA)"
    if lay.tp > 1 or lay.pp > 1 or lay.cp > 1:
        return f"verl's FSDP workers have no tensor or pipeline parallelism (tp={lay.tp} pp={lay.pp} cp={lay.cp})"
    if lay.offload != "none":
        return "verl's FSDP actor offloads nothing during the step (only between phases: recipe.rollout_offload)"
    return None


def verl_overrides(ctx: Ctx, out: Bundle) -> list[str] | None:
    """The plan's ``key=value`` overrides of verl's trainer config, or None (reason in skipped)."""
    reason = verl_unsupported(ctx)
    if reason is not None:
        out.skipped[FMT] = reason
        return None
    wl, lay, recipe = ctx.wl, ctx.lay, ctx.rs.recipe
    prompts = ctx.global_batch // wl.num_generations
    model = ctx.model.hf_repo or "<model>"
    if not ctx.model.hf_repo:
        out.need(FMT, "actor_rollout_ref.model.path in verl_run.sh (the plan's model has no Hugging Face "
                      "repository in the catalog)")
    args = [
        "algorithm.adv_estimator=grpo",
        f"data.train_batch_size={prompts}",
        f"data.max_prompt_length={wl.prompt_len}",
        f"data.max_response_length={wl.completion_len}",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={lay.checkpointing != 'none'}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={wl.micro_batch}",
        f"actor_rollout_ref.actor.use_kl_loss={wl.reference == 'model'}",
        f"actor_rollout_ref.actor.fsdp_config.param_offload={recipe.rollout_offload}",
        f"actor_rollout_ref.actor.fsdp_config.optimizer_offload={recipe.rollout_offload}",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={wl.num_generations}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={lay.engine_memory_fraction}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={lay.generation_tp}",
        f"actor_rollout_ref.rollout.free_cache_engine={recipe.generation_sleep}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={wl.micro_batch}",
    ]
    if wl.reference == "model":
        args.append(f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={wl.micro_batch}")
        if not ctx.rs.recipe.reference_offload and wl.method == "full":
            out.note(FMT, "verl keeps the reference model's parameters on the CPU (FSDP CPU offload): less GPU "
                          "memory than the plan's reference copy")
    if ctx.lora:
        modules = lora_target_modules(ctx, out, FMT)
        listed = modules if isinstance(modules, str) else "[" + ",".join(modules) + "]"
        args += [f"actor_rollout_ref.model.lora_rank={wl.lora_rank}",
                 f"actor_rollout_ref.model.target_modules={listed}",
                 "actor_rollout_ref.rollout.load_format=safetensors"]  # verl requires it with LoRA
        if wl.lora_alpha is not None:
            args.append(f"actor_rollout_ref.model.lora_alpha={wl.lora_alpha}")
        else:
            out.need(FMT, "actor_rollout_ref.model.lora_alpha in verl_run.sh (the plan did not set it)")
    args += [f"trainer.n_gpus_per_node={ctx.per_node or lay.gpus}", f"trainer.nnodes={ctx.nodes}"]
    if lay.gpus > 1 and lay.zero in (1, 2):
        out.note(FMT, f"verl shards the actor fully (FSDP FULL_SHARD): less memory than the plan's ZeRO-{lay.zero}")
    if wl.precision != "mixed":
        out.note(FMT, "verl trains in BF16 mixed precision with FP32 master weights (the plan's 'mixed'), "
                      f"not {wl.precision}")
    out.need(FMT, "data.train_files and data.val_files (parquet with verl's prompt column), the reward "
                  "function, and the trainer's logger, project and experiment names in verl_run.sh")
    return args


def verl_script(args: list[str]) -> str:
    """``verl_run.sh``: verl's trainer with the plan's overrides, one per line."""
    lines = ["#!/usr/bin/env bash", "set -euo pipefail", "python3 -m verl.trainer.main_ppo \\"]
    lines += [f"    {shlex.quote(a)} \\" for a in args[:-1]] + [f"    {shlex.quote(args[-1])}", ""]
    return "\n".join(lines)
