"""Measure the real peak GPU memory of small Llama models across methods and settings, and write
the results as calibration rows that `planner validate` scores.

    pip install ".[truth]" bitsandbytes        # torch, transformers, peft (+ QLoRA)
    python bench/gpu_memory.py --out data/measured_gpu.csv [--quick | --varied | --verdicts]
    planner validate data/measured_gpu.csv

``--varied`` measures instead pairs of runs that differ only in their batches' lengths: one at
the full sequence length every step, one whose steps draw their lengths at random up to it (a
loop padding each batch to its own longest sample, as most fine-tuning recipes without packing
do), over ``VARIED_STEPS`` steps; what the caching allocator keeps reserved beyond the fixed run
is the fragmentation that varied lengths add.

``--verdicts`` replays instead the single-GPU rows of data/verdicts.csv that this runner's stack
can reproduce (:data:`VERDICT_ROWS`), each as the planner reads it, and prints beside each view
whether it would have fitted the row's own card: the measurement that settles a verdict the
published report leaves in doubt.

Needs a CUDA GPU. Each run starts in a fresh process (a clean CUDA context and allocator), builds
a LlamaForCausalLM from a LlamaConfig with random weights (nothing is downloaded; the QLoRA base is
saved to a temporary folder and loaded back quantized), trains ``STEPS`` optimizer steps on random
tokens and records three views: ``torch.cuda.max_memory_allocated``, ``max_memory_reserved`` and
what nvidia-smi reports for the process — one row each, in the columns of
data/measured_calibration.csv.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import subprocess
import sys
from pathlib import Path

#: Optimizer steps per run: the first allocates the optimizer states; the peak is in a later one.
STEPS = 3
#: (hidden, layers, heads, kv_heads, ffn, vocab): about 0.15B, 0.5B and 1.3B parameters.
SHAPES = [(768, 8, 12, 4, 2048, 32000), (1536, 12, 12, 4, 4096, 32000), (2048, 16, 16, 8, 5632, 128256)]
METHODS = ("full", "lora", "qlora")
PRECISIONS = ("bf16-true", "bf16-mixed")
ATTENTION = ("sdpa", "eager")
CHECKPOINTING = (False, True)
SEQ_BATCH = ((512, 4), (2048, 1))
LORA_RANK = 16
#: Steps of a ``--varied`` run (and of its fixed-length twin): enough distinct lengths for the
#: allocator's cache to settle. Each step's length is drawn uniformly from
#: [seq_len / VARIED_SHORTEST, seq_len] (seeded), the last step at seq_len itself, so both runs
#: reach the same largest batch.
VARIED_STEPS = 40
VARIED_SHORTEST = 8

#: Rows of data/verdicts.csv the runner replays: one GPU, a Llama-shaped decoder (Llama, Mistral,
#: SmolLM2) on the Hugging Face stack (transformers, PEFT, bitsandbytes; no Unsloth or Liger
#: kernels), small enough to build with random weights on one H200. Two out-of-memory reports
#: (V322: SmolLM2-1.7B full fine-tuning at 16K tokens without checkpointing, judged to fit at
#: 0.74 of its H100; V055: Llama-3.1-8B QLoRA at 52K tokens, judged out of memory) and three runs
#: that ran (Mistral-7B full and QLoRA at 8K, Llama-3-8B QLoRA at 5.9K).
VERDICT_ROWS = ("V322", "V055", "V326", "V043", "V400")
#: Optimizer steps of a replayed row: the first allocates the optimizer states, the second holds
#: them through a whole step.
VERDICT_STEPS = 2
#: Micro-batches per replayed step, at most: from the second on, each finds the gradients the
#: first left and needs what every later one needs, so a row accumulating over more is replayed
#: with this many (minutes less at 52K tokens).
VERDICT_MICRO_BATCHES = 2
#: The planner's short LoRA target names as Hugging Face Llama module names.
HF_TARGETS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj",
              "up": "up_proj", "down": "down_proj"}
ROOT = Path(__file__).resolve().parents[1]

COLUMNS = ["id", "source", "url_or_path", "model", "params_b", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "method", "quant_bits", "optimizer", "precision", "seq_len", "micro_batch", "grad_ckpt", "flash_attn", "gpus", "gpu_type", "dp", "tp", "pp", "cp", "zero_or_fsdp", "cpu_offload", "lora_rank", "lora_targets", "measured_gb", "measure_kind", "notes", "hf_model", "framework", "framework_date", "loss_impl", "compile", "grad_accum", "lora_dropout", "adapter_dtype", "peak_at_first_step", "quant_impl", "double_quant", "kbit_prep", "bitsandbytes", "optimizer_in_bwd", "norm_fp32", "mqa_sdpa_math", "zero_reduce_bucket", "measured_unit", "kernels", "qk_norm", "algorithm"]


def grid(quick: bool = False) -> list[dict]:
    """Every run of the grid (``quick``: the smallest shape, SDPA, one sequence length)."""
    shapes = SHAPES[:1] if quick else SHAPES
    attention = ATTENTION[:1] if quick else ATTENTION
    seq_batch = SEQ_BATCH[:1] if quick else SEQ_BATCH
    runs = []
    for shape, method, precision, attn, ckpt, (seq, batch) in itertools.product(
            shapes, METHODS, PRECISIONS, attention, CHECKPOINTING, seq_batch):
        if method != "full" and precision == "bf16-mixed":
            continue  # adapters train in FP32 under PEFT either way: one precision suffices
        h, layers, heads, kv, ffn, vocab = shape
        runs.append({"hidden": h, "layers": layers, "heads": heads, "kv_heads": kv, "ffn": ffn,
                     "vocab": vocab, "method": method, "precision": precision, "attention": attn,
                     "checkpointing": ckpt, "seq_len": seq, "micro_batch": batch})
    return runs


def varied_grid() -> list[dict]:
    """Pairs of runs, fixed and varied lengths, of the two larger shapes (32k and 128k
    vocabularies): full fine-tuning and LoRA, bf16 weights, SDPA, checkpointing, 2,048 tokens."""
    runs = []
    for shape, method, lengths in itertools.product(SHAPES[1:], ("full", "lora"), ("fixed", "varied")):
        h, layers, heads, kv, ffn, vocab = shape
        runs.append({"hidden": h, "layers": layers, "heads": heads, "kv_heads": kv, "ffn": ffn,
                     "vocab": vocab, "method": method, "precision": "bf16-true", "attention": "sdpa",
                     "checkpointing": True, "seq_len": 2048, "micro_batch": 1, "lengths": lengths})
    return runs


def verdict_runs(path: Path = ROOT / "data" / "verdicts.csv", ids: tuple[str, ...] = VERDICT_ROWS) -> list[dict]:
    """The runs that replay rows ``ids`` of a verdicts file: the architecture, recipe and layout
    the planner reads from each row (:func:`planner.validate.verdicts.judge_row`'s reading), with
    the row's verdict and its card's capacity. A row this runner cannot replay is an error."""
    from planner.scenario.resolve import resolve
    from planner.validate.verdicts import _model_cell, capacity_of, read_rows, scenario_of, stated_or_least

    rows = {r["id"]: r for r in read_rows(path)}
    runs = []
    for row_id in ids:
        row = {**rows[row_id], "model": _model_cell(rows[row_id])}
        rs = resolve(scenario_of(stated_or_least(row)))
        m, w, lay, rec = rs.model, rs.workload, rs.layout, rs.recipe
        if lay.gpus != 1 or lay.zero or m.impl != "hf" or not m.gated_mlp or m.norm != "rmsnorm" \
                or w.method not in METHODS or rec.kernels != "standard" or w.quant_bits != 4:
            raise ValueError(f"{row_id}: not a single-GPU Llama-shaped run on the Hugging Face stack")
        run = {"hidden": m.hidden, "layers": m.layers, "heads": m.heads, "kv_heads": m.kv_heads,
               "head_dim": m.head_dim or m.hidden // m.heads, "ffn": m.ffn, "vocab": m.vocab,
               "tied": m.tied_embeddings, "method": w.method,
               "precision": "bf16-mixed" if w.precision == "mixed" else "bf16-true",
               "attention": "sdpa", "checkpointing": lay.checkpointing != "none",
               "seq_len": w.seq_len, "micro_batch": w.micro_batch,
               "grad_accum": min(rs.grad_accum or 1, VERDICT_MICRO_BATCHES), "steps": VERDICT_STEPS,
               "optimizer": "adamw_8bit" if w.optimizer == "adam8bit" else "adamw",
               "verdict_id": row_id, "verdict": row["verdict"].strip().lower(), "model": row["model"],
               "capacity_bytes": capacity_of(row)}
        if w.method != "full":
            run.update(lora_rank=w.lora_rank, lora_dropout=w.lora_dropout,
                       lora_targets=("all-linear" if "all" in w.lora_targets
                                     else [HF_TARGETS[t] for t in w.lora_targets]),
                       adapter_dtype="fp32" if w.adapter_dtype == "fp32" else "bf16")
        if w.method == "qlora":
            run.update(double_quant=bool(w.double_quant), kbit_prep=rec.kbit_prep != "none")
        runs.append(run)
    return runs


def step_lengths(run: dict) -> list[int]:
    """The sequence length of each step: seq_len throughout, or (varied) drawn at random."""
    import random

    if run.get("lengths", "fixed") == "fixed":
        return [run["seq_len"]] * (VARIED_STEPS if "lengths" in run else run.get("steps", STEPS))
    rng = random.Random(0)
    shortest = run["seq_len"] // VARIED_SHORTEST
    return [rng.randint(shortest, run["seq_len"]) for _ in range(VARIED_STEPS - 1)] + [run["seq_len"]]


def params_of(run: dict) -> int:
    h, f, v, layers = run["hidden"], run["ffn"], run["vocab"], run["layers"]
    d = run.get("head_dim", h // run["heads"])
    q, kv = d * run["heads"], d * run["kv_heads"]
    per_layer = 2 * h * q + 2 * h * kv + 3 * h * f + 2 * h
    return layers * per_layer + (1 if run.get("tied") else 2) * v * h + h


def row_of(run: dict, index: int, measured_gb: float, kind: str, gpu_name: str) -> dict[str, str]:
    """A calibration row (the columns of data/measured_calibration.csv) for one measured view."""
    full = run["method"] == "full"
    precision = "bf16-mixed (fp32 master weights, autocast)" if run["precision"] == "bf16-mixed" else "bf16-true"
    adapters = ", PEFT adapters " + ("BF16" if run.get("adapter_dtype") == "bf16" else "FP32")
    optimizer = (("bitsandbytes AdamW8bit (8-bit states" if run.get("optimizer") == "adamw_8bit"
                  else "torch AdamW fused (fused=True, HF Trainer-style loop" if run.get("optimizer_impl") == "fused"
                  else "torch AdamW one tensor at a time (for-loop: fused=False, foreach unset; HF Trainer-style loop"
                  if run.get("optimizer_impl") == "for_loop"
                  else "torch AdamW foreach (HF Trainer-style loop")
                 + ("" if full else adapters)
                 + (", states FP32)" if run["precision"] == "bf16-mixed" else ", states in param dtype)"))
    targets = run.get("lora_targets", "all-linear")
    targets = "all linear" if targets == "all-linear" else ",".join(t.removesuffix("_proj") for t in targets)
    replay = (f"replays {run['verdict_id']} of data/verdicts.csv ({run['verdict']} on a card of "
              f"{run['capacity_bytes'] / 1e9:.1f} GB) on the runner's stack; " if "verdict_id" in run else "")
    return {
        "id": str(index), "source": f"planner bench/gpu_memory.py on {gpu_name}",
        "url_or_path": "bench/gpu_memory.py",
        "model": run.get("model", f"llama-h{run['hidden']}-l{run['layers']}"),
        "params_b": f"{params_of(run) / 1e9:.4f}",
        "layers": str(run["layers"]), "hidden": str(run["hidden"]), "heads": str(run["heads"]),
        "kv_heads": str(run["kv_heads"]), "ffn": str(run["ffn"]), "vocab": str(run["vocab"]),
        "method": run["method"], "quant_bits": "4" if run["method"] == "qlora" else "",
        "optimizer": optimizer, "precision": precision, "seq_len": str(run["seq_len"]),
        "micro_batch": str(run["micro_batch"]), "grad_ckpt": "yes" if run["checkpointing"] else "no",
        # (a run whose checkpointing was asked for but not in effect has checkpointing False and
        # ``ckpt_not_in_effect``; its notes say so)
        "flash_attn": run["attention"], "gpus": "1", "gpu_type": gpu_name, "dp": "1", "tp": "1", "pp": "1",
        "cp": "", "zero_or_fsdp": "none", "cpu_offload": "no",
        "lora_rank": "" if full else str(run.get("lora_rank", LORA_RANK)),
        "lora_targets": "" if full else targets,
        "measured_gb": f"{measured_gb:.3f}", "measure_kind": kind,
        "notes": (replay + ("checkpointing requested but not in effect (the quantized model stayed in eval "
                            "mode, where transformers skips it); " if run.get("ckpt_not_in_effect") else "")
                  + f"random-init LlamaForCausalLM ({'tied' if run.get('tied') else 'untied'}), "
                  f"{len(step_lengths(run))} steps"
                  + (f" of {run['grad_accum']} micro-batches each" if run.get("grad_accum", 1) > 1 else "")
                  + " on random tokens, "
                  + ("each step's length drawn uniformly from "
                     f"[{run['seq_len'] // VARIED_SHORTEST}, {run['seq_len']}] (seed 0), the last at "
                     f"{run['seq_len']}; " if run.get("lengths") == "varied" else "no padding; ")
                  + (("quantize=bnb.nf4" + ("-dq (double quant)" if run.get("double_quant", True) else "")
                      + " via BitsAndBytesConfig" + (", prepare_model_for_kbit_training" if run.get("kbit_prep")
                                                     else "") + "; ") if run["method"] == "qlora" else "")
                  + "GB = 1e9 bytes; conf=high"),
        # the recipe: a transformers model with PEFT adapters (FP32 unless the run casts them), the
        # run's k-bit readying and micro-batches per optimizer step, the standard loss
        # hf_model means the Trainer's autocast forward for adapters; this loop autocasts only
        # bf16-mixed runs, so a bf16-true LoRA run's PEFT casts each adapter's input to FP32
        "hf_model": "yes" if run["method"] == "full" or run["precision"] == "bf16-mixed" else "no",
        "framework": "other", "framework_date": "", "loss_impl": "standard",
        "compile": "no", "grad_accum": str(run.get("grad_accum", 1)),
        "lora_dropout": "" if full else str(run.get("lora_dropout", 0)),
        "adapter_dtype": "" if full else ("compute" if run.get("adapter_dtype") == "bf16" else "fp32"),
        "peak_at_first_step": "no",
        "quant_impl": "bnb-nf4" if run["method"] == "qlora" else "",
        "double_quant": ("yes" if run.get("double_quant", True) else "no") if run["method"] == "qlora" else "",
        "kbit_prep": ("trl" if run.get("kbit_prep") else "none") if run["method"] == "qlora" else "",
        "bitsandbytes": "",
        "optimizer_in_bwd": "no", "norm_fp32": "yes", "mqa_sdpa_math": "no", "zero_reduce_bucket": "",
        "measured_unit": "GB",
        "qk_norm": "no",  # a LlamaForCausalLM: no per-head q/k norm, whatever the catalog model has
        "algorithm": run.get("algorithm", ""),
    }


def llama_config(run: dict, *, attention: str = "sdpa", min_positions: int = 2048):
    """The ``LlamaConfig`` of a run's shape (random weights are built from it; no cache)."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=run["hidden"], intermediate_size=run["ffn"], num_hidden_layers=run["layers"],
                       num_attention_heads=run["heads"], num_key_value_heads=run["kv_heads"],
                       head_dim=run.get("head_dim", run["hidden"] // run["heads"]),
                       vocab_size=run["vocab"], max_position_embeddings=max(run["seq_len"], min_positions),
                       tie_word_embeddings=bool(run.get("tied")), use_cache=False, attn_implementation=attention)


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Rows to a CSV file in the given columns (the bench scripts' data files)."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def measure(run: dict) -> dict:
    """One run in this process; returns the three views in bytes."""
    import os
    import shutil
    import tempfile
    import time

    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = llama_config(run, attention=run["attention"])
    mixed = run["precision"] == "bf16-mixed"
    if run["method"] == "qlora":
        from transformers import BitsAndBytesConfig

        tmp = tempfile.mkdtemp()
        with torch.device("cuda"):  # random weights made on the GPU: minutes faster at 8B
            LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp)
        torch.cuda.empty_cache()
        q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_use_double_quant=run.get("double_quant", True),
                               bnb_4bit_compute_dtype=torch.bfloat16)
        torch.cuda.reset_peak_memory_stats()
        model = LlamaForCausalLM.from_pretrained(tmp, quantization_config=q, dtype=torch.bfloat16,
                                                 attn_implementation=run["attention"], device_map={"": 0})
        shutil.rmtree(tmp, ignore_errors=True)  # an 8B base is 16 GB of disk
    else:
        with torch.device("cuda"):  # random weights made on the GPU; the making is not measured
            model = LlamaForCausalLM(cfg).to(torch.float32 if mixed else torch.bfloat16)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model.train()  # from_pretrained returns the model in eval mode, where transformers skips checkpointing
    if run.get("kbit_prep"):  # TRL's readying of a k-bit base: FP32 non-quantized weights
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)  # enabled below
    if run["checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if run["method"] != "full":
        from peft import LoraConfig, get_peft_model

        if run["checkpointing"]:
            model.enable_input_require_grads()
        rank = run.get("lora_rank", LORA_RANK)
        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank,
                                                 lora_dropout=run.get("lora_dropout", 0.0),
                                                 target_modules=run.get("lora_targets", "all-linear")))
        if run.get("adapter_dtype") == "bf16":  # adapters cast to the compute dtype, as some recipes do
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.data = p.data.to(torch.bfloat16)
    params = [p for p in model.parameters() if p.requires_grad]
    if run.get("optimizer") == "adamw_8bit":
        import bitsandbytes as bnb

        opt = bnb.optim.AdamW8bit(params, lr=1e-5)
    else:
        opt = torch.optim.AdamW(params, lr=1e-5)
    tokens = torch.randint(0, run["vocab"], (run["micro_batch"], run["seq_len"]), device="cuda")
    step_s = []
    for length in step_lengths(run):
        batch = tokens[:, :length]
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(run.get("grad_accum", 1)):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mixed):
                loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_s.append(time.perf_counter() - start)
    out = {"max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved(),
           "step_s": step_s, "train_mode": True}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:  # no nvidia-smi on the path: the allocator's two views only
        smi = ""
    for line in smi.splitlines():
        pid, used = (x.strip() for x in line.split(","))
        if int(pid) == os.getpid():
            out["nvidia_smi"] = int(used) * 2**20
    out["gpu_name"] = torch.cuda.get_device_name(0)
    return out


