"""Where a training step's time goes on one GPU, and new throughput and memory rows, each
predicted by the planner before it was measured.

    python bench/gpu_time_session.py prepare            # here: no GPU needed; predictions now
    python bench/gpu_time_session.py run --out-dir OUT  # on a CUDA GPU (torch, transformers, peft)
    python bench/gpu_time_session.py collect --results OUT/results.jsonl

``prepare`` lists :data:`GROUPS` with the planner's predictions at that moment (tokens/s per GPU
and the allocator's peak). ``run`` builds each group's model once (a LlamaForCausalLM of the
catalog model's shape, random weights, BF16, SDPA; PEFT LoRA where asked), then trains each of
its settings for a few optimizer steps on random tokens, timing each step between two
``torch.cuda.synchronize`` calls and the host's own share of it (the time until the step's last
call returns, before the synchronize: a step whose host time is close to its wall time is bound
by the host launching kernels, not by the GPU). A setting marked ``profile`` then runs one more
step under ``torch.profiler``; its CUDA kernels are kept as (name, count, total µs) and their
busy time (the union of their intervals) beside the step's wall time. Groups run in the listed
order (the profiled ones first) and none starts past the budget. ``collect`` writes the rows
with ``predicted_before_tokens_per_s`` / ``predicted_before_gb``: the planner's answers before
any rule was changed for them.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_memory
import gpu_session

ROOT = Path(__file__).resolve().parents[1]
#: Optimizer steps per setting; the first :data:`gpu_session.WARMUP_STEPS` are not timed.
STEPS = 6
#: A step predicted longer than this runs one step fewer (the session's time is short).
LONG_STEP_S = 0.8
#: Kernels kept per profile (by total time); the rest are summed as one line.
PROFILE_TOP = 80
ALL = "all-linear"
QV = ["q_proj", "v_proj"]
#: (catalog model, method, LoRA variant, settings). A variant: rank, targets, adapter dtype
#: ("fp32": PEFT's default, the adapters' input cast to FP32; "bf16": adapters cast to BF16).
#: A setting: (sequence length, micro-batch, checkpointing, profile). One H200, BF16 weights,
#: torch AdamW (states in the parameters' dtype), SDPA, LoRA alpha 2·rank, dropout 0.
GROUPS = (
    # profiled: the settings of earlier rows (a repeat measures run-to-run spread) and their twins
    ("smollm2-135m", "full", None, [(2048, 8, False, True)]),
    ("smollm2-135m", "lora", (16, ALL, "fp32"), [(2048, 8, False, True)]),
    ("smollm2-135m", "lora", (16, ALL, "bf16"), [(2048, 8, False, True)]),
    ("llama-3.2-1b", "lora", (16, ALL, "fp32"), [(2048, 4, False, True)]),
    ("llama-3.2-1b", "lora", (16, ALL, "bf16"), [(2048, 4, False, True), (2048, 4, True, False)]),
    ("llama-3.1-8b", "lora", (16, ALL, "fp32"), [(2048, 4, False, True)]),
    ("llama-3.1-8b", "lora", (16, ALL, "bf16"), [(2048, 4, False, True)]),
    ("llama-3.1-8b", "full", None, [(2048, 2, True, True), (8192, 1, True, False), (16384, 1, True, False)]),
    ("llama-3.2-1b", "full", None, [(2048, 4, False, True), (512, 32, False, False), (16384, 1, False, False),
                                    (32768, 1, True, False)]),
    # new models and settings
    ("tinyllama-1.1b", "full", None, [(2048, 8, False, False), (2048, 16, True, False), (4096, 4, False, False)]),
    ("tinyllama-1.1b", "lora", (16, ALL, "fp32"), [(2048, 8, False, False), (2048, 8, True, False)]),
    ("qwen2.5-0.5b", "full", None, [(2048, 8, False, False), (4096, 8, True, False)]),
    ("qwen2.5-0.5b", "lora", (16, ALL, "fp32"), [(2048, 8, False, False)]),
    ("qwen2.5-1.5b", "full", None, [(2048, 8, False, False), (2048, 16, True, False)]),
    ("qwen2.5-1.5b", "lora", (16, ALL, "fp32"), [(2048, 8, False, False)]),
    ("smollm2-1.7b", "full", None, [(2048, 8, False, False), (1024, 16, False, False)]),
    ("smollm2-1.7b", "lora", (16, ALL, "fp32"), [(2048, 8, False, False)]),
    ("qwen2.5-3b", "full", None, [(2048, 8, True, False)]),
    ("qwen2.5-3b", "lora", (16, ALL, "fp32"), [(2048, 4, False, False)]),
    ("qwen3-4b", "full", None, [(2048, 4, True, False), (2048, 8, True, False)]),
    ("qwen3-4b", "lora", (16, ALL, "fp32"), [(2048, 4, False, False)]),
    ("mistral-7b-v0.3", "full", None, [(2048, 4, True, False), (4096, 2, True, False)]),
    ("mistral-7b-v0.3", "lora", (16, ALL, "fp32"), [(2048, 4, False, False), (2048, 8, True, False)]),
    ("mistral-7b-v0.3", "lora", (64, ALL, "fp32"), [(2048, 4, False, False)]),
    ("llama-2-7b", "full", None, [(2048, 4, True, False)]),
    ("llama-2-7b", "lora", (16, ALL, "fp32"), [(2048, 4, False, False)]),
    ("llama-2-7b", "lora", (16, QV, "fp32"), [(2048, 4, False, False)]),
    ("phi-3-mini", "full", None, [(2048, 4, True, False)]),
    ("phi-3-mini", "lora", (16, ALL, "fp32"), [(2048, 4, False, False)]),
    ("qwen2.5-7b", "full", None, [(2048, 4, True, False)]),
    ("qwen2.5-7b", "lora", (16, ALL, "fp32"), [(4096, 2, True, False)]),
    ("qwen3-8b", "full", None, [(2048, 4, True, False)]),
    ("qwen3-8b", "lora", (16, ALL, "fp32"), [(2048, 4, False, False)]),
    ("llama-2-13b", "lora", (16, ALL, "fp32"), [(2048, 4, True, False), (2048, 2, False, False)]),
    ("llama-2-13b", "full", None, [(2048, 2, True, False)]),
    ("qwen2.5-14b", "lora", (16, ALL, "fp32"), [(2048, 4, True, False)]),
)


#: A second session, planned with the time model that the first one's profiles led to, each
#: setting predicted before it ran: settings the first did not measure (fused AdamW, BF16
#: adapters on other models, ranks 8 and 128, q,v only with FP32 adapters, gradient
#: accumulation, 8K tokens). A setting may add its micro-batches per step; a group may name its
#: AdamW ("fused": torch's fused kernel).
GROUPS_2 = (
    ("llama-3.2-1b", "full", None, [(2048, 4, False, False), (2048, 2, False, False, 4)], "fused"),
    ("qwen2.5-1.5b", "full", None, [(2048, 8, False, False)], "fused"),
    ("llama-3.1-8b", "full", None, [(2048, 2, True, False)], "fused"),
    ("mistral-7b-v0.3", "full", None, [(2048, 4, True, False)], "fused"),
    ("qwen2.5-0.5b", "full", None, [(2048, 4, False, False, 4)], "foreach"),
    ("qwen2.5-7b", "lora", (16, ALL, "bf16"), [(2048, 4, False, False)], "foreach"),
    ("qwen3-4b", "lora", (16, ALL, "bf16"), [(2048, 4, False, False)], "foreach"),
    ("tinyllama-1.1b", "lora", (16, ALL, "bf16"), [(2048, 8, False, False)], "foreach"),
    ("llama-2-13b", "lora", (16, ALL, "bf16"), [(2048, 2, False, False)], "foreach"),
    ("llama-3.2-3b", "lora", (8, ALL, "fp32"), [(2048, 4, False, False)], "foreach"),
    ("llama-3.2-3b", "lora", (128, ALL, "fp32"), [(2048, 4, False, False)], "foreach"),
    ("llama-3.1-8b", "lora", (16, QV, "fp32"), [(2048, 4, False, False), (8192, 1, True, False)], "foreach"),
    ("qwen2.5-0.5b", "lora", (16, ALL, "fp32"), [(4096, 4, False, False)], "foreach"),
    ("llama-3.2-1b", "lora", (16, ALL, "fp32"), [(2048, 2, False, False, 4)], "foreach"),
    ("qwen2.5-7b", "full", None, [(8192, 1, True, False)], "foreach"),
)
#: A third session, planned with the model as it stood after the second, each setting predicted
#: before it ran: long context (32K and 64K tokens, where attention outweighs the GEMMs), small
#: models at small micro-batches (where launches and the host may bound the step), and the
#: Qwen2.5-7B full run whose 8K x 1 peak came out 17 % under its 2K x 4 twin, with its 4K and 16K
#: neighbours and a repeat.
GROUPS_3 = (
    ("smollm2-135m", "full", None, [(1024, 2, False, False), (1024, 8, False, False), (4096, 8, False, False)],
     "foreach"),
    ("smollm2-135m", "lora", (16, ALL, "bf16"), [(1024, 2, False, False)], "foreach"),
    ("smollm2-360m", "full", None, [(2048, 4, False, False), (2048, 16, False, False)], "foreach"),
    ("smollm2-360m", "lora", (16, ALL, "fp32"), [(2048, 8, False, False)], "foreach"),
    ("qwen2.5-0.5b", "full", None, [(1024, 1, False, False)], "foreach"),
    ("llama-3.2-1b", "full", None, [(65536, 1, True, False)], "foreach"),
    ("llama-3.2-1b", "lora", (16, ALL, "bf16"), [(32768, 1, True, False), (65536, 1, True, False)], "foreach"),
    ("llama-3.2-3b", "lora", (16, ALL, "bf16"), [(32768, 1, True, False)], "foreach"),
    ("llama-3.1-8b", "lora", (16, ALL, "bf16"), [(32768, 1, True, False)], "foreach"),
    ("qwen2.5-7b", "full", None, [(8192, 1, True, False), (4096, 2, True, False), (16384, 1, True, False)],
     "foreach"),
)
#: A fourth session, predicted by the model refitted with a fused attention rate and the host's
#: launches (commit 47b772c): small models under torch's real foreach and fused AdamW (the earlier
#: sessions 2 and 3 stepped one tensor at a time), head-dimension-128 models at 16K-32K tokens,
#: and settings between the ones measured.
GROUPS_4 = (
    ("smollm2-135m", "full", None, [(2048, 4, False, False)], "foreach"),
    ("smollm2-135m", "full", None, [(2048, 4, False, False)], "fused"),
    ("smollm2-360m", "lora", (16, ALL, "bf16"), [(1024, 4, False, False)], "foreach"),
    ("qwen2.5-0.5b", "lora", (16, ALL, "fp32"), [(2048, 2, False, False)], "foreach"),
    ("llama-3.2-1b", "full", None, [(4096, 2, False, False)], "foreach"),
    ("llama-3.2-1b", "lora", (16, ALL, "bf16"), [(16384, 1, True, False)], "foreach"),
    ("tinyllama-1.1b", "full", None, [(8192, 1, True, False)], "foreach"),
    ("qwen2.5-1.5b", "lora", (16, ALL, "fp32"), [(8192, 1, True, False)], "foreach"),
    ("llama-3.2-3b", "full", None, [(8192, 1, True, False)], "fused"),
    ("qwen3-4b", "lora", (16, ALL, "bf16"), [(16384, 1, True, False)], "foreach"),
    ("mistral-7b-v0.3", "lora", (16, ALL, "bf16"), [(32768, 1, True, False)], "foreach"),
    ("llama-3.1-8b", "full", None, [(4096, 1, True, False)], "foreach"),
)
SESSIONS = {1: GROUPS, 2: GROUPS_2, 3: GROUPS_3, 4: GROUPS_4}


#: How each AdamW implementation is asked of torch. ``fused=False`` alone is not foreach: with
#: ``fused`` given and ``foreach`` unset, torch's ``adamw()`` skips its default
#: (``_default_to_fused_or_foreach`` runs only when both are None) and steps one tensor at a
#: time; sessions 2 and 3 asked that way, so their "foreach" runs say ``ran_as: for_loop``.
ADAMW_KWARGS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for_loop": {"foreach": False}}


def ran_as(run: dict) -> str:
    """The AdamW implementation the run's step used (see :data:`ADAMW_KWARGS`)."""
    return run.get("ran_as") or run.get("optimizer_impl") or "foreach"


