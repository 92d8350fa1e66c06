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

from planner.launch.exporters import export_resolved
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
    "qlora-fsdp": {"model": "llama-3.1-70b", "workload": {
        "method": "qlora", "micro_batch": 1, "grad_accum": 4, "seq_len": 2048, "lora_rank": 16,
        "lora_alpha": 32, "lora_targets": ["all"]},
        "layout": {"gpu": "a100-80gb", "gpus": 4, "zero": 3, "checkpointing": "full"}},
    "full-single": {"model": "llama-3.2-1b", "workload": {
        "method": "full", "micro_batch": 2, "grad_accum": 8, "seq_len": 2048},
        "layout": {"gpu": "a100-80gb", "gpus": 1, "checkpointing": "full"}},
}
#: The sharding back-end asked for (None: the default).
BACKEND = {"qlora-fsdp": "fsdp"}


def _bundle(name: str):
    rs = resolve({"name": name, "profile": "seed", **PLANS[name]})
    return rs, export_resolved(rs, backend=BACKEND.get(name))


@pytest.fixture(params=sorted(PLANS))
def plan(request):
    return _bundle(request.param)


def _json(bundle, name):
    return json.loads(bundle.files[name])


def test_deepspeed_parser_reads_the_plan(plan, monkeypatch):
    dsc = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed")
    rs, bundle = plan
    lay = rs.layout
    if "ds_config.json" not in bundle.files:  # an FSDP bundle: no DeepSpeed file
        assert BACKEND.get(rs.name) == "fsdp" and "deepspeed" in bundle.skipped
        return

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
    fsdp = rs.layout.zero > 1 and rs.layout.offload != "optimizer" and BACKEND.get(rs.name) == "fsdp"
    deepspeed = rs.layout.zero > 0 and not fsdp
    # beside a DeepSpeed file the precision is the file's (accelerate refuses both)
    assert cfg.mixed_precision == (None if deepspeed else "bf16" if rs.gpu.supports_bf16 else "fp16")
    kind = "FSDP" if fsdp else "DEEPSPEED" if deepspeed else ("MULTI_GPU" if rs.layout.gpus > 1 else "NO")
    assert str(cfg.distributed_type).endswith(kind)
    if deepspeed:  # the launcher accepts the DeepSpeed file (it refuses a mixed_precision beside it)
        from accelerate.utils.launch import prepare_deepspeed_cmd_env

        assert cfg.deepspeed_config["deepspeed_config_file"] == "ds_config.json"
        args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
        args, defaults, mp_from_config = _validate_launch_command(args)
        assert not mp_from_config
        fields = list(defaults.deepspeed_config)
        with mock.patch.dict(os.environ, {"ACCELERATE_CONFIG_DS_FIELDS": ",".join(fields)}):
            from accelerate.utils import DeepSpeedPlugin

            DeepSpeedPlugin(hf_ds_config=json.loads(bundle.files["ds_config.json"]))._deepspeed_config_checks()
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(args)
        assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == "ds_config.json"
        return
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
    fsdp_ckpt = bool((args.fsdp_config or {}).get("activation_checkpointing"))
    assert bool(args.gradient_checkpointing) or fsdp_ckpt == (rs.layout.checkpointing == "full")
    assert not (args.gradient_checkpointing and fsdp_ckpt)  # the Trainer refuses both
    kwargs = _json(bundle, "model_kwargs.json")
    assert kwargs["attn_implementation"] == ("eager" if rs.layout.attention == "eager" else "sdpa")
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
        line = line.replace(f"${{{var}}}", value)  # what the shell does
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


# --- The exports RUN: two training steps, a DeepSpeed engine, torchtune's own parser -----------

TINY = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 64}


def _tiny_llama(transformers, kwargs):
    """A tiny random Llama built as the exported ``from_pretrained`` kwargs ask (no download)."""
    import torch

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**TINY)
    cfg._attn_implementation = kwargs["attn_implementation"]
    return transformers.LlamaForCausalLM(cfg)


class _Tokens:
    def __init__(self, n=8, length=16):
        import torch

        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(0, TINY["vocab_size"], (length,), generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i].clone()}


