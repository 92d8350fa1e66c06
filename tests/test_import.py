"""`--config`: the configs people have, read into a scenario; gaps reported; mistakes warned."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

import planner
from planner.cli.main import app
from planner.core.codes import (
    DS_OFFLOAD_BLOCKS,
    DS_OFFLOAD_DEVICES,
    DS_OFFLOAD_MODES,
    DS_ZERO_STAGE_WORDS,
    OFFLOADS,
)
from planner.launch.exporters import export_resolved, write_bundle
from planner.launch.importers import read_configs
from planner.scenario.resolve import resolve
from planner.validate.sharding import zero_stage_of

runner = CliRunner()


def _estimate(*args):
    res = runner.invoke(app, ["estimate", *args, "--json"])
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.output)


ROUND_TRIPS = {
    "qlora": ({"method": "qlora", "global_batch": 32}, {}),
    "lora-a100": ({"method": "lora", "global_batch": 64}, {"gpu_types": ["a100-80gb"], "max_gpus": 8}),
    "full-8b": ({"method": "full", "global_batch": 64}, {"gpu_types": ["a100-40gb"]}),
    "lora-embeddings": ({"method": "lora", "global_batch": 32, "modules_to_save": ["embed_tokens", "lm_head"]},
                        {"gpu_types": ["a100-80gb"]}),
    "lora-eval": ({"method": "lora", "global_batch": 32, "eval_micro_batch": 8}, {"gpu_types": ["a100-80gb"]}),
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
    (json.dumps({"optim": "galore_adamw", "output_dir": "x"}), "args.json.optim: 'galore_adamw'"),
    (json.dumps({"hello": 1}), "not a DeepSpeed, accelerate"),
])
def test_bad_configs_are_one_line_each(tmp_path, content, field):
    path = tmp_path / "args.json"
    path.write_text(content)
    res = runner.invoke(app, ["estimate", "--config", str(path), "--model", "llama-3.1-8b"])
    assert res.exit_code == 2 and field in res.output and "Traceback" not in res.output


# --- the defects of reading real configs, one test each (the corpus in tests/fixtures/configs
# --- reads whole real files: tests/test_import_corpus.py)

def _found(tmp_path, name, data, header: str = ""):
    from planner.launch.importers import read_configs
    path = tmp_path / name
    text = json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data)
    path.write_text(header + text)
    return read_configs([path])


def _warned(found, key):
    return [w for w in found.warnings if key in w]


TT = {"model": {"_component_": "torchtune.models.llama3_1.llama3_1_8b"}, "batch_size": 2, "dtype": "bf16",
      "optimizer": {"_component_": "torch.optim.AdamW"}, "tokenizer": {"max_seq_len": 2048},
      "enable_activation_checkpointing": True}


def test_torchtune_distributed_recipe_is_sharded_on_its_gpus(tmp_path):
    header = ("# To launch on 4 devices, run the following command from root:\n"
              "#   tune run --nproc_per_node 4 full_finetune_distributed --config llama3_1/8B_full\n")
    f = _found(tmp_path, "8B_full.yaml", TT, header)
    assert (f.values["zero"], f.values["offload"], f.values["gpus"]) == (3, "none", 4)
    f = _found(tmp_path, "8B_full.yaml", {**TT, "fsdp_reshard_after_forward": False})  # no header: the key says
    assert f.values["zero"] == 2 and "gpus" not in f.values
    single = "# tune run full_finetune_single_device --config llama3_1/8B_full_single_device\n"
    f = _found(tmp_path, "8B_full_single_device.yaml", TT, single)
    assert f.values["zero"] == 0


def test_torchtune_nested_fsdp_cpu_offload(tmp_path):
    f = _found(tmp_path, "7B_qlora.yaml", {**TT, "fsdp": {"cpu_offload": True}})
    assert (f.values["zero"], f.values["offload"]) == (3, "optimizer+params")
    assert any("fsdp.cpu_offload" in n for n in f.notes)
    assert _found(tmp_path, "7B_qlora.yaml", {**TT, "fsdp": {"cpu_offload": False}}).values["offload"] == "none"


def test_torchtune_linear_cross_entropy_and_optimizer_in_bwd(tmp_path):
    f = _found(tmp_path, "tt.yaml", {**TT, "optimizer_in_bwd": True, "compile": True, "loss": {
        "_component_": "torchtune.modules.loss.LinearCrossEntropyLoss"}})
    assert (f.values["loss"], f.values["optimizer_step"], f.values["compile"]) == ("chunked_head", "in_backward", True)
    # the detailed profile's figure is lower: no logits, no gradients held until the step
    est = _estimate("--config", str(tmp_path / "tt.yaml"), "--gpu", "h100", "--profile", "detailed")
    plain = _write(tmp_path, "plain.yaml", TT)
    assert est["total_bytes"] < _estimate("--config", plain, "--gpu", "h100", "--profile", "detailed")["total_bytes"]
    chunked = _found(tmp_path, "ce.yaml", {**TT, "loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"}})
    assert chunked.values["loss"] == "chunked"
    dpo = _found(tmp_path, "dpo.yaml", {**TT, "loss": {"_component_": "torchtune.rlhf.loss.DPOLoss", "beta": 0.1}})
    assert "loss" not in dpo.values and _warned(dpo, "loss._component_")


def test_axolotl_liger_and_cut_cross_entropy_losses_are_read(tmp_path):
    base = {**AXOLOTL, "plugins": ["axolotl.integrations.liger.LigerPlugin"]}
    assert _found(tmp_path, "ax.yaml", {**base, "liger_fused_linear_cross_entropy": True}).values["loss"] == "fused"
    cce = {**AXOLOTL, "plugins": ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"]}
    assert _found(tmp_path, "ax.yaml", cce).values["loss"] == "cce"  # the plugin's default is on
    assert _found(tmp_path, "ax.yaml", {**AXOLOTL, "chunked_cross_entropy": True}).values["loss"] == "chunked"


def test_attn_implementation_is_read(tmp_path):
    ax = {k: v for k, v in AXOLOTL.items() if k != "flash_attention"}
    assert _found(tmp_path, "ax.yaml", {**ax, "attn_implementation": "eager"}).values["attention"] == "eager"
    f = _found(tmp_path, "ax.yaml", {**ax, "attn_implementation": "flash_attention_2"})
    assert f.values["attention"] == "flash" and f.facts["asks_fa2"].endswith("attn_implementation")
    trl = _found(tmp_path, "sft.yaml", {"model_name_or_path": "x", "attn_implementation": "eager"})
    assert trl.values["attention"] == "eager"


def test_transformers5_activation_checkpointing(tmp_path):
    f = _found(tmp_path, "args.json", {"output_dir": "x", "activation_checkpointing": True,
                                       "activation_checkpointing_kwargs": {"offload": True}})
    assert f.values["checkpointing"] == "full" and f.values["activation_offload"] is True
    # the new name wins over its deprecated alias, as in TrainingArguments.__post_init__
    f = _found(tmp_path, "args.json", {"output_dir": "x", "activation_checkpointing": False,
                                       "gradient_checkpointing": True})
    assert f.values["checkpointing"] == "none"
    f = _found(tmp_path, "args.json", {"output_dir": "x", "activation_checkpointing": True,
                                       "activation_checkpointing_kwargs": {"every_n_layers": 2}})
    assert _warned(f, "every_n_layers")


def test_axolotl_bf16_full_finetune_is_pure_bf16(tmp_path):
    full = {k: v for k, v in AXOLOTL.items() if k not in ("adapter", "load_in_4bit", "lora_r", "lora_alpha",
                                                          "lora_target_linear")}
    assert _found(tmp_path, "ax.yaml", {**full, "bf16": True}).values["precision"] == "bf16"
    # DeepSpeed keeps FP32 masters of the BF16 model: mixed
    (tmp_path / "ds.json").write_text(json.dumps({"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}))
    f = _found(tmp_path, "ax.yaml", {**full, "bf16": True, "deepspeed": str(tmp_path / "ds.json")})
    assert f.values["precision"] == "mixed"
    assert _found(tmp_path, "ax.yaml", {**AXOLOTL, "bf16": True}).values["precision"] == "mixed"  # QLoRA adapters


def test_embeddings_and_head_trained_in_full_are_read_under_each_tools_key(tmp_path):
    ax = _found(tmp_path, "ax.yaml", {**AXOLOTL, "lora_modules_to_save": ["embed_tokens", "lm_head"]})
    assert ax.values["modules_to_save"] == ["embed_tokens", "lm_head"]
    assert not _warned(ax, "lora_modules_to_save")
    # LLaMA-Factory's comma-separated additional_target; GPT-NeoX's names for the same modules
    lf = _found(tmp_path, "lf.yaml", {"stage": "sft", "finetuning_type": "lora",
                                      "additional_target": "embed_in,embed_out"})
    assert lf.values["modules_to_save"] == ["embed_tokens", "lm_head"]
    peft = _found(tmp_path, "adapter_config.json", {"r": 8, "peft_type": "LORA", "target_modules": ["q_proj"],
                                                    "modules_to_save": ["model.embed_tokens", "score"]})
    assert peft.values["modules_to_save"] == ["embed_tokens"] and _warned(peft, "score")


def test_trained_modules_the_planner_cannot_count_are_warned(tmp_path):
    f = _found(tmp_path, "ax.yaml", {**AXOLOTL, "peft_layers_to_transform": [0, 1]})
    assert _warned(f, "peft_layers_to_transform")
    full = {k: v for k, v in AXOLOTL.items() if k not in ("adapter", "load_in_4bit")}
    assert _warned(_found(tmp_path, "ax.yaml", {**full, "unfrozen_parameters": ["^lm_head.weight$"]}),
                   "unfrozen_parameters")
    peft = _found(tmp_path, "adapter_config.json", {"r": 8, "peft_type": "LORA", "modules_to_save": ["score"],
                                                    "target_modules": ["model.layers.0.self_attn.q_proj"]})
    assert _warned(peft, "modules_to_save") and _warned(peft, "layers.0")
    regex = _found(tmp_path, "adapter_config.json", {"r": 8, "target_modules": r".*\.layers\.(0|1)\..*(q_proj|v_proj)"})
    assert regex.values["lora_targets"] == ["q", "v"] and _warned(regex, "target_modules")
    lf = _found(tmp_path, "lf.yaml", {"stage": "sft", "finetuning_type": "lora", "additional_target": "v_head"})
    assert _warned(lf, "additional_target") and "modules_to_save" not in lf.values


def test_deepspeed_param_offload_alone_is_not_optimizer_offload(tmp_path):
    f = _found(tmp_path, "ds.json", {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})
    assert f.values["offload"] == "none" and _warned(f, "offload_param")
    both = {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}
    assert _found(tmp_path, "ds.json", {"zero_optimization": both}).values["offload"] == "optimizer+params"


def test_relative_deepspeed_path_is_read_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "z.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    (tmp_path / "cfg" / "ds").mkdir(parents=True)
    (tmp_path / "cfg" / "ds" / "z.json").write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    monkeypatch.chdir(tmp_path)
    from planner.launch.importers import read_configs
    for name, data in (("ax.yaml", {**AXOLOTL, "deepspeed": "ds/z.json"}),
                       ("args.json", {"output_dir": "x", "deepspeed": "ds/z.json"}),
                       ("acc.yaml", {"distributed_type": "DEEPSPEED", "deepspeed_config": {
                           "deepspeed_config_file": "ds/z.json"}})):
        path = tmp_path / "cfg" / name
        path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
        f = read_configs([path])
        assert f.values["zero"] == 2, name  # the working directory's, not the one beside the config
        assert not f.warnings, f.warnings
    (tmp_path / "ds" / "z.json").unlink()  # only beside the config: read, and said
    f = read_configs([tmp_path / "cfg" / "ax.yaml"])
    assert f.values["zero"] == 1 and _warned(f, "working directory")
    (tmp_path / "cfg" / "ds" / "z.json").unlink()
    res = runner.invoke(app, ["estimate", "--config", str(tmp_path / "cfg" / "ax.yaml"), "--gpu", "a10g"])
    assert res.exit_code == 2 and "working directory" in res.output


def test_the_optimizer_name_says_how_it_steps(tmp_path):
    """The Trainer's fused AdamW holds no list-wide copy of exp_avg_sq's root, transformers' own
    AdamW steps one tensor at a time, torch's plain AdamW is foreach; axolotl's default optimizer
    is the fused one. An exported fused plan writes it back."""
    base = {"model_name_or_path": "meta-llama/Llama-3.1-8B", "bf16": True, "max_length": 2048,
            "per_device_train_batch_size": 1}
    steps = {optim: _found(tmp_path, f"{optim}.yaml", {**base, "optim": optim}).values.get("optimizer_step")
             for optim in ("adamw_torch_fused", "adamw_hf", "adamw_torch")}
    assert steps == {"adamw_torch_fused": "fused", "adamw_hf": "for_loop", "adamw_torch": None}
    ax = {k: v for k, v in AXOLOTL.items() if k != "optimizer"}
    assert _found(tmp_path, "ax.yaml", ax).values["optimizer_step"] == "fused"


def test_trl_and_llamafactory_keys_are_read(tmp_path):
    trl = _found(tmp_path, "config_qlora.yaml", {
        "model_name_or_path": "mistralai/Mistral-7B-v0.1", "torch_dtype": "bfloat16", "use_peft": True,
        "load_in_4bit": True, "lora_r": 16, "lora_alpha": 16, "lora_target_modules": ["q_proj", "v_proj"],
        "bf16": True, "max_length": 2048, "per_device_train_batch_size": 4, "use_liger_kernel": True})
    v = trl.values
    assert (v["method"], v["quant_bits"], v["lora_rank"], v["lora_targets"], v["seq_len"], v["loss"]) == \
        ("qlora", 4, 16, ["q", "v"], 2048, "fused")
    assert v["checkpointing"] == "full"  # TRL's default gradient_checkpointing=True
    lf = _found(tmp_path, "lf.yaml", {
        "model_name_or_path": "Qwen/Qwen3-4B", "stage": "sft", "finetuning_type": "lora", "lora_rank": 8,
        "lora_target": "q_proj,v_proj", "quantization_bit": 4, "cutoff_len": 4096, "enable_liger_kernel": True,
        "flash_attn": "fa2", "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "bf16": True})
    v = lf.values
    assert (v["method"], v["quant_bits"], v["lora_alpha"], v["lora_targets"], v["seq_len"], v["loss"]) == \
        ("qlora", 4, 16, ["q", "v"], 4096, "fused")
    assert (v["checkpointing"], v["attention"]) == ("full", "flash") and "asks_fa2" in lf.facts
    dpo = _found(tmp_path, "dpo.yaml", {"model_name_or_path": "x", "beta": 0.1, "max_length": 1024})
    assert _warned(dpo, "beta")


def test_llamafactory_use_muon_is_read_as_muon_and_adam_mini_stays_unmodelled(tmp_path):
    """LLaMA-Factory's ``use_muon`` trains with Muon on the 2-D weights (AdamW on the rest), which
    the planner models; ``use_adam_mini`` changes the optimizer to one it does not: said, not read."""
    base = {"model_name_or_path": "Qwen/Qwen3-4B", "stage": "sft", "finetuning_type": "full", "bf16": True}
    muon = _found(tmp_path, "lf.yaml", {**base, "use_muon": True})
    assert muon.values["optimizer"] == "muon" and not _warned(muon, "Muon")
    mini = _found(tmp_path, "lf.yaml", {**base, "use_adam_mini": True})
    assert mini.values.get("optimizer") != "muon" and _warned(mini, "Adam-mini")


def test_eight_bit_lora_is_said_not_labelled_qlora_silently(tmp_path):
    for name, data in (("ax.yaml", {**AXOLOTL, "adapter": "lora", "load_in_4bit": False, "load_in_8bit": True}),
                       ("bnb.json", {"load_in_8bit": True}),
                       ("lf.yaml", {"stage": "sft", "finetuning_type": "lora", "quantization_bit": 8}),
                       ("trl.yaml", {"model_name_or_path": "x", "use_peft": True, "load_in_8bit": True})):
        f = _found(tmp_path, name, data)
        assert f.values["quant_bits"] == 8 and _warned(f, "8-bit"), name
    assert not _warned(_found(tmp_path, "ax.yaml", AXOLOTL), "8-bit")


def test_unknown_keys_are_warned_not_dropped(tmp_path):
    f = _found(tmp_path, "ax.yaml", {**AXOLOTL, "learning_rate": 2e-4, "my_new_memory_saver": True,
                                     "fsdp_config": {"fsdp_some_future_knob": 3}})
    assert _warned(f, "my_new_memory_saver")
    assert any("learning_rate" in n and "no bearing on memory" in n for n in f.notes)
    keys = f.keys["ax.yaml"]
    assert "my_new_memory_saver" in keys["unknown"] and "learning_rate" in keys["ignored"]
    assert "sequence_len" in keys["read"]
    ds = _found(tmp_path, "ds.json", {**DS, "zero_optimization": {**DS["zero_optimization"], "new_feature": {"x": 1}}})
    assert _warned(ds, "zero_optimization.new_feature.x")


def test_what_was_read_is_listed_with_where_it_came_from(tmp_path):
    f = _found(tmp_path, "ax.yaml", AXOLOTL)
    read = {r["key"]: r for r in f.read()}
    assert read["seq_len"] == {"key": "seq_len", "value": 4096, "from": "ax.yaml.sequence_len"}
    assert read["method"]["from"] == "ax.yaml.adapter"


def test_an_optimizer_without_a_rule_can_be_replaced_by_the_flag(tmp_path):
    args = _write(tmp_path, "args.json", {"output_dir": "x", "optim": "galore_adamw", "max_length": 1024})
    flags = ["--model", "llama-3.1-8b", "--method", "full", "--attention", "flash", "--gpu", "h100", "--profile", "seed"]
    res = runner.invoke(app, ["estimate", "--config", args, *flags])
    assert res.exit_code == 2 and "args.json.optim: 'galore_adamw'" in res.output
    assert _estimate("--config", args, *flags, "--optimizer", "adamw")["method"] == "full"


def test_a_deepspeed_zero_config_is_deepspeed_s_zero(tmp_path):
    """Stages 1-3 of a DeepSpeed config are DeepSpeed's (its FP32 gradient partition at the step);
    stage 0 shards nothing."""
    for stage in (1, 2, 3):
        f = _found(tmp_path, "ds.json", {"zero_optimization": {"stage": stage}})
        assert f.values["zero"] == stage and f.values["zero_impl"] == "deepspeed"
    assert "zero_impl" not in _found(tmp_path, "ds.json", {"zero_optimization": {"stage": 0}}).values


#: Every ZeRO stage and offload mode a plan can have (offload needs ZeRO; parameters, ZeRO-3).
DS_LAYOUTS = [(zero, offload) for zero in range(4) for offload in OFFLOADS
              if offload == "none" or (zero > 0 and (offload == "optimizer" or zero == 3))]


@pytest.mark.parametrize(("zero", "offload"), DS_LAYOUTS)
def test_deepspeed_stage_and_offload_are_read_back_as_exported(zero, offload, tmp_path, monkeypatch):
    """The DeepSpeed exporter and the readers share core.codes' ZeRO table: each stage and offload
    mode written into ds_config.json is read back as itself, from the JSON and from the accelerate
    config that names it; and the stage's words are the ones a data file's sharding cell is read by."""
    raw = {"name": "ds", "profile": "seed", "model": "llama-3.1-8b",
           "workload": {"method": "full", "micro_batch": 1, "grad_accum": 1, "seq_len": 1024},
           "layout": {"gpu": "h100", "gpus": 8, "zero": zero, "offload": offload}}
    bundle = export_resolved(resolve(raw), ("deepspeed", "accelerate"), backend="deepspeed")
    write_bundle(bundle, tmp_path)
    monkeypatch.chdir(tmp_path)  # accelerate's config names ds_config.json from where it runs
    for name in ("ds_config.json", "accelerate_config.yaml"):
        f = read_configs([tmp_path / name])
        assert (f.values["zero"], f.values["offload"]) == (zero, offload), (name, f.where)
        assert (f.values.get("zero_impl") == "deepspeed") is (zero > 0)
    written = json.loads(bundle.files["ds_config.json"])["zero_optimization"]
    assert written["stage"] == zero
    for block, offloads in zip(DS_OFFLOAD_BLOCKS, DS_OFFLOAD_MODES[offload]):
        assert (written.get(block, {}).get("device") in DS_OFFLOAD_DEVICES) is offloads
    for word in DS_ZERO_STAGE_WORDS.get(zero, ()):
        assert zero_stage_of(word) == zero_stage_of(f"DeepSpeed {word.upper()}") == zero


def test_the_zero_table_covers_every_stage_offload_and_device(tmp_path):
    """Every offload mode is in the table, and each offload device word, in a DeepSpeed JSON or in
    accelerate's inline DeepSpeed settings, reads as the mode whose blocks it is set on."""
    assert set(DS_OFFLOAD_MODES) == set(OFFLOADS) and {0, *DS_ZERO_STAGE_WORDS} == {zero for zero, _ in DS_LAYOUTS}
    for device in (*DS_OFFLOAD_DEVICES, DS_OFFLOAD_DEVICES[0].upper()):
        for offload, blocks in DS_OFFLOAD_MODES.items():
            on = [block for block, offloads in zip(DS_OFFLOAD_BLOCKS, blocks) if offloads]
            ds = _found(tmp_path, "ds.json", {"zero_optimization": {"stage": 3, **{b: {"device": device} for b in on}}})
            acc = _found(tmp_path, "acc.yaml", {"distributed_type": "DEEPSPEED", "num_processes": 8, "deepspeed_config": {
                "zero_stage": 3, **{f"{b}_device": device for b in on}}})
            assert ds.values["offload"] == acc.values["offload"] == offload, (device, offload)


