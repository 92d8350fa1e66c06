"""One GPU session's measurements, planned here and run there: real peak memory and training
throughput of small Llama-shaped models, each with the planner's prediction recorded before the
measurement.

    python bench/gpu_session.py prepare --out data/gpu_h200_runs.json        # here: no GPU needed
    python bench/gpu_session.py run --runs data/gpu_h200_runs.json --out-dir OUT   # on a CUDA GPU
    python bench/gpu_session.py repredict --results OUT/results.jsonl   # here, before any fit
    python bench/gpu_session.py collect --results OUT/results.jsonl

``prepare`` lists every run (the throughput sweep of catalog models, the replayed verdict rows,
the memory grid and the fixed/varied-length twins of bench/gpu_memory.py) with what the planner
predicts for it *now*: the three memory views of the detailed profile and, for the sweep, the
time model's tokens/s per GPU. ``run`` needs only torch, transformers, peft and bitsandbytes (not
the planner): the sweep runs first, one run after another in one process so that its timings own
the GPU; then the memory runs, each in a fresh process (a clean CUDA context and allocator),
several at once as long as their predicted device memory fits :data:`GPU_BUDGET_BYTES`; a run's
result is appended to ``results.jsonl`` as it ends, and nothing new starts past the deadline.
``collect`` writes the measured rows beside those predictions: ``predicted_before_gb`` (memory)
and ``predicted_before_tokens_per_s`` (throughput) are the planner's answers before any rule was
changed for these rows, which ``planner validate`` scores as the unseen error.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_memory

ROOT = Path(__file__).resolve().parents[1]
#: GPU memory the concurrent memory runs may hold together (an H200 has 143,771 MiB): each run
#: is charged its predicted nvidia-smi view × :data:`BUDGET_FACTOR` + :data:`BUDGET_SLACK_BYTES`.
GPU_BUDGET_BYTES = 130e9
BUDGET_FACTOR = 1.25
BUDGET_SLACK_BYTES = 1.5e9
#: Concurrent memory runs at most (the machine has 16 CPU cores; each run imports torch).
JOBS = 8
#: The last replay (V055: 8B QLoRA at 52K tokens) takes minutes and most of the card: it starts
#: alone, and only with this much time left before the memory runs are stopped.
LAST_RUN_MIN_S = 150
#: Steps of a sweep run: the first :data:`WARMUP_STEPS` (allocations, autotuning) are not timed.
SWEEP_STEPS = 6
WARMUP_STEPS = 2
#: The throughput sweep: (catalog model, method, sequence length, micro-batch, checkpointing).
#: One H200, BF16 weights, torch AdamW, SDPA attention, LoRA rank 16 on all linear layers.
SWEEP = (
    ("smollm2-135m", "full", 2048, 8, False), ("smollm2-135m", "full", 2048, 32, False),
    ("smollm2-135m", "lora", 2048, 8, False),
    ("smollm2-360m", "full", 2048, 8, False), ("smollm2-360m", "full", 2048, 8, True),
    ("llama-3.2-1b", "full", 2048, 4, False), ("llama-3.2-1b", "full", 2048, 8, True),
    ("llama-3.2-1b", "lora", 2048, 4, False), ("llama-3.2-1b", "full", 8192, 1, False),
    ("llama-3.2-1b", "qlora", 2048, 4, True),
    ("llama-3.2-3b", "full", 2048, 4, False), ("llama-3.2-3b", "full", 2048, 8, True),
    ("llama-3.2-3b", "lora", 2048, 4, False),
    ("llama-3.1-8b", "full", 2048, 2, True), ("llama-3.1-8b", "full", 2048, 8, True),
    ("llama-3.1-8b", "lora", 2048, 4, False),
)
GPU_ID = "h200-sxm-141gb"
THROUGHPUT_COLUMNS = ["id", "source", "source_ref", "model", "planner_model", "params_b", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "gated_mlp", "tied_embeddings", "method", "lora_rank", "quant", "precision", "gpu_type", "planner_gpu", "gpus", "gpus_per_node", "tp", "pp", "cp", "dp", "zero_fsdp", "seq_len", "micro_batch", "grad_accum", "global_batch", "checkpointing", "measured_stated", "measured_value", "measured_unit", "tokens_per_s_per_gpu", "conversion", "confidence", "notes"]


# --------------------------------------------------------------------------------------------
# prepare (here)


def sweep_run(model_id: str, method: str, seq: int, batch: int, ckpt: bool) -> dict:
    """A sweep run of a catalog model's architecture (random weights)."""
    from planner import catalog

    m = catalog.get_model(model_id)
    run = {"hidden": m.hidden, "layers": m.layers, "heads": m.heads, "kv_heads": m.kv_heads,
           "head_dim": m.head_dim or m.hidden // m.heads, "ffn": m.ffn, "vocab": m.vocab,
           "tied": m.tied_embeddings, "method": method, "precision": "bf16-true", "attention": "sdpa",
           "checkpointing": ckpt, "seq_len": seq, "micro_batch": batch, "steps": SWEEP_STEPS,
           "model": model_id}
    if method != "full":
        run.update(lora_rank=gpu_memory.LORA_RANK, lora_targets="all-linear")
    if method == "qlora":
        run.update(double_quant=True)
    return run


