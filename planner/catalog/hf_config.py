"""Read a local Hugging Face ``config.json`` into a :class:`ModelSpec` (never the hub).

Covers the families in the catalog (Llama, Mistral, Mixtral, Qwen2/2.5/3 and their MoE
variants, Gemma 1/2/3, Phi-3, DeepSeek-V2/V3, OLMo 1/2, OLMoE, gpt-oss, OPT, GPT-2 style,
GPT-NeoX and Pythia, and the remote-code Qwen v1, ChatGLM 1-3 / GLM-4, Baichuan and InternLM2) by
the keys their configs use; other decoder-only configs that use the standard key names load too.
A config whose layers are not all softmax-attention decoder layers of one shape (linear
attention, state-space or convolution blocks, an encoder-decoder, per-layer widths) is refused
with the key that shows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.core.entries import MLASpec, ModelSpec, MoESpec
from planner.core.errors import InputError
from planner.core.textfiles import is_dir, is_file, load_json

#: model_type -> extra facts the config does not state but the architecture implies.
_FAMILY_FACTS: dict[str, dict[str, Any]] = {
    "qwen2": {"qkv_bias": True},
    "qwen2_moe": {"qkv_bias": True},
    # Qwen v1 (remote code QWen): one fused c_attn with bias, no other bias; its config's
    # intermediate_size is the width of w1 and w2 together (each is half of it, see below).
    "qwen": {"qkv_bias": True, "fused_qkv": True},
    # Baichuan and Baichuan2 (remote code): one fused W_pack q/k/v linear without bias.
    "baichuan": {"fused_qkv": True},
    # InternLM2 / 2.5 (remote code): one fused wqkv linear, no biases.
    "internlm2": {"fused_qkv": True},
    # ChatGLM 1-3 and GLM-4 (remote code): one fused query_key_value linear (the rest by version:
    # _chatglm_keys).
    "chatglm": {"fused_qkv": True},
    # GPT-NeoX and Pythia: two LayerNorms (attention and MLP in parallel), one fused
    # query_key_value linear, biases on every linear, a GELU MLP.
    "gpt_neox": {"norm": "layernorm", "fused_qkv": True, "qkv_bias": True, "o_bias": True,
                 "mlp_bias": True},
    # OLMo 1: LayerNorm without affine weights (counted as LayerNorm: 2·hidden per norm apart).
    "olmo": {"norm": "layernorm"},
    # OLMoE: RMSNorm on the full Q and K projections, as OLMo 2.
    "olmoe": {"qk_norm": True},
    "qwen3": {"qk_norm": True},
    "qwen3_moe": {"qk_norm": True},
    # Gemma 1 configs name the activation "gelu" but the MLP is GeGLU (gated).
    # Gemma's RMSNorm scales by (1 + weight) in FP32 before casting back.
    "gemma": {"gated_mlp": True, "norm_fp32_scale": True},
    "gemma2": {"norms_per_layer": 4, "norm_fp32_scale": True},
    "gemma3": {"norms_per_layer": 4, "qk_norm": True, "norm_fp32_scale": True},
    "gemma3_text": {"norms_per_layer": 4, "qk_norm": True, "norm_fp32_scale": True},
    # DeepSeek's config classes default to untied embeddings (their config.json omit the key).
    "deepseek_v2": {"tied_embeddings": False},
    "deepseek_v3": {"tied_embeddings": False},
    # OLMo 2: RMSNorm on the full Q and K projections (counted as per-head norms: a few
    # thousand parameters per layer apart), norms after attention and MLP.
    # Its RMSNorm multiplies by the weight in FP32 before casting back, as Gemma's does.
    "olmo2": {"qk_norm": True, "norm_fp32_scale": True},
    # gpt-oss experts carry biases (gate_up and down), as do its attention projections.
    "gpt_oss": {"mlp_bias": True},
    # Phi-1/1.5/2 and GPT-J: attention and MLP in parallel on one LayerNorm; Phi has biases on
    # every linear, GPT-J on its MLP only.
    "phi": {"norm": "layernorm", "norms_per_layer": 1, "qkv_bias": True, "o_bias": True,
            "mlp_bias": True},
    "gptj": {"norm": "layernorm", "norms_per_layer": 1, "mlp_bias": True},
    "opt": {
        "gated_mlp": False, "norm": "layernorm", "position": "learned",
        "qkv_bias": True, "o_bias": True, "mlp_bias": True,
    },
    "gpt2": {
        "gated_mlp": False, "norm": "layernorm", "position": "learned",
        "qkv_bias": True, "o_bias": True, "mlp_bias": True,
        # its eager attention softmaxes in the compute dtype (modeling_gpt2 eager_attention_forward)
        "softmax_fp32": False,
    },
}

#: model_type -> ``tie_word_embeddings`` of its transformers config class, where that is not
#: the older base class's True: what a config.json without the key means. Read in transformers'
#: ``models/<type>/configuration_<type>.py`` at commit 008e5743 (``tie_word_embeddings: bool =
#: False``) for llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, phi, phi3, olmo,
#: olmo2, gpt_neox, granite, glm; as an ``__init__`` default of False for gptj (c4c7dfb7),
#: stablelm (1459750d) and gpt_oss (02b8f42b). Gemma 1–3, Starcoder2, Cohere and SmolLM3 declare
#: True, as the base class did. A Llama config without the key has an untied head (Llama 3.1 8B:
#: 8.03B parameters, not 7.50B).
TIE_DEFAULT: dict[str, bool] = {t: False for t in (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi", "phi3", "olmo",
    "olmo2", "gpt_neox", "granite", "glm", "gptj", "stablelm", "gpt_oss")}

_GATED_ACTIVATIONS = {"silu", "swiglu", "gelu_pytorch_tanh", "geglu", "gelu_new_gated"}


class ConfigError(ValueError):
    pass


#: ``layer_types`` entries whose layer is a softmax-attention decoder layer, the one structure
#: the planner's formulas describe (a sliding, chunked or local window changes which keys a
#: query sees, not what the layer holds for backward under FlashAttention or SDPA).
_ATTENTION_LAYER_TYPES = frozenset({
    "full_attention", "sliding_attention", "chunked_attention", "window_attention", "attention",
    "global", "local",
})
#: Keys of hybrid configs that list or place their non-attention blocks (Jamba, Bamba, Zamba,
#: Falcon-H1, Granite 4.0-H, Nemotron-H, RecurrentGemma; MiniMax-Text-01's original config).
_HYBRID_KEYS = ("layers_block_type", "hybrid_override_pattern", "attn_layer_period", "block_types",
                "attn_type_list", "linear_attn_config", "attn_layer_indices")
#: The keys a layer's shape is read from (a list in any of them: layers differ, as in Gemma 3n).
_SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "moe_intermediate_size", "num_experts_per_tok",
               "vocab_size")
#: Keys only state-space (Mamba, Mamba-2) and short-convolution (LFM2) blocks have, besides
#: every ``mamba_*`` key of the hybrids.
_STATE_SPACE_KEYS = frozenset({"ssm_state_size", "state_size", "time_step_rank", "ssm_cfg",
                               "conv_L_cache"})


def _unmodelled_layers(cfg: dict[str, Any], source: str) -> str | None:
    """Why a config's layers are not the softmax-attention decoder layers the formulas describe
    (None when they are). Linear attention (Gated DeltaNet, Lightning), state-space (Mamba) and
    convolution mixers have other parameters and keep other tensors for backward: counting them
    as attention layers would print a precise-looking wrong number."""
    if cfg.get("is_encoder_decoder"):
        return f"{source}: is_encoder_decoder is true: encoder-decoder models are not modelled"
    kinds = cfg.get("layer_types")
    if isinstance(kinds, list):
        other = [k for k in kinds if str(k).lower() not in _ATTENTION_LAYER_TYPES]
        if other:
            counts = {str(k): other.count(k) for k in dict.fromkeys(other)}
            listed = ", ".join(f"{n} {k}" for k, n in counts.items())
            return (f"{source}: layer_types has {listed} of {len(kinds)} layers: only "
                    "softmax-attention decoder layers are modelled (linear-attention, state-space "
                    "and convolution layers have other parameters and activations)")
    ssm = sorted(k for k in cfg if k.startswith("mamba_") or k in _STATE_SPACE_KEYS)
    if ssm:
        return (f"{source}: {ssm[0]} describes state-space or convolution blocks: only "
                "softmax-attention decoder layers are modelled")
    attention_at = cfg.get("full_attn_idxs")
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers")
    if isinstance(attention_at, list) and isinstance(layers, int) and len(attention_at) < layers:
        return (f"{source}: full_attn_idxs names {len(attention_at)} of {layers} layers as "
                "attention (the others are convolution blocks): only softmax-attention decoder "
                "layers are modelled")
    for key in _HYBRID_KEYS:
        if cfg.get(key) is not None:
            return (f"{source}: {key} places non-attention blocks (state-space, recurrent or "
                    "linear attention) among the layers: only softmax-attention decoder layers "
                    "are modelled")
    return None


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def _chatglm_keys(cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """ChatGLM's remote-code config in the standard keys, and the facts of its version that no
    key states. ChatGLM2/3 and GLM-4 (``ChatGLMModel`` with ``ffn_hidden_size``): GLM blocks of
    RMSNorm, a fused QKV with bias (``add_qkv_bias``), ``multi_query_group_num`` K/V heads, a
    SwiGLU ``ffn_hidden_size`` wide per branch, ``padded_vocab_size`` rows and a separate
    ``output_layer``. The first ChatGLM (``inner_hidden_size``): LayerNorm, GELU MLP, biases on
    every linear, and an ``lm_head`` tied to the word embeddings (THUDM/chatglm-6b: 6.2B)."""
    out, facts = dict(cfg), {}
    if "ffn_hidden_size" in cfg:
        out.setdefault("intermediate_size", cfg["ffn_hidden_size"])
        out.setdefault("vocab_size", cfg.get("padded_vocab_size"))
        if cfg.get("multi_query_attention"):  # ChatGLMConfig's default: False, every head its K/V
            out.setdefault("num_key_value_heads", cfg.get("multi_query_group_num"))
        out.setdefault("head_dim", cfg.get("kv_channels"))
        out.setdefault("max_position_embeddings", cfg.get("seq_length"))
        out.setdefault("tie_word_embeddings", False)
        out.setdefault("attention_bias", bool(cfg.get("add_qkv_bias", False)))
        out.setdefault("hidden_act", "silu")
        facts = {"o_bias": bool(cfg.get("add_bias_linear", False)),
                 "mlp_bias": bool(cfg.get("add_bias_linear", False))}
    elif "inner_hidden_size" in cfg:
        out.setdefault("intermediate_size", cfg["inner_hidden_size"])
        out.setdefault("max_position_embeddings", cfg.get("max_sequence_length"))
        out.setdefault("tie_word_embeddings", True)
        out.setdefault("hidden_act", "gelu")
        facts = {"norm": "layernorm", "qkv_bias": True, "o_bias": True, "mlp_bias": True}
    return out, facts


def spec_from_hf_config(cfg: dict[str, Any], *, source: str = "config.json") -> ModelSpec:
    """Map a parsed config to a ModelSpec; raises :class:`ConfigError` naming what is missing."""
    if "text_config" in cfg and "num_hidden_layers" not in cfg:
        # Multimodal wrappers (Gemma 3, Llama 4...): the language model is what trains here.
        # The wrapper's own tie_word_embeddings speaks for the language model where its
        # text_config is silent (Llama 4: untied at the top, no key in text_config).
        tied = {"tie_word_embeddings": cfg["tie_word_embeddings"]} if "tie_word_embeddings" in cfg else {}
        cfg = {**tied, **cfg["text_config"], "model_type": cfg["text_config"].get("model_type", "")}
    model_type = str(cfg.get("model_type", "")).lower()
    version_facts: dict[str, Any] = {}
    if model_type == "chatglm":
        cfg, version_facts = _chatglm_keys(cfg)
    reason = _unmodelled_layers(cfg, source)
    if reason:
        raise ConfigError(reason)
    per_layer = [k for k in _SHAPE_KEYS if isinstance(cfg.get(k), list)]
    if per_layer:
        raise ConfigError(f"{source}: {', '.join(per_layer)} gives one value per layer: layers of "
                          "different shapes are not modelled")
    fields: dict[str, Any] = {
        "id": Path(source).parent.name or "custom",
        "layers": _first(cfg, "num_hidden_layers", "n_layer", "num_layers"),
        "hidden": _first(cfg, "hidden_size", "n_embd", "d_model"),
        "heads": _first(cfg, "num_attention_heads", "n_head"),
        "vocab": cfg.get("vocab_size"),
    }
    missing = [k for k in ("layers", "hidden", "heads", "vocab") if fields[k] is None]
    if missing:
        raise ConfigError(f"{source} lacks {', '.join(missing)} (not a decoder LLM config?)")
    _check_sizes(cfg, source)
    fields["kv_heads"] = _first(cfg, "num_key_value_heads", default=fields["heads"])
    fields["head_dim"] = cfg.get("head_dim") or fields["hidden"] // fields["heads"]
    ffn = _first(cfg, "intermediate_size", "n_inner", "ffn_dim")
    fields["ffn"] = ffn if ffn is not None else 4 * fields["hidden"]
    if model_type == "qwen" and ffn is not None:
        # QWenMLP: w1 and w2 are each intermediate_size // 2 wide (Qwen-7B: 22016 -> 11008)
        fields["ffn"] = ffn // 2
    # Where the config.json leaves the key out, its model type's config class decides.
    fields["tied_embeddings"] = bool(cfg.get("tie_word_embeddings", TIE_DEFAULT.get(model_type, True)))
    act = str(_first(cfg, "hidden_act", "hidden_activation", "activation_function", default="silu"))
    fields["gated_mlp"] = act in _GATED_ACTIVATIONS
    # transformers' gelu_new is the tanh formula written out in Python: three more FFN-wide tensors
    fields["activation_saved_copies"] = 3 if act == "gelu_new" else 0
    fields["activation_keeps_output"] = act == "relu"  # ReLU keeps its output, GELU its input
    fields["qkv_bias"] = bool(cfg.get("attention_bias", False))
    fields["o_bias"] = bool(cfg.get("attention_bias", False)) and model_type not in {"qwen2"}
    fields["mlp_bias"] = bool(cfg.get("mlp_bias", False))
    fields["max_position"] = _first(cfg, "max_position_embeddings", "n_positions")
    fields["attention_softcap"] = cfg.get("attn_logit_softcapping") is not None
    fields["logit_softcap"] = cfg.get("final_logit_softcapping") is not None
    fields.update(_FAMILY_FACTS.get(model_type, {}))
    fields.update(version_facts)

    if model_type == "llama4_text" and cfg.get("num_local_experts"):
        # Llama 4 (transformers' Llama4TextMoe): routed experts and one shared expert, each
        # intermediate_size wide, in every interleave_moe_layer_step-th layer; the other layers'
        # MLP is intermediate_size_mlp wide. Scout: 17B active of its 107.8B language model.
        cfg = {**cfg, "moe_intermediate_size": cfg.get("intermediate_size"),
               "shared_expert_intermediate_size": cfg.get("intermediate_size"),
               "decoder_sparse_step": cfg.get("interleave_moe_layer_step", 1)}
        fields["ffn"] = cfg.get("intermediate_size_mlp") or fields["ffn"]
        fields["qk_norm"] = bool(cfg.get("use_qk_norm", False))
    experts = _first(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    if experts:
        fields["moe"] = MoESpec(
            experts=experts,
            active=_first(cfg, "num_experts_per_tok", "moe_top_k", "moe_topk", default=2),
            expert_ffn=_first(cfg, "moe_intermediate_size", default=fields["ffn"]),
            # DeepSeek: n_shared_experts of moe_intermediate_size; Qwen MoE: one shared expert of
            # shared_expert_intermediate_size.
            shared_experts=_first(cfg, "n_shared_experts",
                                  default=1 if cfg.get("shared_expert_intermediate_size") else 0),
            shared_ffn=_first(cfg, "moe_intermediate_size", default=0)
            if cfg.get("n_shared_experts")
            else _first(cfg, "shared_expert_intermediate_size", default=0),
            first_dense_layers=_first(cfg, "first_k_dense_replace", default=0),
            moe_every=_first(cfg, "decoder_sparse_step", "moe_layer_freq", default=1),
        )
    if cfg.get("kv_lora_rank"):
        fields["mla"] = MLASpec(
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=cfg["kv_lora_rank"],
            qk_nope_head_dim=cfg["qk_nope_head_dim"],
            qk_rope_head_dim=cfg["qk_rope_head_dim"],
            v_head_dim=cfg["v_head_dim"],
        )
    fields["family"] = model_type or None
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        raise ConfigError("; ".join(
            f"{source}: {_CONFIG_KEY.get(str(e['loc'][0]), e['loc'][0]) if e['loc'] else 'config'}: "
            f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())) from None


#: The config.json key a model field was read from, to name it in a message.
_CONFIG_KEY = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
               "kv_heads": "num_key_value_heads", "vocab": "vocab_size", "ffn": "intermediate_size",
               "head_dim": "head_dim", "max_position": "max_position_embeddings"}
#: Sizes a config gives as positive whole numbers (the first present of each group is read).
_SIZE_KEYS = (("num_hidden_layers", "n_layer", "num_layers"), ("hidden_size", "n_embd", "d_model"),
              ("num_attention_heads", "n_head"), ("vocab_size",), ("num_key_value_heads",), ("head_dim",),
              ("intermediate_size", "n_inner", "ffn_dim"))


def _check_sizes(cfg: dict[str, Any], source: str) -> None:
    """Every size the config gives is a positive whole number: one line per key that is not
    (a zero head count would divide by zero; a float or a string is a typo, not a size)."""
    problems = []
    for group in _SIZE_KEYS:
        key = next((k for k in group if cfg.get(k) is not None), None)
        if key is None:
            continue
        value = cfg[key]
        whole = isinstance(value, int) and not isinstance(value, bool)
        if isinstance(value, float) and value.is_integer():
            whole = True
        if not whole or value < 1:
            problems.append(f"{source}: {key}: {str(value)[:40]!s} is not a positive whole number")
    if problems:
        raise ConfigError("; ".join(problems))


def load_hf_config(path: Path) -> ModelSpec:
    path = Path(path)
    if is_dir(path):
        path = path / "config.json"
    if not is_file(path):
        raise ConfigError(f"no such file {str(path)!r}")
    try:
        cfg = load_json(path)
    except InputError as exc:
        raise ConfigError("; ".join(exc.problems)) from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} does not hold a JSON object")
    return spec_from_hf_config(cfg, source=str(path))
