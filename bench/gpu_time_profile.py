"""Where the profiled steps of bench/gpu_time_session.py spent their time, by kernel kind.

    python bench/gpu_time_profile.py [--results data/gpu_h200_time_results.jsonl]

For each profiled setting: the step's wall time, the GPU's busy time, and the CUDA kernels'
time by kind — 16-bit GEMMs (with their rate against the model's weight FLOPs, 6 or 4 per
parameter and token, 2 more with checkpointing), fused attention, FP32 GEMMs (CUDA cores),
element-wise and copy kernels (also as hidden vectors per token and layer at the card's nominal
bandwidth, the unit of the time model's ``elementwise_vectors``), the optimizer's ``_foreach_``
kernels (also as bytes per parameter at that bandwidth) and the loss.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The H200's nominal memory bandwidth (catalogs/gpus.yaml), bytes/s.
NOMINAL_BPS = 4.8e12
KINDS = (("annotation", r"step#"), ("attention", r"sdpa|flash|fmha"), ("gemm_fp32", r"f32f32"),
         ("gemm", r"gemm|nvjet|cutlass|xmma|cublas|splitk|gemv"), ("optimizer", r"multi_tensor|adam"),
         ("loss", r"softmax|nll|cross|logsumexp"))


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, pattern in KINDS if re.search(pattern, low)), "elementwise")


def summary(run: dict, result: dict) -> dict:
    from planner import catalog
    from planner.perf.flops import model_flops

    mf = model_flops(catalog.get_model(run["model"]))
    tokens = run["seq_len"] * run["micro_batch"]
    by_kind: dict[str, float] = {}
    for name, _, us in result["profile"]["kernels"]:
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + us / 1e6
    per_param = (6 if run["method"] == "full" else 4) + (2 if run["checkpointing"] else 0)
    step = statistics.median(result["step_s"][2:])
    return {"key": run["key"], "model": run["model"], "method": run["method"],
            "adapters": run.get("adapter_dtype", ""), "step_ms": step * 1e3,
            "busy_ms": result["profile"]["busy_us"] / 1e3,
            "gemm_ms": by_kind.get("gemm", 0.0) * 1e3,
            "gemm_tflops": per_param * mf.params * tokens / max(by_kind.get("gemm", 0.0), 1e-9) / 1e12,
            "attention_ms": by_kind.get("attention", 0.0) * 1e3, "gemm_fp32_ms": by_kind.get("gemm_fp32", 0.0) * 1e3,
            "elementwise_ms": by_kind.get("elementwise", 0.0) * 1e3,
            "elementwise_vectors": by_kind.get("elementwise", 0.0) * NOMINAL_BPS / (2 * mf.hidden * tokens * mf.layers),
            "optimizer_ms": by_kind.get("optimizer", 0.0) * 1e3,
            "optimizer_bytes_per_param": (by_kind.get("optimizer", 0.0) * NOMINAL_BPS / mf.params
                                          if run["method"] == "full" else float("nan")),
            "loss_ms": by_kind.get("loss", 0.0) * 1e3, "kernels": result["profile"]["kernel_count"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "data" / "gpu_h200_time_results.jsonl")
    ap.add_argument("--runs", type=Path, default=ROOT / "data" / "gpu_h200_time_runs.json")
    args = ap.parse_args()
    runs = {r["key"]: r for g in json.loads(args.runs.read_text()) for r in g["runs"]}
    rows = [summary(runs[res["key"]], res) for res in map(json.loads, args.results.read_text().splitlines())
            if "profile" in res]
    cols = list(rows[0])
    print("  ".join(cols))
    for row in rows:
        print("  ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
