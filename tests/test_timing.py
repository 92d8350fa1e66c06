"""The time model's physics, one change at a time (planner/perf/timing.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import planner
from planner import catalog
from planner.perf import timing
from planner.perf.flops import CAUSAL_SHARE, flops_per_token, model_flops
from planner.perf.hardware import GpuPerf, group_collective_s, utilization_mid
from planner.perf.timing import (
    COMM_OVERLAP_SHARE,
    DEQUANT_BYTES_PER_PARAM,
    FITTED,
    JOB_STARTUP_S,
    default_global_batch,
    job_time_s,
    step_time_s,
)

MF = model_flops(catalog.get_model("llama-3-8b"))
H100 = GpuPerf.of(catalog.get_gpu("h100"))
BASE = {"method": 0, "checkpointing": 0, "offload": 0, "zero": 0, "seq_len": 4096, "micro_batch": 2, "grad_accum": 4,
            "tp": 1, "pp": 1, "cp": 1, "dp": 1, "ep": 1, "n_lora": 0.0, "weight_bytes": 2.0}


def step(perf: GpuPerf = H100, **changes) -> float:
    return float(step_time_s(MF, perf, **{**BASE, **changes}))


def test_one_utilisation_recompute_charged_once():
    """Full recomputation adds the forward's FLOPs (2N + the attention forward) and nothing else:
    utilisation is hardware-FLOPs utilisation, the same number with or without recompute."""
    f0 = float(flops_per_token(MF, method=0, seq_len=4096, checkpointing=0))
    f2 = float(flops_per_token(MF, method=0, seq_len=4096, checkpointing=2))
    attn = 12 * CAUSAL_SHARE * MF.layers * 4096 * MF.attn_width
    assert f2 - f0 == pytest.approx(2 * MF.active_params + attn / 3)
    # Compute-bound: time grows by the FLOPs ratio at most (the memory-bound forward repeats too).
    ratio = step(checkpointing=2) / step()
    assert ratio < f2 / f0 * 1.05


def test_catalog_utilisation_is_the_fitted_one():
    """The catalog's band middle for measured cards is the fitted HFU of the tensor-core work."""
    for name in ("h100", "a100-80gb", "v100-16gb", "b200"):
        assert utilization_mid(catalog.get_gpu(name)) == pytest.approx(FITTED.gemm_hfu, rel=0.01)
    mi = catalog.get_gpu("mi300x")  # AMD: its own measured band (tests/test_amd_utilisation.py)
    assert utilization_mid(mi) < FITTED.gemm_hfu
    assert "measured_throughput_amd.csv" in mi.utilization_source


def test_dp_allreduce_overlaps_the_last_backward():
    fast = replace(H100, intra_bps=1e15, inter_bps=1e15)
    assert step(fast, dp=8) == pytest.approx(step(fast, dp=1), rel=1e-3)  # hidden entirely
    slow = replace(H100, intra_bps=1e9, inter_bps=1e9)
    exposed = step(slow, dp=8) - step(slow, dp=1)
    grad = MF.params * 2.0
    allreduce = 2 * 7 / 8 * grad / 1e9
    t_mb = step(grad_accum=1) - float(timing.OPTIMIZER_BYTES_PER_PARAM * MF.params / H100.memory_bps)
    # The all-reduce minus what hides behind the backward (2/3 of a micro-batch's compute).
    assert exposed == pytest.approx(allreduce - COMM_OVERLAP_SHARE * 2 / 3 * t_mb, rel=0.05)


def test_zero3_moves_three_times_the_parameters_per_micro_batch():
    """All-gather forward, all-gather backward, reduce-scatter gradients: 3 × (g−1)/g × 2N bytes."""
    slow = replace(H100, intra_bps=1e9, inter_bps=1e9)
    ga = 4
    t3 = step(slow, zero=3, dp=8, grad_accum=ga)
    t1 = step(slow, zero=3, dp=1, grad_accum=ga)
    traffic = 3 * 7 / 8 * MF.params * 2.0 / 1e9
    compute = (t1 - float(timing.OPTIMIZER_BYTES_PER_PARAM * MF.params / H100.memory_bps)) / ga
    optimizer_saved = timing.OPTIMIZER_BYTES_PER_PARAM * MF.params * (1 - 1 / 8) / H100.memory_bps
    assert t3 - t1 + optimizer_saved == pytest.approx(ga * (traffic - COMM_OVERLAP_SHARE * compute), rel=0.02)


def test_collectives_across_nodes_use_every_nic():
    """8 GPUs per node, 16 GPUs: the nodes exchange half the buffer over 8 NICs at once."""
    b = 16e9
    t = float(group_collective_s(b, 16, 1, 8, 450e9, 50e9, 1.0))
    assert t == pytest.approx(7 / 8 * b / 450e9 + 1 / 2 * b / (8 * 50e9))
    # One member per node (TP 8 inside it): one NIC each.
    t = float(group_collective_s(b, 2, 8, 8, 450e9, 50e9, 1.0))
    assert t == pytest.approx(1 / 2 * b / 50e9)