def test_fused_kernels_are_read(tmp_path):
    """Liger's RMSNorm alone (axolotl ``liger_rms_norm``) is the fused RMSNorm; with its rotary and
    GLU activation, or patched as a whole (LLaMA-Factory ``enable_liger_kernel``, the Trainer's
    ``use_liger_kernel`` unless its config turns a kernel off), Liger's kernels; LLaMA-Factory's
    ``use_unsloth`` runs Unsloth's kernels instead."""
    ax = {**AXOLOTL, "plugins": ["axolotl.integrations.liger.LigerPlugin"], "liger_rms_norm": True}
    assert _found(tmp_path, "ax.yaml", ax).values["kernels"] == "fused_rmsnorm"
    whole = {**ax, "liger_rope": True, "liger_glu_activation": True}
    assert _found(tmp_path, "ax.yaml", whole).values["kernels"] == "liger"
    old_name = {**ax, "liger_rope": True, "liger_swiglu": True}  # the GLU key's earlier name
    assert _found(tmp_path, "ax.yaml", old_name).values["kernels"] == "liger"
    no_plugin = {**AXOLOTL, "liger_rms_norm": True}
    assert _warned(_found(tmp_path, "ax.yaml", no_plugin), "liger_rms_norm")
    glu_alone = {**AXOLOTL, "plugins": ax["plugins"], "liger_glu_activation": True}
    got_glu = _found(tmp_path, "ax.yaml", glu_alone)
    assert "kernels" not in got_glu.values and _warned(got_glu, "liger_glu_activation")
    lf = {"model_name_or_path": "Qwen/Qwen3-4B", "stage": "sft", "finetuning_type": "lora",
          "enable_liger_kernel": True}
    got = _found(tmp_path, "lf.yaml", lf).values
    assert got["kernels"] == "liger" and got["loss"] == "fused"
    assert _found(tmp_path, "lf.yaml", {**lf, "use_unsloth": True}).values["kernels"] == "unsloth"
    hf = {"output_dir": "out", "bf16": True, "per_device_train_batch_size": 4, "use_liger_kernel": True}
    assert _found(tmp_path, "training_args.json", hf).values["kernels"] == "liger"
    no_swiglu = {**hf, "liger_kernel_config": {"swiglu": False}}
    assert _found(tmp_path, "training_args.json", no_swiglu).values["kernels"] == "fused_rmsnorm"


