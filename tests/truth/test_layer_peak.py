"""Peaks on the CPU against the profiler: a whole decoder layer's forward and backward (the most
bytes alive at once, beside the layer's saved tensors, is what :func:`backward_temporaries` says),
and two whole training steps of a small model against the detailed profile's allocated view.

Eager attention is where the saved-tensor count alone falls short: its softmax's backward makes
the scores' gradient twice in FP32 beside the saved FP32 probabilities
(:func:`planner.memory.activations.eager_scores_backward_bytes`), which at long sequences is as
much again as everything the layer saved. Sequences long against the hidden size make those
s²-sized terms dominate; a short one checks the MLP's gradients still bound the peak.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from harness import Shape, peak_bytes, saved_bytes, spec_of

from planner.memory import activations as act
from planner.memory.inventory import LayerRecipe

SHAPES = [  # b, s, h, f, heads, kv_heads
    (1, 1024, 32, 64, 4, 2),
    (2, 512, 64, 128, 4, 4),
    (1, 256, 256, 688, 4, 2),
]


def _measured(dtype, b, s, h, f, heads, kv, trainable: bool) -> int:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = _config("llama", b, s, h, f, heads, kv, 1, 64)
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(cfg, 0).to(dtype).train()
    for p in layer.parameters():
        p.requires_grad_(trainable)
    x = torch.randn(b, s, h, dtype=dtype, requires_grad=True)
    pos = torch.arange(s)[None].expand(b, s)
    cos, sin = LlamaRotaryEmbedding(cfg)(x, pos)  # shared by the layers: made before
    mask = torch.full((s, s), torch.finfo(dtype).min, dtype=dtype).triu(1)[None, None]
    mask = mask.expand(b, 1, s, s).contiguous()
    grad = torch.randn(b, s, h, dtype=dtype)

    def step() -> None:
        out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin))
        (out[0] if isinstance(out, tuple) else out).backward(grad)

    return peak_bytes(step)


def _predicted(dtype, b, s, h, f, heads, kv, trainable: bool) -> float:
    spec = spec_of(Shape(b=b, s=s, h=h, f=f, heads=heads, kv_heads=kv, layers=1, vocab=64))
    rec = LayerRecipe(e=4 if dtype == torch.float32 else 2, trainable_base=trainable,
                          attention="eager")
    return act.layer_saved(spec, rec, b, s).total() + act.backward_temporaries(spec, rec, b, s).total()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("trainable", [False, True], ids=["frozen", "full"])
def test_eager_layer_peak_matches_the_profiler(shape, dtype, trainable):
    """Within 8 % and never under (the parameters' gradients, a few kB here, are not counted);
    without the scores' backward term the long shapes measure 1.6–2.6 times the prediction."""
    measured = _measured(dtype, *shape, trainable)
    want = _predicted(dtype, *shape, trainable)
    assert 0.92 * want <= measured <= want + 0.01 * want, (measured, want)


STEP_SHAPES = [  # b, s, h, f, heads, kv_heads, layers, vocab
    (2, 256, 256, 688, 4, 2, 2, 2048),
    (4, 128, 512, 1376, 8, 8, 2, 1024),
    (1, 1024, 128, 352, 4, 2, 2, 1024),  # the scores dominate
]


def _config(family: str, b, s, h, f, heads, kv, layers, vocab, experts: str | None = None):
    """A transformers config of the family (Llama; Qwen3: RMSNorm on each head of q and k; OLMo 2:
    post-norms scaling in FP32 and q/k norms over the whole projection; Gemma 2:
    soft-capped scores and logits, four norms per layer scaling in FP32, GeGLU, tied embeddings;
    Gemma 3: Gemma 2's layer with q/k norms; Mixtral, Qwen2-MoE with its shared expert and
    Qwen3-MoE: four experts of width f, two per token, every layer sparse, run by
    transformers' ``experts``), eager attention, no cache."""
    import transformers

    common = {"hidden_size": h, "intermediate_size": f, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": h // heads,
              "vocab_size": vocab, "max_position_embeddings": max(s, 128), "use_cache": False,
              "attn_implementation": "eager"}
    moe = {"num_experts_per_tok": 2, "output_router_logits": False,
           **({"experts_implementation": experts} if experts else {})}
    if family == "mixtral":
        return transformers.MixtralConfig(**common, tie_word_embeddings=False, num_local_experts=4, **moe)
    if family == "qwen2_moe":
        return transformers.Qwen2MoeConfig(**common, tie_word_embeddings=False, num_experts=4,
                                           moe_intermediate_size=f, shared_expert_intermediate_size=f,
                                           decoder_sparse_step=1, **moe)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, tie_word_embeddings=False, num_experts=4,
                                           moe_intermediate_size=f, decoder_sparse_step=1, **moe)
    if family == "gemma2":  # a window as long as the sequence: every layer sees all of it
        return transformers.Gemma2Config(**common, sliding_window=max(s, 128))
    if family == "gemma3":
        return transformers.Gemma3TextConfig(**common, sliding_window=max(s, 128))
    if family == "qwen3":
        return transformers.Qwen3Config(**common, tie_word_embeddings=False)
    if family == "olmo2":  # norms after attention and MLP, q/k norms over the whole projection
        return transformers.Olmo2Config(**{k: v for k, v in common.items() if k != "head_dim"},
                                        tie_word_embeddings=False, pad_token_id=0)
    if family == "phi":  # parallel attention and GELU MLP on one LayerNorm, biases, gelu_new
        return transformers.PhiConfig(**{k: v for k, v in common.items()
                                         if k not in ("head_dim", "num_key_value_heads")},
                                      tie_word_embeddings=False, hidden_act="gelu_new")
    if family == "opt":  # LayerNorm, learned positions, ReLU, biases
        return transformers.OPTConfig(hidden_size=h, ffn_dim=f, num_hidden_layers=layers,
                                      num_attention_heads=heads, vocab_size=vocab,
                                      max_position_embeddings=max(s, 128), dropout=0.0,
                                      attention_dropout=0.0, word_embed_proj_dim=h,
                                      use_cache=False, attn_implementation="eager", pad_token_id=1)
    if family == "gpt2":  # LayerNorm, learned positions, gelu_new, softmax in BF16
        return transformers.GPT2Config(n_embd=h, n_layer=layers, n_head=heads, n_inner=f,
                                       n_positions=max(s, 128), vocab_size=vocab, resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                                       attn_implementation="eager")
    return transformers.LlamaConfig(**common, tie_word_embeddings=False)