def _run_of(model: str, method: str, variant, setting, optimizer: str = "foreach") -> dict:
    seq, batch, ckpt, prof, *accum = setting
    run = gpu_session.sweep_run(model, method, seq, batch, ckpt)
    run["steps"] = STEPS
    run["grad_accum"] = accum[0] if accum else 1
    run["optimizer_impl"] = optimizer
    if variant is not None:
        rank, targets, dtype = variant
        run.update(lora_rank=rank, lora_targets=targets, adapter_dtype=dtype)
    run["profile"] = prof
    return run


def prepare(session: int = 1) -> list[dict]:
    """Every group with its runs and the planner's predictions for each, now."""
    groups, key = [], 0
    for model, method, variant, settings, *optimizer in SESSIONS[session]:
        runs = []
        for setting in settings:
            run = _run_of(model, method, variant, setting, *optimizer)
            run["key"] = key
            key += 1
            run["predicted"] = gpu_session._predicted_memory(run)
            run["predicted_tokens_per_s"] = gpu_session._predicted_tokens_per_s(run)
            if run["seq_len"] * run["micro_batch"] * run["grad_accum"] / run["predicted_tokens_per_s"] > LONG_STEP_S:
                run["steps"] = STEPS - 1  # a long step: one timed step fewer
            runs.append(run)
        groups.append({"model": model, "method": method, "variant": variant, "runs": runs})
    return groups