@pytest.mark.parametrize("value, read, warned", [
    (True, None, "True"),
    ([None, "lm_head"], ["lm_head"], "None"),
    (["embed_tokens,lm_head"], ["embed_tokens", "lm_head"], None),
    (["tok_embeddings", "output"], ["embed_tokens", "lm_head"], None)])
def test_odd_modules_to_save_values_are_warned_not_fatal(tmp_path, value, read, warned):
    f = _found(tmp_path, "adapter_config.json", {"r": 8, "peft_type": "LORA", "target_modules": ["q_proj"],
                                                 "modules_to_save": value})
    assert f.values.get("modules_to_save") == read
    assert bool(warned) == bool(_warned(f, "modules_to_save"))
    if warned:
        assert _warned(f, warned)


@pytest.mark.parametrize("name, data, evals", [
    ("training_args.json", {"per_device_train_batch_size": 1, "eval_strategy": "steps"}, 8),
    ("training_args.json", {"per_device_train_batch_size": 1, "evaluation_strategy": "epoch",
                            "per_device_eval_batch_size": 2}, 2),
    ("training_args.json", {"per_device_train_batch_size": 1, "eval_strategy": "no",
                            "per_device_eval_batch_size": 2}, None),
    ("lf.yaml", {"stage": "sft", "finetuning_type": "lora", "per_device_train_batch_size": 1,
                 "val_size": 0.1}, 8),
    ("lf.yaml", {"stage": "sft", "finetuning_type": "lora", "per_device_train_batch_size": 1}, None),
    ("ax.yaml", {**AXOLOTL, "val_set_size": 0.05}, 2),
    ("ax.yaml", {**AXOLOTL, "val_set_size": 0.05, "eval_batch_size": 4}, 4),
    ("ax.yaml", AXOLOTL, None)])
