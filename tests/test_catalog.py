"""Every catalog entry loads, carries its sources, and counts its parameters right."""

from __future__ import annotations

import pytest

from planner import catalog
from planner.catalog.store import UnknownName
from planner.core.arch import param_counts

GPUS = list(catalog.gpus())
MODELS = list(catalog.models())

#: The GPU types the catalog must have, by a name people type.
REQUIRED_GPUS = [
    "h100-sxm-80gb", "h100-pcie", "h200", "b200", "a100-40gb", "a100-80gb", "a800", "h800", "h20",
    "l40s", "l4", "a10g", "rtx-a6000", "rtx-3090", "rtx-4090", "rtx-5090", "rtx-3060-12gb",
    "rtx-4060-ti-16gb", "t4", "v100-16gb", "v100-32gb", "mi300x", "ascend-910b",
]

REQUIRED_MODELS = [
    "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-8b",
    "llama-3.1-70b", "llama-3.1-405b", "llama-3.2-1b", "llama-3.2-3b", "llama-3.3-70b",
    "qwen2.5-7b", "qwen2.5-72b", "qwen3-8b", "qwen3-30b-a3b", "qwen3-235b-a22b", "mistral-7b",
    "mixtral-8x7b", "mixtral-8x22b", "gemma-2-9b", "gemma-3-27b", "phi-3-mini", "phi-4",
    "deepseek-v3", "gpt-3-175b", "tinyllama-1.1b",
    # From the "names people type" issue: each with its architecture from its config.json.
    "qwen2-0.5b", "qwen2-1.5b", "qwen2-7b", "qwen2-72b", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b",
    "qwen2.5-14b", "qwen2.5-32b", "yi-1.5-34b", "mistral-7b-v0.2", "mistral-7b-v0.3",
    "deepseek-r1-distill-llama-70b", "deepseek-r1-distill-llama-8b", "deepseek-r1-distill-qwen-7b",
    "deepseek-r1-distill-qwen-14b", "deepseek-r1-distill-qwen-32b", "gemma-3-1b", "gemma-3-4b",
    "gemma-3-12b", "phi-3.5-mini", "smollm2-135m", "smollm2-360m", "smollm2-1.7b", "olmo-2-32b",
    # Widely used earlier generations and families, each with its architecture from its config.json
    # (or, where that could not be read, the source its notes name).
    "llama-7b", "llama-13b", "llama-30b", "llama-65b", "codellama-7b", "gemma-2b", "gemma-7b",
    "falcon-7b", "falcon-40b", "bloom-7b1", "bloom-176b", "phi-1.5", "phi-2", "qwen1.5-7b",
    "qwen1.5-14b", "qwen1.5-72b", "yi-34b", "gpt2-large", "gpt2-xl", "olmo-2-7b", "olmo-2-13b",
    "chatglm3-6b", "glm-4-9b",
]


def test_catalog_sizes():
    assert len(GPUS) >= 24
    assert len(MODELS) >= 85


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_required_gpus_present(name):
    assert catalog.get_gpu(name).memory_mib > 0


@pytest.mark.parametrize("name", REQUIRED_MODELS)
def test_required_models_present(name):
    assert catalog.get_model(name).layers > 0


@pytest.mark.parametrize("gpu", GPUS, ids=[g.id for g in GPUS])
def test_gpu_entry_is_sourced_and_sane(gpu):
    assert gpu.memory_source and gpu.tflops_source and gpu.utilization_source
    # A "nominal" figure is the marketed size converted exactly; a measured one is a real printout.
    assert gpu.memory_mib_kind in {"nvidia-smi", "vendor-tool", "nominal"}
    assert 4 * 1024 <= gpu.memory_mib <= 300 * 1024
    assert gpu.utilization_low < gpu.utilization_high <= 1.0  # hardware-FLOPs utilisation of GEMMs
    assert gpu.nvlink_domain <= gpu.gpus_per_node
    if gpu.supports_bf16:
        assert gpu.bf16_dense_tflops and gpu.bf16_dense_tflops > 0
    else:
        assert gpu.bf16_dense_tflops is None and gpu.fp16_dense_tflops
    if gpu.fp8_dense_tflops is not None:
        # Dense FP8 is twice dense BF16 on every card that has it: catches a sparse figure.
        assert gpu.fp8_dense_tflops <= 2.05 * gpu.bf16_dense_tflops
    for price, source in (
        (gpu.price_on_demand_usd_per_hour, gpu.price_on_demand_source),
        (gpu.price_spot_usd_per_hour, gpu.price_spot_source),
        (gpu.price_purchase_usd, gpu.price_purchase_source),
    ):
        assert (price is None) or (price > 0 and source), "a price without a source"


