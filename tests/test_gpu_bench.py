"""bench/gpu_memory.py writes rows that `planner validate` can score: the contract a GPU session
relies on when it measures real peaks (the measurement itself needs a GPU and is not run here)."""

from __future__ import annotations

import csv
import importlib.util

import pytest
from conftest import ROOT

from planner.validate.score import validate_rows

spec = importlib.util.spec_from_file_location("gpu_memory", ROOT / "bench" / "gpu_memory.py")
gpu_memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_memory)


def test_columns_are_the_calibration_columns():
    with open(ROOT / "data" / "measured_calibration.csv", newline="", encoding="utf-8") as fh:
        assert next(csv.reader(fh)) == gpu_memory.COLUMNS


def test_parameter_count_of_a_grid_shape():
    """768 hidden, 8 layers, 12 heads of 64 (4 KV heads), FFN 2048, vocab 32000, untied:
    8·(2·768² + 2·768·256 + 3·768·2048 + 2·768) + 2·32000·768 + 768 = 99,496,704 — the count
    planner.core.arch gives for the same architecture."""
    from planner.core.arch import param_counts
    from planner.core.entries import ModelSpec

    run = gpu_memory.grid(quick=True)[0]
    assert gpu_memory.params_of(run) == 99_496_704
    spec = ModelSpec(layers=8, hidden=768, heads=12, kv_heads=4, ffn=2048, vocab=32000)
    assert param_counts(spec).total == 99_496_704


@pytest.mark.parametrize("kind", ["max_allocated", "max_reserved", "nvidia_smi"])
def test_every_grid_row_is_modelled_with_its_recipe(kind):
    runs = gpu_memory.grid(quick=True)
    assert {r["method"] for r in runs} == {"full", "lora", "qlora"}
    rows = [gpu_memory.row_of(r, i + 1, 1.0, kind, "NVIDIA H200") for i, r in enumerate(runs)]
    results = validate_rows(rows, "detailed")
    assert all(r.reason is None and r.predicted_bytes > 0 for r in results), [r.reason for r in results]
    # The recipe is read back as written: more memory with a longer micro-batch of tokens, and
    # FP32 master weights for bf16-mixed full fine-tuning.
    by = {(r["method"], r["precision"], r["checkpointing"]): res.predicted_bytes
          for r, res in zip(runs, results)}
    assert by[("full", "bf16-mixed", False)] > by[("full", "bf16-true", False)]
    assert by[("full", "bf16-true", True)] < by[("full", "bf16-true", False)]


def test_varied_runs_differ_from_their_twins_only_in_lengths():
    """``--varied`` pairs each run whose steps draw their lengths at random with a twin at the
    full length every step; both take the same number of steps and end at the same largest
    batch, so what the varied run reserves beyond its twin is the fragmentation of varied
    lengths alone. Its rows say how the lengths were drawn."""
    runs = gpu_memory.varied_grid()
    fixed = [r for r in runs if r["lengths"] == "fixed"]
    varied = [r for r in runs if r["lengths"] == "varied"]
    assert len(fixed) == len(varied) >= 4
    strip = [{k: v for k, v in r.items() if k != "lengths"} for r in fixed]
    assert strip == [{k: v for k, v in r.items() if k != "lengths"} for r in varied]
    for f, v in zip(fixed, varied):
        lf, lv = gpu_memory.step_lengths(f), gpu_memory.step_lengths(v)
        assert len(lf) == len(lv) == gpu_memory.VARIED_STEPS
        assert set(lf) == {f["seq_len"]} and max(lv) == lv[-1] == v["seq_len"]
        assert min(lv) >= v["seq_len"] // gpu_memory.VARIED_SHORTEST and len(set(lv)) > len(lv) // 2
    assert gpu_memory.step_lengths(gpu_memory.grid(quick=True)[0]) == [512] * gpu_memory.STEPS
    row = gpu_memory.row_of(varied[0], 1, 1.0, "max_reserved", "NVIDIA H200")
    assert "drawn uniformly from [256, 2048]" in row["notes"] and "40 steps" in row["notes"]
    assert validate_rows([row], "detailed")[0].reason is None


def test_verdict_replays_are_the_rows_as_the_planner_reads_them():
    """``--verdicts`` replays single-GPU rows of data/verdicts.csv at their own architecture and
    recipe. The runner's Llama is the published model: 1,711,376,384 parameters for SmolLM2-1.7B
    (tied embeddings; Hugging Face model card, 1.7B) and 8,030,261,248 for Llama-3-8B (Meta's
    8.03B), as planner.core.arch counts them. V322 runs as reported: full fine-tuning at 16,384
    tokens without checkpointing, 8-bit AdamW, on an 80 GB card. Each replayed row is modelled
    and says which verdict row it replays; a row the stack cannot replay is refused."""
    from planner import catalog
    from planner.core.arch import param_counts
    from planner.validate.verdicts import capacity_of, read_rows

    runs = {r["verdict_id"]: r for r in gpu_memory.verdict_runs()}
    assert set(runs) == set(gpu_memory.VERDICT_ROWS)
    assert {r["verdict"] for r in runs.values()} == {"ran", "oom"}
    for run in runs.values():
        assert gpu_memory.params_of(run) == param_counts(catalog.get_model(run["model"])).total
    assert gpu_memory.params_of(runs["V322"]) == 1_711_376_384
    assert gpu_memory.params_of(runs["V400"]) == 8_030_261_248
    v322 = runs["V322"]
    assert v322["tied"] and not v322["checkpointing"] and v322["optimizer"] == "adamw_8bit"
    assert (v322["method"], v322["seq_len"], v322["micro_batch"], v322["precision"]) == ("full", 16384, 1, "bf16-true")
    rows = {r["id"]: r for r in read_rows(ROOT / "data" / "verdicts.csv")}
    assert v322["capacity_bytes"] == capacity_of(rows["V322"]) == 81_559 * 2**20  # H100 80GB, nvidia-smi MiB
    # rows accumulating gradients (V326: 4 micro-batches) replay two, V322 (one) one
    assert runs["V326"]["grad_accum"] == gpu_memory.VERDICT_MICRO_BATCHES == 2 and runs["V322"]["grad_accum"] == 1
    assert runs["V043"]["lora_targets"][0] == "q_proj"
    replayed = [gpu_memory.row_of(r, i + 1, 1.0, "max_reserved", "NVIDIA H200") for i, r in enumerate(runs.values())]
    assert all(r.reason is None for r in validate_rows(replayed, "detailed"))
    assert "replays V322 of data/verdicts.csv" in replayed[0]["notes"] and replayed[1]["grad_accum"] == "2"
    line = gpu_memory.verdict_line(v322, {"max_reserved": v322["capacity_bytes"] // 2})
    assert line.startswith("V322 reported oom") and "(0.50 of the card)" in line
    with pytest.raises(ValueError, match="V059"):
        gpu_memory.verdict_runs(ids=("V059",))  # two GPUs under ZeRO-3