def test_evaluation_during_training_is_read_at_its_batch(tmp_path, name, data, evals):
    """The Trainer evaluates at per_device_eval_batch_size (8 unless set) once an eval strategy
    (or LLaMA-Factory's val_size) asks for it; axolotl at eval_batch_size, its micro batch unless set."""
    assert _found(tmp_path, name, data).values.get("eval_micro_batch") == evals


@pytest.mark.parametrize("value, seq", [("4096.0", 4096), ("'4096'", 4096), ("4096", 4096), ("2.048e3", 2048)])
def test_a_count_written_as_a_float_or_a_string_is_read_as_the_tool_reads_it(tmp_path, value, seq):
    """axolotl reads ``sequence_len: 4096.0`` or ``"4096"`` as 4096; it was read as "not set"
    and estimated at the 512-token default."""
    cfg = tmp_path / "ax.yaml"
    cfg.write_text(f"base_model: meta-llama/Llama-3.1-8B\nsequence_len: {value}\nmicro_batch_size: 2\n"
                   "adapter: lora\nlora_r: 16\n")
    _estimate("--config", str(cfg), "--gpu", "h100")  # answers (exit 0 or 1), not exit 2
    from planner.launch.importers import read_configs

    assert read_configs([cfg]).values["seq_len"] == seq