def _step_measured(cfg, b, s, ckpt: bool, lora: bool, precision: str) -> int:
    """Peak bytes of two steps (forward, backward, AdamW step, gradients set to None), weights
    included: BF16 weights (``bf16``), or as the HF Trainer runs ``bf16=True`` (``mixed``): FP32
    weights (a LoRA base loaded in BF16) under BF16 autocast."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    if precision == "bf16" or lora:
        model = model.to(torch.bfloat16)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:  # Llama-style module names
        from peft import LoraConfig, get_peft_model

        if ckpt:
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    model.train()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4,
                            foreach=False)  # what AdamW runs on the CPU
    ids = torch.randint(0, cfg.vocab_size, (b, s))

    def steps() -> None:
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "mixed"):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)

    return peak_bytes(steps) + weights


def _step_predicted(cfg, b, s, ckpt: bool, lora: bool, precision: str) -> int:
    """The allocated view for the same config, read by the planner's config.json reader."""
    from planner.catalog.hf_config import spec_from_hf_config
    from planner.memory.estimate import memory_of
    from planner.scenario.resolve import resolve

    spec = spec_from_hf_config(cfg.to_dict())
    adapters = {"lora_rank": 8, "lora_targets": ["q", "k", "v", "o", "gate", "up", "down"]}
    scenario = {
        "name": "cpu-step",
        "model": spec.model_dump(exclude={"id", "family"}, exclude_none=True),
        "workload": {"method": "lora" if lora else "full", "precision": precision, "seq_len": s,
                     "micro_batch": b, "global_batch": b, **(adapters if lora else {})},
        "layout": {"gpu": "h100", "attention": "eager", "checkpointing": "full" if ckpt else "none"},
        "recipe": {"optimizer_step": "for_loop"},
    }
    return memory_of(resolve(scenario)).predicted["allocated_bytes"]


#: (family, precision): every family in BF16, the HF Trainer's AMP recipe on Llama.
STEP_RECIPES = [("llama", "bf16"), ("llama", "mixed"), ("qwen3", "bf16"), ("gemma2", "bf16"),
                ("gemma3", "bf16"), ("olmo2", "bf16")]


