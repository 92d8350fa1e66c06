"""GRPO's generation engine (vLLM) as memory sees it: what the engine holds, and what it leaves the
training step on the GPUs it shares.

vLLM takes ``gpu_memory_utilization`` of each GPU it runs on when it starts and keeps it: its
16-bit weights (divided by its tensor parallelism), the activations of its profiling pass, and a
KV cache filling the rest. It refuses to start when that share cannot hold the weights and the KV
cache of one sequence of ``max_model_len`` tokens. Colocated with training (TRL's
``vllm_mode="colocate"``, without sleep mode) the share stays taken through the training step, so
the step must fit in the rest of the card; an engine on GPUs of its own (TRL's server mode) leaves
the training GPUs whole.

Where the engine sleeps while the step trains (vLLM sleep mode: TRL ``vllm_enable_sleep_mode``,
verl's ``free_cache_engine``) a step has the card less what a sleeping engine keeps, and the card
holds two peaks in turn: the step's, and while generating the trainer's states at rest (weights,
optimizer states, a reference copy: no gradients, no activations) beside the engine's whole share.
That second peak is the phase :data:`GENERATION_PHASE`, held to the card less the engine's share;
the step's phases are renamed with :data:`ASLEEP_SUFFIX` and held to the card less the engine
asleep (:func:`engine_phases`, one rule for the estimate, the search and the checker). Where the
trainer's states also go to host memory while it generates, the generation phase holds nothing of
the trainer's.

Not counted: vLLM's CUDA graphs and sampler buffers (inside its share), and the transient copy of
the policy's weights gathered to load them into the engine each step (freed before training).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.core.arch import total_params
from planner.core.entries import ModelSpec
from planner.core.specs import Layout, Recipe, Workload

#: Bytes per weight and per cached key or value element in the engine: vLLM serves the policy in
#: its 16-bit dtype (TRL loads the policy's weights, LoRA merged, each step).
ENGINE_BYTES_PER_ELEMENT = 2

#: What a sleeping engine keeps on the card: vLLM's sleep moves its weights to host memory (level
#: 1) or drops them (level 2) and drops its KV cache, both allocated through its
#: ``CuMemAllocator`` pool; its CUDA graphs' memory pool stays. vLLM logs that pool at start-up ("Graph capturing finished ...
#: took X GiB"): 0.10–0.39 GiB for 0.6B–20B models at 16K tokens on an H100 (llm-d's empirical
#: vLLM memory table), and vLLM's own sleep test bounds what stays at 2 GiB for a 1B model
#: (``tests/basic_correctness/test_cumem.py``, ``test_end_to_end``). A stated guess inside that
#: range; an engine run eagerly (verl's ``enforce_eager``) keeps less.
ENGINE_ASLEEP_BYTES = 2**29  # 0.5 GiB

#: The phase in which a sleeping engine generates beside the trainer's states at rest.
GENERATION_PHASE = "generation"
#: Suffix of a step's phases while the engine sleeps: held to the card less the engine asleep.
ASLEEP_SUFFIX = " (engine asleep)"


def is_generation_phase(name: str) -> bool:
    """``name`` is a stage's generation phase (``generation``, ``generation (last stage)``)."""
    return name.split(" (")[0] == GENERATION_PHASE


def is_asleep_phase(name: str) -> bool:
    """``name`` is a step phase while the engine sleeps: held to the card without its share."""
    return name.endswith(ASLEEP_SUFFIX)


def phase_limit(name: str, usable: Any, asleep_usable: Any) -> Any:
    """The usable bytes phase ``name`` is held to: ``asleep_usable`` (the card without the engine's
    share) for a step phase the engine sleeps through, else ``usable``."""
    return asleep_usable if is_asleep_phase(name) else usable


def kv_bytes_per_token(model: ModelSpec) -> float:
    """The KV cache of one token: a key and a value per layer, ``kv_heads · head_dim`` wide, 16-bit."""
    heads = model.heads or max(1, model.hidden // 128)
    head_dim = model.head_dim_eff or model.hidden // heads
    kv_heads = model.kv_heads_eff or heads
    return 2.0 * model.layers * kv_heads * head_dim * ENGINE_BYTES_PER_ELEMENT


def engine_weight_bytes(model: ModelSpec) -> float:
    """The engine's weights, all of them (every expert of a MoE model), 16-bit."""
    return float(total_params(model)) * ENGINE_BYTES_PER_ELEMENT


def colocated(wl: Workload, lay: Layout) -> bool:
    """Whether each step generates on the training GPUs themselves (GRPO, engine colocated)."""
    return wl.generates and not lay.generation_gpus


def engine_share(wl: Workload, lay: Layout) -> float:
    """The share of each training GPU a colocated engine holds while it generates (and, awake,
    through the step): 0 without generation or with the engine on GPUs of its own. Phases named
    with :data:`ASLEEP_SUFFIX` are held to the card without it (:func:`phase_limit`)."""
    return lay.engine_memory_fraction if colocated(wl, lay) else 0.0


def engine_phases(phases: dict[str, Any], wl: Workload, lay: Layout, *, sleep: Any, offload: Any) -> dict[str, Any]:
    """A step's phases (bytes per GPU, scalars or arrays) as the card holds them beside a colocated
    engine, with the trainer's states at rest in :data:`GENERATION_PHASE` (as the memory profile
    gives them) and ``sleep``/``offload`` the recipe's ``generation_sleep``/``rollout_offload``
    (flags or arrays of them):

    - engine awake through the step: the step's phases as they are, held to the card less the
      engine's share; the states at rest fit wherever the step does, so no generation phase;
    - engine asleep while the step trains: each step phase renamed with :data:`ASLEEP_SUFFIX`, plus
      :data:`ENGINE_ASLEEP_BYTES`, and the generation phase kept: the states at rest beside the
      engine's share, unless the trainer's states go to host memory while it generates.

    Entries that do not apply are 0 (phases of 0 bytes constrain nothing). Phases of other
    workloads pass through, less a generation phase."""
    # the generation phase of every pipeline stage ("generation (last stage)"): the largest binds
    gens = [v for k, v in phases.items() if is_generation_phase(k)]
    steps = {k: v for k, v in phases.items() if not is_generation_phase(k)}
    if not gens or not colocated(wl, lay):
        return steps
    gen = np.maximum.reduce([np.asarray(g) for g in gens]) if len(gens) > 1 else gens[0]
    asleep = np.asarray(sleep, dtype=bool)
    out: dict[str, Any] = {}
    for name, value in steps.items():
        out[name] = np.where(asleep, 0, value)
        out[name + ASLEEP_SUFFIX] = np.where(asleep, np.asarray(value) + ENGINE_ASLEEP_BYTES, 0)
    out[GENERATION_PHASE] = np.where(asleep & ~np.asarray(offload, dtype=bool), gen, 0)
    if all(np.ndim(v) == 0 for v in phases.values()) and np.ndim(sleep) == 0 and np.ndim(offload) == 0:
        return {k: int(v) for k, v in out.items() if int(v) > 0}
    return out


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
        return share + ("asleep while the step trains (the step has the card less what it keeps asleep); the "
                        "trainer's states at rest stay beside it while it generates, within the rest of the card")
    return share + "held through the step (TRL vllm_mode colocate, no sleep mode)"