def _targets_text(targets) -> str:
    return "all linear" if targets == "all-linear" else ",".join(t.removesuffix("_proj") for t in targets)


def throughput_row(run: dict, index: int, tokens_per_s: float, step_s: list[float], gpu_name: str) -> dict:
    """A row in the columns of data/measured_throughput.csv."""
    tokens = run["micro_batch"] * run["seq_len"] * run.get("grad_accum", 1)
    timed = step_s[WARMUP_STEPS:]
    row = {
        "id": f"G{index}", "source": "planner-bench-h200-hf", "source_ref": "bench/gpu_session.py",
        "model": run["model"], "planner_model": run["model"],
        "params_b": f"{gpu_memory.params_of(run) / 1e9:.4f}", "layers": run["layers"], "hidden": run["hidden"],
        "heads": run["heads"], "kv_heads": run["kv_heads"], "ffn": run["ffn"], "vocab": run["vocab"],
        "gated_mlp": "yes", "tied_embeddings": "yes" if run.get("tied") else "no", "method": run["method"],
        "lora_rank": run.get("lora_rank", "") if run["method"] != "full" else "",
        "quant": "nf4" if run["method"] == "qlora" else "",
        "precision": "bf16 (BF16 weights, torch AdamW states in BF16)" if run["method"] == "full"
        else "bf16 base, BF16 PEFT adapters (cast)" if run.get("adapter_dtype") == "bf16"
        else "bf16 base, FP32 PEFT adapters, no autocast (inputs cast to FP32)",
        "gpu_type": gpu_name, "planner_gpu": GPU_ID, "gpus": 1, "gpus_per_node": 1, "tp": 1, "pp": 1, "cp": 1,
        "dp": 1, "zero_fsdp": "none", "seq_len": run["seq_len"], "micro_batch": run["micro_batch"],
        "grad_accum": run.get("grad_accum", 1), "global_batch": run["micro_batch"] * run.get("grad_accum", 1),
        "checkpointing": "full" if run["checkpointing"] else "none",
        "measured_stated": f"median step {statistics.median(timed):.4f} s of {len(timed)} timed steps",
        "measured_value": f"{tokens_per_s:.1f}", "measured_unit": "tokens/s/GPU",
        "tokens_per_s_per_gpu": f"{tokens_per_s:.1f}",
        "conversion": f"{tokens} tokens per step / median step time", "confidence": "high",
        "notes": (f"transformers LlamaForCausalLM, random weights, SDPA, torch.cuda.synchronize around each "
                  f"optimizer step; {WARMUP_STEPS} warm-up steps not timed; no compile, standard loss; "
                  + ("torch AdamW fused (fused=True)" if run.get("optimizer_impl") == "fused"
                     else "torch AdamW one tensor at a time (for-loop: fused=False, foreach unset)"
                     if run.get("optimizer_impl") == "for_loop"
                     else "torch AdamW foreach (torch's default)") + ", states in the parameters' dtype"
                  + (", bitsandbytes NF4 base (double quant)" if run["method"] == "qlora" else "")
                  + ("" if run["method"] == "full" else f"; LoRA rank {run.get('lora_rank', gpu_memory.LORA_RANK)} on "
                     + _targets_text(run.get("lora_targets", "all-linear")))),
    }
    return {k: str(v) for k, v in row.items()}  # as a CSV reads it back