def test_trainer_runs_two_steps_with_the_exported_arguments(plan, tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    _rs, bundle = plan
    body = _json(bundle, "training_args.json")
    said = []  # what a CPU run cannot take from the file, and why
    if body.pop("deepspeed", None):
        said.append("deepspeed: its engine is started below")
    if body.pop("fsdp", None):
        body.pop("fsdp_config", None)
        said.append("fsdp: needs a process group of GPUs")
    if body.get("fp16"):
        body["fp16"] = False
        said.append("fp16: CUDA only")
    if body["optim"] in ("adamw_bnb_8bit", "paged_adamw_8bit"):
        bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")
        try:
            import torch

            bnb.optim.AdamW8bit([torch.nn.Parameter(torch.zeros(4096))]).step()
        except Exception:  # noqa: BLE001 - a build without CPU kernels: the rest of the file still runs
            body["optim"] = "adamw_torch"
            said.append("8-bit optimizer: this bitsandbytes has no CPU kernels")
    args = transformers.TrainingArguments(**body, output_dir=str(tmp_path), use_cpu=True, max_steps=2,
                                          report_to=[], save_strategy="no", logging_strategy="no",
                                          dataloader_num_workers=0)
    model = _tiny_llama(transformers, _json(bundle, "model_kwargs.json"))
    if "lora_config.json" in bundle.files:
        peft = pytest.importorskip("peft", reason="peft is not installed")
        model = peft.get_peft_model(model, peft.LoraConfig(**_json(bundle, "lora_config.json")))
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens(n=body[
        "per_device_train_batch_size"] * body["gradient_accumulation_steps"] * 2))
    out = trainer.train()
    assert out.global_step == 2, said
    changed = [n for n, p in model.named_parameters() if p.requires_grad and not (p.detach() == before[n]).all()]
    assert changed, said


#: Run in a child process: DeepSpeed's engine patches torch globally (later tests would see it).
_DS_CHILD = r"""
import json, os, socket, sys, importlib
from unittest import mock
import torch, transformers, deepspeed
ds, lora, tiny = (json.loads(a) for a in sys.argv[1:4])
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
ds_torch = importlib.import_module("deepspeed.comm.torch")
# the shared-memory all-reduce is a compiled CPU op for many local ranks; one rank needs none
with mock.patch.dict(os.environ, env), mock.patch.object(ds_torch, "build_shm_op", lambda: None):
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**tiny)
    cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(cfg)
    if lora is not None:
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(**lora))
    params = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(params, lr=1e-3), config=ds)
    ids = torch.randint(0, tiny["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(engine.gradient_accumulation_steps()):  # one optimizer step
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    print(json.dumps({"zero": engine.zero_optimization_stage(), "grad_accum": engine.gradient_accumulation_steps(),
                      "micro_batch": engine.train_micro_batch_size_per_gpu(), "bf16": engine.bfloat16_enabled(),
                      "steps": engine.global_steps}))
"""


