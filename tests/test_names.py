"""Model names as people type them: hub ids, mirrors, variant tags; suggestions that keep the
architecture family; the config.json way out; the context-length warning."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner import catalog
from planner.catalog.store import UnknownName, model_name_candidates, name_family
from planner.cli.main import app
from planner.scenario.resolve import resolve


@pytest.mark.parametrize(
    "typed, expected",
    [
        # Meta's own ids, old and new spellings, and the chat/instruct variants.
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
        ("meta-llama/Llama-2-7b-chat-hf", "llama-2-7b"),
        ("meta-llama/Llama-2-70b-hf", "llama-2-70b"),
        ("meta-llama/Llama-3.2-1B-Instruct", "llama-3.2-1b"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b"),
        # Mirrors and re-packagers: the organisation and the quantisation tags go.
        ("NousResearch/Meta-Llama-3-8B", "llama-3-8b"),
        ("NousResearch/Llama-2-13b-hf", "llama-2-13b"),
        ("unsloth/llama-3-8b-Instruct-bnb-4bit", "llama-3-8b"),
        ("unsloth/Meta-Llama-3.1-8B-Instruct-bnb-4bit", "llama-3.1-8b"),
        ("unsloth/Qwen2.5-7B-Instruct-unsloth-bnb-4bit", "qwen2.5-7b"),
        ("TheBloke/Llama-2-7B-Chat-GPTQ", "llama-2-7b"),
        ("TheBloke/Llama-2-70B-Chat-AWQ", "llama-2-70b"),
        ("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", "llama-3.1-8b"),
        ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "llama-3.1-8b"),
        ("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4", "qwen2.5-72b"),
        ("Qwen/Qwen2.5-14B-Instruct-AWQ", "qwen2.5-14b"),
        ("google/gemma-2-9b-it", "gemma-2-9b"),
        ("google/gemma-3-27b-it", "gemma-3-27b"),
        ("unsloth/gemma-3-4b-it-bnb-4bit", "gemma-3-4b"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("Qwen/Qwen3-8B-Base", "qwen3-8b"),
        ("Qwen/Qwen3-8B-FP8", "qwen3-8b"),
        ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "tinyllama-1.1b"),
        ("  LLAMA_3.1_70B  ", "llama-3.1-70b"),
        # Models added with this catalog: their hub ids and the usual re-packagings.
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", "deepseek-r1-distill-llama-70b"),
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "deepseek-r1-distill-llama-8b"),
        ("unsloth/DeepSeek-R1-Distill-Llama-8B-bnb-4bit", "deepseek-r1-distill-llama-8b"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "deepseek-r1-distill-qwen-7b"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "deepseek-r1-distill-qwen-14b"),
        ("bartowski/DeepSeek-R1-Distill-Qwen-32B-GGUF", "deepseek-r1-distill-qwen-32b"),
        ("mistralai/Mistral-7B-Instruct-v0.2", "mistral-7b-v0.2"),
        ("TheBloke/Mistral-7B-Instruct-v0.2-GPTQ", "mistral-7b-v0.2"),
        ("mistralai/Mistral-7B-v0.3", "mistral-7b-v0.3"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b-v0.3"),
        ("Qwen/Qwen2-7B-Instruct", "qwen2-7b"),
        ("Qwen/Qwen2-72B-Instruct-AWQ", "qwen2-72b"),
        ("Qwen/Qwen2-0.5B", "qwen2-0.5b"),
        ("Qwen/Qwen2.5-3B-Instruct", "qwen2.5-3b"),
        ("01-ai/Yi-1.5-34B-Chat", "yi-1.5-34b"),
        ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "smollm2-1.7b"),
        ("allenai/OLMo-2-0325-32B-Instruct", "olmo-2-32b"),
        ("microsoft/Phi-3.5-mini-instruct", "phi-3.5-mini"),
        ("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-v2-lite"),
        ("codellama/CodeLlama-34b-Instruct-hf", "codellama-34b"),
        ("openai/gpt-oss-20b", "gpt-oss-20b"),
        ("openai-community/gpt2", "gpt2"),
        # The original LLaMA as converted by huggyllama, and the old decapoda spellings.
        ("huggyllama/llama-65b", "llama-65b"),
        ("huggyllama/llama-7b", "llama-7b"),
        ("decapoda-research/llama-30b-hf", "llama-30b"),
        ("LLaMA-33B", "llama-30b"),
        # Yi: the original release and Yi-1.5 are different entries.
        ("01-ai/Yi-34B", "yi-34b"),
        ("01-ai/Yi-34B-Chat", "yi-34b"),
        ("01-ai/Yi-1.5-34B", "yi-1.5-34b"),
        # Falcon, BLOOM, Gemma 1, Phi, Qwen1.5, GPT-2, OLMo 2, Code Llama hub ids.
        ("tiiuae/falcon-7b", "falcon-7b"),
        ("tiiuae/falcon-40b-instruct", "falcon-40b"),
        ("bigscience/bloom-7b1", "bloom-7b1"),
        ("bigscience/bloom", "bloom-176b"),
        ("google/gemma-2b", "gemma-2b"),
        ("google/gemma-7b-it", "gemma-7b"),
        ("microsoft/phi-1_5", "phi-1.5"),
        ("microsoft/phi-2", "phi-2"),
        ("Qwen/Qwen1.5-7B-Chat", "qwen1.5-7b"),
        ("Qwen/Qwen1.5-72B-Chat-GPTQ-Int4", "qwen1.5-72b"),
        ("openai-community/gpt2-xl", "gpt2-xl"),
        ("allenai/OLMo-2-1124-13B-Instruct", "olmo-2-13b"),
        ("codellama/CodeLlama-7b-Instruct-hf", "codellama-7b"),
        # Updates re-released under a date stamp (YYMM) keep the architecture: Qwen3's July 2025
        # instruct and thinking releases have Qwen3-4B's, -30B-A3B's and -235B-A22B's dimensions
        # (their config.json differ in max_position_embeddings only).
        ("Qwen/Qwen3-4B-Instruct-2507", "qwen3-4b"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
        ("Qwen/Qwen3-235B-A22B-Thinking-2507", "qwen3-235b-a22b"),
        ("unsloth/Qwen3-4B-Instruct-2507-bnb-4bit", "qwen3-4b"),
    ],
)
def test_hub_style_names_resolve(typed, expected):
    assert catalog.get_model(typed).id == expected


def test_versions_and_sizes_are_not_stripped():
    """Tags go, but what changes the architecture stays: a version, a size."""
    keys = model_name_candidates("TheBloke/Mistral-7B-Instruct-v0.2-GPTQ")
    assert keys[-1] == "mistral7bv0.2"
    assert model_name_candidates("Llama-3.1-405B-Instruct-FP8")[-1] == "llama3.1405b"
    # a date stamp goes; a size or a version beside it stays
    assert model_name_candidates("Qwen/Qwen3-4B-Instruct-2507")[-1] == "qwen34b"
    assert model_name_candidates("Mistral-Small-3.1-24B-Instruct-2503")[-1] == "mistralsmall3.124b"
    with pytest.raises(UnknownName):
        catalog.get_model("qwen3-2507")  # a stamp alone names no size


@pytest.mark.parametrize(
    "name, family",
    [("deepseek-r1-distill-llama-70b", "llama"), ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "qwen"),
     ("deepseek-v3", "deepseek"), ("TinyLlama-1.1B", "tinyllama"), ("TheBloke/Llama-2-7B-GPTQ", "llama"),
     ("mixtral-8x7b", "mistral"), ("Yi-34B-Chat", "yi"), ("dolphin-2.9-llama3-8b", "llama"),
     ("gpt-3", "gpt"), ("nothing-known", None)],
)
def test_name_family(name, family):
    assert name_family(name) == family


@pytest.mark.parametrize(
    "typed, wanted, never",
    [
        ("deepseek-r1-distill-llama-72b", "llama", "deepseek-v3"),
        ("deepseek-r1-distill-qwen-3b", "qwen", "deepseek-v3"),
        ("llama-3.1-7b", "llama", "qwen"),
        ("lama-3-70b", "llama", "deepseek"),
        ("qwen2.5-8b", "qwen", "llama"),
        ("gemma-2-8b-it", "gemma", "llama"),
        ("dolphin-2.9-llama3-8b", "llama", "dolphin"),
    ],
)
def test_suggestions_keep_the_family(typed, wanted, never):
    with pytest.raises(UnknownName) as info:
        catalog.get_model(typed)
    message = str(info.value)
    assert "did you mean" in message
    suggested = message.split("did you mean ", 1)[1].split("?", 1)[0].split(", ")
    assert suggested and all(catalog.get_model(s).family == wanted for s in suggested), message
    assert never not in message.split("did you mean", 1)[1].split("?")[0]


@pytest.mark.parametrize("name", ["deepseek-r1-distill-llama-70b", "deepseek-r1-distill-llama-8b",
                                  "deepseek-r1-distill-qwen-7b", "deepseek-r1-distill-qwen-14b",
                                  "deepseek-r1-distill-qwen-32b"])
def test_r1_distills_are_their_base_architectures(name):
    """The distills are Llama/Qwen2 dense models: no MoE, no MLA, never DeepSeek-V3's shapes."""
    model = catalog.get_model(name)
    assert model.family == ("llama" if "llama" in name else "qwen")
    assert model.moe is None and model.mla is None
    assert model.max_position == 131072