@pytest.mark.parametrize("shape", STEP_SHAPES)
@pytest.mark.parametrize("ckpt", [False, True], ids=["no-ckpt", "ckpt"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("family, precision", STEP_RECIPES)
def test_a_training_step_peak_matches_the_profiler(family, precision, shape, ckpt, lora):
    """Within −8 % / +5 % of the allocated view (measured 0.93–1.04; the low end is eager
    attention at 1,024 tokens). Without the q/k norms' saved tensors Qwen3 measured up to 1.09
    times the prediction and Gemma 3 up to 1.15; without the FP32-scaled norm outputs Gemma 2 up
    to 1.06 and OLMo 2 up to 1.05. Full fine-tuning with checkpointing measured 0.91–0.93 while
    the first layer's and the embedding's gradients were counted beside that layer's
    recomputation (they are made after it); now 1.00. Known: LoRA with checkpointing in BF16
    with PEFT's FP32 adapters and no autocast is up to 4 % low (the FP32 gradients of the
    adapters' paths; under the Trainer's autocast recipe 0.99–1.00). Without eager attention's
    backward term the long-sequence shape measures 1.4 times the prediction."""
    cfg = _config(family, *shape)
    b, s = shape[:2]
    measured = _step_measured(cfg, b, s, ckpt, lora, precision)
    want = _step_predicted(cfg, b, s, ckpt, lora, precision)
    assert 0.92 * want <= measured <= 1.05 * want, (measured, want, measured / want)


@pytest.mark.parametrize("shape", STEP_SHAPES[:2])
@pytest.mark.parametrize("ckpt", [False, True], ids=["no-ckpt", "ckpt"])
@pytest.mark.parametrize("family", ["gpt2", "phi", "opt"])
def test_plain_mlp_families_step_peak_matches_the_profiler(family, shape, ckpt):
    """Full fine-tuning of GPT-2, Phi and OPT-style models, read from their configs: transformers'
    gelu_new keeps three FFN-wide tensors beside its input, GPT-2's eager softmax runs in BF16 and
    ReLU keeps only its output (measured 0.98–1.02; without those terms GPT-2 measured up to 1.12
    times the prediction and OPT 0.95, and a Phi config read as two RMSNorms without biases up to
    1.10)."""
    cfg = _config(family, *shape)
    b, s = shape[:2]
    measured = _step_measured(cfg, b, s, ckpt, False, "bf16")
    want = _step_predicted(cfg, b, s, ckpt, False, "bf16")
    assert 0.92 * want <= measured <= 1.05 * want, (measured, want, measured / want)


MOE_FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe"]


@pytest.mark.parametrize("experts", ["grouped_mm", "eager"])
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_a_moe_layer_saves_what_the_profile_counts(family, experts):
    """One sparse decoder layer's saved tensors, full fine-tuning in BF16, against the profile's
    inventory: the router keeps its input and FP32 probabilities, each routed token's copy is
    the experts' input, their MLP keeps four FFN-wide tensors and the routing weight's multiply
    keeps each expert output; transformers' eager expert loop (``moe_experts`` loop, as in
    transformers 4) also keeps each weighted output on ``index_add_``. Measured 1.00–1.02 of the
    count (indices and routing weights left out); without the router's input and the loop's
    kept outputs the count was 3 % (grouped) and 7 % (loop) low."""
    from transformers import AutoModelForCausalLM

    from planner.catalog.hf_config import spec_from_hf_config

    b, s, h, f, heads, kv = 2, 256, 256, 688, 4, 2
    cfg = _config(family, b, s, h, f, heads, kv, 1, 512, experts=experts)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    layer = model.model.layers[0]
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    rope = model.model.rotary_emb(x, torch.arange(s)[None].expand(b, s))
    measured = saved_bytes(model, lambda: layer(x, position_embeddings=rope))
    rec = LayerRecipe(e=2, attention="eager", one_dtype=True, moe_loop=experts == "eager")
    want = act.layer_saved(spec_from_hf_config(cfg.to_dict()), rec, b, s).total()
    assert want <= measured <= 1.02 * want, (measured, want, measured / want)


@pytest.mark.parametrize("shape", STEP_SHAPES)
@pytest.mark.parametrize("ckpt", [False, True], ids=["no-ckpt", "ckpt"])
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_a_moe_training_step_peak_matches_the_profiler(family, shape, ckpt):
    """Full fine-tuning of MoE models as transformers 5 runs them by default (grouped experts),
    within −8 % / +5 % of the allocated view (measured 0.95–1.00)."""
    cfg = _config(family, *shape)
    b, s = shape[:2]
    measured = _step_measured(cfg, b, s, ckpt, False, "bf16")
    want = _step_predicted(cfg, b, s, ckpt, False, "bf16")
    assert 0.92 * want <= measured <= 1.05 * want, (measured, want, measured / want)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_a_moe_optimizer_step_holds_two_copies_of_the_fused_expert_weight(family):
    """AdamW one tensor at a time (what it runs on the CPU) over a MoE model as transformers 5
    builds it: the largest tensor it steps is the experts' fused ``gate_up_proj`` (experts × 2f ×
    h), and ``exp_avg_sq.sqrt() / bias_correction2_sqrt`` holds two copies of it. Measured over a
    step whose states an earlier step made: within 1 % (14 % of it without the fused tensor,
    when the largest was taken to be a dense matrix)."""
    from transformers import AutoModelForCausalLM

    from planner.catalog.hf_config import spec_from_hf_config
    from planner.core.specs import Layout, Recipe, Workload
    from planner.memory.buffers import buffer_terms
    from planner.memory.model_states import model_states

    b, s, h, f, heads, kv = 2, 64, 256, 688, 4, 2
    cfg = _config(family, b, s, h, f, heads, kv, 1, 512)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()  # the states exist from here on
    measured = peak_bytes(opt.step)
    spec = spec_from_hf_config(cfg.to_dict())
    wl = Workload(method="full", precision="bf16")
    recipe = Recipe(optimizer_step="for_loop")
    st = model_states(spec, wl, recipe=recipe, tp=1, pp=1, zero_degree=1, zero=0, offload="none",
                      adapter_bytes=2)
    want = buffer_terms(spec, wl, Layout(dp=1), st, recipe=recipe)["optimizer_temp"]
    assert want == pytest.approx(2 * 2 * 4 * 2 * f * h)  # two BF16 copies of 4 experts' gate_up
    assert 0.99 * want <= measured <= 1.01 * want, (measured, want)