@pytest.mark.parametrize("value", ["abc", "4096.5", "[1]"])
def test_a_count_that_is_no_whole_number_is_a_problem_naming_its_key(tmp_path, value):
    cfg = tmp_path / "ax.yaml"
    cfg.write_text(f"base_model: meta-llama/Llama-3.1-8B\nsequence_len: {value}\nmicro_batch_size: 2\n"
                   "adapter: lora\nlora_r: 16\n")
    out = CliRunner().invoke(app, ["estimate", "--config", str(cfg), "--gpu", "h100"])
    assert out.exit_code == 2 and "ax.yaml.sequence_len" in out.output and "whole number" in out.output


def test_deepspeed_auto_is_left_to_the_trainer_and_a_float_count_is_read(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 4.0,'
                   ' "zero_optimization": {"stage": 2}}')
    from planner.launch.importers import read_configs

    found = read_configs([cfg])
    assert found.values.get("grad_accum") == 4 and "micro_batch" not in found.values and not found.problems


@pytest.mark.parametrize("zero, elements", [
    ({"stage": 3}, 500_000_000),  # DeepSpeed's default where the JSON names none
    ({"stage": 3, "reduce_bucket_size": 2e8}, 200_000_000),
    ({"stage": 2, "reduce_bucket_size": 1e8, "overlap_comm": True}, 200_000_000),  # two buckets
    ({"stage": 2, "reduce_bucket_size": 1e8}, 100_000_000),
    ({"stage": 3, "reduce_bucket_size": "auto"}, None),  # the Trainer's hidden²: the model's default
    ({"stage": 3, "contiguous_gradients": False}, None),
    ({"stage": 0}, None)])