def test_deepspeed_initialize_runs_the_exported_json_on_cpu(plan):
    pytest.importorskip("deepspeed", reason="deepspeed is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    import subprocess
    import sys

    rs, bundle = plan
    if "ds_config.json" not in bundle.files:
        pytest.skip("an FSDP bundle has no DeepSpeed file")
    ds = _json(bundle, "ds_config.json")
    # one process stands for the plan's data-parallel world: the batch per step is its share
    ds["train_batch_size"] = ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"]
    ds["zero_force_ds_cpu_optimizer"] = False  # a torch AdamW, not DeepSpeed's compiled CPU Adam
    if ds.get("fp16", {}).get("enabled"):  # DeepSpeed's CPU accelerator has no fp16; the rest still runs
        assert rs.workload.precision == "fp16" or not rs.gpu.supports_bf16, "fp16 exported for a bf16 GPU"
        ds["fp16"]["enabled"] = False
    lora = _json(bundle, "lora_config.json") if "lora_config.json" in bundle.files else None
    if lora is not None:
        pytest.importorskip("peft", reason="peft is not installed")
    run = subprocess.run([sys.executable, "-c", _DS_CHILD, json.dumps(ds), json.dumps(lora), json.dumps(TINY)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "DS_BUILD_OPS": "0"},
                         check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["zero"] == rs.layout.zero
    assert got["grad_accum"] == rs.grad_accum
    assert got["micro_batch"] == rs.workload.micro_batch
    assert got["bf16"] == ds.get("bf16", {}).get("enabled", False)
    assert got["steps"] == 1


def _torchtune_base(name: str):
    """A base config shipped with torchtune (its recipes/configs)."""
    torchtune = pytest.importorskip("torchtune", reason="torchtune is not installed")
    from pathlib import Path

    path = Path(torchtune.__file__).parent.parent / "recipes" / "configs" / name
    if not path.is_file():
        pytest.skip(f"torchtune ships no {name}")
    return path


def _tune_overrides(bundle) -> list[str]:
    """The key=value words `tune run` gets from torchtune_run.sh, as bash splits them."""
    script = bundle.files["torchtune_run.sh"]
    words = shlex.split(script.split("\n", 3)[3].replace("\\\n", " "))
    assert words.count("--config") == 1
    return words[words.index("--config") + 2:]


def test_torchtune_parser_merges_the_overrides_over_the_base(plan):
    pytest.importorskip("torchtune", reason="torchtune is not installed")
    from torchtune.config._parse import TuneRecipeArgumentParser
    from torchtune.config._utils import _merge_yaml_and_cli_args

    rs, bundle = plan
    if "torchtune_run.sh" not in bundle.files:
        assert "torchtune" in bundle.skipped
        return
    wl = rs.workload
    base = _torchtune_base("llama3_1/" + ("8B_full_single_device.yaml" if wl.method == "full" else
                                          "8B_qlora_single_device.yaml" if wl.method == "qlora" else
                                          "8B_lora_single_device.yaml"))
    parser = TuneRecipeArgumentParser(description="")
    yaml_args, cli_args = parser.parse_known_args(["--config", str(base), *_tune_overrides(bundle)])
    cfg = _merge_yaml_and_cli_args(yaml_args, cli_args)
    assert cfg.batch_size == wl.micro_batch and cfg.gradient_accumulation_steps == rs.grad_accum
    assert cfg.tokenizer.max_seq_len == wl.seq_len
    assert cfg.enable_activation_checkpointing == (rs.layout.checkpointing == "full")
    # the base's kept (YAML 1.1 reads "2e-5" as text; OmegaConf as a number)
    assert float(cfg.optimizer.lr) == float(yaml.safe_load(base.read_text())["optimizer"]["lr"])
    assert cfg.model._component_ == yaml.safe_load(base.read_text())["model"]["_component_"]
    if wl.method != "full":
        assert cfg.model.lora_rank == wl.lora_rank
        return
    assert cfg.optimizer_in_bwd is False  # the base turns it on
    import importlib.util

    spec = importlib.util.spec_from_file_location("tt_full_single", base.parents[2] / "full_finetune_single_device.py")
    recipes = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(recipes)
    except ImportError as exc:  # torchtune's recipe imports APIs that newer torchao releases dropped
        pytest.skip(f"torchtune's recipe does not import beside this torchao: {exc}")
    cfg.device = "cpu"
    recipes.FullFinetuneRecipeSingleDevice(cfg)  # its checks pass: no optimizer_in_bwd with accumulation
    cfg.optimizer_in_bwd = True
    with pytest.raises(RuntimeError, match="optimizer in bwd"):
        recipes.FullFinetuneRecipeSingleDevice(cfg)


#: DPO plans: a full fine-tuning with its frozen reference copy under ZeRO-3, and LoRA, whose
#: reference is the base with the adapters disabled (no second model).
DPO_PLANS = {
    "dpo-full-zero3": {"model": "llama-3.1-8b", "workload": {
        "method": "full", "algorithm": "dpo", "micro_batch": 2, "grad_accum": 2, "seq_len": 16},
        "layout": {"gpu": "h100", "gpus": 8, "zero": 3, "checkpointing": "full"}},
    "dpo-lora": {"model": "llama-3.1-8b", "workload": {
        "method": "lora", "algorithm": "dpo", "micro_batch": 2, "grad_accum": 2, "seq_len": 16,
        "lora_rank": 4, "lora_alpha": 8, "lora_targets": ["q", "v"]},
        "layout": {"gpu": "h100", "gpus": 1, "checkpointing": "none"}},
}


def _word_tokenizer(transformers, tmp_path):
    """A word-level tokenizer over the tiny model's vocabulary, built here (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(TINY["vocab_size"] - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                                unk_token="<unk>")


def _two_cpu_steps(config_cls, body: dict, tmp_path):
    """A TRL config from an exported file's keys, for two steps on the CPU, nothing saved or logged."""
    return config_cls(**body, output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=2, report_to=[],
                      save_strategy="no", logging_strategy="no", dataloader_num_workers=0)


def _tiny_model_dir(transformers, bundle, tmp_path):
    """The tiny Llama built from the bundle's model kwargs and the word-level tokenizer, saved where
    a trainer loads them by path: (that directory, the tokenizer)."""
    model_dir = tmp_path / "model"
    _tiny_llama(transformers, _json(bundle, "model_kwargs.json")).save_pretrained(model_dir)
    tokenizer = _word_tokenizer(transformers, tmp_path)
    tokenizer.save_pretrained(model_dir)
    return model_dir, tokenizer


def _trains_two_steps(trainer) -> None:
    """The trainer runs its two steps and moves the trainable parameters."""
    trained = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainer.train().global_step == 2
    assert any(not (p.detach() == trained[n]).all() for n, p in trainer.model.named_parameters() if p.requires_grad)


@pytest.mark.parametrize("name", sorted(DPO_PLANS))
def test_trl_dpo_trainer_runs_two_steps_with_the_exported_config(name, tmp_path):
    """The exported dpo_config.json is TRL's DPOConfig: DPOTrainer takes it and trains two steps on
    CPU, a pair per example as the plan counts them, with a reference model exactly where the plan
    charged one (a frozen copy for full fine-tuning; none for LoRA, the adapters disabled)."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    trl = pytest.importorskip("trl", reason="trl is not installed")
    datasets = pytest.importorskip("datasets", reason="datasets is not installed")
    rs = resolve({"name": name, "profile": "seed", **DPO_PLANS[name]})
    bundle = export_resolved(rs, formats=("hf", "deepspeed"))
    assert "training_args.json" not in bundle.files
    body = _json(bundle, "dpo_config.json")
    assert body["max_length"] == rs.workload.seq_len and body["precompute_ref_log_probs"] is False
    body.pop("deepspeed", None)  # its engine needs a process group; the config itself is checked above
    body["bf16"] = False  # CPU
    args = _two_cpu_steps(trl.DPOConfig, body, tmp_path)
    assert args.per_device_train_batch_size == rs.workload.micro_batch  # pairs
    model_dir, tokenizer = _tiny_model_dir(transformers, bundle, tmp_path)
    peft_config = None
    if "lora_config.json" in bundle.files:
        peft = pytest.importorskip("peft", reason="peft is not installed")
        peft_config = peft.LoraConfig(**_json(bundle, "lora_config.json"))
    pairs = datasets.Dataset.from_list([{"prompt": "w1 w2 w3", "chosen": " w4 w5", "rejected": " w6 w7 w8"}] * 8)
    trainer = trl.DPOTrainer(model=str(model_dir), args=args, train_dataset=pairs, processing_class=tokenizer,
                             peft_config=peft_config)
    assert (trainer.ref_model is not None) == rs.workload.reference_copy
    _trains_two_steps(trainer)


def test_trl_grpo_trainer_runs_two_steps_with_the_exported_config(tmp_path):
    """The exported grpo_config.json is TRL's GRPOConfig: GRPOTrainer takes it and trains two steps
    on CPU, generating each step's completions (here through transformers, as vLLM needs a GPU),
    the batch counting completions in groups of num_generations as the plan does, and no reference
    model where the plan keeps none (beta 0)."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    trl = pytest.importorskip("trl", reason="trl is not installed")
    datasets = pytest.importorskip("datasets", reason="datasets is not installed")
    peft = pytest.importorskip("peft", reason="peft is not installed")
    rs = resolve({"name": "grpo-lora", "profile": "seed", "model": "llama-3.1-8b",
                  "workload": {"method": "lora", "algorithm": "grpo", "micro_batch": 4, "grad_accum": 1,
                               "seq_len": 24, "completion_len": 8, "num_generations": 4, "lora_rank": 4,
                               "lora_alpha": 8, "lora_targets": ["q", "v"]},
                  "layout": {"gpu": "h100", "gpus": 1}})
    bundle = export_resolved(rs, formats=("hf",))
    body = _json(bundle, "grpo_config.json")
    assert (body["num_generations"], body["max_completion_length"], body["beta"]) == (4, 8, 0.0)
    body.update(use_vllm=False, bf16=False)  # CPU: transformers generates
    args = _two_cpu_steps(trl.GRPOConfig, body, tmp_path)
    assert args.per_device_train_batch_size == rs.workload.micro_batch  # completions
    model_dir, tokenizer = _tiny_model_dir(transformers, bundle, tmp_path)
    prompts = datasets.Dataset.from_list([{"prompt": "w1 w2 w3"}] * 8)
    trainer = trl.GRPOTrainer(model=str(model_dir), args=args, train_dataset=prompts, processing_class=tokenizer,
                              reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
                              peft_config=peft.LoraConfig(**_json(bundle, "lora_config.json")))
    assert getattr(trainer, "ref_model", None) is None  # beta 0: no reference model, as planned
    _trains_two_steps(trainer)
