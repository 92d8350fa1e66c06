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
    ],
)
def test_hub_style_names_resolve(typed, expected):
    assert catalog.get_model(typed).id == expected


def test_versions_and_sizes_are_not_stripped():
    """Tags go, but what changes the architecture stays: a version, a size."""
    keys = model_name_candidates("TheBloke/Mistral-7B-Instruct-v0.2-GPTQ")
    assert keys[-1] == "mistral7bv0.2"
    assert model_name_candidates("Llama-3.1-405B-Instruct-FP8")[-1] == "llama3.1405b"


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