def test_deepspeed_reduce_bucket_is_read_as_the_memory_it_holds(tmp_path, zero, elements):
    """DeepSpeed allocates its gradient reduce bucket (reduce_bucket_size elements, twice with
    overlap_comm below stage 3) when contiguous_gradients is on, its default."""
    f = _found(tmp_path, "ds.json", {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero})
    assert f.values.get("zero_bucket_elements") == elements
    assert not f.problems


def test_an_exported_deepspeed_config_names_the_bucket_its_plan_holds(tmp_path):
    """Left out, DeepSpeed's 5e8-element default (1 GB in 16 bits) would sit beside a plan that
    counted the Trainer's "auto" hidden²: the export writes the plan's size, and reading it back
    gives the same memory."""
    raw = {"model": "llama-3.1-8b", "workload": {"method": "full", "seq_len": 2048, "micro_batch": 1},
           "layout": {"gpu": "h100", "gpus": 8, "zero": 3}, "recipe": {"zero_impl": "deepspeed"}}
    bundle = export_resolved(resolve(raw), ("deepspeed",), backend="deepspeed")
    cfg = json.loads(next(text for name, text in bundle.files.items() if name.endswith(".json")))
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 4096**2
    custom = export_resolved(resolve({**raw, "recipe": {"zero_impl": "deepspeed", "zero_bucket_elements": 3e8}}),
                             ("deepspeed",), backend="deepspeed")
    cfg = json.loads(next(text for name, text in custom.files.items() if name.endswith(".json")))
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 300_000_000


