"""The detailed profile's formulas against real PyTorch + transformers + PEFT on the CPU.

Every saved-for-backward byte of a tiny Llama (random init, built from a config) is counted and
compared with ``planner.memory.activations`` over a grid of shapes and recipes: per decoder layer and
the RoPE tables exactly; outside the layers (final norm, LM head, loss) within
:data:`OUTSIDE_TOLERANCE_BYTES` (with b = 1 the loss saves one more int64 scalar). Parameter,
gradient and AdamW-state bytes are compared with ``planner.memory.model_states`` and ``planner.core.arch``.
Skipped when the ``truth`` extra (torch, transformers, peft) is not installed.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from harness import Shape, build, measure, predicted, spec_of

from planner.core.arch import exact_lora_params, param_counts

#: Outside the layers the loss saves an extra 8-byte int64 scalar for some shapes (b = 1): the
#: one tolerance of the comparison, far below any figure the planner reports.
OUTSIDE_TOLERANCE_BYTES = 8
BASE = Shape()
#: Shapes that move one dimension each (b, s, h with heads, f, KV heads, layers, vocab).
SHAPES = [BASE, Shape(b=1, s=96), Shape(h=192, heads=6, kv_heads=3), Shape(f=512),
          Shape(kv_heads=4), Shape(kv_heads=1), Shape(layers=3), Shape(vocab=1000)]
RECIPES = [
    # (label, dtype, attention, lora, adapter_fp32, checkpointing, dropout)
    ("bf16-sdpa-full", torch.bfloat16, "sdpa", False, True, False, 0.0),
    ("bf16-eager-full", torch.bfloat16, "eager", False, True, False, 0.0),
    ("fp32-sdpa-full", torch.float32, "sdpa", False, True, False, 0.0),
    ("fp32-eager-full", torch.float32, "eager", False, True, False, 0.0),
    ("bf16-sdpa-lora-fp32adapters", torch.bfloat16, "sdpa", True, True, False, 0.0),
    ("bf16-eager-lora-fp32adapters", torch.bfloat16, "eager", True, True, False, 0.0),
    ("bf16-sdpa-lora-bf16adapters", torch.bfloat16, "sdpa", True, False, False, 0.0),
    ("bf16-eager-lora-bf16adapters", torch.bfloat16, "eager", True, False, False, 0.0),
    ("bf16-sdpa-full-ckpt", torch.bfloat16, "sdpa", False, True, True, 0.0),
    ("bf16-sdpa-lora-ckpt", torch.bfloat16, "sdpa", True, True, True, 0.0),
    ("bf16-sdpa-lora-dropout", torch.bfloat16, "sdpa", True, True, False, 0.1),
]


def _run(shape, label, dtype, attention, lora, fp32, ckpt, dropout, targets=None, autocast=False):
    kw = {"dtype": dtype, "attention": attention, "lora": lora, "adapter_fp32": fp32,
              "checkpointing": ckpt, "dropout": dropout}
    if targets is not None:
        kw["targets"] = targets
    return (measure(build(shape, **kw), shape, autocast=autocast),
            predicted(shape, **kw, autocast=autocast))


@pytest.mark.parametrize("recipe", RECIPES, ids=[r[0] for r in RECIPES])
def test_saved_activations_exact_over_recipes(recipe):
    got, want = _run(BASE, *recipe)
    assert got.layers == [int(x) for x in want["layers"]], recipe[0]
    assert got.shared == want["shared"]
    assert abs(got.outside - want["outside"]) <= OUTSIDE_TOLERANCE_BYTES


@pytest.mark.parametrize("shape", SHAPES[1:], ids=[str(s) for s in SHAPES[1:]])
@pytest.mark.parametrize("recipe", [RECIPES[0], RECIPES[1], RECIPES[4]], ids=lambda r: r[0])
def test_saved_activations_exact_over_shapes(shape, recipe):
    got, want = _run(shape, *recipe)
    assert got.layers == [int(x) for x in want["layers"]]
    assert got.shared == want["shared"]
    assert abs(got.outside - want["outside"]) <= OUTSIDE_TOLERANCE_BYTES


def test_lora_targets_subset_exact():
    """q and v only (layer 0 then saves only what reaches those adapters)."""
    got, want = _run(BASE, *RECIPES[4], targets=("q", "v"))
    assert got.layers == [int(x) for x in want["layers"]]


@pytest.mark.parametrize("lora, fp32", [(False, True), (True, True), (True, False)])
def test_parameter_gradient_and_adam_bytes(lora, fp32):
    """Full FT in pure BF16: weights, gradients, m and v all 2 bytes per parameter. PEFT: FP32
    adapters (4 + 4 + 8 bytes) by default, BF16 with autocast_adapter_dtype=False."""
    shape = BASE
    got = measure(build(shape, dtype=torch.bfloat16, attention="sdpa", lora=lora, adapter_fp32=fp32), shape)
    spec = spec_of(shape)
    n_base = param_counts(spec).total
    if not lora:
        assert got.param_bytes == 2 * n_base
        assert got.trainable_bytes == got.grad_bytes == 2 * n_base
        assert got.adam_bytes == 4 * n_base
    else:
        n_lora = exact_lora_params(spec, 4)
        c = 4 if fp32 else 2
        assert got.trainable_params == n_lora
        assert got.param_bytes == 2 * n_base + c * n_lora
        assert got.grad_bytes == c * n_lora and got.adam_bytes == 2 * c * n_lora


@pytest.mark.parametrize("shape", [BASE, Shape(b=1, s=96), Shape(kv_heads=4)], ids=str)
@pytest.mark.parametrize("recipe", [RECIPES[4], RECIPES[5], RECIPES[10]], ids=lambda r: r[0])
def test_lora_under_autocast_exact(shape, recipe):
    """HF Trainer's AMP (bf16 autocast) over a bf16 model with PEFT's FP32 adapters: each module
    still copies its input to FP32, autocast re-casts it to bf16, and that copy, lora_A's bf16
    output and the adapters' bf16 weight casts are what is saved (per decoder layer, exactly)."""
    got, want = _run(shape, *recipe, autocast=True)
    assert got.layers == [int(x) for x in want["layers"]], recipe[0]
    assert got.shared == want["shared"]


