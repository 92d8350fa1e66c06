"""The ``detailed`` profile: per-layer formulas against published CPU measurements, state bytes,
phases and views, and the estimate contract.

Golden figures: ``../shared/design/cpu-ground-truth.md`` §4 (HF Llama, h=256, f=688, L=4, a=8,
a_kv=2, V=1000, s=128, b=2, random init, torch 2.13 CPU), re-measured by ``tests/truth``.
"""

from __future__ import annotations

import pytest

import planner
from planner.core.arch import exact_lora_params
from planner.core.entries import ModelSpec
from planner.memory import activations as act
from planner.memory.inventory import LayerRecipe
from planner.memory.logits import loss_bytes
from planner.memory.model_states import NF4_BYTES, NF4_DQ_BYTES

TINY = ModelSpec(layers=4, hidden=256, heads=8, kv_heads=2, head_dim=32, ffn=688, vocab=1000)
ALL = frozenset({"q", "k", "v", "o", "gate", "up", "down"})


def _rec(e, attention, lora=False, c=None, first=False, dropout=False):
    return LayerRecipe(e=e, attention=attention, trainable_base=not lora,
                           lora_targets=ALL if lora else frozenset(), c=c or e,
                           lora_rank=8 if lora else 0, lora_dropout=dropout, mask_bytes=c or e,
                           input_requires_grad=not first)


# (label, recipe, bytes per decoder layer measured on CPU) — cpu-ground-truth.md §4 table
LAYER_CASES = [
    ("bf16 eager full", _rec(2, "eager"), 4_556_800),
    ("bf16 sdpa full", _rec(2, "flash"), 2_795_520),
    ("fp32 eager full", _rec(4, "eager"), 6_490_112),
    ("fp32 sdpa full", _rec(4, "flash"), 5_056_512),
    ("bf16 eager lora fp32 adapters", _rec(2, "eager", True, 4), 5_883_904),
    ("bf16 eager lora layer 0", _rec(2, "eager", True, 4, first=True), 5_620_736),
    ("bf16 sdpa lora fp32 adapters", _rec(2, "flash", True, 4), 4_253_696),
    ("bf16 sdpa lora layer 0", _rec(2, "flash", True, 4, first=True), 3_990_528),
    ("fp32 eager lora", _rec(4, "eager", True, 4), 6_023_168),
    ("fp32 sdpa lora", _rec(4, "flash", True, 4), 4_589_568),
    ("fp32 sdpa lora layer 0", _rec(4, "flash", True, 4, first=True), 4_326_400),
    ("bf16 sdpa lora dropout 0.05 (CPU float masks)", _rec(2, "flash", True, 4, dropout=True), 6_531_072),
]


@pytest.mark.parametrize("label, rec, expected", LAYER_CASES, ids=[c[0] for c in LAYER_CASES])
def test_layer_saved_matches_cpu_measurements(label, rec, expected):
    assert act.layer_saved(TINY, rec, 2, 128).total() == expected


def test_checkpoint_head_and_shared_match_cpu_measurements():
    """GC keeps e·b·s·h per layer (131,072 bf16; 262,144 fp32); the head saves 1,551,364 bytes
    in bf16 full FT and 1,289,220 with LoRA (final norm, LM-head input, FP32 log-probs, labels,
    nll's 4-byte total_weight); RoPE cos/sin 16,384 (bf16)."""
    bf16, fp32 = _rec(2, "flash"), _rec(4, "flash")
    assert act.checkpoint_saved(TINY, bf16, 2, 128).total() == 131_072
    assert act.checkpoint_saved(TINY, fp32, 2, 128).total() == 262_144
    loss_saved, _, _ = loss_bytes(TINY, 2, 256, "standard")
    head = act.head_saved(TINY, bf16, 2, 128, lm_head_trainable=True, embedding_trainable=False)
    assert head + loss_saved + 4 == 1_551_364
    lora_head = act.head_saved(TINY, _rec(2, "flash", True, 4), 2, 128, lm_head_trainable=False,
                               embedding_trainable=False)
    assert lora_head + loss_saved + 4 == 1_289_220
    assert act.shared_saved(TINY, bf16, 2, 128) == 16_384


