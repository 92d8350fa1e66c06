"""Every exported config, loaded by the library that consumes it: the parsed values are the plan's.

Needs the ``integrations`` extra (CPU builds: ``pip install torch==2.13.0`` first). Each library
is imported with ``pytest.importorskip``, so a missing one skips its tests and says which.
"""

from __future__ import annotations

import json
import os
import shlex
from unittest import mock

import pytest
import yaml

from planner.launch.export import export_resolved
from planner.scenario.resolve import resolve

#: Pinned plans: (scenario, what it exercises).
PLANS = {
    "full-zero3-offload": {"model": "llama-3.1-8b", "workload": {
        "method": "full", "micro_batch": 2, "grad_accum": 4, "seq_len": 4096},
        "layout": {"gpu": "a100-40gb", "gpus": 8, "zero": 3, "offload": "optimizer",
                   "checkpointing": "full"}},
    "lora-2-nodes-zero2": {"model": "llama-3.1-8b", "workload": {
        "method": "lora", "optimizer": "adam8bit", "micro_batch": 4, "grad_accum": 2, "seq_len": 2048,
        "lora_rank": 32, "lora_alpha": 64, "lora_targets": ["q", "v"]},
        "layout": {"gpu": "h100", "gpus": 16, "zero": 2, "checkpointing": "none", "attention": "flash"}},
    "qlora-t4": {"model": "llama-3.1-8b", "workload": {
        "method": "qlora", "optimizer": "paged_adamw8bit", "micro_batch": 1, "grad_accum": 16,
        "seq_len": 1024, "double_quant": False},
        "layout": {"gpu": "t4", "gpus": 1, "checkpointing": "full", "attention": "eager"}},
}


def _bundle(name: str):
    rs = resolve({"name": name, "profile": "seed", **PLANS[name]})
    return rs, export_resolved(rs)


@pytest.fixture(params=sorted(PLANS))
def plan(request):
    return _bundle(request.param)


def _json(bundle, name):
    return json.loads(bundle.files[name])