def _predicted_memory(run: dict) -> dict[str, float]:
    from planner.validate.score import predict_row

    views, _ = predict_row(gpu_memory.row_of(run, 0, 1.0, "max_allocated", "NVIDIA H200"), "detailed")
    return {k: float(v) for k, v in views.items()}


def _predicted_tokens_per_s(run: dict) -> float:
    from planner.perf import timing
    from planner.validate.throughput import Batch, cases_of

    cases, unmodelled = cases_of([throughput_row(run, 0, 1.0, [1.0] * SWEEP_STEPS, "NVIDIA H200")])
    if unmodelled:
        raise ValueError(f"{run}: {unmodelled[0].reason}")
    return float(Batch.of(cases).predict(timing.FITTED)[0])


def prepare() -> list[dict]:
    """Every run of the session, in the order it runs, with the planner's predictions now."""
    runs = [dict(sweep_run(*s), phase="sweep") for s in SWEEP]
    verdicts = {r["verdict_id"]: r for r in gpu_memory.verdict_runs()}
    # the runs that check a verdict first; V055 (8B QLoRA at 52K tokens, minutes) last of all
    runs += [dict(verdicts[v], phase="memory") for v in ("V322", "V326", "V043", "V400")]
    grid = gpu_memory.grid()
    runs += [dict(r, phase="memory") for r in grid if r["attention"] == "sdpa"]
    runs += [dict(r, phase="memory") for r in gpu_memory.varied_grid()]
    runs += [dict(r, phase="memory") for r in grid if r["attention"] == "eager"]
    runs.append(dict(verdicts["V055"], phase="memory", last=True))
    for i, run in enumerate(runs):
        run["key"] = i
        run["predicted"] = _predicted_memory(run)
        if run["phase"] == "sweep":
            run["predicted_tokens_per_s"] = _predicted_tokens_per_s(run)
    return runs


# --------------------------------------------------------------------------------------------
# run (there)


def _append(path: Path, record: dict) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def _cost(run: dict) -> float:
    return run["predicted"]["device_bytes"] * BUDGET_FACTOR + BUDGET_SLACK_BYTES


def run_sweep(runs: list[dict], out: Path, deadline: float) -> None:
    """The throughput sweep, in this process, one run after another."""
    import torch

    for run in runs:
        if time.monotonic() > deadline:
            _append(out, {"key": run["key"], "error": "skipped: past the sweep's deadline"})
            continue
        gc.collect()
        torch.cuda.empty_cache()
        try:
            views = gpu_memory.measure(run)
        except Exception as exc:  # noqa: BLE001 - an OOM or an API change: recorded, the sweep goes on
            views = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        views.pop("nvidia_smi", None)  # the process holds earlier runs' context: not this run's view
        _append(out, {"key": run["key"], **views})
        print(run["key"], run["model"], run["method"], views.get("step_s", views.get("error")), flush=True)


