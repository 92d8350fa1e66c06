"""Ground truth on the CPU: build a tiny Hugging Face Llama from a config (random init, nothing
downloaded), train one step with real PyTorch / transformers / PEFT, and count exact bytes.

Measured per run:
- parameters, gradients and AdamW state (``exp_avg`` + ``exp_avg_sq``) in bytes;
- tensors saved for backward, through ``torch.autograd.graph.saved_tensors_hooks``, each
  storage once (keyed by its data pointer; parameters excluded), attributed to the decoder layer
  that saved it: ``layers[i]`` (saved by layer i only), ``shared`` (saved by several layers: the
  RoPE tables) and ``outside`` (saved outside the layers: final norm, LM head, loss, input ids).

Needs the ``truth`` extra (torch, transformers, peft). CPU caveats: dropout masks are float in
the input dtype (bool on CUDA); AdamW runs its single-tensor path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Shape:
    b: int = 2
    s: int = 64
    h: int = 128
    f: int = 344
    heads: int = 4
    kv_heads: int = 2
    layers: int = 2
    vocab: int = 512


@dataclass
class Measured:
    layers: list[int]
    shared: int
    outside: int
    param_bytes: int
    trainable_params: int
    trainable_bytes: int
    grad_bytes: int
    adam_bytes: int


def build(shape: Shape, *, dtype: torch.dtype, attention: str, lora: bool, adapter_fp32: bool = True,
          rank: int = 4, targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down"),
          dropout: float = 0.0, checkpointing: bool = False):
    """A LlamaForCausalLM from a LlamaConfig (untied, no biases), optionally wrapped by PEFT."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=shape.h, intermediate_size=shape.f, num_hidden_layers=shape.layers,
                      num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                      vocab_size=shape.vocab, max_position_embeddings=max(shape.s, 128),
                      tie_word_embeddings=False, use_cache=False, attn_implementation=attention)
    model = LlamaForCausalLM(cfg).to(dtype)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        from peft import LoraConfig, get_peft_model

        names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj",
                 "up": "up_proj", "down": "down_proj"}
        conf = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=dropout,
                          target_modules=[names[t] for t in targets])
        model = get_peft_model(model, conf, autocast_adapter_dtype=adapter_fp32)
    model.train()
    return model


def _decoder_layers(model) -> list:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    return [m for m in model.modules() if isinstance(m, LlamaDecoderLayer)]


def _model_storages(model) -> set[int]:
    """Data pointers of the model's parameters' and buffers' storages: what a saved-tensor count
    leaves out (views of them included)."""
    return ({p.untyped_storage().data_ptr() for p in model.parameters()}
            | {b.untyped_storage().data_ptr() for b in model.buffers()})


def measure(model, shape: Shape, *, autocast: bool = False) -> Measured:
    """One forward (saved tensors counted; under CPU bf16 autocast if asked), backward and AdamW
    step; byte counts."""
    layers = _decoder_layers(model)
    current: list[int | None] = [None]
    param_ptrs = _model_storages(model)
    saved: dict[int, tuple[int, set]] = {}

    def pre(i):
        def hook(module, args, kwargs=None):
            current[0] = i
        return hook

    def post(module, args, output):
        current[0] = None

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(pre(i)))
        handles.append(layer.register_forward_hook(post))

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in param_ptrs:
            entry = saved.setdefault(ptr, (storage.nbytes(), set()))
            entry[1].add(current[0])
        return t

    torch.manual_seed(1)
    ids = torch.randint(0, shape.vocab, (shape.b, shape.s))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids)
    for h in handles:
        h.remove()
    per_layer = [0] * len(layers)
    shared = outside = 0
    for n_bytes, owners in saved.values():
        in_layers = {o for o in owners if o is not None}
        if len(in_layers) > 1:
            shared += n_bytes
        elif in_layers:
            per_layer[in_layers.pop()] += n_bytes
        else:
            outside += n_bytes
    out.loss.backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4)
    opt.step()
    adam = sum(v.numel() * v.element_size() for st in opt.state.values()
               for k, v in st.items() if k in ("exp_avg", "exp_avg_sq"))
    return Measured(
        layers=per_layer, shared=shared, outside=outside,
        param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
        trainable_params=sum(p.numel() for p in trainable),
        trainable_bytes=sum(p.numel() * p.element_size() for p in trainable),
        grad_bytes=sum(p.grad.numel() * p.grad.element_size() for p in trainable if p.grad is not None),
        adam_bytes=adam,
    )