def test_deepspeed_parser_reads_the_plan(plan, monkeypatch):
    dsc = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed")
    rs, bundle = plan
    lay = rs.layout

    class Mpu:  # the data-parallel world DeepSpeed checks the batch against
        def __init__(self, n):
            self.n = n

        def get_data_parallel_world_size(self):
            return self.n

    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    cfg = dsc.DeepSpeedConfig(_json(bundle, "ds_config.json"), mpu=Mpu(lay.dp))
    assert cfg.train_micro_batch_size_per_gpu == rs.workload.micro_batch
    assert cfg.gradient_accumulation_steps == rs.grad_accum
    assert cfg.train_batch_size == rs.workload.micro_batch * lay.dp * rs.grad_accum
    assert cfg.zero_optimization_stage == lay.zero
    assert cfg.bfloat16_config.enabled == (rs.gpu.supports_bf16 and rs.workload.precision != "fp32")
    assert cfg.float16_config.enabled == (not rs.gpu.supports_bf16)
    offload = cfg.zero_config.offload_optimizer
    assert (offload is not None and str(offload.device).endswith("cpu")) == (lay.offload != "none")
    if lay.dp > 1:  # the batch check bites: the same file on half the GPUs is refused
        with pytest.raises(AssertionError, match="train_batch_size"):
            dsc.DeepSpeedConfig(_json(bundle, "ds_config.json"), mpu=Mpu(lay.dp // 2))


def test_accelerate_loader_and_launcher_read_the_plan(plan, tmp_path):
    pytest.importorskip("accelerate", reason="accelerate is not installed")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    rs, bundle = plan
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(bundle.files["accelerate_config.yaml"])
    cfg = load_config_from_file(str(path))
    assert cfg.num_processes == rs.layout.gpus
    assert cfg.mixed_precision == ("bf16" if rs.gpu.supports_bf16 else "fp16")
    fsdp = rs.layout.zero > 0
    assert str(cfg.distributed_type).endswith("FSDP" if fsdp else ("MULTI_GPU" if rs.layout.gpus > 1 else "NO"))
    if not fsdp:
        return
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)  # what `accelerate launch` hands to the workers
    assert env["FSDP_SHARDING_STRATEGY"] == {3: "FULL_SHARD", 2: "SHARD_GRAD_OP", 1: "SHARD_GRAD_OP"}[rs.layout.zero]
    assert env["FSDP_OFFLOAD_PARAMS"] == str(rs.layout.offload != "none").lower()
    assert env["FSDP_ACTIVATION_CHECKPOINTING"] == str(rs.layout.checkpointing == "full").lower()
    assert env["FSDP_USE_ORIG_PARAMS"] == str(rs.workload.method != "full").lower()
    assert env["ACCELERATE_MIXED_PRECISION"] == cfg.mixed_precision
    assert args.num_machines == -(-rs.layout.gpus // rs.gpu.gpus_per_node)


def test_training_arguments_read_the_plan(plan, tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    rs, bundle = plan
    body = _json(bundle, "training_args.json")
    if "deepspeed" in body:  # the DeepSpeed file is checked above; the Trainer would start its engine
        assert body.pop("deepspeed") == "ds_config.json"
    with mock.patch.dict(os.environ, {}, clear=False):
        args = transformers.TrainingArguments(**body, output_dir=str(tmp_path), use_cpu=True)
    assert args.per_device_train_batch_size == rs.workload.micro_batch
    assert args.gradient_accumulation_steps == rs.grad_accum
    assert args.optim.value == {"adamw": "adamw_torch", "adam8bit": "adamw_bnb_8bit",
                                "paged_adamw8bit": "paged_adamw_8bit", "sgd": "sgd"}[rs.workload.optimizer]
    assert args.bf16 == rs.gpu.supports_bf16 and args.fp16 == (not rs.gpu.supports_bf16)
    assert bool(args.gradient_checkpointing) == (rs.layout.checkpointing == "full")
    kwargs = _json(bundle, "model_kwargs.json")
    assert kwargs["attn_implementation"] == ("eager" if rs.layout.attention == "eager" else "flash_attention_2")
    assert kwargs["pretrained_model_name_or_path"] == rs.model.hf_repo


def test_peft_and_bitsandbytes_configs_read_the_plan(plan):
    peft = pytest.importorskip("peft", reason="peft is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    rs, bundle = plan
    wl = rs.workload
    if wl.method == "full":
        assert "lora_config.json" not in bundle.files
        return
    lora = peft.LoraConfig(**_json(bundle, "lora_config.json"))
    assert lora.r == wl.lora_rank
    assert lora.lora_alpha == (wl.lora_alpha if wl.lora_alpha is not None else 8)
    expected = "all-linear" if "all" in wl.lora_targets else {f"{t}_proj" for t in wl.lora_targets}
    assert lora.target_modules == expected
    if wl.method == "qlora":
        bnb = transformers.BitsAndBytesConfig(**_json(bundle, "bnb_config.json"))
        assert bnb.load_in_4bit and bnb.bnb_4bit_quant_type == "nf4"
        assert bnb.bnb_4bit_use_double_quant == wl.double_quant
        assert str(bnb.bnb_4bit_compute_dtype) == ("torch.bfloat16" if rs.gpu.supports_bf16 else "torch.float16")


def test_torchrun_parser_reads_the_plan(plan):
    run = pytest.importorskip("torch.distributed.run", reason="torch is not installed")
    rs, bundle = plan
    line = bundle.files["launch.sh"].strip().splitlines()[-1]
    for var, value in {"NODE_RANK": "1", "MASTER_ADDR": "node0", "TRAIN_SCRIPT": "train.py"}.items():
        line = line.replace("${%s}" % var, value)  # what the shell does
    ns = run.get_args_parser().parse_args(shlex.split(line)[1:])
    assert ns.training_script == "train.py"
    nodes = -(-rs.layout.gpus // rs.gpu.gpus_per_node)
    assert ns.nnodes == str(nodes)
    assert int(ns.nproc_per_node) * nodes == rs.layout.gpus
    assert ns.standalone == (nodes == 1)
    if nodes > 1:
        assert ns.node_rank == 1 and ns.rdzv_endpoint == "node0:29500"


def test_skypilot_task_schema_reads_the_plan(plan):
    pytest.importorskip("sky", reason="skypilot is not installed")
    import sky
    from sky.utils import common_utils, schemas

    rs, bundle = plan
    task = yaml.safe_load(bundle.files["sky_task.yaml"])
    common_utils.validate_schema(task, schemas.get_task_schema(), "Invalid task YAML: ")
    parsed = sky.Task.from_yaml_config(task, env_overrides=[("TRAIN_SCRIPT", "train.py")])
    nodes = -(-rs.layout.gpus // rs.gpu.gpus_per_node)
    assert parsed.num_nodes == nodes
    (res,) = parsed.resources
    assert sum(res.accelerators.values()) * nodes == rs.layout.gpus
    bad = dict(task, num_nodes="two")
    with pytest.raises(Exception, match="num_nodes|two"):
        common_utils.validate_schema(bad, schemas.get_task_schema(), "Invalid task YAML: ")