def test_exact_lora_count_and_nf4_bytes():
    """cpu-ground-truth.md §3: r=8 on all 7 projections = 143,872 trainable parameters.
    memory-references.md §6: NF4 4.5 bits/param, with double quantization 4.127 bits."""
    assert exact_lora_params(TINY, 8) == 143_872
    assert NF4_BYTES * 8 == pytest.approx(4.5)
    assert NF4_DQ_BYTES * 8 == pytest.approx(4.127, abs=0.001)


def test_korthikanti_selective_and_tp_split():
    """TP with sequence parallelism divides everything by t; without it the h-wide tensors
    (norms, layer input) stay whole — Korthikanti et al. 2022 §4.2."""
    inv = act.layer_saved(TINY, _rec(2, "flash"), 2, 128)
    assert inv.total(tp=4, sp=True) == pytest.approx(inv.total() / 4)
    assert inv.total() / 4 < inv.total(tp=4, sp=False) < inv.total()


LLAMA_8B_LORA = {"model": "llama-3.1-8b", "workload": {"method": "lora", "seq_len": 2048},
                 "layout": {"gpu": "a100-80gb"}}


def test_estimate_contract_detailed():
    est = planner.estimate(LLAMA_8B_LORA)
    assert est.profile == "detailed"  # the default once it beat seed on measured runs
    p = est.predicted
    assert p["allocated_bytes"] <= p["reserved_bytes"] <= p["device_bytes"]
    # the total is what the run needs at the card's limit: at most what nvidia-smi would show
    assert p["allocated_bytes"] <= p["needed_bytes"] == est.total_bytes <= p["device_bytes"]
    assert sum(est.components.values()) == est.total_bytes
    assert est.components["overhead"] == p["needed_bytes"] - p["allocated_bytes"]
    assert est.error_band > 0 and est.tight is (est.headroom_bytes < est.error_band * est.total_bytes)
    seed = planner.estimate(LLAMA_8B_LORA, profile="seed")
    assert seed.predicted is None and seed.error_band is None and seed.tight is None


def test_tight_when_headroom_inside_band():
    """A plan that fits with less headroom than the method's measured error is marked tight."""
    est = planner.estimate(LLAMA_8B_LORA)
    usable_needed = est.total_bytes * (1 + est.error_band / 2)
    reserve = 1 - usable_needed / est.capacity_bytes
    tight = planner.estimate(LLAMA_8B_LORA, reserve=reserve)
    assert tight.fits and tight.tight


@pytest.mark.parametrize("change, smaller", [
    ({"layout": {"checkpointing": "full"}}, True),
    ({"layout": {"checkpointing": "selective"}}, True),
    ({"recipe": {"loss": "chunked"}}, True),
    ({"recipe": {"optimizer_step": "in_backward"}, "layout": {"checkpointing": "full"}}, True),
    ({"workload": {"micro_batch": 2}}, False),
])
def test_recipe_knobs_move_memory_the_right_way(change, smaller):
    base = {"model": "llama-3.2-3b", "workload": {"method": "full", "seq_len": 4096, "precision": "bf16"}}
    if "layout" in change and "checkpointing" in change["layout"] and "recipe" in change:
        base = planner.scenario.files.deep_merge(base, {"layout": change["layout"]})  # vary one knob
    a = planner.estimate(base).predicted["allocated_bytes"]
    b = planner.estimate(planner.scenario.files.deep_merge(base, change)).predicted["allocated_bytes"]
    assert (b < a) if smaller else (b > a)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_stages_never_add_memory(zero):
    base = {"model": "llama-3.1-8b", "workload": {"method": "full", "precision": "mixed"},
            "layout": {"gpus": 8, "checkpointing": "full"}}
    lower = planner.estimate(planner.scenario.files.deep_merge(base, {"layout": {"zero": max(zero - 1, 0)}}))
    here = planner.estimate(planner.scenario.files.deep_merge(base, {"layout": {"zero": zero}}))
    assert here.components.get("optimizer_states", 0) <= lower.components.get("optimizer_states", 0)
    assert here.components.get("weights", 0) <= lower.components.get("weights", 0)


