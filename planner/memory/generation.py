"""GRPO's generation engine (vLLM) as memory sees it: what the engine holds, and what it leaves the
training step on the GPUs it shares.

vLLM takes ``gpu_memory_utilization`` of each GPU it runs on when it starts and keeps it: its
16-bit weights (divided by its tensor parallelism), the activations of its profiling pass, and a
KV cache filling the rest. It refuses to start when that share cannot hold the weights and the KV
cache of one sequence of ``max_model_len`` tokens. Colocated with training (TRL's
``vllm_mode="colocate"``, without sleep mode) the share stays taken through the training step, so
the step must fit in the rest of the card; an engine on GPUs of its own (TRL's server mode) leaves
the training GPUs whole.

Not counted: vLLM's CUDA graphs and sampler buffers (inside its share), and the transient copy of
the policy's weights gathered to load them into the engine each step (freed before training).
"""

from __future__ import annotations

from planner.core.arch import total_params
from planner.core.entries import ModelSpec
from planner.core.specs import Layout, Recipe, Workload

#: Bytes per weight and per cached key or value element in the engine: vLLM serves the policy in
#: its 16-bit dtype (TRL loads the policy's weights, LoRA merged, each step).
ENGINE_BYTES_PER_ELEMENT = 2


def kv_bytes_per_token(model: ModelSpec) -> float:
    """The KV cache of one token: a key and a value per layer, ``kv_heads · head_dim`` wide, 16-bit."""
    heads = model.heads or max(1, model.hidden // 128)
    head_dim = model.head_dim_eff or model.hidden // heads
    kv_heads = model.kv_heads_eff or heads
    return 2.0 * model.layers * kv_heads * head_dim * ENGINE_BYTES_PER_ELEMENT


def engine_weight_bytes(model: ModelSpec) -> float:
    """The engine's weights, all of them (every expert of a MoE model), 16-bit."""
    return float(total_params(model)) * ENGINE_BYTES_PER_ELEMENT


def engine_share(wl: Workload, lay: Layout, recipe: Recipe) -> float:
    """The share of each training GPU a colocated engine takes from the step: 0 without generation,
    with the engine on GPUs of its own, or where the phases take turns (the engine asleep while
    the step trains, the trainer's states in host memory while it generates). An engine asleep
    beside states that stay keeps its share counted: the states must fit beside it while it
    generates, which the step's own peak bounds from above."""
    if not wl.generates or lay.generation_gpus or (recipe.generation_sleep and recipe.rollout_offload):
        return 0.0
    return lay.engine_memory_fraction


def engine_budget_bytes(capacity_bytes: int, lay: Layout) -> float:
    """What one engine may hold over its ``generation_tp`` GPUs."""
    return lay.engine_memory_fraction * capacity_bytes * lay.generation_tp


def engine_need_bytes(model: ModelSpec, wl: Workload) -> float:
    """The least an engine needs to start: its weights and one full sequence's KV cache."""
    return engine_weight_bytes(model) + kv_bytes_per_token(model) * wl.seq_len


def engine_kv_tokens(model: ModelSpec, lay: Layout, capacity_bytes: int) -> float:
    """Tokens the engine's KV cache holds once its weights are in (0 when they do not fit)."""
    free = engine_budget_bytes(capacity_bytes, lay) - engine_weight_bytes(model)
    return max(0.0, free / kv_bytes_per_token(model))


def engine_fits(model: ModelSpec, wl: Workload, lay: Layout, capacity_bytes: int) -> bool:
    """The engine starts on this card: its share holds its weights and one sequence's KV cache."""
    return not wl.generates or engine_need_bytes(model, wl) <= engine_budget_bytes(capacity_bytes, lay)


def generation_notes(model: ModelSpec, wl: Workload, lay: Layout, recipe: Recipe,
                     capacity_bytes: int | None) -> list[str]:
    """What a GRPO estimate assumes of its engine, in words (none without generation)."""
    if not wl.generates:
        return []
    where = _placement_words(lay, recipe)
    ref = ("a reference model (beta > 0), run forward on every completion" if wl.reference == "model"
           else "no reference model (beta 0)")
    notes = [(f"GRPO: {wl.num_generations} completions of up to {wl.completion_len} tokens per prompt of "
              f"{wl.prompt_len}; micro-batch counts completions; {ref}; vLLM engine (tp {lay.generation_tp}) {where}")]
    if capacity_bytes is None:
        return notes
    if not engine_fits(model, wl, lay, capacity_bytes):
        notes.append(f"GRPO: the engine's {engine_budget_bytes(capacity_bytes, lay) / 1e9:.1f} GB cannot hold its "
                     f"16-bit weights ({engine_weight_bytes(model) / 1e9:.1f} GB) and one {wl.seq_len}-token "
                     f"sequence's KV cache ({kv_bytes_per_token(model) * wl.seq_len / 1e9:.2f} GB): vLLM will not "
                     "start; raise layout.generation_memory_fraction or generation_tp")
    else:
        tokens = engine_kv_tokens(model, lay, capacity_bytes)
        notes.append(f"GRPO: the engine's KV cache holds {tokens:,.0f} tokens ({tokens / wl.seq_len:,.0f} full sequences)")
    return notes


def _placement_words(lay: Layout, recipe: Recipe) -> str:
    """Where the engine runs and what it holds through the step, in words."""
    if lay.generation_gpus:
        return (f"on {lay.generation_gpus} GPUs of its own at {lay.engine_memory_fraction:.0%} (TRL server mode); "
                "the training GPUs carry no engine")
    share = f"colocated on the training GPUs at {lay.engine_memory_fraction:.0%} of each, "
    if recipe.generation_sleep and recipe.rollout_offload:
        return share + ("asleep while the step trains and the trainer's states in host memory while it "
                        "generates: each phase has the card")
    if recipe.generation_sleep:
        return share + ("asleep while the step trains, its share still counted: the trainer's states stay "
                        "beside it while it generates")
    return share + "held through the step (TRL vllm_mode colocate, no sleep mode)"