def test_interleaved_pipeline_divides_the_bubble():
    one = step(pp=4, grad_accum=8, vp=1)
    four = step(pp=4, grad_accum=8, vp=4)
    t_mb = (one - four) / (3 * (1 - 1 / 4))
    assert one == pytest.approx((8 + 3) * t_mb + (one - 11 * t_mb), rel=1e-6)
    assert four < one


def test_context_parallel_traffic_hides_behind_attention():
    fast = replace(H100, intra_bps=1e15)
    assert step(H100, cp=2, seq_len=32768, micro_batch=1) == pytest.approx(
        step(fast, cp=2, seq_len=32768, micro_batch=1), rel=0.02)


def test_qlora_pays_the_dequantisation_over_memory_bandwidth():
    lora = step(method=1, n_lora=2e7, quant=0, checkpointing=2)
    qlora = step(method=2, n_lora=2e7, quant=1, weight_bytes=0.5, checkpointing=2)
    assert qlora - lora == pytest.approx(
        BASE["grad_accum"] * 3 * MF.params * DEQUANT_BYTES_PER_PARAM / H100.memory_bps, rel=0.01)
    # Small micro-batches are not punished much: 2,048 tokens keep most of the GEMM speed.
    assert float(timing.microbatch_efficiency(2048)) > 0.85


def test_fp8_runs_linear_layers_at_the_fp8_peak():
    assert step(fp8=1) < 0.9 * step()
    a100 = GpuPerf.of(catalog.get_gpu("a100-80gb"))  # no FP8: the 16-bit peak
    assert step(a100, fp8=1) == pytest.approx(step(a100))


def test_eager_attention_is_slower_than_fused():
    assert step(attention=0) > 1.05 * step(attention=1)


def test_start_up_cost_and_default_batch():
    assert float(job_time_s(1.0, tokens=1e6, seq_len=1000, micro_batch=1, dp=1, grad_accum=1)) == \
        pytest.approx(JOB_STARTUP_S + 1000)
    assert default_global_batch("full", 4096, 1e12) == 1024  # 4M tokens
    assert default_global_batch("lora", 4096, 1e9) == 64


def test_short_job_without_a_batch_stays_on_few_gpus():
    """No global batch and a small token budget: the cheapest plan is not a thousand GPUs."""
    res = planner.plan({"model": "llama-3.1-8b", "workload": {"method": "lora", "seq_len": 2048, "tokens": 1e7},
                        "search": {"gpu_types": ["h100", "a100-80gb"]}, "top": 3})
    assert res.plans and all(p.gpus <= 8 for p in res.plans)
    assert all(p.micro_batch * p.dp * p.grad_accum == 64 for p in res.plans)


def test_lora_adapters_pay_their_side_path_over_memory_bandwidth():
    """LoRA's adapters add memory-bound traffic over the adapted width (n_lora / rank): 19 bytes
    per element in the compute dtype, 76 as PEFT's FP32 adapters (kernel profiles of 1B and 8B
    steps on an H200, data/README.md); full recompute repeats the forward's third; a fusing stack
    keeps the fused share; full fine-tuning has none."""
    n_lora, rank = 4.2e7, 16
    tokens = BASE["micro_batch"] * BASE["seq_len"] * BASE["grad_accum"]
    plain = step(method=1, n_lora=n_lora)
    for dtype, per in (("compute", 19.0), ("fp32", 76.0)):
        traffic = timing.adapter_bytes_per_token(n_lora, rank, dtype)
        assert traffic == pytest.approx(n_lora / rank * per)
        assert step(method=1, n_lora=n_lora, adapter_bytes=traffic) - plain == pytest.approx(
            tokens * traffic / H100.memory_bps / H100.kernel_speed, rel=1e-6)
        ckpt = step(method=1, n_lora=n_lora, adapter_bytes=traffic, checkpointing=2)
        assert ckpt - step(method=1, n_lora=n_lora, checkpointing=2) == pytest.approx(
            4 / 3 * tokens * traffic / H100.memory_bps / H100.kernel_speed, rel=1e-6)
        fused = step(method=1, n_lora=n_lora, adapter_bytes=traffic, fused=1)
        assert fused - step(method=1, n_lora=n_lora, fused=1) == pytest.approx(
            FITTED.fused_elementwise_share * tokens * traffic / H100.memory_bps / H100.kernel_speed, rel=1e-6)
    assert step(adapter_bytes=1e9) == pytest.approx(step())  # full fine-tuning: no adapters


def test_optimizer_step_by_implementation():
    """torch's foreach AdamW: 20 passes over its states at the measured bandwidth share; a fused
    step 7 passes (FP32 states with a 16-bit copy: the 28 bytes every published row assumes)."""
    assert timing.optimizer_bytes_per_param("fused", 4.0) == timing.OPTIMIZER_BYTES_PER_PARAM == 28.0
    assert timing.optimizer_bytes_per_param("fused", 2.0) == 14.0
    foreach = timing.optimizer_bytes_per_param("foreach", 2.0)
    assert foreach == pytest.approx(40.0 / timing.FOREACH_BANDWIDTH_SHARE)
    assert 0.5 <= timing.FOREACH_BANDWIDTH_SHARE <= 0.95
    delta = step(optimizer_bytes=foreach) - step()
    assert delta == pytest.approx(MF.params * (foreach - 28.0) / H100.memory_bps, rel=1e-6)