# --------------------------------------------------------------------------------------------
# run (there)


def _build(run: dict, device: str):
    """The group's model: random weights in BF16 on ``device``, PEFT adapters where asked."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    # one build serves the group's lengths (``longest``: the group's longest, at least 32K positions)
    cfg = gpu_memory.llama_config(run, min_positions=max(32768, run.get("longest", 0)))
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.train()
    if run["method"] != "full":
        from peft import LoraConfig, get_peft_model

        rank = run["lora_rank"]
        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                                 target_modules=run["lora_targets"]))
        if run.get("adapter_dtype") == "bf16":
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.data = p.data.to(torch.bfloat16)
    return model


def _kernels(prof) -> dict:
    """The profiled step's device kernels: busy time (union of intervals), count, top names."""
    spans, names = [], {}
    for e in prof.events():
        if not str(getattr(e, "device_type", "")).endswith("CUDA"):
            continue
        start, end = e.time_range.start, e.time_range.end
        spans.append((start, end))
        n, t = names.get(e.name, (0, 0.0))
        names[e.name] = (n + 1, t + (end - start))
    spans.sort()
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    ranked = sorted(names.items(), key=lambda kv: -kv[1][1])
    top = [[name[:160], n, round(t, 1)] for name, (n, t) in ranked[:PROFILE_TOP]]
    rest = ranked[PROFILE_TOP:]
    if rest:
        top.append(["(other kernels)", sum(n for _, (n, _) in rest), round(sum(t for _, (_, t) in rest), 1)])
    return {"kernel_count": len(spans), "kernel_us": round(sum(e - s for s, e in spans), 1),
            "busy_us": round(busy, 1), "span_us": round((spans[-1][1] - spans[0][0]) if spans else 0.0, 1),
            "kernels": top}