def test_array_form_equals_estimates():
    """The search's array evaluation gives exactly the totals single estimates give."""
    import numpy as np

    from planner.memory.breakdown import ATTENTION, CHECKPOINTING, METHODS, OFFLOADS, OPTIMIZERS, PRECISIONS
    from planner.memory.profiles import memory_components
    from planner.scenario.resolve import resolve

    rs = resolve({"model": "llama-3.1-8b", "workload": {"method": "lora"}})
    ckpts = np.array([0, 2, 2])
    dps = np.array([1, 1, 4])
    zeros = np.array([0, 0, 3])
    got = memory_components("detailed", rs.model, rs.overrides, base=(rs.workload, rs.layout, rs.recipe),
                            method=METHODS.index("lora"), precision=PRECISIONS.index("mixed"),
                            optimizer=OPTIMIZERS.index("adamw"), checkpointing=ckpts,
                            attention=ATTENTION.index("flash"), offload=OFFLOADS.index("none"),
                            seq_len=2048, micro_batch=1, lora_rank=16, tp=1, pp=1, cp=1, sp=0,
                            zero=zeros, dp=dps, grad_accum=0)
    for i in range(3):
        est = planner.estimate({"model": "llama-3.1-8b", "workload": {"method": "lora"},
                                "layout": {"checkpointing": CHECKPOINTING[ckpts[i]],
                                           "dp": int(dps[i]), "zero": int(zeros[i])}})
        assert got["total"][i] == est.total_bytes


def test_litgpt_lora_layer_matches_cpu_measurement():
    """litgpt's own modules (commit 8641822, Oct 2023: fused QKV, ``LoRAQKVLinear`` on q and v,
    RMSNorm in the input dtype, LLaMA MLP) saved 664,064 bytes in decoder layer 1 of a tiny
    bf16 model (h=128, 4 heads = 4 KV heads, f=344, b=2, s=64, r=4, dropout 0.05) on torch 2.13
    CPU, counted with ``saved_tensors_hooks`` (each storage once, parameters excluded). The
    inventory: v is a view of the fused QKV output (kept whole), ``index_copy`` keeps the
    zero-padded q/v update, the CPU dropout mask is bf16 (2 bytes; bool on CUDA)."""
    model = ModelSpec(layers=3, hidden=128, heads=4, kv_heads=4, ffn=344, vocab=512,
                      fused_qkv=True, impl="litgpt", norm_upcast=False)
    rec = LayerRecipe(e=2, attention="flash", trainable_base=False,
                          lora_targets=frozenset({"q", "v"}), c=2, lora_rank=4, lora_dropout=True,
                          mask_bytes=2)
    inv = act.layer_saved(model, rec, 2, 64)
    assert inv.total() == 664_064
    hf = act.layer_saved(model.model_copy(update={"impl": "hf", "norm_upcast": True}), rec, 2, 64)
    tokens, h = 128, 128
    # litgpt keeps the fused output (6h) for v instead of v (2h), plus the padded update (4h);
    # its bf16 RMSNorms keep 2h + 2 each where HF's keep an FP32 copy, 4h + 4.
    assert inv.whole["norm1.input"] == tokens * 2 * h
    assert inv.split["attn.qkv_out"] - hf.split["attn.v"] == tokens * 4 * h
    assert inv.split["qkv.lora_zero_pad_source"] == tokens * 4 * h


def test_litgpt_gqa_expands_kv_and_all_qkv_lora_pads_nothing():
    """With fewer KV heads litgpt expands and reshapes k and v to all heads (copies), and a
    LoRA on all of q, k and v is added without zero padding."""
    model = ModelSpec(layers=2, hidden=256, heads=8, kv_heads=2, ffn=688, vocab=1000,
                      fused_qkv=True, impl="litgpt")
    rec = LayerRecipe(e=2, attention="flash", trainable_base=False,
                          lora_targets=frozenset({"q", "k", "v"}), c=2, lora_rank=8)
    inv = act.layer_saved(model, rec, 2, 128)
    assert inv.split["attn.k_expanded"] == inv.split["attn.v_expanded"] == 256 * 2 * 256
    assert "qkv.lora_zero_pad_source" not in inv.split and "attn.qkv_out" not in inv.split