def run_memory(runs: list[dict], out: Path, deadline: float, stop: float) -> None:
    """The memory runs, each in a fresh process, as many at once as the budget allows."""
    pending, running = list(runs), {}
    logs = out.parent / "logs"
    logs.mkdir(exist_ok=True)
    while pending or running:
        now = time.monotonic()
        for key, (proc, run, started) in list(running.items()):
            if proc.poll() is None and now < stop:
                continue
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            lines = (logs / f"{key}.out").read_text().strip().splitlines()
            stderr = (logs / f"{key}.err").read_text(errors="replace")
            if proc.returncode == 0 and lines:
                _append(out, {"key": key, **json.loads(lines[-1]), "wall_s": now - started})
            else:
                _append(out, {"key": key, "error": (stderr.strip().splitlines() or ["killed"])[-1][:300]})
            del running[key]
            print(key, run.get("verdict_id", run["method"]), "done" if proc.returncode == 0 else "failed", flush=True)
        held = sum(_cost(r) for _, r, _ in running.values())
        if now < deadline:
            reserve = 0.0  # room kept for the first verdict replay that must wait
            for run in list(pending):
                if len(running) >= JOBS:
                    break
                first = run.get("verdict_id") and not run.get("last") and not reserve
                if run.get("last") and (running or stop - now < LAST_RUN_MIN_S):
                    continue  # the longest replay runs alone, and only with time left for it
                if held + _cost(run) + (0.0 if first else reserve) <= GPU_BUDGET_BYTES or not running:
                    with (logs / f"{run['key']}.out").open("w") as so, (logs / f"{run['key']}.err").open("w") as se:
                        proc = subprocess.Popen([sys.executable, gpu_memory.__file__, "--one", json.dumps(run)],
                                                stdout=so, stderr=se, text=True)
                    running[run["key"]] = (proc, run, now)
                    held += _cost(run)
                    pending.remove(run)
                elif first:
                    reserve = _cost(run)  # later runs may not take its room: it is not overtaken for ever
        else:
            for run in pending:
                _append(out, {"key": run["key"], "error": "skipped: past the deadline"})
            pending = []
        time.sleep(0.5)


def run(runs_path: Path, out_dir: Path, sweep_s: float, launch_s: float, stop_s: float,
        resume: Path | None = None) -> None:
    """The sweep (in a child process, which gives its cached memory back when it ends), then the
    memory runs; ``resume``: a results file whose measured runs are not run again."""
    start = time.monotonic()
    runs = json.loads(runs_path.read_text())
    if resume is not None:
        done = {r["key"] for r in map(json.loads, resume.read_text().splitlines()) if "error" not in r}
        runs = [r for r in runs if r["key"] not in done]
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "results.jsonl"
    sweep = [r for r in runs if r["phase"] == "sweep"]
    if sweep:
        (out_dir / "sweep.json").write_text(json.dumps(sweep))
        subprocess.run([sys.executable, __file__, "sweep", str(out_dir / "sweep.json"), str(out), str(sweep_s)],
                       check=False)
    run_memory([r for r in runs if r["phase"] == "memory"], out, start + launch_s, start + stop_s)


# --------------------------------------------------------------------------------------------
# collect (here)


def as_ran(run: dict, result: dict) -> dict:
    """The run as it ran: a QLoRA base measured before the runner put the model in training mode
    (``train_mode`` missing from the result) ran without checkpointing, whatever was asked, since
    ``from_pretrained`` returns the model in eval mode and transformers checkpoints only in
    training mode. Its predictions were made for that run (:func:`repredict`)."""
    if run["method"] == "qlora" and run["checkpointing"] and not result.get("train_mode"):
        run = {**run, "checkpointing": False, "ckpt_not_in_effect": True}
    return run


def repredict(runs_path: Path, results_path: Path) -> int:
    """Record beside each measured run the planner's predictions for the run as it ran and as
    its row is coded now (``predicted_as_ran``, ``predicted_tokens_per_s_as_ran``); the
    predictions made when the runs were planned stay. Run before any rule is changed for these
    rows, like ``prepare``: a row coded otherwise than planned (checkpointing not in effect, the
    adapters' autocast) is then still predicted before any fit."""
    runs = json.loads(runs_path.read_text())
    results = {r["key"]: r for r in map(json.loads, results_path.read_text().splitlines()) if "error" not in r}
    changed = 0
    for run in runs:
        if run["key"] not in results:
            continue
        ran = as_ran(run, results[run["key"]])
        run["predicted_as_ran"] = _predicted_memory(ran)
        if run["phase"] == "sweep":
            run["predicted_tokens_per_s_as_ran"] = _predicted_tokens_per_s(ran)
        changed += run["predicted_as_ran"] != run["predicted"]
    runs_path.write_text(json.dumps(runs, indent=0))
    return changed


