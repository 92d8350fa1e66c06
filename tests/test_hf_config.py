"""A local Hugging Face config.json is accepted wherever a model name is (no hub access)."""

from __future__ import annotations

import json

import pytest

import planner
from planner import catalog
from planner.core.arch import param_counts
from planner.core.errors import InputError

from conftest import FIXTURES, ROOT

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
    common = dict(method="lora", seq_len=1024, micro_batch=1, gpu="l4")
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