def verdict_line(run: dict, views: dict) -> str:
    """Whether each measured view of a replayed verdict row is within the row's own card."""
    cap = run["capacity_bytes"]
    within = ", ".join(f"{k} {views[k] / 1e9:.1f} GB ({views[k] / cap:.2f} of the card)"
                       for k in ("max_allocated", "max_reserved", "nvidia_smi") if k in views)
    return f"{run['verdict_id']} reported {run['verdict']}: {within}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/measured_gpu.csv")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--varied", action="store_true", help="fixed- and varied-length pairs instead")
    ap.add_argument("--verdicts", action="store_true", help="replay the single-GPU verdict rows instead")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a single run, in a fresh process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(json.loads(args.one))))
        return 0
    rows, failures = [], 0
    runs = verdict_runs() if args.verdicts else varied_grid() if args.varied else grid(args.quick)
    for run in runs:
        proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(run)], capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0:
            failures += 1
            print(f"failed: {run}: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        views = json.loads(proc.stdout.strip().splitlines()[-1])
        for kind in ("max_allocated", "max_reserved", "nvidia_smi"):
            if kind in views:
                rows.append(row_of(run, len(rows) + 1, views[kind] / 1e9, kind, views["gpu_name"]))
        print(f"{run} -> {views}", flush=True)
        if "verdict_id" in run:
            print(verdict_line(run, views), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_csv(Path(args.out), rows, list(COLUMNS))
    print(f"{len(rows)} rows -> {args.out}; {failures} runs failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