def test_op_level_selective_checkpointing_reruns_every_second_matmul():
    """torchtitan's op-level selective checkpointing saves every second matmul's output in
    forward order and the attention kernel's (its ``_save_list``/``_custom_policy``): in a Llama
    layer k, o and up run again, 2 FLOPs per parameter and token, and the attention core does not;
    Megatron's selective recomputation (Transformer Engine layers) reruns the attention core only."""
    from planner.perf.arguments import selective_is_op
    from planner.perf.flops import attention_flops_per_token, linear_flops_per_token, model_flops

    m = catalog.get_model("llama-3.1-8b")
    mf = model_flops(m)
    h, kv, f = m.hidden, m.kv_heads * m.head_dim_eff, m.ffn
    assert mf.op_recompute_params == m.layers * (h * kv + h * h + h * f)
    none = linear_flops_per_token(mf, method=0, checkpointing=0)
    op = linear_flops_per_token(mf, method=0, checkpointing=1, selective_op=1)
    megatron = linear_flops_per_token(mf, method=0, checkpointing=1, selective_op=0)
    assert op - none == 2 * mf.op_recompute_params and megatron == none
    att = {k: attention_flops_per_token(mf, seq_len=8192, checkpointing=1, selective_op=k) for k in (0, 1)}
    assert att[0] == attention_flops_per_token(mf, seq_len=8192, checkpointing=0) * 4 / 3
    assert att[1] == attention_flops_per_token(mf, seq_len=8192, checkpointing=0)
    assert list(selective_is_op(["op", "core_attention", "op"])) == [1, 0, 1]


def test_op_level_selective_reruns_every_routed_expert_and_counts_fused_qkv_once():
    """torchtitan's op policy counts plain matmuls only: a MoE layer's routed experts (grouped
    matmuls) and its router are all rerun, whatever the parity; a fused qkv is one matmul, so
    o and up are the rerun ones (not k). A model known only by its size reruns
    ``OP_RERUN_SHARE`` of its parameters."""
    from planner.core.arch import op_policy_matmuls
    from planner.perf.flops import OP_RERUN_SHARE, model_flops

    moe = catalog.get_model("mixtral-8x7b")
    h, f, k, e = moe.hidden, moe.moe.expert_ffn, moe.moe.active, moe.moe.experts
    kv = moe.kv_heads * moe.head_dim_eff
    assert model_flops(moe).op_recompute_params == moe.layers * (h * kv + h * h + 3 * h * f * k + h * e)
    fused = catalog.get_model("llama-3.1-8b").model_copy(update={"fused_qkv": True})
    assert [name for name, *_ in op_policy_matmuls(fused, moe_layer=False)[1::2]] == ["o", "up"]
    bare = catalog.get_model("llama-3.1-8b").model_copy(update={"heads": None, "ffn": None, "vocab": None,
                                                              "params_b": 8.0})
    assert model_flops(bare).op_recompute_params == pytest.approx(OP_RERUN_SHARE * model_flops(bare).params)


def test_consumer_blackwell_keeps_fp8_transposes():
    """Transformer Engine needs the TN layout for FP8 GEMMs below compute capability 10 and at
    12.x (``is_non_tn_fp8_gemm_supported``): the RTX 5090 keeps the copies, the B200 does not."""
    assert not catalog.get_gpu("b200").keeps_fp8_transpose
    assert catalog.get_gpu("rtx-5090").keeps_fp8_transpose
    assert catalog.get_gpu("h100").keeps_fp8_transpose


def test_expert_all_to_all_leaves_the_node_only_for_other_nodes_ranks():
    """Qwen3-30B-A3B (hidden 2048, top-8 of 128 experts, 48 MoE layers), one 4,096-token
    sequence per micro-batch: each GPU sends 4,096 · 2,048 · 2 B · 8 = 134 MB per all-to-all, four
    per layer. EP 8 inside an 8-GPU node: (8−1)/8 of it over NVLink. EP 16 over two nodes: 7/16
    over NVLink while 8/16 crosses the NIC (the slower decides), not all 15/16 at the NIC's speed
    (Megatron-Bridge's EP-16 H100 rows ran 8,826 tokens/s per GPU; priced the old way, 6,030).
    Tensor parallelism (sequence-parallel) halves what each GPU dispatches."""
    from planner.perf.timing import _model_parallel_comm_s

    mf = model_flops(catalog.get_model("qwen3-30b-a3b"))
    tokens = 4096.0
    sent = tokens * mf.hidden * 2.0 * mf.experts_per_token

    def ep_s(ep, tp=1):
        x = {"tp": tp, "pp": 1, "cp": 1, "dp": 1, "checkpointing": 0, "ep": ep}
        return float(_model_parallel_comm_s(mf, H100, x, tokens, 0.0, 8)[3])

    layers = 4.0 * mf.moe_layers
    assert ep_s(8) == pytest.approx(layers * sent * 7 / 8 / H100.intra_bps)
    two_nodes = max(sent * 7 / 16 / H100.intra_bps, sent * 8 / 16 / H100.inter_bps)
    assert ep_s(16) == pytest.approx(layers * two_nodes)
    assert ep_s(16) < layers * sent * 15 / 16 / H100.inter_bps
    # TP 2: half the tokens per GPU, and an 8-GPU node holds 4 of the EP group's ranks
    assert ep_s(16, tp=2) == pytest.approx(
        layers * max(sent / 2 * 3 / 16 / H100.intra_bps, sent / 2 * 12 / 16 / H100.inter_bps))