def test_dense_not_sparse_flops():
    """catalog-facts §8: H100 dense BF16 is 989 TFLOPS; 1,979 is the sparse figure."""
    assert catalog.get_gpu("h100").bf16_dense_tflops == pytest.approx(989, rel=0.01)
    assert catalog.get_gpu("a100-80gb").bf16_dense_tflops == pytest.approx(312, rel=0.01)


@pytest.mark.parametrize(
    "name, mib",
    [("h100", 81559), ("a100-80gb", 81920), ("a100-40gb", 40960), ("rtx-4090", 24564),
     ("rtx-3060-12gb", 12288)],
)
def test_memory_as_nvidia_smi_reports(name, mib):
    """memory-model.md "Units": H100 81,559 MiB, A100 81,920 MiB, RTX 4090 24,564 MiB, 12 GB 12,288."""
    gpu = catalog.get_gpu(name)
    assert gpu.memory_mib == mib
    assert gpu.memory_bytes == mib * 2**20


def test_no_bf16_or_fa2_on_volta_and_turing():
    for name in ("v100-16gb", "v100-32gb", "t4"):
        gpu = catalog.get_gpu(name)
        assert not gpu.supports_bf16 and not gpu.supports_flash_attn2


@pytest.mark.parametrize("model", MODELS, ids=[m.id for m in MODELS])
def test_parameter_count_matches_official(model):
    """The count computed from the architecture is within 1 % of the official figure."""
    assert model.official_params_b and model.params_source
    computed = param_counts(model).total / 1e9
    assert computed == pytest.approx(model.official_params_b, rel=0.01)


def test_moe_active_parameters():
    """Mixtral 8x7B: 46.7B total, 12.9B active (Mistral AI release); Qwen3-30B-A3B: 3.3B active
    (model card); DeepSeek-V3: 37B active (technical report)."""
    assert param_counts(catalog.get_model("mixtral-8x7b")).active / 1e9 == pytest.approx(12.9, rel=0.01)
    assert param_counts(catalog.get_model("qwen3-30b-a3b")).active / 1e9 == pytest.approx(3.3, rel=0.02)
    assert param_counts(catalog.get_model("deepseek-v3")).active / 1e9 == pytest.approx(37, rel=0.02)


@pytest.mark.parametrize(
    "typed, expected",
    [("h100", "h100-sxm-80gb"), ("H100-SXM-80GB", "h100-sxm-80gb"), ("a100-40gb", "a100-sxm-40gb"),
     ("a100-80gb", "a100-sxm-80gb"), ("rtx-4090", "rtx-4090"), ("4090", "rtx-4090"),
     ("RTX 4090", "rtx-4090"), ("rtx-3090", "rtx-3090"), ("rtx-3060-12gb", "rtx-3060-12gb"),
     ("A100", "a100-sxm-40gb")],
)
def test_gpu_aliases(typed, expected):
    assert catalog.get_gpu(typed).id == expected


@pytest.mark.parametrize(
    "typed, expected",
    [("llama-2-70b", "llama-2-70b"), ("llama-3-70b", "llama-3-70b"), ("llama-3.1-70b", "llama-3.1-70b"),
     ("LLAMA-3.1-70B", "llama-3.1-70b"), ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
     # names of published runs the catalog once lacked
     ("Qwen/Qwen1.5-32B-Chat", "qwen1.5-32b"), ("deepseek-ai/deepseek-coder-33b-instruct", "deepseek-coder-33b"),
     ("Ministral-8B-Instruct-2410", "ministral-8b"), ("opt-2.7b", "opt-2.7b"),
     ("Qwen2.5-Coder-14B", "qwen2.5-14b"), ("Qwen-7B-Chat-Int4", "qwen-7b"),
     ("EleutherAI/pythia-1b-deduped", "pythia-1b"), ("internlm2_5-7b-chat", "internlm2.5-7b"),
     ("Baichuan2-7B-Chat", "baichuan2-7b"), ("moonshotai/Kimi-K2-Instruct", "kimi-k2"),
     # DeepSeek-R1 keeps DeepSeek-V3's tensors; its distills are other architectures
     ("deepseek-ai/DeepSeek-R1", "deepseek-v3"), ("DeepSeek-R1-0528", "deepseek-v3"),
     ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "deepseek-r1-distill-qwen-7b")],
)
def test_model_aliases(typed, expected):
    assert catalog.get_model(typed).id == expected


def test_unknown_names_suggest():
    with pytest.raises(UnknownName, match="did you mean.*rtx-4090"):
        catalog.get_gpu("rtx-4909")
    with pytest.raises(UnknownName, match="did you mean.*llama-3.1-70b"):
        catalog.get_model("llama-3.1-70")


def test_aliases_unique_across_catalog():
    """Catalog() raises on a name owned by two entries; this checks it is really enforced."""
    from planner.catalog.store import Catalog

    a, b = GPUS[0], GPUS[1].model_copy(update={"aliases": [GPUS[0].aliases[0]]})
    with pytest.raises(ValueError, match="belongs to both"):
        Catalog("gpu", [a, b])
