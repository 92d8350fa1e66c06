"""DPO steps on one GPU, each predicted by the planner before it ran: the allocated peak and the
step time of a policy trained on chosen/rejected pairs against a reference.

    python bench/gpu_dpo_session.py prepare             # here: the settings and their predictions
    python bench/gpu_dpo_session.py run --out-dir OUT   # on a CUDA GPU (torch, transformers, peft)
    python bench/gpu_dpo_session.py collect --results OUT/results.jsonl

The step is TRL's DPOTrainer's, written out: chosen and rejected concatenated into one batch of
2 × pairs sequences; the reference's log-probabilities first, without gradients (a frozen copy of
the starting weights for full fine-tuning, the policy with its adapters disabled for LoRA); then
the policy's forward, per-sequence log-probabilities of the labels (``log_softmax`` row by row, as
TRL's ``selective_log_softmax`` does for 16-bit logits), the sigmoid DPO loss (beta 0.1), its
backward and torch AdamW (foreach). Random-weight ``LlamaForCausalLM`` of catalog models' shapes,
BF16, SDPA, random tokens; the first two of five steps untimed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_memory
import gpu_session

ROOT = Path(__file__).resolve().parents[1]
STEPS, WARMUP = 5, 2
BETA = 0.1
#: (catalog model, method, sequence length, pairs per micro-batch, checkpointing)
SETTINGS = (
    ("llama-3.2-1b", "full", 2048, 2, False), ("llama-3.2-1b", "lora", 2048, 2, False),
    ("llama-3.2-3b", "full", 2048, 1, True), ("llama-3.2-3b", "lora", 2048, 2, False),
    ("qwen2.5-1.5b", "full", 1024, 4, False), ("llama-3.1-8b", "lora", 2048, 1, False),
)
#: A second session, each setting predicted before it ran by the model that reads the first's
#: log-probabilities row by row: TRL's own 16-bit ``log_softmax`` (``bf16``) beside the FP32 rows
#: of the first session (``fp32``), reference log-probabilities precomputed (no reference pass or
#: copy), other models, more pairs and checkpointing. (model, method, sequence length, pairs,
#: checkpointing, log-probabilities, reference)
SETTINGS_2 = (
    ("llama-3.2-1b", "full", 2048, 2, False, "bf16", "model"),
    ("llama-3.2-1b", "lora", 2048, 4, False, "bf16", "model"),
    ("qwen2.5-0.5b", "full", 2048, 4, False, "bf16", "model"),
    ("qwen2.5-0.5b", "full", 2048, 4, False, "fp32", "model"),
    ("qwen2.5-3b", "lora", 2048, 2, False, "bf16", "model"),
    ("qwen2.5-3b", "full", 1024, 2, True, "bf16", "precomputed"),
    ("llama-3.2-3b", "lora", 4096, 1, True, "fp32", "model"),
    ("mistral-7b-v0.3", "lora", 2048, 2, False, "bf16", "model"),
    ("llama-3.1-8b", "full", 1024, 1, True, "bf16", "precomputed"),
)
SESSIONS = {1: tuple(s + ("fp32", "model") for s in SETTINGS), 2: SETTINGS_2}


def _scenario(run: dict) -> dict:
    wl = {"method": run["method"], "algorithm": "dpo", "precision": "bf16", "optimizer": "adamw",
          "seq_len": run["seq_len"], "micro_batch": run["micro_batch"], "tokens": 1e9,
          "reference": run.get("reference", "model")}
    recipe = {}
    if run.get("logps") == "fp32" and run.get("session", 1) > 1:
        # rows upcast before log_softmax (the first session's runs, read so since)
        recipe["loss"] = "rowwise_fp32"
    if run["method"] != "full":
        wl.update(lora_rank=16, lora_targets=["all"], adapter_dtype="fp32")
    return {"name": "dpo", "model": run["model"], "workload": wl,
            "layout": {"gpu": "h200-sxm-141gb", "gpus": 1, "checkpointing": "full" if run["checkpointing"] else "none",
                       "attention": "flash"}, "recipe": recipe}


def prepare(session: int = 1) -> list[dict]:
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve
    from planner.search.answer import plan_raw

    runs = []
    for key, (model, method, seq, pairs, ckpt, logps, reference) in enumerate(SESSIONS[session]):
        run = gpu_session.sweep_run(model, method, seq, pairs, ckpt)
        run.update(logps=logps, reference=reference, session=session)
        run.update(key=key, steps=STEPS, algorithm="dpo")
        est = estimate_resolved(resolve(_scenario(run)))
        run["predicted_allocated_bytes"] = est.predicted["allocated_bytes"]
        run["predicted_components"] = est.components
        pinned = _scenario(run)
        pinned["search"] = {"gpu_types": ["h200-sxm-141gb"], "max_gpus": 1, "micro_batch": [pairs], "tp": [1], "pp": [1],
                            "stacks": ["hf-fsdp"],
                            "cp": [1], "zero": [0], "offload": ["none"],
                            "checkpointing": ["full" if ckpt else "none"], "attention": ["flash"]}
        pinned["workload"] = {**pinned["workload"], "global_batch": pairs}
        del pinned["layout"]
        plans = plan_raw(pinned).plans
        run["predicted_tokens_per_s"] = plans[0].tokens_per_s if plans else None
        runs.append(run)
    return runs


def _logps(logits, labels, fp32: bool = True):
    """Per-sequence sum of the labels' log-probabilities, one row at a time: each row upcast to
    FP32 first (``fp32``, the first session) or in the logits' 16 bits (TRL's
    ``selective_log_softmax`` for 16-bit logits)."""
    import torch

    out = []
    for row_logits, row_labels in zip(logits, labels):
        lp = torch.log_softmax(row_logits[:-1].float() if fp32 else row_logits[:-1], dim=-1)
        out.append(lp.gather(-1, row_labels[1:].unsqueeze(-1)).squeeze(-1).sum())
        del lp
    return torch.stack(out)


def measure(run: dict) -> dict:
    import copy

    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = gpu_memory.llama_config(run)
    with torch.device("cuda"):
        policy = LlamaForCausalLM(cfg).to(torch.bfloat16)
    reference = None
    fp32 = run.get("logps", "fp32") == "fp32"
    precomputed = run.get("reference", "model") == "precomputed"
    if run["method"] == "full" and not precomputed:
        reference = copy.deepcopy(policy).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    policy.train()
    if run["checkpointing"]:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if run["method"] != "full":
        from peft import LoraConfig, get_peft_model

        policy = get_peft_model(policy, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear"))
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6)
    pairs = run["micro_batch"]
    ids = torch.randint(0, run["vocab"], (2 * pairs, run["seq_len"]), device="cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    step_s = []
    for _ in range(run["steps"]):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            if precomputed:  # read from the dataset: no reference pass
                ref_lp = torch.zeros(2 * pairs, device="cuda")
            elif reference is not None:
                ref_lp = _logps(reference(input_ids=ids).logits, ids, fp32)
            else:
                with policy.disable_adapter():
                    ref_lp = _logps(policy(input_ids=ids).logits, ids, fp32)
        lp = _logps(policy(input_ids=ids).logits, ids, fp32)
        margin = (lp[:pairs] - ref_lp[:pairs]) - (lp[pairs:] - ref_lp[pairs:])
        loss = -F.logsigmoid(BETA * margin).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t0)
    return {"max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved(),
            "step_s": step_s, "gpu_name": torch.cuda.get_device_name(0)}


def run_all(runs: list[dict], out: Path, budget_s: float) -> None:
    import subprocess

    deadline = time.monotonic() + budget_s
    for run in runs:
        if time.monotonic() > deadline:
            gpu_session._append(out, {"key": run["key"], "error": "skipped: past the budget"})
            continue
        proc = subprocess.run([sys.executable, __file__, "one", json.dumps(run)], capture_output=True, text=True,
                              check=False)
        lines = proc.stdout.strip().splitlines()
        res = json.loads(lines[-1]) if proc.returncode == 0 and lines else \
            {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]}
        gpu_session._append(out, {"key": run["key"], **res})
        print(run["key"], run["model"], run["method"], res.get("max_allocated", res.get("error")), flush=True)


def collect(results: Path, runs_path: Path, memory_out: Path, throughput_out: Path) -> tuple[int, int]:
    runs = {r["key"]: r for r in json.loads(runs_path.read_text())}
    mem_rows, tp_rows = [], []
    for res in map(json.loads, results.read_text().splitlines()):
        if "error" in res:
            continue
        run = runs[res["key"]]
        row = gpu_memory.row_of({**run, "algorithm": "dpo"}, len(mem_rows) + 1, res["max_allocated"] / 1e9,
                                "max_allocated", res["gpu_name"])
        row["loss_impl"] = "rowwise-fp32" if run.get("logps", "fp32") == "fp32" else "rowwise"
        row["reference"] = run.get("reference", "model")
        row.update(source=f"planner bench/gpu_dpo_session.py on {res['gpu_name']}", url_or_path="bench/gpu_dpo_session.py",
                   notes=row["notes"] + "; DPO (sigmoid, beta 0.1): chosen and rejected concatenated, the reference's "
                   "log-probs first without gradients (" + ("precomputed: no reference pass"
                                                            if run.get("reference") == "precomputed" else
                                                            "a frozen copy" if run["method"] == "full" else
                                                            "adapters disabled") + "), log_softmax row by row"
                   + (" upcast to FP32" if run.get("logps", "fp32") == "fp32" else " in BF16"))
        row["predicted_before_gb"] = f"{run['predicted_allocated_bytes'] / 1e9:.3f}"
        mem_rows.append(row)
        timed = res["step_s"][WARMUP:]
        tokens = 2 * run["micro_batch"] * run["seq_len"]
        tp_rows.append({"id": f"D{len(tp_rows) + 1}", "model": run["model"], "method": run["method"],
                        "seq_len": run["seq_len"], "pairs": run["micro_batch"],
                        "checkpointing": "full" if run["checkpointing"] else "none",
                        "tokens_per_s": f"{tokens / statistics.median(timed):.1f}",
                        "predicted_before_tokens_per_s": f"{run['predicted_tokens_per_s']:.1f}",
                        "measured_gb": f"{res['max_allocated'] / 1e9:.3f}",
                        "predicted_before_gb": f"{run['predicted_allocated_bytes'] / 1e9:.3f}"})
    gpu_memory.write_csv(memory_out, mem_rows, list(gpu_memory.COLUMNS) + ["reference", "predicted_before_gb"])
    gpu_memory.write_csv(throughput_out, tp_rows, list(tp_rows[0]) if tp_rows else ["id"])
    return len(mem_rows), len(tp_rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, default=ROOT / "data" / "gpu_h200_dpo_runs.json")
    p.add_argument("--session", type=int, choices=sorted(SESSIONS), default=1)
    r = sub.add_parser("run")
    r.add_argument("--runs", type=Path, default=ROOT / "data" / "gpu_h200_dpo_runs.json")
    r.add_argument("--out-dir", type=Path, required=True)
    r.add_argument("--budget-s", type=float, default=150)
    o = sub.add_parser("one")
    o.add_argument("run")
    c = sub.add_parser("collect")
    c.add_argument("--results", type=Path, required=True)
    c.add_argument("--runs", type=Path, default=ROOT / "data" / "gpu_h200_dpo_runs.json")
    c.add_argument("--memory-out", type=Path, default=ROOT / "data" / "measured_gpu_h200_dpo.csv")
    c.add_argument("--throughput-out", type=Path, default=ROOT / "data" / "measured_h200_dpo_steps.csv")
    args = ap.parse_args()
    if args.cmd == "prepare":
        runs = prepare(args.session)
        args.out.write_text(json.dumps(runs, indent=0))
        print(f"{len(runs)} settings -> {args.out}")
    elif args.cmd == "run":
        args.out_dir.mkdir(parents=True, exist_ok=True)
        run_all(json.loads(args.runs.read_text()), args.out_dir / "results.jsonl", args.budget_s)
    elif args.cmd == "one":
        print(json.dumps(measure(json.loads(args.run))))
    else:
        n_mem, n_steps = collect(args.results, args.runs, args.memory_out, args.throughput_out)
        print(f"{n_mem} memory rows, {n_steps} step rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
