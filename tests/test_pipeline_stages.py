"""Each pipeline stage's activations in flight, and the last stage's own peak.

Megatron's interleaved schedule (``forward_backward_pipelining_with_interleaving``) warms pipeline
rank r up with 2·(p−r−1) + (v−1)·p chunk forwards before its first backward, capped at the step's
m·v chunks; 1F1B's last stage runs each backward right after its forward. Megatron writes its
memory scalars (``mem-max-allocated-bytes``) from the last rank only, whose TensorBoard writer
``_set_tensorboard_writer`` creates when ``args.rank == args.world_size - 1``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from planner.core.specs import Layout
from planner.memory.estimate import estimate_resolved
from planner.memory.stage_activations import in_flight_micro_batches
from planner.scenario.resolve import resolve
from planner.validate.score import validate_rows

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("schedule", "p", "v", "m", "first", "last"), [
    ("1f1b", 4, 1, 8, 4.0, 1.0),
    ("1f1b", 4, 1, 2, 2.0, 1.0),            # fewer micro-batches than stages
    ("interleaved", 4, 3, 8, 5.0, 3.0),      # p(1 + (p-1)/(pv)) = 5; last: ((v-1)p + 1)/v = 3
    ("interleaved", 4, 3, 4, 4.0, 3.0),      # the first rank's 15 chunks capped at m·v = 12
    ("interleaved", 4, 8, 4, 4.0, 29 / 8),   # Megatron's gpt3_7b_tp1_pp4 test: v = 8, m = 4
    ("gpipe", 4, 1, 6, 6.0, 6.0),
    ("interleaved", 4, 3, None, 5.0, 3.0),   # m unknown: no cap, as when m is large
    ("1f1b", 4, 1, None, 4.0, 1.0),
])
def test_stages_hold_the_micro_batches_their_schedule_warms_up(schedule, p, v, m, first, last):
    lay = Layout(gpus=p, pp=p, pp_schedule=schedule, pp_virtual_stages=v)
    assert in_flight_micro_batches(lay, m) == pytest.approx(first)
    assert in_flight_micro_batches(lay, m, last_stage=True) == pytest.approx(last)


def _scenario(pp: int, virtual: int = 1) -> dict:
    lay = {"gpu": "h100-sxm-80gb", "gpus": 8, "pp": pp, "tp": 1, "zero": 0, "checkpointing": "none"}
    if virtual > 1:
        lay.update(pp_schedule="interleaved", pp_virtual_stages=virtual)
    return {"model": "llama-3.1-8b", "profile": "detailed",
            "workload": {"method": "full", "seq_len": 4096, "micro_batch": 1, "global_batch": 16},
            "layout": lay}


def test_the_last_stage_of_a_1f1b_pipeline_holds_less_than_the_peak():
    """Under 1F1B the first stage holds p micro-batches of its layers, the last one (plus the
    logits): the estimate's peak is the first stage's, and it says the last stage's apart."""
    est = estimate_resolved(resolve(_scenario(pp=4)))
    pred = est.predicted or {}
    assert pred["last_stage_allocated_bytes"] < pred["allocated_bytes"]
    assert pred["last_stage_reserved_bytes"] <= pred["reserved_bytes"]
    interleaved = estimate_resolved(resolve(_scenario(pp=4, virtual=2))).predicted or {}
    # interleaving keeps more micro-batches in flight on every rank, the last included
    assert interleaved["last_stage_allocated_bytes"] > pred["last_stage_allocated_bytes"]
    assert "last_stage_allocated_bytes" not in (estimate_resolved(resolve(_scenario(pp=1))).predicted or {})
    # GPipe's last stage keeps every micro-batch's layers and head tensors until backward
    gpipe = _scenario(pp=4)
    gpipe["layout"]["pp_schedule"] = "gpipe"
    held = estimate_resolved(resolve(gpipe)).predicted or {}
    assert held["last_stage_allocated_bytes"] > 2 * pred["last_stage_allocated_bytes"]
    assert pred["last_stage_device_bytes"] > pred["last_stage_reserved_bytes"]


def test_rows_measured_on_the_last_rank_are_scored_against_its_stage():
    """Megatron-LM's functional test gpt3_mcore_te_tp1_pp4_disable_bias_linear (data/
    measured_memory_published9.csv, id 6608): 2.69 GB on the last rank; the estimate's peak is the
    first stage's (4.07 GB), its last stage within 5 % of what that rank logged."""
    rows = list(csv.DictReader((ROOT / "data" / "measured_memory_published9.csv").open(newline="")))
    row = next(r for r in rows if r["id"] == "6608")
    assert row["measured_rank"] == "last"
    scored = validate_rows([row], "detailed")[0]
    assert scored.signed_error is not None and abs(scored.signed_error) < 0.05
    peak = validate_rows([{**row, "measured_rank": ""}], "detailed")[0]
    assert peak.predicted_bytes > 1.3 * scored.predicted_bytes
    bad = validate_rows([{**row, "measured_rank": "first"}], "detailed")[0]
    assert bad.predicted_bytes is None and "measured_rank" in (bad.reason or "")