@pytest.mark.parametrize("shape", [BASE, Shape(b=1, s=96), Shape(kv_heads=4)], ids=str)
@pytest.mark.parametrize("attention,targets", [("sdpa", ("q", "k", "v", "o", "gate", "up", "down")),
                                               ("sdpa", ("q", "v")),
                                               ("eager", ("q", "k", "v", "o", "gate", "up", "down"))],
                         ids=["sdpa-all", "sdpa-qv", "eager-all"])
@pytest.mark.parametrize("ckpt,dropout", [(False, 0.0), (False, 0.1), (True, 0.0)])
def test_lora_over_an_fp32_base_under_autocast_exact(shape, attention, targets, ckpt, dropout):
    """A model loaded in FP32 and trained with LoRA under bf16 autocast (Lightning's bf16-mixed,
    the Trainer's --bf16 without torch_dtype): autocast casts each frozen FP32 weight at every
    use and F.linear saves that cast for its input's gradient, the RoPE tables and the
    checkpointed layer inputs are FP32, the lm_head's cast is saved; every other tensor is what
    a bf16 base saves (``Workload.base_dtype``; per decoder layer and the tables, exactly)."""
    kw = {"attention": attention, "lora": True, "targets": targets, "checkpointing": ckpt,
          "dropout": dropout}
    got = measure(build(shape, dtype=torch.float32, **kw), shape, autocast=True)
    want = predicted(shape, dtype=torch.bfloat16, autocast=True, fp32_base=True, **kw)
    assert got.layers == [int(x) for x in want["layers"]]
    assert got.shared == want["shared"]
    assert abs(got.outside - want["outside"]) <= OUTSIDE_TOLERANCE_BYTES
    bf16 = predicted(shape, dtype=torch.bfloat16, autocast=True, **kw)
    assert sum(want["layers"]) > sum(bf16["layers"])  # the casts (or FP32 checkpoints) are counted