def collect(results_path: Path, runs_path: Path, memory_out: Path, throughput_out: Path) -> tuple[int, int]:
    from planner.validate.score import KIND_VIEW

    runs = {r["key"]: r for r in json.loads(runs_path.read_text())}
    mem_rows, tp_rows = [], []
    for line in results_path.read_text().splitlines():
        res = json.loads(line)
        if "error" in res:
            continue
        run = as_ran(runs[res["key"]], res)
        gpu = res.get("gpu_name", "NVIDIA H200")
        for kind in ("max_allocated", "max_reserved", "nvidia_smi"):
            view = KIND_VIEW[kind]  # the prediction's view each measured kind is scored against
            if kind in res:
                row = gpu_memory.row_of(run, len(mem_rows) + 1, res[kind] / 1e9, kind, gpu)
                predicted = run.get("predicted_as_ran", run["predicted"])
                row["predicted_before_gb"] = f"{predicted[view] / 1e9:.3f}"
                mem_rows.append(row)
        if run["phase"] == "sweep":
            timed = res["step_s"][WARMUP_STEPS:]
            tokens = run["micro_batch"] * run["seq_len"] * run.get("grad_accum", 1)
            row = throughput_row(run, len(tp_rows) + 1, tokens / statistics.median(timed), res["step_s"], gpu)
            predicted = run.get("predicted_tokens_per_s_as_ran", run["predicted_tokens_per_s"])
            row["predicted_before_tokens_per_s"] = f"{predicted:.1f}"
            tp_rows.append(row)
    gpu_memory.write_csv(memory_out, mem_rows, list(gpu_memory.COLUMNS) + ["predicted_before_gb"])
    gpu_memory.write_csv(throughput_out, tp_rows, list(THROUGHPUT_COLUMNS) + ["predicted_before_tokens_per_s"])
    return len(mem_rows), len(tp_rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, default=ROOT / "data" / "gpu_h200_runs.json")
    r = sub.add_parser("run")
    r.add_argument("--runs", type=Path, default=ROOT / "data" / "gpu_h200_runs.json")
    r.add_argument("--out-dir", type=Path, required=True)
    r.add_argument("--sweep-s", type=float, default=150, help="no sweep run starts after this")
    r.add_argument("--launch-s", type=float, default=360, help="no memory run starts after this")
    r.add_argument("--stop-s", type=float, default=420, help="memory runs still going are stopped")
    r.add_argument("--resume", type=Path, help="results of an earlier run: what they measured is not run again")
    w = sub.add_parser("sweep")  # the sweep's own process (started by run)
    w.add_argument("runs", type=Path)
    w.add_argument("results", type=Path)
    w.add_argument("seconds", type=float)
    q = sub.add_parser("repredict")
    q.add_argument("--results", type=Path, required=True)
    q.add_argument("--runs", type=Path, default=ROOT / "data" / "gpu_h200_runs.json")
    c = sub.add_parser("collect")
    c.add_argument("--results", type=Path, required=True)
    c.add_argument("--runs", type=Path, default=ROOT / "data" / "gpu_h200_runs.json")
    c.add_argument("--memory-out", type=Path, default=ROOT / "data" / "measured_gpu_h200.csv")
    c.add_argument("--throughput-out", type=Path, default=ROOT / "data" / "measured_throughput_h200.csv")
    args = ap.parse_args()
    if args.cmd == "prepare":
        runs = prepare()
        args.out.write_text(json.dumps(runs, indent=0))
        print(f"{len(runs)} runs -> {args.out}")
    elif args.cmd == "run":
        run(args.runs, args.out_dir, args.sweep_s, args.launch_s, args.stop_s, args.resume)
    elif args.cmd == "sweep":
        run_sweep(json.loads(args.runs.read_text()), args.results, time.monotonic() + args.seconds)
    elif args.cmd == "repredict":
        print(f"{repredict(args.runs, args.results)} runs predicted otherwise as they ran than as planned")
    else:
        n_mem, n_tp = collect(args.results, args.runs, args.memory_out, args.throughput_out)
        print(f"{n_mem} memory rows -> {args.memory_out}; {n_tp} throughput rows -> {args.throughput_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