def spec_of(shape: Shape):
    """The planner's ModelSpec for the same architecture."""
    from planner.core.entries import ModelSpec

    return ModelSpec(layers=shape.layers, hidden=shape.h, heads=shape.heads, kv_heads=shape.kv_heads,
                     head_dim=shape.h // shape.heads, ffn=shape.f, vocab=shape.vocab,
                     tied_embeddings=False, gated_mlp=True, norm="rmsnorm")


#: The loss's FP32 ``total_weight`` scalar that ``nll_loss`` saves (4 bytes).
NLL_TOTAL_WEIGHT_BYTES = 4


def predicted(shape: Shape, *, dtype: torch.dtype, attention: str, lora: bool, adapter_fp32: bool = True,
              rank: int = 4, targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down"),
              dropout: float = 0.0, checkpointing: bool = False, autocast: bool = False,
              kbit_prep: str = "none", shares_input: bool = False, clamp: bool = False,
              fp32_base: bool = False) -> dict:
    """What the planner's formulas say the same run saves (CPU: float dropout masks)."""
    from planner.memory import activations as act
    from planner.memory.inventory import LayerRecipe
    from planner.memory.logits import loss_bytes

    spec = spec_of(shape)
    e = 4 if dtype == torch.float32 else 2
    c = (4 if adapter_fp32 else e) if lora else e

    def rec(first: bool) -> LayerRecipe:
        return LayerRecipe(
            e=e, attention="eager" if attention == "eager" else "flash", trainable_base=not lora,
            lora_targets=frozenset(targets) if lora else frozenset(), c=c,
            lora_rank=rank if lora else 0, lora_dropout=lora and dropout > 0, mask_bytes=c,
            input_requires_grad=not (first and lora and not checkpointing), autocast=autocast,
            fp32_stream=kbit_prep != "none", fp32_embeddings=kbit_prep == "peft" or fp32_base,
            fp32_base=fp32_base,
            lora_shares_input=shares_input,
            clamp_bytes=(4 if kbit_prep == "peft" else e) if clamp else 0)

    b, s = shape.b, shape.s
    if checkpointing:
        layers = [act.checkpoint_saved(spec, rec(False), b, s).total()] * shape.layers
        shared = 0.0
    else:
        layers = [act.layer_saved(spec, rec(i == 0), b, s).total() for i in range(shape.layers)]
        shared = act.shared_saved(spec, rec(False), b, s)
    loss_saved, _, _ = loss_bytes(spec, e, b * s, "standard")
    outside = (act.head_saved(spec, rec(False), b, s, lm_head_trainable=not lora,
                              embedding_trainable=not lora) + loss_saved + NLL_TOTAL_WEIGHT_BYTES)
    return {"layers": layers, "shared": shared, "outside": outside}


def build_qlora(shape: Shape, *, prep: str, rank: int = 4, dropout: float = 0.0,
                targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down"),
                attention: str = "sdpa"):
    """A bitsandbytes NF4 (double-quantized) Llama as Hugging Face loads it, prepared the way a
    QLoRA script does: ``prep="peft"`` runs ``peft.prepare_model_for_kbit_training`` (every
    16-bit weight to FP32), ``"trl"`` then casts embeddings and lm_head back to bf16 as TRL's
    ``peft_module_casting_to_bf16`` does, ``"none"`` leaves them bf16. Needs bitsandbytes."""
    import tempfile

    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=shape.h, intermediate_size=shape.f, num_hidden_layers=shape.layers,
                      num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                      vocab_size=shape.vocab, max_position_embeddings=max(shape.s, 128),
                      tie_word_embeddings=False, use_cache=False, attn_implementation=attention)
    with tempfile.TemporaryDirectory() as tmp:
        LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp)
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                   bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=quant, device_map="cpu",
                                                     dtype=torch.bfloat16, attn_implementation=attention)
    if prep != "none":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj",
             "up": "up_proj", "down": "down_proj"}
    conf = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=dropout,
                      target_modules=[names[t] for t in targets])
    model = get_peft_model(model, conf)
    if prep == "trl":
        for name, module in model.named_modules():
            if ("embed_tokens" in name or "lm_head" in name) and hasattr(module, "weight"):
                module.to(torch.bfloat16)
    model.train()
    return model


def peak_bytes(run) -> int:
    """The most bytes allocated at once while ``run()`` runs: the profiler's allocation and free
    events replayed in time order (what was allocated before it is not counted, nor its frees)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    now = peak = 0
    for event in events:
        now += event.nbytes()
        peak = max(peak, now)
    return peak


def saved_bytes(model, run) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``run()`` runs, the
    model's parameters and buffers (and views of them, such as one expert's slice of a fused
    expert weight) left out."""
    params = _model_storages(model)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in params:
            saved[ptr] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(saved.values())
