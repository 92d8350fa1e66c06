"""A local Hugging Face config.json is accepted wherever a model name is (no hub access)."""

from __future__ import annotations

import json

import pytest
from conftest import FIXTURES, ROOT, one_line
from typer.testing import CliRunner

import planner
from planner import catalog
from planner.cli.main import app
from planner.core.arch import param_counts
from planner.core.errors import InputError

HF = FIXTURES / "hf"


@pytest.mark.parametrize("name", ["qwen2.5-7b", "mixtral-8x7b", "qwen3-30b-a3b", "gemma-2-9b", "deepseek-v3"])
def test_config_matches_catalog_entry(name):
    """Reading the real config gives exactly the count of the hand-curated catalog entry."""
    from_config = catalog.get_model(str(HF / name / "config.json"))
    assert param_counts(from_config).total == param_counts(catalog.get_model(name)).total


def test_gpt2_xl_exact_count():
    """GPT-2 XL (learned positions, biases, LayerNorm, tied head): 1,557,611,200 parameters,
    as counted by transformers' GPT2LMHeadModel (sum of p.numel() over unique parameters)."""
    spec = catalog.get_model(str(HF / "gpt2-xl"))
    assert param_counts(spec).total == 1_557_611_200


def test_shipped_config_estimates_like_catalog_name():
    path = ROOT / "scenarios" / "configs" / "llama-3.1-8b" / "config.json"
    common = {"method": "lora", "seq_len": 1024, "micro_batch": 1, "gpu": "l4"}
    by_path = planner.estimate(model=str(path), **common)
    by_name = planner.estimate(model="llama-3.1-8b", **common)
    assert by_path.total_bytes == by_name.total_bytes
    assert by_path.params == 8_030_261_248  # meta-llama/Llama-3.1-8B safetensors total


def test_bad_config_files(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "vision.json").write_text(json.dumps({"model_type": "vit", "hidden_size": 768}))
    for path, needle in (("broken.json", "not valid JSON"), ("vision.json", "lacks layers"),
                         ("missing.json", "no such file")):
        with pytest.raises(InputError, match=needle):
            planner.estimate(model=str(tmp_path / path), gpu="h100")


#: A dense decoder's keys, to which each case below adds what a real config of another kind of
#: model carries (the keys of transformers' configuration classes for those models).
_DENSE = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 1000,
          "intermediate_size": 128}
_QWEN3_5_TEXT = {**_DENSE, "model_type": "qwen3_5_text", "linear_num_value_heads": 32,
                 # Qwen3_5TextConfig: every fourth layer attention, the rest Gated DeltaNet
                 "layer_types": ["linear_attention"] * 3 + ["full_attention"]}


@pytest.mark.parametrize("cfg, key", [
    (_QWEN3_5_TEXT, "3 linear_attention of 4 layers"),
    ({"model_type": "qwen3_5", "text_config": _QWEN3_5_TEXT}, "layer_types"),  # multimodal wrapper
    ({**_DENSE, "model_type": "lfm2", "layer_types": ["conv", "conv", "full_attention", "conv"]},
     "3 conv of 4"),
    ({**_DENSE, "model_type": "jamba", "attn_layer_period": 8, "mamba_d_state": 16}, "mamba_d_state"),
    ({**_DENSE, "model_type": "falcon_mamba", "state_size": 16}, "state_size"),
    ({**_DENSE, "model_type": "recurrent_gemma", "block_types": ["recurrent", "attention"]}, "block_types"),
    ({**_DENSE, "model_type": "nemotron_h", "hybrid_override_pattern": "M-M*-"}, "hybrid_override_pattern"),
    ({**_DENSE, "model_type": "t5", "is_encoder_decoder": True}, "is_encoder_decoder"),
    ({**_DENSE, "model_type": "gemma3n_text", "intermediate_size": [128] * 4}, "intermediate_size"),
])
def test_layers_that_are_not_one_attention_shape_are_refused(tmp_path, cfg, key):
    """Counting Gated DeltaNet, Mamba or convolution blocks (or per-layer widths) as attention
    layers gives a precise-looking wrong number: such a config is refused, naming the key."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=key):
        planner.estimate(model=str(path), gpu="h100")


def test_window_attention_layers_are_attention_layers():
    """Sliding, chunked and full attention layers hold the same parameters: a config listing them
    counts as one that lists none (Gemma 2/3, gpt-oss, Llama 4 name their layers so)."""
    from planner.catalog.hf_config import spec_from_hf_config

    kinds = ["sliding_attention", "full_attention", "chunked_attention", "full_attention"]
    listed = spec_from_hf_config({**_DENSE, "layer_types": kinds})
    assert param_counts(listed).total == param_counts(spec_from_hf_config(_DENSE)).total


def test_a_refused_config_is_one_line_exit_2(tmp_path):
    from typer.testing import CliRunner

    from planner.cli.main import app

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_QWEN3_5_TEXT))
    result = CliRunner().invoke(app, ["estimate", "--model", str(path), "--gpu", "h100"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "layer_types" in lines[0], result.output


def test_hunyuan_names_its_routed_experts_moe_topk():
    """Hunyuan's MoE configs give the experts each token is routed to as ``moe_topk``."""
    from planner.catalog.hf_config import spec_from_hf_config

    spec = spec_from_hf_config({**_DENSE, "model_type": "hunyuan_v1_moe", "num_experts": 16,
                                "moe_topk": 1})
    assert spec.moe is not None and spec.moe.active == 1


