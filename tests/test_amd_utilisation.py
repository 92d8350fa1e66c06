"""AMD cards carry their own measured utilisation (catalogs/gpus.yaml), derived from their rows of
data/measured_throughput_amd.csv the way the NVIDIA entries are: the hardware-FLOPs utilisation of the
tensor-core work (recompute included) at which the time model, with its fitted constants, gives
each run's measured tokens/s; the band's middle is their median.

The MLPerf MI300X runs recompute 21 of their 80 layers (ACG=full, ACM=block, ACL=21), which a row's
``checkpointing`` (none / selective / full) cannot state: the step time of such a run is taken as
the layer-weighted mix of the time model's step without and with full recomputation.

``python tests/test_amd_utilisation.py`` prints the figures the catalog entries quote.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from planner import catalog
from planner.perf import timing
from planner.perf.hardware import GpuPerf, utilization_mid
from planner.perf.timing import step_time_s
from planner.validate import throughput as T
from planner.validate import throughput_cases as C

DATA = Path(__file__).resolve().parents[1] / "data" / "measured_throughput_amd.csv"
AMD_CARDS = ("mi300x", "mi325x")
#: The measured NVIDIA cards' band: x/÷ sqrt(2) around the middle (0.495-0.99 around 0.70).
NVIDIA_BAND_FACTOR = 0.99 / 0.70


def recompute_share(row: dict[str, str]) -> float:
    """Share of the layers a row's run recomputed in full ("full recompute of 21 of the 80 layers")."""
    found = re.search(r"full recompute of (\d+) of the (\d+) layers", row.get("checkpointing", ""))
    return int(found.group(1)) / int(found.group(2)) if found else 0.0


def tokens_per_s(case: C.ThroughputCase, hfu: float, share: float, middle: float | None = None) -> float:
    """The time model's tokens/s per GPU for a run at tensor-core utilisation ``hfu``, ``share`` of
    its layers recomputed, with the fitted constants, priced as the planner prices a card
    (``GpuPerf.of``, ``step_time_s``). ``middle``: the band's middle when ``hfu`` is one of its
    ends, so that the memory-bound kernels move with it (speed hfu / middle); none: ``hfu`` is the
    middle (memory-bound kernels at the card's bandwidth)."""
    perf = replace(GpuPerf.of(case.gpu_spec), gpus_per_node=case.gpus_per_node, utilization=hfu,
                   kernel_speed=1.0 if middle is None else hfu / middle)

    def rate(checkpointing: int) -> float:
        step = step_time_s(case.mf, perf, timing.FITTED, **{**case.x, "checkpointing": checkpointing})
        return float(case.tokens_per_step / (step * case.gpus))

    plain = rate(case.x["checkpointing"])
    return plain if share == 0.0 else 1.0 / ((1.0 - share) / plain + share / rate(2))


def implied_hfu(case: C.ThroughputCase, share: float) -> float:
    """The utilisation at which the time model reproduces the measured tokens/s (bisection)."""
    lo, hi = 0.05, 1.5
    for _ in range(50):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if tokens_per_s(case, mid, share) < case.measured else (lo, mid)
    return (lo * hi) ** 0.5


def amd_runs(card: str) -> list[tuple[dict[str, str], C.ThroughputCase, float, float]]:
    """(row, case, implied HFU as the validation reads the row, implied HFU with its recompute)."""
    rows = [r for r in T.read_rows(DATA) if r["planner_gpu"].strip() == card]
    out = []
    for row in rows:
        case = C.case_of(row)  # raises Unmodelable: every AMD row must be modelled
        out.append((row, case, implied_hfu(case, 0.0), implied_hfu(case, recompute_share(row))))
    return out


@pytest.fixture(scope="module", params=AMD_CARDS)
def card_runs(request):
    return request.param, amd_runs(request.param)


def test_amd_rows_are_modelled():
    cases, unmodelled = T.cases_of([r for r in T.read_rows(DATA) if r["planner_gpu"].strip() in AMD_CARDS])
    assert not unmodelled
    assert sum(c.gpu == "mi300x" for c in cases) >= 6
    assert all(c.method in ("full", "lora", "qlora") for c in cases)


def test_band_covers_the_measured_runs(card_runs):
    card, runs = card_runs
    gpu = catalog.get_gpu(card)
    assert runs, f"no measured {card} rows"
    assert "data/measured_throughput_amd.csv" in gpu.utilization_source
    for row, case, _, hfu in runs:
        assert gpu.utilization_low <= hfu <= gpu.utilization_high, (row["id"], hfu)
        # The same, as the planner prices the band's ends: the slow end is slower than the run
        # and the fast end faster (kernel speeds follow the utilisation, as in GpuPerf.of).
        share, mid = recompute_share(row), utilization_mid(gpu)
        assert tokens_per_s(case, gpu.utilization_low, share, mid) <= case.measured <= tokens_per_s(
            case, gpu.utilization_high, share, mid), row["id"]


def test_middle_is_the_measured_median(card_runs):
    card, runs = card_runs
    gpu = catalog.get_gpu(card)
    median = statistics.median(hfu for *_, hfu in runs)
    assert utilization_mid(gpu) == pytest.approx(median, rel=0.01)
    assert utilization_mid(gpu) < timing.FITTED.gemm_hfu  # below the measured NVIDIA cards
    # Band width as the measured NVIDIA cards'.
    assert gpu.utilization_high / utilization_mid(gpu) == pytest.approx(NVIDIA_BAND_FACTOR, rel=0.01)


def test_mi325x_is_not_the_mi300x_band():
    """Same catalog peak, but the 1000 W MI325X runs the same benchmark at a higher utilisation."""
    mi300x, mi325x = (statistics.median(h for *_, h in amd_runs(c)) for c in AMD_CARDS)
    assert mi325x > 1.1 * mi300x


if __name__ == "__main__":
    for card in AMD_CARDS:
        gpu = catalog.get_gpu(card)
        runs = amd_runs(card)
        read = [r for _, _, r, _ in runs]
        counted = [h for *_, h in runs]
        print(f"{card}: {len(runs)} runs; implied HFU with recompute counted: median "
              f"{statistics.median(counted):.4f} (range {min(counted):.4f}-{max(counted):.4f}); as the "
              f"validation reads the rows: median {statistics.median(read):.4f} (range {min(read):.4f}-"
              f"{max(read):.4f}); catalog band {gpu.utilization_low}-{gpu.utilization_high} (middle "
              f"{utilization_mid(gpu):.4f})")
        for row, case, r, h in runs:
            print(f"  id {row['id']:>4} {case.gpus:>3} GPUs cp {case.x['cp']} recompute "
                  f"{recompute_share(row):.3f} measured {case.measured:7.1f} tok/s/GPU  HFU {r:.4f} as read, "
                  f"{h:.4f} counted")