@pytest.mark.parametrize("shape", [BASE, Shape(b=1, s=96), Shape(f=512)], ids=str)
@pytest.mark.parametrize("prep", ["none", "peft", "trl"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_qlora_prepared_for_kbit_training_exact(shape, prep, dropout):
    """A bitsandbytes NF4 Llama under bf16 autocast, with PEFT adapters, as Hugging Face QLoRA
    scripts ready it: FP32 norms make the 4-bit MLP projections return FP32, so gate, up and
    their product are FP32; peft's FP32 embeddings also make the RoPE tables FP32 and the FP32
    lm_head's bf16 copy is saved. On the CPU PEFT's quantized layers read CUDA's autocast flag
    (off), so each adapter copies its input as the plain LoRA layers do: the formulas are
    checked with that copy (``lora_shares_input`` False), per layer and outside, exactly."""
    pytest.importorskip("bitsandbytes")
    from harness import build_qlora

    got = measure(build_qlora(shape, prep=prep, dropout=dropout), shape, autocast=True)
    want = predicted(shape, dtype=torch.bfloat16, attention="sdpa", lora=True, dropout=dropout,
                     autocast=True, kbit_prep=prep)
    assert got.layers == [int(x) for x in want["layers"]]
    assert got.shared == want["shared"]
    assert abs(got.outside - want["outside"]) <= OUTSIDE_TOLERANCE_BYTES


@pytest.mark.parametrize("prep", ["none", "peft", "trl"])
def test_qlora_adapters_share_their_input_under_cuda_autocast(prep, monkeypatch):
    """On CUDA, PEFT's bitsandbytes layers see autocast on (``torch.is_autocast_enabled()``,
    which reads CUDA's flag) and skip their FP32 input cast: an adapter then reads the layer's
    own tensor, and only FP32 inputs (behind FP32 norms) are re-cast per module. Emulated here by
    pointing that flag at the CPU's autocast state; checked exactly with ``lora_shares_input``."""
    pytest.importorskip("bitsandbytes")
    from harness import build_qlora

    flag = torch.is_autocast_enabled
    monkeypatch.setattr(torch, "is_autocast_enabled",
                        lambda device_type=None: flag(device_type or "cpu"))
    got = measure(build_qlora(BASE, prep=prep), BASE, autocast=True)
    want = predicted(BASE, dtype=torch.bfloat16, attention="sdpa", lora=True, autocast=True,
                     kbit_prep=prep, shares_input=True)
    assert got.layers == [int(x) for x in want["layers"]]
    assert got.shared == want["shared"]
    assert abs(got.outside - want["outside"]) <= OUTSIDE_TOLERANCE_BYTES


def test_sdpa_math_path_for_unexpanded_multi_query():
    """PyTorch's SDPA given multi-query K/V that were not expanded to every head runs its math
    path (no fused kernel took grouped queries before 2.5): what it saves is the scaled q, K and
    V broadcast to every head (copies ``bmm`` keeps) and the softmax output, as modelled for
    litgpt before Oct 2023 (``mqa_sdpa_math``). FP32 here, which the CPU does not upcast."""
    from planner.core.entries import ModelSpec
    from planner.memory.attention import litgpt_attention
    from planner.memory.inventory import Inventory, LayerRecipe

    b, a, s, d = 2, 8, 64, 16
    q, k, v = (torch.randn(b, heads, s, d, requires_grad=True) * 1 for heads in (a, 1, 1))
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        saved.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    spec = ModelSpec(layers=1, hidden=a * d, heads=a, kv_heads=1, head_dim=d, ffn=4 * a * d,
                     vocab=100, impl="litgpt", fused_qkv=True, mqa_sdpa_math=True)
    inv = Inventory()
    litgpt_attention(inv, spec, LayerRecipe(e=4), b * s, s)
    assert sum(saved.values()) == inv.total()


def _clamped_eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0,
                             **kwargs):
    """Today's eager attention with the clamp transformers' Llama applied before 4.31.0 (and OPT
    before 4.49.0): after adding the causal mask, ``torch.max(scores, finfo(dtype).min)`` (a
    0-d FP32 tensor), then the FP32 softmax."""
    from transformers.models.llama.modeling_llama import repeat_kv

    key = repeat_kv(key, module.num_key_value_groups)
    value = repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
        scores = torch.max(scores, torch.tensor(torch.finfo(scores.dtype).min))
    probs = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


@pytest.mark.parametrize("recipe", [RECIPES[1], RECIPES[3], RECIPES[5], RECIPES[7]],
                         ids=lambda r: r[0])
def test_eager_mask_clamp_exact(recipe, monkeypatch):
    """The clamp keeps the masked scores (``torch.max`` saves its input) in the scores' dtype,
    plus its 0-d floor: per decoder layer exactly (``ModelSpec.eager_mask_clamp``)."""
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", _clamped_eager_attention)
    label, dtype, attention, lora, fp32, ckpt, dropout = recipe
    kw = {"dtype": dtype, "attention": attention, "lora": lora, "adapter_fp32": fp32,
          "checkpointing": ckpt, "dropout": dropout}
    got = measure(build(BASE, **kw), BASE)
    want = predicted(BASE, **kw, clamp=True)
    assert got.layers == [int(x) for x in want["layers"]], label
    unclamped = predicted(BASE, **kw)
    scores = BASE.b * BASE.heads * BASE.s * BASE.s * (4 if dtype == torch.float32 else 2)
    assert want["layers"][1] - unclamped["layers"][1] == scores + 4


@pytest.mark.parametrize("prep", ["none", "peft", "trl"])
def test_eager_mask_clamp_in_the_mask_dtype(prep, monkeypatch):
    """Under bf16 autocast the scores are bf16, but the causal mask is made in the embeddings'
    dtype: with peft's FP32 embeddings the masked scores, and what the clamp keeps, are FP32
    (Baichuan-7B's and pre-4.31 Llama QLoRA runs); with bf16 embeddings they stay bf16."""
    pytest.importorskip("bitsandbytes")
    from harness import build_qlora
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", _clamped_eager_attention)
    got = measure(build_qlora(BASE, prep=prep, attention="eager"), BASE, autocast=True)
    want = predicted(BASE, dtype=torch.bfloat16, attention="eager", lora=True, autocast=True,
                     kbit_prep=prep, clamp=True)
    assert got.layers == [int(x) for x in want["layers"]]


def _cache_bytes_not_saved(model, *, autocast: bool) -> int:
    """Bytes of the storages a training forward's returned KV cache holds that no tensor saved
    for backward shares (each storage once), under bf16 autocast or not."""
    import contextlib

    saved: set[int] = set()

    def pack(t):
        saved.add(t.untyped_storage().data_ptr())
        return t

    ids = torch.randint(0, BASE.vocab, (BASE.b, BASE.s))
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with cast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids, use_cache=True)
    own = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
           for layer in out.past_key_values.layers for t in (layer.keys, layer.values)
           if t.untyped_storage().data_ptr() not in saved}
    return sum(own.values())