def _setting(model, run: dict, device: str) -> dict:
    """One setting's steps on the built model: times, host times, peak allocated, a profile."""
    import torch

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if run["checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, **ADAMW_KWARGS[ran_as(run)])
    tokens = torch.randint(0, run["vocab"], (run["micro_batch"], run["seq_len"]), device=device)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    def step():
        for _ in range(run.get("grad_accum", 1)):
            loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step_s, host_s = [], []
    try:
        for _ in range(run["steps"]):
            sync()
            start = time.perf_counter()
            step()
            host_s.append(time.perf_counter() - start)
            sync()
            step_s.append(time.perf_counter() - start)
        out = {"step_s": step_s, "host_s": host_s}
        if cuda:
            out.update(max_allocated=torch.cuda.max_memory_allocated(),
                       max_reserved=torch.cuda.max_memory_reserved(), gpu_name=torch.cuda.get_device_name(0))
        if run.get("profile"):
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            sync()
            with profile(activities=acts) as prof:
                start = time.perf_counter()
                step()
                sync()
                wall = time.perf_counter() - start
            out["profile"] = {"wall_us": round(wall * 1e6, 1), **_kernels(prof)}
    finally:
        opt = tokens = params = None  # drop the setting's tensors before the next one
        model.zero_grad(set_to_none=True)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return out


def run_groups(groups: list[dict], out: Path, budget_s: float, device: str) -> None:
    import torch

    deadline = time.monotonic() + budget_s
    import peft
    import transformers

    gpu_session._append(out, {"meta": {"torch": torch.__version__, "transformers": transformers.__version__,
                                       "peft": peft.__version__, "device": device,
                                       "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "",
                                       "steps": STEPS, "warmup": gpu_session.WARMUP_STEPS}})
    for group in groups:
        runs = group["runs"]
        if time.monotonic() > deadline:
            for r in runs:
                gpu_session._append(out, {"key": r["key"], "error": "skipped: past the budget"})
            continue
        model = None
        try:
            t0 = time.perf_counter()
            model = _build({**runs[0], "longest": max(r["seq_len"] for r in runs)}, device)
            build_s = time.perf_counter() - t0
            for r in runs:
                if time.monotonic() > deadline:
                    gpu_session._append(out, {"key": r["key"], "error": "skipped: past the budget"})
                    continue
                try:
                    res = _setting(model, r, device)
                    res["build_s"] = build_s
                except Exception as exc:  # noqa: BLE001 - an OOM: recorded, the next setting goes on
                    res = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                gpu_session._append(out, {"key": r["key"], **res})
                med = statistics.median(res["step_s"][gpu_session.WARMUP_STEPS:]) if "step_s" in res else None
                print(r["key"], r["model"], r["method"], r["seq_len"], r["micro_batch"], r["checkpointing"],
                      med, res.get("error", ""), f"{time.monotonic() - deadline + budget_s:.0f}s", flush=True)
        except Exception as exc:  # noqa: BLE001 - a build failure: recorded for the group's settings
            for r in runs:
                gpu_session._append(out, {"key": r["key"], "error": f"build: {type(exc).__name__}: {str(exc)[:300]}"})
        finally:
            del model
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------
# collect (here)


def collect(results: Path, runs_path: Path, memory_out: Path, throughput_out: Path, start: int,
            source: str = "planner-bench-h200-hf-2") -> tuple[int, int]:
    groups = json.loads(runs_path.read_text())
    runs = {r["key"]: r for g in groups for r in g["runs"]}
    mem_rows, tp_rows = [], []
    for line in results.read_text().splitlines():
        res = json.loads(line)
        if "error" in res or "key" not in res:
            continue
        run = {**runs[res["key"]], "optimizer_impl": ran_as(runs[res["key"]])}  # rows say what ran
        timed = res["step_s"][gpu_session.WARMUP_STEPS:]
        tokens = run["micro_batch"] * run["seq_len"] * run.get("grad_accum", 1)
        row = gpu_session.throughput_row(run, start + len(tp_rows), tokens / statistics.median(timed),
                                         res["step_s"], res.get("gpu_name", "NVIDIA H200"))
        row["source"] = source
        row["source_ref"] = "bench/gpu_time_session.py"
        row["notes"] += ("; one process per model, settings in turn; host share of the "
                         f"step {statistics.median(res['host_s'][gpu_session.WARMUP_STEPS:]) / statistics.median(timed):.2f}")
        row["predicted_before_tokens_per_s"] = f"{run['predicted_tokens_per_s']:.1f}"
        tp_rows.append(row)
        mrow = gpu_memory.row_of(run, len(mem_rows) + 1, res["max_allocated"] / 1e9, "max_allocated",
                                 res.get("gpu_name", "NVIDIA H200"))
        mrow["url_or_path"] = "bench/gpu_time_session.py"
        mrow["source"] = f"planner bench/gpu_time_session.py on {res.get('gpu_name', 'NVIDIA H200')}"
        mrow["notes"] += "; the model built once per group, its settings run in turn in one process"
        mrow["predicted_before_gb"] = f"{run['predicted']['allocated_bytes'] / 1e9:.3f}"
        mem_rows.append(mrow)
    gpu_memory.write_csv(memory_out, mem_rows, list(gpu_memory.COLUMNS) + ["predicted_before_gb"])
    gpu_memory.write_csv(throughput_out, tp_rows, list(gpu_session.THROUGHPUT_COLUMNS) + ["predicted_before_tokens_per_s"])
    return len(mem_rows), len(tp_rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, default=ROOT / "data" / "gpu_h200_time_runs.json")
    p.add_argument("--session", type=int, choices=sorted(SESSIONS), default=1)
    p.add_argument("--first-key", type=int, default=0, help="the first run's key")
    r = sub.add_parser("run")
    r.add_argument("--runs", type=Path, default=ROOT / "data" / "gpu_h200_time_runs.json")
    r.add_argument("--out-dir", type=Path, required=True)
    r.add_argument("--budget-s", type=float, default=420, help="no group or setting starts after this")
    r.add_argument("--device", default="cuda", help="cpu: a dry run of the code paths on tiny shapes")
    c = sub.add_parser("collect")
    c.add_argument("--results", type=Path, required=True)
    c.add_argument("--runs", type=Path, default=ROOT / "data" / "gpu_h200_time_runs.json")
    c.add_argument("--memory-out", type=Path, default=ROOT / "data" / "measured_gpu_h200_time.csv")
    c.add_argument("--throughput-out", type=Path, default=ROOT / "data" / "measured_throughput_h200_time.csv")
    c.add_argument("--first-id", type=int, default=101, help="the first throughput row's number (G101...)")
    c.add_argument("--source", default="planner-bench-h200-hf-2",
                   help="the throughput rows' source (one per session: -hf-2, -hf-3, -hf-4)")
    args = ap.parse_args()
    if args.cmd == "prepare":
        groups = prepare(args.session)
        for g in groups:
            for r in g["runs"]:
                r["key"] += args.first_key
        args.out.write_text(json.dumps(groups, indent=0))
        print(f"{sum(len(g['runs']) for g in groups)} runs in {len(groups)} groups -> {args.out}")
    elif args.cmd == "run":
        args.out_dir.mkdir(parents=True, exist_ok=True)
        groups = json.loads(args.runs.read_text())
        if args.device == "cpu":  # tiny shapes, two steps: the code paths, not the numbers
            for g in groups:
                for r in g["runs"]:
                    r.update(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=256,
                             seq_len=32, micro_batch=2, steps=3)
        run_groups(groups, args.out_dir / "results.jsonl", args.budget_s, args.device)
    else:
        n_mem, n_tp = collect(args.results, args.runs, args.memory_out, args.throughput_out, args.first_id,
                             args.source)
        print(f"{n_mem} memory rows -> {args.memory_out}; {n_tp} throughput rows -> {args.throughput_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
