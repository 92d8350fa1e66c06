"""The `seed` profile reproduces the documents' worked examples.

Sources:
- 000_caedea04805f5c38.txt §五 (cases A–D): 7B, L=32, H=4096, T=2048, B=4, K=3.
- 004_84505362de90c709.txt: 1B model, with that document's own assumptions as overrides
  (4M trainable at 14 bytes, 4 GB activations, 0.5 bytes per 4-bit weight).
- Rajbhandari et al., ZeRO (arXiv 1910.02054), Figure 1: 7.5B parameters, N_d = 64, K = 12:
  baseline 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.9 GB (1.875).
"""

from __future__ import annotations

import pytest

import planner
from planner.scenario.files import deep_merge

GB = 1e9

# (id, scenario changes over the 7B setting, expected total GB, tolerance, source)
CASES_000 = [
    ("A", {"workload": {"method": "full"}}, 118.4, "000 §五 case A: 112 + 6.44 GB"),
    ("B", {"workload": {"method": "full"}, "layout": {"gpus": 8, "zero": 3}}, 20.4,
     "000 §五 case B: 14 + 6.44 GB per GPU"),
    ("C", {"workload": {"method": "lora", "lora_rank": 16, "optimizer": "adam8bit"}}, 20.8,
     "000 §五 case C: 14 GB + 37.7M·10 + 6.44 GB"),
    ("D", {"workload": {"method": "qlora", "lora_rank": 16, "optimizer": "adam8bit"}}, 11.0,
     "000 §五 case D: 0.6·7 + 0.38 + 6.44 GB"),
]


@pytest.mark.parametrize("case, change, expected_gb, source", CASES_000, ids=[c[0] for c in CASES_000])
def test_000_worked_examples(seed_7b, case, change, expected_gb, source):
    est = planner.estimate(deep_merge(seed_7b, change))
    assert est.total_bytes / GB == pytest.approx(expected_gb, rel=0.005), source
    assert sum(est.components.values()) == est.total_bytes


def test_000_activation_and_lora_figures_exact(seed_7b):
    """memory-model.md: activations 4·2048·4096·32·3·2 = 6,442,450,944 bytes;
    N_lora = 32·18·16·4096 = 37,748,736, so case C's adapter states are 377,487,360 bytes."""
    est = planner.estimate(deep_merge(seed_7b, {"workload": {"method": "lora", "optimizer": "adam8bit"}}))
    assert est.components["activations"] == 6_442_450_944
    assert est.components["adapter_states"] == 37_748_736 * 10
    assert est.components["weights"] == 14_000_000_000


def test_000_case_a_model_states_112gb(seed_7b):
    est = planner.estimate(deep_merge(seed_7b, {"workload": {"method": "full"}}))
    states = est.total_bytes - est.components["activations"]
    assert states == 112_000_000_000  # 16 bytes · 7e9 (000 §一.1)


@pytest.mark.parametrize(
    "case, change, gpu, fits",
    [
        ("A", {"workload": {"method": "full"}}, "h100", False),  # "单卡不可行"
        ("B", {"workload": {"method": "full"}, "layout": {"gpus": 8, "zero": 3}}, "a100-40gb", True),
        ("C", {"workload": {"method": "lora", "optimizer": "adam8bit"}}, "rtx-4090", True),
        ("D", {"workload": {"method": "qlora", "optimizer": "adam8bit"}}, "rtx-3060-12gb", True),
        ("D on 8 GB", {"workload": {"method": "qlora", "optimizer": "adam8bit"}}, None, None),
    ],
)
def test_000_fit_verdicts(seed_7b, case, change, gpu, fits):
    """000 §五: A does not fit one GPU; B fits an A100 40GB; C fits an RTX 4090 (tight);
    D fits a 16 GB and even a 12 GB card — with the 10 % reserve, in exact bytes."""
    est = planner.estimate(deep_merge(seed_7b, change), gpu=gpu)
    assert est.fits is fits
    if gpu is not None:
        assert est.usable_bytes == int(est.capacity_bytes * 0.9)


def test_000_case_c_is_tight_on_4090(seed_7b):
    """'可在单张24GB GPU（如RTX 4090）上运行，但显存紧张': under 3 GB of the 23.2 GB usable remain."""
    est = planner.estimate(
        deep_merge(seed_7b, {"workload": {"method": "lora", "optimizer": "adam8bit"}}), gpu="rtx-4090"
    )
    assert est.capacity_bytes == 24_564 * 2**20
    assert 0 < est.headroom_bytes < 3 * GB


DOC_004 = {"profile": "seed", "model": {"params_b": 1, "layers": 16, "hidden": 2048}, "overrides": {"activation_bytes": 4e9}}


@pytest.mark.parametrize(
    "method, overrides, expected_gb",
    [
        ("full", {}, 20.0),  # 2 + 2 + 12 + 4 GB
        ("lora", {"lora_params": 4e6, "lora_bytes_per_param": 14}, 6.05),  # 2 + 4 + 0.056 GB
        ("qlora", {"lora_params": 4e6, "lora_bytes_per_param": 14, "base_bytes_per_param": 0.5}, 4.55),
    ],
)
def test_004_one_billion_examples(method, overrides, expected_gb):
    """004_…: full FT ≈ 20 GB, LoRA ≈ 6.05 GB, QLoRA ≈ 4.55 GB (its table rounds to 6.1/4.6)."""
    scenario = deep_merge(DOC_004, {"workload": {"method": method}, "overrides": overrides})
    est = planner.estimate(scenario)
    assert est.total_bytes / GB == pytest.approx(expected_gb, rel=0.005)


@pytest.mark.parametrize(
    "zero, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.875)]
)
def test_zero_paper_figure_1(zero, expected_gb):
    """ZeRO paper Figure 1: Ψ = 7.5B, N_d = 64, mixed-precision Adam (2 + 2 + 12 bytes)."""
    est = planner.estimate(
        {"profile": "seed", "model": {"params_b": 7.5, "layers": 32, "hidden": 4096},
         "workload": {"method": "full"},
         "layout": {"gpus": 64, "zero": zero},
         "overrides": {"activation_bytes": 0}}
    )
    assert est.total_bytes / GB == pytest.approx(expected_gb, rel=0.005)


def test_002_errata_not_followed():
    """002_… claims 1B FP16 weights take ~1 GB and FP32 training takes 12 bytes/param;
    memory-model.md: they take 2 GB, and FP32 AdamW training takes 4 + 4 + 8 = 16."""
    base = {"profile": "seed", "model": {"params_b": 1, "layers": 16, "hidden": 2048}, "overrides": {"activation_bytes": 0}}
    inference = planner.estimate(deep_merge(base, {"workload": {"method": "inference", "seq_len": 1}}))
    assert inference.components["weights"] == 2_000_000_000
    fp32 = planner.estimate(deep_merge(base, {"workload": {"method": "full", "precision": "fp32"}}))
    assert fp32.total_bytes == 16_000_000_000