def test_gemma_and_olmo2_norms_scale_in_fp32_by_catalog_and_by_config():
    """Gemma's RMSNorm multiplies by (1 + weight) in FP32 (transformers' GemmaRMSNorm), OLMo 2's
    by its weight, so a trainable weight keeps the FP32 normalised input: the catalog entries and
    their configs agree."""
    from planner.catalog.hf_config import spec_from_hf_config

    assert catalog.get_model(str(HF / "gemma-2-9b" / "config.json")).norm_fp32_scale
    assert spec_from_hf_config({**_DENSE, "model_type": "olmo2"}).norm_fp32_scale
    assert not spec_from_hf_config({**_DENSE, "model_type": "llama"}).norm_fp32_scale
    # Gemma 1-3 and OLMo 2 (OLMo 1's LayerNorm has no weight; OLMoE's RMSNorm casts first)
    assert all(m.norm_fp32_scale == (m.family == "gemma" or m.id.startswith("olmo-2"))
               for m in catalog.models())


def test_gpt2_keeps_its_gelu_and_bf16_softmax_by_catalog_and_by_config():
    """transformers' gelu_new (the tanh formula in Python) keeps three FFN-wide tensors beyond
    its input; GPT-2's eager attention softmaxes in the compute dtype."""
    from_config = catalog.get_model(str(HF / "gpt2-xl"))
    for spec in (from_config, catalog.get_model("gpt2-xl")):
        assert spec.activation_saved_copies == 3 and not spec.softmax_fp32


def test_phi_reads_as_one_layernorm_with_biases():
    """Phi-1/1.5/2 configs name neither their LayerNorm nor their biases: the family says so."""
    from planner.catalog.hf_config import spec_from_hf_config

    spec = spec_from_hf_config({**_DENSE, "model_type": "phi", "hidden_act": "gelu_new"})
    assert (spec.norm, spec.norms_per_layer) == ("layernorm", 1)
    assert spec.qkv_bias and spec.o_bias and spec.mlp_bias and spec.activation_saved_copies == 3


def test_relu_keeps_its_output_by_catalog_and_by_config():
    """ReLU keeps its output, which is the down projection's saved input: OPT's MLP keeps one
    FFN-wide tensor, not two."""
    from planner.catalog.hf_config import spec_from_hf_config

    spec = spec_from_hf_config({**_DENSE, "model_type": "opt", "activation_function": "relu"})
    assert spec.activation_keeps_output and catalog.get_model("opt-1.3b").activation_keeps_output
    assert not spec_from_hf_config({**_DENSE, "model_type": "gpt2"}).activation_keeps_output


@pytest.mark.parametrize("key, value", [
    ("num_attention_heads", 0), ("num_hidden_layers", -2), ("hidden_size", 64.5), ("vocab_size", "abc"),
    ("num_attention_heads", True), ("num_key_value_heads", 0), ("intermediate_size", None or -1),
])
def test_a_size_that_is_no_positive_whole_number_is_one_line_exit_2(tmp_path, key, value):
    """A config.json's sizes are read as counts: zero heads used to divide by zero (exit 3); a
    float, a string, a boolean or a negative count is named with its key, exit 2."""
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "vocab_size": 100, "intermediate_size": 128, key: value}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = CliRunner().invoke(app, ["estimate", "--model", str(tmp_path / "config.json"), "--method", "lora"])
    assert out.exit_code == 2, out.output
    line = one_line(out.output)
    assert key in line and "positive whole number" in line, out.output


