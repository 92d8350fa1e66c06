"""Properties of the memory model (Hypothesis): monotone in sharding, parts sum to the total."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.entries import ModelSpec
from planner.core.specs import Layout, Overrides, Recipe, Workload
from planner.memory.seed import seed_memory

MODEL = ModelSpec(id="m", params_b=7, layers=32, hidden=4096, heads=32, kv_heads=8, ffn=11008, vocab=32000)

workloads = st.builds(
    Workload,
    method=st.sampled_from(["full", "lora", "qlora"]),
    optimizer=st.sampled_from(["adamw", "adam8bit", "paged_adamw8bit", "sgd"]),
    precision=st.sampled_from(["mixed", "bf16", "fp16", "fp32"]),
    seq_len=st.sampled_from([512, 2048, 8192]),
    micro_batch=st.integers(1, 16),
    lora_rank=st.sampled_from([8, 16, 64]),
)
layouts = st.builds(
    Layout,
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4, 8]),
    cp=st.sampled_from([1, 2]),
    sp=st.booleans(),
    zero=st.sampled_from([0, 1, 2, 3]),
    offload=st.sampled_from(["none", "optimizer"]),
    checkpointing=st.sampled_from(["none", "selective", "full"]),
    attention=st.sampled_from(["eager", "flash"]),
)
dps = st.sampled_from([1, 2, 4, 8, 64])
grad_accums = st.none() | st.integers(1, 64)


def total(workload: Workload, layout: Layout, dp: int, grad_accum: int | None = None) -> int:
    return seed_memory(MODEL, workload, layout, Overrides(), dp=dp, grad_accum=grad_accum).total_bytes


@settings(max_examples=300, deadline=None)
@given(workloads, layouts, dps, grad_accums)
def test_components_sum_to_total(workload, layout, dp, grad_accum):
    mem = seed_memory(MODEL, workload, layout, Overrides(), dp=dp, grad_accum=grad_accum)
    assert sum(mem.components.values()) == mem.total_bytes
    assert all(v >= 0 for v in mem.components.values())


@settings(max_examples=300, deadline=None)
@given(workloads, layouts, st.sampled_from([2, 4, 8, 64]))
def test_higher_zero_stage_never_needs_more(workload, layout, dp):
    """With D ≥ 2, each ZeRO stage shards more of the model states."""
    stages = [total(workload, layout.model_copy(update={"zero": z, "offload": "none"}), dp) for z in range(4)]
    assert stages == sorted(stages, reverse=True)
    if workload.method == "full":
        assert stages[3] < stages[0]


@settings(max_examples=300, deadline=None)
@given(workloads, layouts, dps, grad_accums, st.sampled_from(["tp", "pp", "cp"]))
def test_more_model_parallelism_never_needs_more(workload, layout, dp, grad_accum, knob):
    low = layout.model_copy(update={knob: 1})
    high = layout.model_copy(update={knob: 4})
    assert total(workload, high, dp, grad_accum) <= total(workload, low, dp, grad_accum)


@settings(max_examples=300, deadline=None)
@given(workloads, layouts, dps)
def test_more_checkpointing_never_needs_more(workload, layout, dp):
    levels = [total(workload, layout.model_copy(update={"checkpointing": c}), dp)
              for c in ("none", "selective", "full")]
    assert levels == sorted(levels, reverse=True)


@settings(max_examples=200, deadline=None)
@given(workloads, layouts, dps)
def test_flash_never_needs_more_than_eager(workload, layout, dp):
    eager = total(workload, layout.model_copy(update={"attention": "eager"}), dp)
    flash = total(workload, layout.model_copy(update={"attention": "flash"}), dp)
    assert flash <= eager


@settings(max_examples=200, deadline=None)
@given(workloads, layouts.filter(lambda lay: lay.zero >= 1), dps)
def test_offload_moves_bytes_to_host_without_losing_any(workload, layout, dp):
    on_gpu = seed_memory(MODEL, workload, layout.model_copy(update={"offload": "none"}), Overrides(), dp=dp)
    off = seed_memory(MODEL, workload, layout.model_copy(update={"offload": "optimizer"}), Overrides(), dp=dp)
    assert off.total_bytes <= on_gpu.total_bytes
    # Rounding happens once per component, so allow a byte per component.
    assert abs(off.total_bytes + off.host_bytes - on_gpu.total_bytes) <= len(on_gpu.components)


@settings(max_examples=200, deadline=None)
@given(workloads, layouts, dps, st.integers(1, 8))
def test_memory_grows_with_micro_batch(workload, layout, dp, extra):
    bigger = workload.model_copy(update={"micro_batch": workload.micro_batch + extra})
    assert total(bigger, layout, dp) > total(workload, layout, dp)


# ---------------------------------------------------------------------------------------------
# The detailed profile (the default): the same properties, with the recipe details it reads.
# The search bisects on the data-parallel degree, so memory must never rise with dp from 2 up.

from planner.memory.detailed import detailed_memory

DETAILED_MODEL = ModelSpec(id="d", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=11008,
                           vocab=128256)

detailed_workloads = st.builds(
    Workload,
    method=st.sampled_from(["full", "lora", "qlora"]),
    optimizer=st.sampled_from(["adamw", "adam8bit", "paged_adamw8bit", "sgd"]),
    precision=st.sampled_from(["mixed", "bf16", "fp16"]),
    seq_len=st.sampled_from([512, 2048, 8192]),
    micro_batch=st.integers(1, 8),
    lora_rank=st.sampled_from([8, 64]),
)
detailed_layouts = st.builds(
    Layout,
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2, 4]),
    cp=st.sampled_from([1, 2]),
    sp=st.booleans(),
    zero=st.sampled_from([0, 1, 2, 3]),
    offload=st.sampled_from(["none", "optimizer"]),
    checkpointing=st.sampled_from(["none", "selective", "full"]),
    attention=st.sampled_from(["eager", "flash"]),
)
detailed_recipes = st.builds(
    Recipe,
    optimizer_step=st.sampled_from(["foreach", "foreach_torch20", "for_loop", "fused", "in_backward"]),
    loss=st.sampled_from(["standard", "chunked", "fused", "compiled"]),
    kbit_prep=st.sampled_from(["none", "trl"]),
    grad_dtype=st.sampled_from(["param", "fp32"]),
    keeps_kv_cache=st.booleans(),
    full_state_dict=st.booleans(),
)


def detailed_total(workload: Workload, layout: Layout, recipe: Recipe, dp: int,
                   grad_accum: int | None = None) -> int:
    return detailed_memory(DETAILED_MODEL, workload, layout, Overrides(), recipe=recipe, dp=dp,
                           grad_accum=grad_accum).total_bytes


@settings(max_examples=150, deadline=None)
@given(detailed_workloads, detailed_layouts, detailed_recipes, dps, grad_accums)
def test_detailed_components_sum_to_total_and_are_never_negative(workload, layout, recipe, dp, grad_accum):
    mem = detailed_memory(DETAILED_MODEL, workload, layout, Overrides(), recipe=recipe, dp=dp,
                          grad_accum=grad_accum)
    assert sum(mem.components.values()) == mem.total_bytes
    assert all(v >= 0 for v in mem.components.values())
    assert mem.host_bytes >= 0
    p = mem.predicted
    assert 0 <= p["allocated_bytes"] <= p["reserved_bytes"] <= p["device_bytes"]
    assert p["allocated_bytes"] <= p["needed_bytes"] == mem.total_bytes <= p["device_bytes"]
    # The search states one memory constraint per phase: together they must say exactly "the
    # total fits", so the largest phase is the total and none is above it.
    phases = mem.phase_bytes
    assert phases and max(phases.values()) == mem.total_bytes
    assert min(phases.values()) > 0
    stages = {name.removesuffix(" (last stage)") for name in phases}
    assert {"backward start", "backward end"} <= stages
    assert ("optimizer step" in stages) == (recipe.optimizer_step != "in_backward")


@settings(max_examples=150, deadline=None)
@given(detailed_workloads, detailed_layouts, detailed_recipes, st.sampled_from([32, 64, 256]))
def test_detailed_never_rises_with_dp_at_a_fixed_global_batch(workload, layout, recipe, global_batch):
    """dp from 2 up, the global batch fixed: grad_accum = global / (dp · micro-batch) falls to 1
    on the way (the case of a search that bisects on dp)."""
    totals = []
    for dp in (2, 4, 8, 16, 32, 64):
        ga = max(1, global_batch // (dp * workload.micro_batch))
        totals.append(detailed_total(workload, layout, recipe, dp, ga))
    assert totals == sorted(totals, reverse=True)


@settings(max_examples=150, deadline=None)
@given(detailed_workloads, detailed_layouts, detailed_recipes, grad_accums)
def test_detailed_never_rises_with_dp_at_a_fixed_grad_accum(workload, layout, recipe, grad_accum):
    totals = [detailed_total(workload, layout, recipe, dp, grad_accum) for dp in (2, 4, 8, 64)]
    assert totals == sorted(totals, reverse=True)


@settings(max_examples=150, deadline=None)
@given(detailed_workloads, detailed_layouts.filter(lambda lay: lay.pp == 1), detailed_recipes,
       st.sampled_from([2, 4, 8, 64]), grad_accums)
def test_detailed_higher_zero_stage_never_needs_more(workload, layout, recipe, dp, grad_accum):
    """Without pipeline parallelism. Under PP, FSDP keeps each stage's parameters unsharded for
    the whole step and accumulates unsharded gradients in its FP32 reduce dtype (torchtitan,
    FSDP2 ``to_accumulated_grad_if_needed``): there ZeRO-3 holds more than ZeRO-1, as it does
    on real runs. Stage 3 is compared with stage 0 for full fine-tuning only: it keeps the root
    unit (embeddings and head, 16-bit) and two layer units gathered, which a 4-bit or frozen base
    sharded over two GPUs need not repay; and with FSDP1/DeepSpeed gathers (``fsdp_version`` 1)
    its reserved view adds the fragmentation of ``record_stream`` frees."""
    def views(z: int, version: int) -> dict[str, int]:
        lay = layout.model_copy(update={"zero": z, "offload": "none"})
        return detailed_memory(DETAILED_MODEL, workload, lay, Overrides(),
                               recipe=recipe.model_copy(update={"fsdp_version": version}), dp=dp,
                               grad_accum=grad_accum).predicted

    for version in (1, 2):
        stages = [views(z, version) for z in range(4)]
        for view in ("allocated_bytes", "device_bytes"):
            upto2 = [v[view] for v in stages[:3]]
            assert upto2 == sorted(upto2, reverse=True)
        if workload.method == "full":
            assert stages[3]["allocated_bytes"] <= stages[0]["allocated_bytes"]


@settings(max_examples=150, deadline=None)
@given(detailed_workloads, detailed_layouts, detailed_recipes, dps, grad_accums)
def test_detailed_more_checkpointing_never_needs_more(workload, layout, recipe, dp, grad_accum):
    levels = [detailed_total(workload, layout.model_copy(update={"checkpointing": c}), recipe, dp, grad_accum)
              for c in ("none", "selective", "full")]
    assert levels == sorted(levels, reverse=True)


@settings(max_examples=150, deadline=None)
@given(detailed_workloads, detailed_layouts, detailed_recipes, dps, grad_accums)
def test_detailed_more_tensor_parallelism_never_needs_more(workload, layout, recipe, dp, grad_accum):
    """TP from 1 to 2 to 4 at a fixed dp (the first TP group adds its NCCL communicator, which
    the sharded states of a 8B model outweigh)."""
    totals = [detailed_total(workload, layout.model_copy(update={"tp": t}), recipe, dp, grad_accum)
              for t in (1, 2, 4)]
    assert totals == sorted(totals, reverse=True)