@pytest.mark.parametrize("tp, dp, ep, etp", [(2, 4, 8, 1), (2, 4, 4, 0), (1, 8, 8, 0), (2, 4, 4, 2)])
def test_a_sharded_optimizer_steps_its_share_of_every_parameter(tp, dp, ep, etp):
    """Under ZeRO-1 (Megatron's distributed optimizer) the stage's dense parameters are sharded
    over dp·cp and the routed experts over their own data-parallel group (dp·cp·tp / (ep·etp)):
    either way each of the dp·tp GPUs steps 1/(dp·tp) of the model, whatever ep and etp (the
    expert share was divided by ep twice)."""
    from planner.perf.timing import _parameters_on_gpu

    mf = model_flops(catalog.get_model("qwen3-30b-a3b"))
    x = {**BASE, "method": 0, "zero": 1, "tp": tp, "pp": 1, "cp": 1, "dp": dp, "ep": ep, "etp": etp}
    shard = float(_parameters_on_gpu(mf, x)[3])
    assert shard == pytest.approx(mf.params / (tp * dp), rel=1e-9)


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    """tp 8, dp 1, ep 2, etp 1: the dense layers have no data-parallel group, but each expert is
    held by 4 GPUs (dp·cp·tp / (ep·etp)), whose gradients must still be reduced."""
    from planner.perf.timing import _data_parallel_and_optimizer_s

    mf = model_flops(catalog.get_model("olmoe-1b-7b"))
    x = {**BASE, "method": 0, "zero": 1, "tp": 8, "pp": 1, "cp": 1, "dp": 1, "ep": 2, "etp": 1,
         "micro_batch": 1, "grad_accum": 1, "offload": 0}
    folded = float(_data_parallel_and_optimizer_s(mf, H100, timing.FITTED, x, 0.0, 8)[0])
    plain = float(_data_parallel_and_optimizer_s(mf, H100, timing.FITTED, {**x, "ep": 1, "etp": 0}, 0.0, 8)[0])
    assert plain == 0.0 < folded


def test_folded_expert_groups_sit_etp_apart():
    """Megatron-Core's MoE parallel folding orders the expert layers' ranks etp, ep, dp (its MoE
    README): at TP 2 with the experts' own TP 1, an EP-8 group is 8 neighbouring GPUs, one node,
    all over NVLink; with no expert TP of its own its ranks sit tp = 2 apart, 4 per node, as
    before. The experts' own TP equal to tp prices as unset."""
    from planner.perf.timing import _model_parallel_comm_s

    mf = model_flops(catalog.get_model("qwen3-30b-a3b"))
    tokens = 4096.0
    sent = tokens / 2 * mf.hidden * 2.0 * mf.experts_per_token  # TP 2: half the tokens per GPU

    def ep_s(**extra):
        x = {"tp": 2, "pp": 1, "cp": 1, "dp": 4, "checkpointing": 0, "ep": 8, **extra}
        return float(_model_parallel_comm_s(mf, H100, x, tokens, 0.0, 8)[3])

    layers = 4.0 * mf.moe_layers
    assert ep_s(etp=1) == pytest.approx(layers * sent * 7 / 8 / H100.intra_bps)
    assert ep_s() == pytest.approx(layers * max(sent * 3 / 8 / H100.intra_bps, sent * 4 / 8 / H100.inter_bps))
    assert ep_s(etp=2) == ep_s() == ep_s(etp=0)


def test_experts_with_their_own_tp_run_their_own_tp_collectives():
    """A layer's TP collectives are half its attention's, half its MLP's; a MoE layer's experts
    run theirs over their own TP on the tokens dispatched to that group: none at etp 1 (the
    folded layout's ranks send their sequence shards through the all-to-all), over 2 ranks with
    half the bytes at tp 4, etp 2, and as the dense MLP's where etp is tp or unset."""
    from planner.perf.hardware import ring_allreduce_s
    from planner.perf.timing import _model_parallel_comm_s

    mf = model_flops(catalog.get_model("qwen3-30b-a3b"))  # 48 layers, all MoE
    tokens = 4096.0
    act = tokens * mf.hidden * 2.0

    def tp_s(tp, ckpt=0, **extra):
        x = {"tp": tp, "pp": 1, "cp": 1, "dp": 4, "checkpointing": ckpt, "ep": 8, **extra}
        return float(_model_parallel_comm_s(mf, H100, x, tokens, 0.0, 8)[0])

    def ring(n_bytes, group):
        return float(ring_allreduce_s(n_bytes, group, H100.intra_bps))

    assert tp_s(2, etp=1) == pytest.approx(2 * 48 * ring(act, 2))  # the attention's alone
    assert tp_s(2, ckpt=2, etp=1) == pytest.approx(3 * 48 * ring(act, 2))
    assert tp_s(4, etp=2) == pytest.approx(2 * 48 * (ring(act, 4) + ring(act / 2, 2)))
    assert tp_s(2, etp=2) == tp_s(2) == pytest.approx(4 * 48 * ring(act, 2))