def test_fsdp_units_mixing_frozen_weights_give_them_gradients():
    """FSDP1 with use_orig_params=True: a LoRA layer wrapped whole gets a gradient for its whole
    flat parameter, "equivalent to not freezing" (PyTorch FSDP docs): the layers' weights in the
    compute dtype, sharded over the data-parallel ranks."""
    from planner.catalog.store import get_model
    from planner.core.arch import param_counts

    base = {"model": "llama-2-7b", "workload": {"method": "lora", "precision": "bf16", "seq_len": 1024},
            "layout": {"gpus": 4, "zero": 3, "checkpointing": "full"}}
    plain = planner.estimate(base)
    mixed = planner.estimate(planner.scenario.files.deep_merge(base, {"recipe": {"fsdp_mixed_units": True}}))
    counts = param_counts(get_model("llama-2-7b"))
    layers_bytes = (counts.attention + counts.mlp) * 2
    assert plain.components.get("gradients", 0) == 0
    assert mixed.components["gradients"] == pytest.approx(layers_bytes / 4, abs=2)


def test_legacy_bitsandbytes_keeps_every_frozen_input():
    """bitsandbytes before 0.43.2 keeps each 4-bit matmul's input (ctx.tensors); current versions
    keep none, so only the adapters' own inputs are saved."""
    base = {"model": "llama-3.1-8b", "workload": {"method": "qlora", "precision": "bf16",
                                                  "seq_len": 2048, "lora_targets": ["q", "v"]}}
    now = planner.estimate(base).components["activations"]
    legacy = planner.estimate(planner.scenario.files.deep_merge(
        base, {"recipe": {"bnb_keeps_input": True}})).components["activations"]
    # per layer and token: the norms' outputs (h each) and the MLP product (f) in bf16; the
    # attention output is kept by SDPA anyway; layer 0's first norm output needs no gradient.
    model = planner.catalog.get_model("llama-3.1-8b")
    per_layer = 2048 * 2 * (2 * model.hidden + model.ffn)
    assert per_layer * (model.layers - 1) < legacy - now <= per_layer * model.layers


def test_llm_int8_matmuls_keep_their_input_and_its_int8_copy_per_module():
    """bitsandbytes' MatMul8bitLt (autograd/_functions.py, 0.40.0 to 0.44.1) keeps
    ``(CAt, subA, A)`` whenever its input needs a gradient: the layer's own input, shared by the
    modules that read it, plus an int8 copy (1 byte per element) per module; 0.45.0 keeps A
    alone. A LoRA layer on q and v, per token: the MLP's input (h) and product (f) in fp16 once
    (the adapters on q and v already save the attention's input); int8 copies for q, k, v, o,
    gate, up (6 × h) and down (f)."""
    model = planner.catalog.get_model("llama-2-7b")
    wl = {"method": "qlora", "quant_bits": 8, "precision": "fp16", "seq_len": 1024,
          "lora_targets": ["q", "v"]}
    base = {"model": "llama-2-7b", "workload": wl, "layout": {"checkpointing": "none"}}

    def acts(**extra):
        merged = planner.scenario.files.deep_merge(base, {"recipe": extra})
        return planner.estimate(merged).components["activations"]

    dropped, now, with_copy = (acts(bnb_keeps_input=False), acts(),
                               acts(int8_keeps_transposed=True))
    tokens, h, f = 1024, model.hidden, model.ffn
    inputs = tokens * 2 * (h + f)
    assert inputs * (model.layers - 1) < now - dropped <= inputs * model.layers
    copies = tokens * (6 * h + f)
    assert copies * (model.layers - 1) < with_copy - now <= copies * model.layers


def test_llm_int8_temporaries_follow_the_bitsandbytes_release():
    """The largest LLM.int8 temporary at 4,096 tokens is the MLP's forward: up to 0.44 an int8
    input and its col32 layout (2 bytes per input element) and int32, FP16 and cloned FP16
    results (8 bytes per output element); from 0.45 1 + 6 bytes."""
    from planner.core.specs import Layout, Recipe, Workload
    from planner.memory.buffers import buffer_terms
    from planner.memory.model_states import StateParts

    model = planner.catalog.get_model("llama-2-7b")
    t, h, f = 4096, model.hidden, model.ffn
    for transposed, expected in ((True, t * (2 * h + 8 * f)), (False, t * (h + 6 * f))):
        wl = Workload(method="qlora", quant_bits=8, precision="fp16", seq_len=t)
        recipe = Recipe(int8_keeps_transposed=transposed)
        states = StateParts(device={}, host=0.0, trainable=0.0, largest_grad=0.0)
        layout = Layout(gpus=1, dp=1)
        assert buffer_terms(model, wl, layout, states, recipe=recipe)["dequant"] == pytest.approx(expected)


