"""Properties of the memory model (Hypothesis): monotone in sharding, parts sum to the total."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.memory.seed import seed_memory
from planner.core.specs import Layout, ModelSpec, Overrides, Workload

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