@pytest.mark.parametrize("gpu, ep", [("l40s", 6), ("l40s", 12), ("h100", 16), ("h100", 6)])
def test_the_search_bound_never_prices_expert_all_to_all_above_the_step(gpu, ep):
    """The search's lower bound (``intra_only``: every group at the in-node link) must not exceed
    the step it bounds: on a PCIe card whose NIC is half its link, pricing an all-to-all whose
    ranks span nodes wholly at the link would (an L40S EP-6 step: 0.107 s against 0.086 s)."""
    from planner.perf.timing import _model_parallel_comm_s

    mf = model_flops(catalog.get_model("qwen1.5-moe-a2.7b"))
    perf = GpuPerf.of(catalog.get_gpu(gpu))
    x = {**BASE, "tp": 2, "ep": ep, "dp": ep, "micro_batch": 1}
    tokens = x["micro_batch"] * x["seq_len"]

    def ep_s(node):
        return float(_model_parallel_comm_s(mf, perf, x, tokens, 0.0, node)[3])

    assert 0 < ep_s(np.inf) <= ep_s(perf.gpus_per_node)
    assert float(step_time_s(mf, perf, intra_only=1, **x)) <= float(step_time_s(mf, perf, **x))


def test_fused_kernels_save_the_element_wise_traffic_of_the_ops_they_replace():
    """Hand-written fused kernels take their eager ops' reads and writes out of the element-wise
    traffic, counted per token and layer in hidden vectors (timing.FUSED_*_SAVED_VECTORS): two
    RMSNorms 121; rotary 20 per hidden width of q and k (Llama 3 8B: (4096 + 1024)/4096 → 25);
    SwiGLU 6 per hidden width of the MLP (14336/4096 → 21); a MoE layer's SwiGLU over its active
    experts (Mixtral: 2 × 14336). A step of an 8B model at 8K tokens
    per micro-batch is shorter by exactly that traffic at the card's bandwidth, and its
    launches by the same share; a fusing stack (Transformer Engine, compile) is unchanged."""
    from planner.perf.timing import KERNEL_FUSIONS, fused_kernel_vectors

    assert fused_kernel_vectors(MF, True, False, False) == pytest.approx(121.0)
    assert fused_kernel_vectors(MF, True, True, True) == pytest.approx(121.0 + 25.0 + 21.0)
    assert fused_kernel_vectors(MF, *KERNEL_FUSIONS["unsloth"]) == pytest.approx(167.0)
    assert fused_kernel_vectors(MF, *KERNEL_FUSIONS["fused_rmsnorm"]) == pytest.approx(121.0)
    mixtral = model_flops(catalog.get_model("mixtral-8x7b"))
    assert fused_kernel_vectors(mixtral, False, False, True) == pytest.approx(6.0 * 2 * 14336 / 4096)
    saved = 167.0
    tokens = BASE["seq_len"] * BASE["micro_batch"]
    per_mb = saved * 2.0 * MF.hidden * tokens * MF.layers / H100.memory_bps / H100.kernel_speed
    assert step() - step(kernel_vectors=saved) == pytest.approx(BASE["grad_accum"] * per_mb, rel=1e-6)
    assert step(fused=1) == pytest.approx(step(fused=1, kernel_vectors=saved), rel=1e-12)
    # never below what a fusing stack keeps
    assert step(kernel_vectors=1e6) == pytest.approx(step(fused=1), rel=1e-12)