def test_a_model_level_rule_is_one_line_naming_the_config(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 3, "vocab_size": 100, "intermediate_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = CliRunner().invoke(app, ["estimate", "--model", str(tmp_path / "config.json"), "--method", "lora"])
    assert out.exit_code == 2
    assert [line for line in out.output.splitlines() if line.strip()] == [
        f"error: model: {tmp_path / 'config.json'}: config: kv_heads (3) must divide heads (4)"]


@pytest.mark.parametrize("model_type, tied", [("llama", False), ("qwen2", False), ("qwen3", False),
                                              ("mistral", False), ("mixtral", False), ("phi3", False),
                                              ("olmo2", False), ("gemma", True), ("gpt2", True)])
def test_a_config_without_tie_word_embeddings_takes_its_model_type_s_default(tmp_path, model_type, tied):
    """transformers' LlamaConfig, Qwen2Config, Qwen3Config and MistralConfig default to untied
    embeddings; the base class ties them. A Llama 3.1 8B config.json stripped of the key is the
    8,030,261,248-parameter model, not one with a tied head."""
    from planner.catalog.hf_config import spec_from_hf_config

    cfg = {"model_type": model_type, "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}
    spec = spec_from_hf_config(cfg)
    assert spec.tied_embeddings is tied
    assert spec_from_hf_config({**cfg, "tie_word_embeddings": not tied}).tied_embeddings is (not tied)
    if model_type == "llama":
        assert param_counts(spec).total == 8_030_261_248


def test_qwen_v1_reads_its_mlp_as_two_halves():
    """Qwen v1's remote-code QWenMLP has w1 and w2 each ``intermediate_size // 2`` wide and one
    fused c_attn. Qwen/Qwen-7B's config.json keys (hidden 4096, intermediate_size 22016, 32
    layers, vocab 151,936, untied) give 7,721,324,544 parameters, the count public benchmark
    tables list for Qwen-7B; read as one 22016-wide SwiGLU it would be 10.5B."""
    from planner.catalog.hf_config import spec_from_hf_config

    spec = spec_from_hf_config({"model_type": "qwen", "hidden_size": 4096, "intermediate_size": 22016,
                                "num_attention_heads": 32, "num_hidden_layers": 32, "kv_channels": 128,
                                "vocab_size": 151936, "tie_word_embeddings": False, "no_bias": True})
    assert spec.ffn == 11008 and spec.fused_qkv and spec.qkv_bias and not spec.o_bias
    assert param_counts(spec).total == 7_721_324_544
    assert param_counts(catalog.get_model("Qwen/Qwen-7B-Chat")).total == 7_721_324_544


def test_chatglm_configs_read_in_their_own_keys():
    """ChatGLM's remote-code configs name their sizes ``num_layers``, ``ffn_hidden_size``,
    ``multi_query_group_num`` and ``padded_vocab_size`` (ChatGLM2/3, GLM-4), or
    ``inner_hidden_size`` (the first ChatGLM, 6.2B by its model card: a GELU MLP, LayerNorm,
    biases, a tied head). Both read as the catalog entries do."""
    from planner.catalog.hf_config import spec_from_hf_config

    v2 = spec_from_hf_config({"model_type": "chatglm", "num_layers": 28, "hidden_size": 4096,
                              "num_attention_heads": 32, "multi_query_attention": True,
                              "multi_query_group_num": 2, "kv_channels": 128, "ffn_hidden_size": 13696,
                              "padded_vocab_size": 65024, "seq_length": 32768, "add_qkv_bias": True,
                              "add_bias_linear": False, "rmsnorm": True})
    entry = catalog.get_model("chatglm2-6b")
    assert param_counts(v2).total == param_counts(entry).total
    assert (v2.kv_heads, v2.fused_qkv, v2.qkv_bias, v2.o_bias, v2.tied_embeddings) == (2, True, True, False, False)
    assert entry.fused_qkv and catalog.get_model("glm-4-9b").fused_qkv
    # multi_query_group_num counts only under multi_query_attention (ChatGLMConfig default off)
    no_mqa = spec_from_hf_config({"model_type": "chatglm", "num_layers": 2, "hidden_size": 64,
                                  "num_attention_heads": 4, "multi_query_group_num": 2,
                                  "ffn_hidden_size": 128, "padded_vocab_size": 100})
    assert no_mqa.kv_heads == 4
    v1 = spec_from_hf_config({"model_type": "chatglm", "num_layers": 28, "hidden_size": 4096,
                              "num_attention_heads": 32, "inner_hidden_size": 16384,
                              "max_sequence_length": 2048, "vocab_size": 130528,
                              "position_encoding_2d": True})
    assert param_counts(v1).total / 1e9 == pytest.approx(6.2, rel=0.01)
    assert (v1.norm, v1.gated_mlp, v1.tied_embeddings, v1.mlp_bias) == ("layernorm", False, True, True)
    assert param_counts(catalog.get_model("THUDM/chatglm-6b")).total == param_counts(v1).total


def test_gpt_neox_configs_count_exactly_as_the_pythia_model_card():
    """GPT-NeoX configs state neither their LayerNorms nor their biases; with the family's
    facts EleutherAI/pythia-410m's config.json (24 layers, hidden 1024, 16 heads, GELU MLP of
    4096, vocab 50304, untied) gives the model card's 405,334,016 parameters exactly."""
    from planner.catalog.hf_config import spec_from_hf_config

    spec = spec_from_hf_config({"model_type": "gpt_neox", "num_hidden_layers": 24, "hidden_size": 1024,
                                "num_attention_heads": 16, "intermediate_size": 4096, "vocab_size": 50304,
                                "hidden_act": "gelu", "tie_word_embeddings": False, "rotary_pct": 0.25})
    assert param_counts(spec).total == 405_334_016
    assert spec.norm == "layernorm" and spec.fused_qkv and spec.qkv_bias and spec.mlp_bias
    assert param_counts(catalog.get_model("EleutherAI/pythia-410m-deduped")).total == 405_334_016


@pytest.mark.parametrize("model_type", ["internlm2", "baichuan"])
def test_remote_code_models_with_one_qkv_linear_read_as_fused(model_type):
    """InternLM2 (``wqkv``) and Baichuan (``W_pack``) project q, k and v with one linear: a LoRA
    on it has one input, as the catalog entries say."""
    from planner.catalog.hf_config import spec_from_hf_config

    assert spec_from_hf_config({**_DENSE, "model_type": model_type}).fused_qkv
    assert not spec_from_hf_config({**_DENSE, "model_type": "llama"}).fused_qkv
    assert all(m.fused_qkv for m in catalog.models() if m.family in ("baichuan", "internlm")
               and m.id != "internlm3-8b")


def test_llama4_reads_its_shared_expert_and_untied_head():
    """Llama 4 Scout (meta-llama/Llama-4-Scout-17B-16E; model card: 17B active parameters):
    every layer routes to 1 of 16 experts beside one shared expert, each intermediate_size
    8192 wide, and the wrapper's tie_word_embeddings false unties the 202,048-row head that its
    text_config does not mention. Without the shared expert it would count 11.1B active."""
    from planner.catalog.hf_config import spec_from_hf_config

    text = {"model_type": "llama4_text", "num_hidden_layers": 48, "hidden_size": 5120,
            "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_local_experts": 16,
            "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "vocab_size": 202048,
            "use_qk_norm": True, "hidden_act": "silu"}
    spec = spec_from_hf_config({"model_type": "llama4", "tie_word_embeddings": False, "text_config": text})
    counts = param_counts(spec)
    assert counts.active / 1e9 == pytest.approx(17.0, rel=0.02)
    assert counts.total / 1e9 == pytest.approx(107.8, rel=0.001) and not spec.tied_embeddings
    assert spec.moe is not None and (spec.moe.shared_experts, spec.moe.shared_ffn) == (1, 8192)
    maverick = spec_from_hf_config({**text, "num_local_experts": 128, "interleave_moe_layer_step": 2,
                                    "tie_word_embeddings": False})
    # alternate layers dense (16384 wide) and MoE: 17B active, ~400B total (model card)
    assert param_counts(maverick).active / 1e9 == pytest.approx(17.0, rel=0.03)
    assert param_counts(maverick).total / 1e9 == pytest.approx(400, rel=0.02)