def test_adafactor_and_lion_are_read_as_themselves(tmp_path):
    """The Trainer's ``adafactor`` and bitsandbytes' 32-bit Lion (``lion_32bit``; paged: its states
    in unified memory) are optimizers the memory model keeps apart from AdamW."""
    for optim, want, paged in (("adafactor", "adafactor", False), ("lion_32bit", "lion", False),
                               ("paged_lion_32bit", "lion", True)):
        f = _found(tmp_path, "args.json", {"output_dir": "x", "optim": optim})
        assert f.values["optimizer"] == want, optim
        assert bool(f.values.get("optimizer_paged")) is paged, optim


def test_liger_applies_nothing_to_a_model_it_has_no_patch_for(tmp_path):
    """LLaMA-Factory's ``apply_liger_kernel`` and the Trainer's ``_apply_liger_kernel_to_instance``
    patch only the model types Liger-Kernel supports; for another ("Current model does not support
    liger kernel.") neither the kernels nor the fused loss apply. A Baichuan 2 LoRA with
    ``enable_liger_kernel`` is estimated as without it, and says so; a Llama keeps both."""
    from planner.core.arch import liger_patches
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve

    base = {"workload": {"method": "lora", "seq_len": 2048, "micro_batch": 4},
            "layout": {"gpu": "h100-sxm-80gb", "gpus": 1, "checkpointing": "none"}}
    liger = {"recipe": {"kernels": "liger", "loss": "fused"}}
    for model, patched in (("baichuan2-7b", False), ("qwen-7b", False), ("opt-1.3b", False),
                           ("llama-3.1-8b", True), ("qwen2.5-7b", True), ("phi-4", True), ("phi-2", False)):
        rs = resolve({**base, **liger, "model": model})
        assert liger_patches(rs.model) is patched, model
        plain = estimate_resolved(resolve({**base, "model": model}))
        with_liger = estimate_resolved(rs)
        if patched:
            assert rs.scenario.recipe.kernels == "liger" and with_liger.total_bytes < plain.total_bytes, model
        else:
            assert (rs.scenario.recipe.kernels, rs.scenario.recipe.loss) == ("standard", "standard"), model
            assert with_liger.total_bytes == plain.total_bytes, model
            assert any("no patch" in w for w in rs.warnings), model