def test_r1_distill_typos_never_suggest_deepseek_v3():
    for typed in ("deepseek-r1-distill-llama-7b", "deepseek-r1-distill-lama-70b", "DeepSeek-R1-Distill-Qwen-72B",
                  "deepseek-r1-distil-qwen-32b"):
        with pytest.raises(UnknownName) as info:
            catalog.get_model(typed)
        assert "deepseek-v3" not in str(info.value), str(info.value)
        assert "did you mean" in str(info.value)


def test_mistral_versions_differ_where_they_should():
    """v0.2+: 32K context, no sliding window; v0.3: vocabulary 32768."""
    v1, v2, v3 = (catalog.get_model(f"mistral-7b-v0.{i}") for i in (1, 2, 3))
    assert v2.vocab == v1.vocab == 32000 and v3.vocab == 32768
    assert v2.max_position == v3.max_position == 32768
    assert "sliding" in (v1.notes or "").lower()


def test_every_model_has_a_context_length():
    assert all(m.max_position for m in catalog.models())


def test_unknown_model_says_how_to_pass_a_config_json():
    with pytest.raises(UnknownName) as info:
        catalog.get_model("acme/totally-new-model-9b")
    message = str(info.value)
    assert "config.json" in message and "\n" not in message


def test_unknown_model_cli_is_one_line_exit_2():
    result = CliRunner().invoke(app, ["estimate", "--model", "acme/totally-new-model-9b", "--gpu", "h100"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "config.json" in lines[0], result.output


def test_the_hint_works(tmp_path):
    """What the hint says to do loads: a config.json path as the model."""
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "vocab_size": 1000, "intermediate_size": 128, "max_position_embeddings": 512}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert catalog.get_model(str(path)).max_position == 512


def _scenario(model: str, seq_len: int) -> dict:
    return {"model": model, "workload": {"seq_len": seq_len}, "layout": {"gpu": "h100"}}


def test_seq_len_past_the_context_warns():
    rs = resolve(_scenario("llama-2-7b", 8192))
    assert any("seq_len" in w and "4096" in w for w in rs.warnings), rs.warnings


def test_seq_len_within_the_context_does_not_warn():
    rs = resolve(_scenario("llama-3.1-8b", 8192))
    assert not any("max_position_embeddings" in w for w in rs.warnings), rs.warnings


def test_context_warning_reaches_the_estimate():
    result = CliRunner().invoke(app, ["estimate", "--model", "meta-llama/Llama-2-7b-chat-hf", "--gpu",
                                      "h100", "--seq-len", "8192", "--method", "qlora", "--json"])
    assert result.exit_code in (0, 1), result.output  # 1: does not fit; the estimate still prints
    data = json.loads(result.output)
    assert any("max_position_embeddings" in w for w in data["warnings"])


def test_older_generations_are_not_their_successors():
    """LLaMA 1, Gemma 1, Yi and Qwen1.5 share names with later releases but not their shapes."""
    assert catalog.get_model("llama-7b").max_position == 2048
    assert catalog.get_model("llama-2-7b").max_position == 4096
    assert catalog.get_model("gemma-2b").norms_per_layer == 2
    assert catalog.get_model("gemma-2-2b").norms_per_layer == 4
    assert catalog.get_model("yi-34b").id != catalog.get_model("yi-1.5-34b").id
    assert catalog.get_model("qwen1.5-7b").vocab == 151936


@pytest.mark.parametrize(
    "typed, wanted",
    [("falcon-11b", "falcon"), ("bloom-3b", "bloom"), ("tiiuae/falcon-180b", "falcon"),
     ("gemma-3b", "gemma"), ("olmo-2-9b", "olmo"), ("yi-13b", "yi")],
)
def test_new_families_keep_their_suggestions(typed, wanted):
    with pytest.raises(UnknownName) as info:
        catalog.get_model(typed)
    message = str(info.value)
    assert "did you mean" in message
    suggested = message.split("did you mean ", 1)[1].split("?", 1)[0].split(", ")
    assert suggested and all(catalog.get_model(s).family == wanted for s in suggested), message


@pytest.mark.parametrize("name", ["falcon-7b", "falcon-40b", "bloom-7b1", "phi-1.5", "phi-2"])
def test_layernorm_models_carry_their_layout(name):
    """Falcon and Phi: parallel attention (Falcon-7B and Phi: one LayerNorm per layer); BLOOM: ALiBi."""
    model = catalog.get_model(name)
    assert model.norm == "layernorm" and not model.gated_mlp
    assert model.norms_per_layer == (2 if name in ("falcon-40b", "bloom-7b1") else 1)
    assert (model.position == "alibi") == name.startswith("bloom")


def test_glm_names_resolve_within_their_family():
    """ChatGLM3 and GLM-4 (ChatGLMModel: 2 KV groups, QKV bias, untied output layer)."""
    assert catalog.get_model("THUDM/chatglm3-6b").id == "chatglm3-6b"
    assert catalog.get_model("ChatGLM3-6B").kv_heads == 2
    assert catalog.get_model("THUDM/glm-4-9b-chat").id == "glm-4-9b"
    assert name_family("chatglm3-6b") == name_family("glm-4-9b") == "glm"
    assert "glm" in catalog.models().suggest("chatglm4-6b")


@pytest.mark.parametrize("typed", [
    "Qwen/Qwen3.5-27B", "Qwen/Qwen3-Next-80B-A3B-Instruct", "ai21labs/AI21-Jamba-Mini-1.6",
    "tiiuae/falcon-mamba-7b", "tiiuae/Falcon-H1-7B-Instruct", "LiquidAI/LFM2-1.2B",
    "ibm-granite/granite-4.0-h-small", "moonshotai/Kimi-Linear-48B-A3B-Instruct",
])
def test_hybrid_models_are_explained_not_substituted(typed):
    """A model whose layers are not all softmax attention is not offered a transformer spelled
    alike (Qwen3.5-27B is no Qwen2.5-7B), nor the config.json way out (it is refused too)."""
    with pytest.raises(UnknownName) as info:
        catalog.get_model(typed)
    message = str(info.value)
    assert "softmax attention" in message and "did you mean" not in message
    assert "give the path" not in message


@pytest.mark.parametrize("typed", ["ibm-granite/granite-4.0-micro", "MiniMaxAI/MiniMax-M2",
                                   "Qwen/Qwen3-32B", "google/gemma-3-27b-it"])
def test_attention_models_spelled_alike_are_not_called_hybrid(typed):
    from planner.catalog.store import hybrid_architecture

    assert hybrid_architecture(typed) is None