@pytest.mark.parametrize("prep", ["none", "peft", "trl"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_returned_kv_cache_beyond_the_saved_tensors(prep, attention):
    """A training forward with the cache on returns every layer's K and V. Where they are the
    tensors attention saved (a bf16 stream, SDPA) the cache costs nothing more; FP32 norms over
    the 4-bit base make K and V FP32, and eager attention with grouped heads saves repeated
    copies, so the cache then holds storages of its own: ``kv_cache_bytes``, per layer exactly."""
    pytest.importorskip("bitsandbytes")
    from harness import build_qlora, spec_of

    from planner.memory import activations as act
    from planner.memory.inventory import LayerRecipe

    own = _cache_bytes_not_saved(build_qlora(BASE, prep=prep, attention=attention), autocast=True)
    rec = LayerRecipe(e=2, attention="eager" if attention == "eager" else "flash",
                          trainable_base=False, fp32_stream=prep != "none")
    per_layer = act.kv_cache_bytes(spec_of(BASE), rec, BASE.b, BASE.s).total()
    assert own == BASE.layers * per_layer
    assert (per_layer > 0) == (prep != "none" or attention == "eager")  # BASE has grouped heads


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_kv_cache_returned_under_a_checkpoint_wrapper_holds_every_key_and_value(checkpointed):
    """transformers turns the cache off under its own gradient checkpointing, but not under a
    checkpoint wrapped around each layer from outside (FSDP's ``apply_activation_checkpointing``):
    such a layer saves nothing inside it, so the cache it returns holds every K and V as storages
    of its own, where without checkpointing a bf16 SDPA model's cache is the saved K and V
    (``kv_cache_bytes(checkpointed=...)``, exactly)."""
    import functools

    from harness import build, spec_of
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from planner.memory import activations as act
    from planner.memory.inventory import LayerRecipe

    model = build(BASE, dtype=torch.bfloat16, attention="sdpa", lora=False)
    if checkpointed:
        apply_activation_checkpointing(
            model, check_fn=lambda m: isinstance(m, LlamaDecoderLayer),
            checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    own = _cache_bytes_not_saved(model, autocast=False)
    rec = LayerRecipe(e=2, attention="flash", trainable_base=True)
    per_layer = act.kv_cache_bytes(spec_of(BASE), rec, BASE.b, BASE.s, checkpointed=checkpointed).total()
    assert own == BASE.layers * per_layer
    assert (per_layer > 0) == checkpointed


def test_a_fused_projection_view_keeps_the_whole_output():
    """Baichuan-7B's attention takes V as a view of its fused W_pack output (``unflatten``,
    ``transpose``, ``squeeze``, ``view``): a cache holding that V keeps all h_q + 2·h_kv columns,
    as :func:`kv_cache_bytes` counts for ``fused_qkv``."""
    from harness import spec_of

    from planner.memory import activations as act
    from planner.memory.inventory import LayerRecipe

    b, s, heads, d = BASE.b, BASE.s, BASE.heads, BASE.h // BASE.heads
    proj = torch.randn(b, s, 3 * heads * d)
    proj = proj.unflatten(-1, (3, heads * d)).unsqueeze(0).transpose(0, -2).squeeze(-2)
    v = proj[2].view(b, s, heads, d).transpose(1, 2)
    k = proj[1].view(b, s, heads, d).transpose(1, 2) * 1.0  # RoPE's output: a tensor of its own
    spec = spec_of(BASE).model_copy(update={"kv_heads": heads, "fused_qkv": True})
    rec = LayerRecipe(e=2, trainable_base=False, fp32_stream=True)
    cached = k.untyped_storage().nbytes() + v.untyped_storage().nbytes()
    assert cached == act.kv_cache_bytes(spec, rec, b, s).total()


@pytest.mark.parametrize("shape", [BASE, Shape(h=192, heads=6, kv_heads=3), Shape(vocab=1000)], ids=str)
@pytest.mark.parametrize("lora", [False, True])
def test_adafactor_state_bytes_exact(shape, lora):
    """transformers' Adafactor (its defaults: no first moment) after one step keeps FP32 row and
    column means of each matrix's squared gradient and the full moment of each vector: the
    planner's bytes per parameter times the trainable parameters, exactly."""
    from transformers.optimization import Adafactor

    from planner.core.specs import Workload
    from planner.memory.model_states import adafactor_bytes_per_param

    model = build(shape, dtype=torch.float32, attention="sdpa", lora=lora)
    trainable = [p for p in model.parameters() if p.requires_grad]
    ids = torch.randint(0, shape.vocab, (shape.b, shape.s))
    model(input_ids=ids, labels=ids).loss.backward()
    opt = Adafactor(trainable)
    opt.step()
    got = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
              if torch.is_tensor(v) and v.dim() > 0)
    wl = Workload(method="lora" if lora else "full", lora_rank=4, optimizer="adafactor",
                  lora_targets=["q", "k", "v", "o", "gate", "up", "down"])
    n = sum(p.numel() for p in trainable)
    assert got == round(adafactor_bytes_per_param(spec_of(shape), wl, flat=False) * n)
