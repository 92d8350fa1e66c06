"""`--config`: the configs people have, read into a scenario; gaps reported; mistakes warned."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

import planner
from planner.cli.main import app
from planner.launch.export import export_resolved, write_bundle
from planner.scenario.resolve import resolve

runner = CliRunner()


def _estimate(*args):
    res = runner.invoke(app, ["estimate", *args, "--json"])
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.output)


ROUND_TRIPS = {
    "qlora": ({"method": "qlora", "global_batch": 32}, {}),
    "lora-a100": ({"method": "lora", "global_batch": 64}, {"gpu_types": ["a100-80gb"], "max_gpus": 8}),
    "full-8b": ({"method": "full", "global_batch": 64}, {"gpu_types": ["a100-40gb"]}),
}
#: The Trainer has no selective recomputation: plans that round-trip exactly choose none or full.
EXPRESSIBLE = {"checkpointing": ["none", "full"]}


@pytest.mark.parametrize("profile", ["seed", "detailed"])
@pytest.mark.parametrize("case", sorted(ROUND_TRIPS))
def test_round_trip_plan_export_import_estimate_gives_the_plans_memory(case, profile, tmp_path):
    workload, search = ROUND_TRIPS[case]
    result = planner.plan({"model": "llama-3.1-8b", "profile": profile, "top": 1, "workload": workload,
                           "search": {**search, **EXPRESSIBLE}})
    p = result.plans[0]
    bundle = export_resolved(resolve(p.pinned_scenario))
    write_bundle(bundle, tmp_path)
    configs = [f for f in ("training_args.json", "lora_config.json", "bnb_config.json", "model_kwargs.json")
               if (tmp_path / f).exists()]
    assert "training_args.json" in configs, bundle.skipped
    # TrainingArguments hold no sequence length or GPU; a full fine-tune has no PEFT file to say so
    flags = ["--seq-len", str(p.seq_len), "--gpu", p.gpu, "--gpus", str(p.gpus), "--profile", profile]
    if p.method == "full":
        flags += ["--method", "full"]
    args = [x for f in configs for x in ("--config", str(tmp_path / f))]
    est = _estimate(*args, *flags)
    assert est["method"] == p.method
    assert est["layout"]["zero"] == p.zero and est["layout"]["offload"] == p.offload
    assert est["layout"]["micro_batch"] == p.micro_batch and est["layout"]["grad_accum"] == p.grad_accum
    assert est["components"] == p.memory["components"]
    assert est["total_bytes"] == p.memory["total_bytes"]


def test_selective_recomputation_is_said_and_errs_on_the_safe_side(tmp_path):
    raw = {"model": "llama-3.1-8b", "profile": "detailed", "workload": {"method": "lora", "seq_len": 2048,
           "micro_batch": 2, "grad_accum": 4}, "layout": {"gpu": "a100-80gb", "checkpointing": "selective"}}
    bundle = export_resolved(resolve(raw))
    assert any("no selective recomputation" in n for n in bundle.notes)
    write_bundle(bundle, tmp_path)
    est = _estimate(*[x for f in ("training_args.json", "lora_config.json", "model_kwargs.json")
                      for x in ("--config", str(tmp_path / f))], "--seq-len", "2048", "--gpu", "a100-80gb",
                    "--profile", "detailed")
    assert est["layout"]["checkpointing"] == "none"
    assert est["total_bytes"] >= planner.estimate(raw).total_bytes


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return str(path)


DS = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}


def test_deepspeed_json_reads_batch_precision_and_sharding(tmp_path):
    ds = _write(tmp_path, "ds.json", DS)
    est = _estimate("--config", ds, "--model", "llama-3.1-8b", "--gpu", "a100-40gb", "--method", "full",
                    "--optimizer", "adamw", "--seq-len", "2048", "--checkpointing", "full", "--attention", "flash", "--profile", "seed")
    lay = est["layout"]
    assert (lay["micro_batch"], lay["grad_accum"], lay["dp"], lay["zero"], lay["offload"]) == (2, 4, 8, 3, "optimizer")
    assert est["gpus"] == 8  # 64 / (2·4): the data-parallel world the batch implies
    direct = planner.estimate(model="llama-3.1-8b", gpu="a100-40gb", method="full", seq_len=2048, micro_batch=2,
                              grad_accum=4, gpus=8, zero=3, offload="optimizer", checkpointing="full",
                              profile="seed")
    assert est["total_bytes"] == direct.total_bytes


def test_missing_fields_are_reported_not_defaulted(tmp_path):
    ds = _write(tmp_path, "ds.json", DS)
    res = runner.invoke(app, ["estimate", "--config", ds, "--model", "llama-3.1-8b"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    for field in ("method", "optimizer", "seq_len", "checkpointing", "attention"):
        assert any(ln.startswith(f"error: {field}: not set") and f"--{field.replace('_', '-')}" in ln
                   for ln in lines), (field, lines)
    assert not any("micro_batch" in ln or "precision" in ln or "zero:" in ln for ln in lines)


def test_tool_defaults_are_said(tmp_path):
    ta = _write(tmp_path, "args.json", {"output_dir": "out", "bf16": True})
    est = _estimate("--config", ta, "--model", "llama-3.1-8b", "--method", "full", "--seq-len", "1024",
                    "--attention", "flash", "--gpu", "h100", "--profile", "seed")
    assert est["layout"]["micro_batch"] == 8  # TrainingArguments' own default
    said = " ".join(est["assumptions"])
    assert "per_device_train_batch_size: not set; TrainingArguments's default 8" in said
    assert "gradient_checkpointing: not set" in said


AXOLOTL = {"base_model": "meta-llama/Llama-3.1-8B", "adapter": "qlora", "load_in_4bit": True, "lora_r": 32,
           "lora_alpha": 16, "lora_target_linear": True, "sequence_len": 4096, "micro_batch_size": 2,
           "gradient_accumulation_steps": 4, "optimizer": "paged_adamw_8bit", "bf16": "auto",
           "gradient_checkpointing": True, "flash_attention": True}


def test_axolotl_yaml(tmp_path):
    ax = _write(tmp_path, "ax.yaml", AXOLOTL)
    est = _estimate("--config", ax, "--gpu", "a10g", "--profile", "seed")
    direct = planner.estimate(model="llama-3.1-8b", method="qlora", lora_rank=32, lora_alpha=16, seq_len=4096,
                              micro_batch=2, grad_accum=4, optimizer="paged_adamw8bit", checkpointing="full",
                              attention="flash", gpu="a10g", profile="seed")
    assert est["model"] == "llama-3.1-8b" and est["method"] == "qlora"
    assert est["total_bytes"] == direct.total_bytes
    assert est["warnings"] == list(direct.warnings)  # A10G has BF16 and FA2: nothing to say


def test_torchtune_yaml(tmp_path):
    tt = _write(tmp_path, "tt.yaml", {
        "model": {"_component_": "torchtune.models.llama3_1.lora_llama3_1_8b", "lora_attn_modules":
                  ["q_proj", "v_proj"], "apply_lora_to_mlp": False, "lora_rank": 8, "lora_alpha": 16},
        "tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer", "max_seq_len": 2048},
        "batch_size": 4, "gradient_accumulation_steps": 8, "dtype": "bf16",
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 3e-4},
        "enable_activation_checkpointing": True})
    est = _estimate("--config", tt, "--gpu", "rtx-4090", "--profile", "detailed")
    assert est["model"] == "llama-3.1-8b" and est["method"] == "lora"
    lay = est["layout"]
    assert (lay["micro_batch"], lay["grad_accum"], lay["seq_len"], lay["checkpointing"]) == (4, 8, 2048, "full")
    direct = planner.estimate(model="llama-3.1-8b", method="lora", lora_rank=8, lora_alpha=16,
                              lora_targets=["q", "v"], precision="bf16", seq_len=2048, micro_batch=4,
                              grad_accum=8, checkpointing="full", gpu="rtx-4090", profile="detailed")
    assert est["total_bytes"] == direct.total_bytes


def test_accelerate_fsdp_config(tmp_path):
    acc = _write(tmp_path, "acc.yaml", {
        "distributed_type": "FSDP", "num_processes": 8, "mixed_precision": "bf16",
        "fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_activation_checkpointing": True}})
    est = _estimate("--config", acc, "--model", "llama-3.1-8b", "--method", "full", "--optimizer", "adamw",
                    "--micro-batch", "1", "--seq-len", "2048", "--attention", "flash", "--gpu", "h100",
                    "--profile", "seed")
    assert (est["gpus"], est["layout"]["zero"], est["layout"]["checkpointing"]) == (8, 2, "full")


def test_warnings_for_common_mistakes(tmp_path):
    # gradient accumulation that does not give the asked global batch
    ds = _write(tmp_path, "ds.json", {**DS, "train_batch_size": 64})
    est = _estimate("--config", ds, "--model", "llama-3.1-8b", "--method", "full", "--seq-len", "2048", "--optimizer",
                    "adamw", "--checkpointing", "full", "--attention", "flash", "--gpu", "h100", "--gpus", "8",
                    "--global-batch", "32", "--profile", "seed")
    assert any("gradient_accumulation_steps: 4 gives" in w and "set it to 2" in w for w in est["warnings"])
    # ZeRO-3 with CPU offload of a 70B model: more than a V100 node's host RAM
    ds3 = _write(tmp_path, "ds3.json", {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                                         "fp16": {"enabled": True}, "zero_optimization": {
                                             "stage": 3, "offload_optimizer": {"device": "cpu"},
                                             "offload_param": {"device": "cpu"}}})
    est = _estimate("--config", ds3, "--model", "llama-3.1-70b", "--method", "full", "--seq-len", "1024",
                    "--optimizer", "adamw", "--checkpointing", "full", "--attention", "eager", "--gpu", "v100-32gb", "--gpus", "8",
                    "--profile", "seed")
    assert any("ZeRO-3 CPU offload keeps" in w and "768 GiB can spare" in w for w in est["warnings"]), est["warnings"]
    # bf16 and FlashAttention-2 asked on a T4
    ax = _write(tmp_path, "ax.yaml", {**AXOLOTL, "bf16": True})
    est = _estimate("--config", ax, "--gpu", "t4", "--profile", "seed")
    assert any("ax.yaml.bf16: bf16 on" in w and "no BF16" in w for w in est["warnings"])
    assert any("ax.yaml.flash_attention: FlashAttention-2 does not run" in w for w in est["warnings"])
    # TP past the NVLink domain
    tp = _write(tmp_path, "tp.json", {**DS, "train_batch_size": 16, "tensor_parallel": {"autotp_size": 4}})
    est = _estimate("--config", tp, "--model", "llama-3.1-8b", "--method", "full", "--seq-len", "2048",
                    "--optimizer", "sgd", "--checkpointing", "full", "--attention", "flash", "--gpu", "l40s", "--profile", "seed")
    assert est["layout"]["tp"] == 4 and est["gpus"] == 8
    assert any("autotp_size: TP 4 is larger than the NVLink domain" in w for w in est["warnings"])


def test_plan_takes_the_workload_and_searches_the_layout(tmp_path):
    ax = _write(tmp_path, "ax.yaml", AXOLOTL)
    res = runner.invoke(app, ["plan", "--config", ax, "--global-batch", "16", "--gpu-types", "a10g,l4",
                              "--profile", "seed", "--top", "1", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    p = data["plans"][0]
    assert (p["method"], p["seq_len"], p["optimizer"], p["global_batch"]) == ("qlora", 4096, "paged_adamw8bit", 16)
    assert "left to the search" in res.stderr


@pytest.mark.parametrize("content, field", [
    ("{not json", "not valid JSON"),
    (json.dumps({"optim": "lion_32bit", "output_dir": "x"}), "args.json.optim: 'lion_32bit'"),
    (json.dumps({"hello": 1}), "not a DeepSpeed, accelerate"),
])
def test_bad_configs_are_one_line_each(tmp_path, content, field):
    path = tmp_path / "args.json"
    path.write_text(content)
    res = runner.invoke(app, ["estimate", "--config", str(path), "--model", "llama-3.1-8b"])
    assert res.exit_code == 2 and field in res.output and "Traceback" not in res.output