def test_soft_capped_attention_is_eager_in_litgpt_and_keeps_its_tanh():
    """Gemma 2 under litgpt: soft-capped scores bypass SDPA, so a layer keeps the s² scores' tanh,
    FP32 softmax and its bf16 copy (2 + 4 + 2 bytes per score) beside q, K and V."""
    from planner.catalog.store import get_model

    gemma = get_model("gemma-2-2b")
    litgpt = gemma.model_copy(update={"impl": "litgpt", "fused_qkv": True, "tied_embeddings": False})
    rec = LayerRecipe(e=2, attention="flash")
    b, s = 1, 512
    layer = act.layer_saved(litgpt, rec, b, s)
    scores = b * gemma.heads * s * s
    assert layer.split["attn.softcap_tanh"] == 2 * scores
    assert layer.split["attn.softmax_fp32"] == 4 * scores
    hf = act.layer_saved(gemma, rec, b, s)  # Hugging Face: FlashAttention-2 caps in the kernel
    assert "attn.softcap_tanh" not in hf.split and "attn.lse" in hf.split


def test_first_step_has_no_gradients_from_earlier_micro_batches():
    """At a run's first micro-batch nothing has accumulated yet: its backward start holds no
    gradients, so the peak moves to its backward end, where its own unsharded gradients exist."""
    base = {"model": "llama-2-7b",
            "workload": {"method": "full", "precision": "bf16", "seq_len": 2048, "grad_accum": 4},
            "layout": {"gpus": 2, "zero": 3}, "recipe": {"unsharded_grad_accumulation": True}}
    steady = planner.estimate(base)
    first = planner.estimate(planner.scenario.files.deep_merge(base, {"recipe": {"peak_at_first_step": True}}))
    assert steady.components["gradients"] > 0
    assert "peak phase: backward start" in steady.assumptions
    assert "peak phase: backward end" in first.assumptions
    assert first.components["gradients"] == steady.components["gradients"]  # unsharded, whole
    assert first.total_bytes < steady.total_bytes


def test_inference_memory_with_the_data_parallel_degree_given_apart():
    """The layout's dp may be unset (the search passes it beside the layout): NCCL groups are
    counted with the degree given, and two replicas of a TP-2 layout need one more group."""
    from planner import catalog
    from planner.core.specs import Layout, Overrides, Recipe, Workload
    from planner.memory.detailed import NCCL_COMMUNICATOR_BYTES, detailed_memory

    model = catalog.get_model("llama-3.1-8b")
    wl = Workload(method="inference", seq_len=2048, micro_batch=1)
    one = detailed_memory(model, wl, Layout(tp=2), Overrides(), recipe=Recipe(), dp=1).total_bytes
    two = detailed_memory(model, wl, Layout(tp=2), Overrides(), recipe=Recipe(), dp=2).total_bytes
    assert two - one == NCCL_COMMUNICATOR_BYTES


def test_the_three_class_verdict_follows_fits_and_tight():
    """``verdict`` in the estimate's JSON: does_not_fit when it does not fit, tight when it fits
    inside the method's error band of the card, fits otherwise; plans carry the same."""
    import planner

    roomy = planner.estimate(model="llama-3.1-8b", method="qlora", gpu="h100", checkpointing="full")
    assert (roomy.fits, roomy.tight, roomy.verdict) == (True, False, "fits")
    over = planner.estimate(model="llama-3.1-70b", method="full", gpu="h100")
    assert (over.fits, over.verdict) == (False, "does_not_fit")
    # the tight side: grow the sequence until the headroom falls inside the error band
    seq = 256
    est = planner.estimate(model="llama-3.2-1b", method="lora", gpu="rtx-4090", seq_len=seq, micro_batch=4)
    while est.fits and not est.tight and seq < 65536:
        seq += 64  # a step adds far less than the 8 % band, so the verdict passes through tight
        est = planner.estimate(model="llama-3.2-1b", method="lora", gpu="rtx-4090", seq_len=seq, micro_batch=4)
    assert est.fits and est.tight and est.verdict == "tight"
    assert est.model_dump(mode="json")["verdict"] == "tight"