def test_a_stack_s_fused_kernels_reach_the_plan_s_time():
    """``recipe.kernels`` is read into the time arguments: Unsloth's and Liger's kernels save
    norms, rotary and SwiGLU traffic, a fused RMSNorm the norms', the standard modules and Transformer Engine
    (priced by its ``fused`` share) none; the plan's step is shorter with them."""
    from planner.perf.arguments import kernel_vectors_of, step_arguments
    from planner.scenario.resolve import resolve

    raw = {"model": "llama-3-8b", "workload": {"method": "lora", "seq_len": 4096, "micro_batch": 1, "tokens": 1e9},
           "layout": {"gpu": "h100", "gpus": 1}}
    rs = resolve(raw)
    assert kernel_vectors_of(rs, "unsloth") == pytest.approx(167.0)
    assert kernel_vectors_of(rs, "fused_rmsnorm") == pytest.approx(121.0)
    assert kernel_vectors_of(rs, "liger") == pytest.approx(167.0)
    oss = resolve({**raw, "model": "gpt-oss-20b"})  # Liger's SwiGLU is off for GPT-OSS
    assert kernel_vectors_of(oss, "liger") == pytest.approx(kernel_vectors_of(oss, "unsloth")
                                                           - timing.FUSED_SWIGLU_SAVED_VECTORS
                                                           * model_flops(oss.model).expert_ffn
                                                           * model_flops(oss.model).experts_per_token
                                                           / oss.model.hidden)
    assert kernel_vectors_of(rs, "standard") == kernel_vectors_of(rs, "transformer_engine") == 0.0
    common = {"method": 1, "checkpointing": 2, "offload": 0, "zero": 0, "seq_len": 4096, "micro_batch": 1,
              "grad_accum": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": 1, "attention": 1, "fused": 0}
    plain = step_arguments(rs, **common)
    unsloth = step_arguments(resolve({**raw, "recipe": {"kernels": "unsloth"}}), **common)
    assert plain["kernel_vectors"] == 0.0 and unsloth["kernel_vectors"] == pytest.approx(167.0)
    perf = GpuPerf.of(rs.gpu)
    assert float(step_time_s(MF, perf, **unsloth)) < float(step_time_s(MF, perf, **plain))


def test_muon_newton_schulz_flops_count_each_hidden_matrix():
    """Five Newton–Schulz iterations per matrix (torch.optim.Muon's ``ns_steps``), each A = X·Xᵀ,
    A·A and B·X: 5 · (4·m²·n + 2·m³) FLOPs for an m×n update, m ≤ n. Llama 3 8B: 32 layers of q,
    o (4096²), k, v (4096 × 1024) and three 4096 × 14336 MLP weights; embeddings and head take
    AdamW (none)."""
    from planner.perf.flops import muon_step_flops, newton_schulz_flops

    def ns(m: int, n: int) -> float:
        return 5 * (4 * m * m * n + 2 * m ** 3)

    assert newton_schulz_flops(14336, 4096) == newton_schulz_flops(4096, 14336) == ns(4096, 14336)
    layer = 2 * ns(4096, 4096) + 2 * ns(1024, 4096) + 3 * ns(4096, 14336)
    assert muon_step_flops(catalog.get_model("llama-3-8b"), "full") == pytest.approx(32 * layer)


def test_muon_step_time_adds_its_newton_schulz_gemms_split_by_sharded_optimizers():
    """The orthogonalisation runs at the GEMMs' utilisation once per optimizer step: DDP repeats it
    on every rank (torch.optim.Muon), a sharded optimizer (ZeRO ≥ 1: DeepSpeed's and Megatron's
    Muon, nanochat's DistMuon) splits the matrices over the data-parallel ranks."""
    flops = 1e15
    rate = H100.peak_flops * H100.utilization
    for zero, owners in ((0, 1), (1, 8)):
        plain = step(dp=8, zero=zero)
        muon = step(dp=8, zero=zero, optimizer_flops=flops)
        assert muon - plain == pytest.approx(flops / owners / rate, rel=1e-6)
    assert step(tp=2, optimizer_flops=flops) - step(tp=2) == pytest.approx(flops / 2 / rate, rel=1e-6)


def test_muon_orthogonalises_a_rank_s_share_of_the_routed_experts():
    """A rank holds 1/ep of the routed experts (each split over the experts' own TP): under DDP it
    orthogonalises the dense matrices (its tp shards) and its experts only; a sharded optimizer
    splits the experts over their own data-parallel group, which comes to the same 1/(tp·dp·cp)
    share as the dense matrices. Mixtral 8x7B on 8 GPUs, ep 8: the experts' Newton–Schulz FLOPs
    counted once per 8 ranks without ZeRO."""
    from planner.perf.flops import muon_expert_flops, muon_step_flops

    spec = catalog.get_model("mixtral-8x7b")
    mf = model_flops(spec)
    total, experts = muon_step_flops(spec, "full"), muon_expert_flops(spec, "full")
    assert 0.9 * total < experts < total  # the experts hold most of Mixtral's hidden matrices
    rate = H100.peak_flops * H100.utilization

    def extra(**x):
        args = {**BASE, "dp": 8, "ep": 8, **x}
        with_muon = step_time_s(mf, H100, **args, optimizer_flops=total, optimizer_expert_flops=experts)
        return float(with_muon) - float(step_time_s(mf, H100, **args))

    assert extra(zero=0) == pytest.approx((total - experts + experts / 8) / rate, rel=1e-6)
    assert extra(zero=1) == pytest.approx(total / 8 / rate, rel=1e-6)
    assert extra(zero=0, ep=1) == pytest.approx(total / rate, rel=1e-6)  # DDP without ep: all of it


def test_a_muon_plan_is_timed_with_its_orthogonalisation():
    """``planner estimate`` of one plan and the search's columns time Muon through the same
    arguments: an 8B full fine-tune with Muon takes longer per step than with SGD, by the
    Newton–Schulz FLOPs at the card's rate."""
    from planner.perf.arguments import step_arguments
    from planner.perf.flops import muon_step_flops
    from planner.scenario.resolve import resolve

    raw = {"model": "llama-3-8b", "workload": {"method": "full", "seq_len": 4096, "micro_batch": 1,
                                                "optimizer": "muon", "tokens": 1e9},
           "layout": {"gpu": "h100", "gpus": 8, "zero": 0}}
    rs = resolve(raw)
    common = {"method": 0, "checkpointing": 0, "offload": 0, "zero": 0, "seq_len": 4096, "micro_batch": 1,
              "grad_accum": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": 8, "attention": 1, "fused": 0}
    x = step_arguments(rs, **common)
    assert x["optimizer_flops"] == pytest.approx(muon_step_flops(rs.model, "full"))
    assert "optimizer_flops" not in step_arguments(rs, **common, optimizer="sgd")
    perf = GpuPerf.of(rs.gpu)
    extra = float(step_time_s(MF, perf, **x)) - float(step_time_s(MF, perf, **{k: v for k, v in x.items()
                                                                               if k != "optimizer_flops"}))
    assert extra == pytest.approx(muon_step_flops(rs.model, "full") / (perf.peak_flops * perf.utilization))


def test_gemm_width_efficiency_by_hand():
    """A GEMM loses speed to each narrow weight width as to few tokens, w/(w + d½) with the same
    d½: Llama 3 8B (hidden 4,096; Q 4,096 and K, V 1,024 each; gated MLP 14,336; vocabulary
    128,256), the dense layers' harmonic mean weighted by FLOPs, each width the TP split one
    divided by tp (column-parallel QKV, up, gate and LM head their outputs, O and down their
    inputs)."""
    d = FITTED.microbatch_half_tokens

    def f(w: float) -> float:
        return w / (w + d)

    def by_hand(tp: int) -> float:
        h, qkv, q, ffn, vocab = 4096, 6144, 4096, 14336, 128256
        parts = [(32 * h * qkv, f(h) * f(qkv / tp)), (32 * q * h, f(q / tp) * f(h)),
                 (32 * 3 * h * ffn, f(h) * f(ffn / tp)), (h * vocab, f(h) * f(vocab / tp))]
        return sum(w for w, _ in parts) / sum(w / e for w, e in parts)

    for tp in (1, 2, 8):
        dense, expert = timing.gemm_width_efficiency(MF, tp, tp, d)
        assert float(dense) == pytest.approx(by_hand(tp), rel=1e-12)
        assert float(expert) == 1.0  # no routed experts
    assert by_hand(8) < by_hand(1) < 1.0
    # without the MLP's and the vocabulary's widths (an incomplete architecture) the attention
    # projections decide
    attention_only = replace(MF, ffn=0, vocab=0)
    parts = [(4096 * 6144, f(4096) * f(6144 / 8)), (4096 * 4096, f(4096 / 8) * f(4096))]
    want = sum(w for w, _ in parts) / sum(w / e for w, e in parts)
    assert float(timing.gemm_width_efficiency(attention_only, 8, 8, d)[0]) == pytest.approx(want, rel=1e-12)


def test_gemm_width_efficiency_of_experts_and_stacked_models():
    """A routed expert's GEMMs (hidden 2,048 by 768 in Qwen3-30B-A3B) lose speed to the expert
    width over the experts' own TP; models stacked as the validation stacks them (a dense model, a
    MoE model, one without its MLP's widths) get each its own factors."""
    from dataclasses import fields

    from planner.perf.flops import ModelFlops

    d = FITTED.microbatch_half_tokens
    moe = model_flops(catalog.get_model("qwen3-30b-a3b"))
    for expert_tp in (1, 2, 8):
        got = float(timing.gemm_width_efficiency(moe, 8, expert_tp, d)[1])
        assert got == pytest.approx(2048 / (2048 + d) * (768 / expert_tp) / (768 / expert_tp + d), rel=1e-12)
    models = [MF, moe, replace(MF, ffn=0, vocab=0)]
    stacked = ModelFlops(*(np.array([getattr(m, f.name) for m in models], dtype=float) for f in fields(ModelFlops)))
    tp, etp = np.array([1, 8, 2]), np.array([1, 1, 2])
    dense, expert = timing.gemm_width_efficiency(stacked, tp, etp, d)
    for i, m in enumerate(models):
        one = timing.gemm_width_efficiency(m, int(tp[i]), int(etp[i]), d)
        assert dense[i] == pytest.approx(float(one[0]), rel=1e-12) and expert[i] == pytest.approx(float(one[1]), rel=1e-12)
    assert expert[0] == 1.0 and np.all((dense > 0) & (dense < 1))


def test_a_routed_expert_gemm_sees_its_ep_groups_tokens():
    """Under expert parallelism each of the ep ranks sends its tokens to the experts they are
    routed to, so an expert's GEMMs run tokens·top-k·ep/experts rows (each rank's 1/tp share where
    the experts have a TP of their own): a layout that folds ep·etp onto tp runs them as the
    unfolded one with the same rows per expert."""
    mf = model_flops(catalog.get_model("olmoe-1b-7b"))  # 64 experts, top 8
    x = {**BASE, "seq_len": 4096, "micro_batch": 1, "dp": 8}
    device = replace(FITTED, launch_s_per_layer=0.0)  # the card's work alone, no host wait
    base, _ = timing._microbatch_compute_s(mf, H100, device, {**x, "ep": 1})
    wide, _ = timing._microbatch_compute_s(mf, H100, device, {**x, "ep": 8})
    # 512 rows per expert at ep 1, 4,096 at ep 8: only the experts' GEMM speed changes
    d = FITTED.microbatch_half_tokens
    share = float(timing.expert_active_share(mf))
    lin = float(timing.executed_flops_per_token(mf, x)[0]) * 4096 / (H100.peak_flops * H100.utilization)
    width = float(timing.gemm_width_efficiency(mf, 1, 1, d)[1])
    eff = timing.microbatch_efficiency
    want = lin * share / width * (1 / float(eff(512, d)) - 1 / float(eff(4096, d)))
    assert float(base - wide) == pytest.approx(want, rel=1e-9)
    # at tp 2 without an expert TP of their own the experts are split like the dense layers and
    # see the whole micro-batch's routed tokens of the ep group: 4,096 rows at ep 8, 2,048 at ep 4
    c, _ = timing._microbatch_compute_s(mf, H100, device, {**x, "tp": 2, "ep": 8})
    e, _ = timing._microbatch_compute_s(mf, H100, device, {**x, "tp": 2, "ep": 4})
    width2 = float(timing.gemm_width_efficiency(mf, 2, 2, d)[1])
    want3 = lin / 2 * share / width2 * (1 / float(eff(2048, d)) - 1 / float(eff(4096, d)))
    assert float(e - c) == pytest.approx(want3, rel=1e-9)
    # at tp 2 with the experts' own TP 1 each rank dispatches its half of the tokens: 2,048 rows
    # per expert at ep 8 (4,096·8/64·8/2), 1,024 at ep 4
    a, _ = timing._microbatch_compute_s(mf, H100, device, {**x, "tp": 2, "ep": 8, "etp": 1})
    b, _ = timing._microbatch_compute_s(mf, H100, device, {**x, "tp": 2, "ep": 4, "etp": 1})
    lin2 = lin / 2  # a tp share of the micro-batch's linear FLOPs
    want2 = lin2 * share / width * (1 / float(eff(1024, d)) - 1 / float(eff(2048, d)))
    assert float(b - a) == pytest.approx(want2, rel=1e-9)


def test_a_moe_layers_launches_are_not_hidden():
    """The dropless dispatchers copy the routed tokens' counts to the host in every MoE layer, so
    the card waits for the host's launches: a micro-batch's compute gains one layer's launches per
    MoE layer on this stage and pass (MOE_HOST_SYNCS; the recomputed forward a third of a pass),
    a dense model none; where the host binds already the card waits for it alone."""
    mf = model_flops(catalog.get_model("qwen3-30b-a3b"))  # 48 MoE layers
    for pp, ckpt, passes in ((1, 0, 1.0), (2, 0, 1.0), (1, 2, 4 / 3)):
        x = {**BASE, "pp": pp, "checkpointing": ckpt, "ep": 8, "dp": 8}
        with_sync, _ = timing._microbatch_compute_s(mf, H100, FITTED, x)
        without, _ = timing._microbatch_compute_s(mf, H100, replace(FITTED, launch_s_per_layer=0.0), x)
        want = timing.MOE_HOST_SYNCS * FITTED.launch_s_per_layer * 48 / pp * passes
        assert float(with_sync - without) == pytest.approx(want, rel=1e-9)
    dense, _ = timing._microbatch_compute_s(MF, H100, FITTED, BASE)
    no_launch, _ = timing._microbatch_compute_s(MF, H100, replace(FITTED, launch_s_per_layer=0.0), BASE)
    assert float(dense) == float(no_launch)  # the 8B's device work exceeds its launches
    # a tiny micro-batch through 48 layers, 4 of them MoE: the host's launches of every layer bind
    # and include the MoE layers' (no second charge)
    few = replace(mf, moe_layers=4)
    x = {**BASE, "seq_len": 16, "micro_batch": 1, "ep": 8, "dp": 8}
    bound, _ = timing._microbatch_compute_s(few, H100, FITTED, x)
    device, _ = timing._microbatch_compute_s(few, H100, replace(FITTED, launch_s_per_layer=0.0), x)
    assert float(device) + FITTED.launch_s_per_layer * 4 < FITTED.launch_s_per_layer * 48
    assert float(bound) == pytest.approx(FITTED.launch_s_per_layer * 48, rel=1e-9)


def test_overlapped_expert_all_to_alls_hide_behind_the_micro_batch_compute():
    """``recipe.ep_overlap`` (Megatron-Core's batch-level EP overlap): a micro-batch's all-to-alls
    run during another's compute, exposed only beyond COMM_OVERLAP_SHARE of it; without it they
    add in full. A layout without expert parallelism is untouched."""
    from planner.perf.timing import _microbatch_compute_s, _model_parallel_comm_s

    mf = model_flops(catalog.get_model("qwen3-30b-a3b"))
    perf = replace(H100, gpus_per_node=8)
    x = {**BASE, "ep": 16, "dp": 16, "grad_accum": 1}
    compute, t_att = _microbatch_compute_s(mf, perf, FITTED, x)
    a2a = _model_parallel_comm_s(mf, perf, x, x["micro_batch"] * x["seq_len"], t_att, 8)[3]
    plain = float(step_time_s(mf, perf, **x))
    hidden = float(step_time_s(mf, perf, **x, ep_overlap=1))
    assert float(a2a) > 0
    assert plain - hidden == pytest.approx(float(a2a) - max(float(a2a) - COMM_OVERLAP_SHARE * float(compute), 0.0))
    assert float(step_time_s(MF, H100, **BASE, ep_overlap=1)) == float(step_time_s(MF, H100, **BASE))
