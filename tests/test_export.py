"""`planner export`: every decided setting is in the files, nothing undecided is invented."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT, one_line
from typer.testing import CliRunner

from planner.cli.main import app
from planner.launch.exporters import export_resolved
from planner.scenario.resolve import resolve

runner = CliRunner()

FULL_16 = {"name": "full16", "profile": "seed", "model": "llama-3.1-8b",
           "workload": {"method": "full", "micro_batch": 2, "grad_accum": 4, "seq_len": 4096},
           "layout": {"gpu": "h100", "gpus": 16, "zero": 3, "offload": "optimizer+params",
                      "checkpointing": "full"}}
QLORA = {"name": "q", "profile": "seed", "model": "llama-3.1-8b",
         "workload": {"method": "qlora", "optimizer": "paged_adamw8bit", "micro_batch": 1, "grad_accum": 16,
                      "seq_len": 1024, "lora_rank": 8, "lora_alpha": 16, "lora_targets": ["q", "v", "down"]},
         "layout": {"gpu": "rtx-4090", "gpus": 1, "checkpointing": "full"}}
TP_PP = {"name": "tp", "profile": "seed", "model": "llama-3.1-70b",
         "workload": {"method": "full", "micro_batch": 1, "global_batch": 64, "seq_len": 8192},
         "layout": {"gpu": "h100", "gpus": 32, "tp": 8, "pp": 2, "sp": True, "zero": 1,
                    "checkpointing": "selective", "pp_virtual_stages": 1}}


def _export(raw):
    if "pp_virtual_stages" in raw["layout"]:
        from planner.core.specs import Layout

        if "pp_virtual_stages" not in Layout.model_fields:
            raw = {**raw, "layout": {k: v for k, v in raw["layout"].items() if k != "pp_virtual_stages"}}
    return export_resolved(resolve(raw))


def test_deepspeed_and_accelerate_carry_every_decision():
    b = _export(FULL_16)
    ds = json.loads(b.files["ds_config.json"])
    assert ds["train_micro_batch_size_per_gpu"] == 2 and ds["gradient_accumulation_steps"] == 4
    assert ds["train_batch_size"] == 2 * 16 * 4
    assert ds["bf16"] == {"enabled": True} and "fp16" not in ds
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["zero_optimization"]["offload_param"]["device"] == "cpu"
    acc = yaml.safe_load(b.files["accelerate_config.yaml"])
    assert acc["distributed_type"] == "DEEPSPEED" and acc["num_processes"] == 16 and acc["num_machines"] == 2
    assert acc["deepspeed_config"] == {"deepspeed_config_file": "ds_config.json", "zero3_init_flag": True}
    assert "mixed_precision" not in acc  # accelerate refuses it beside a DeepSpeed file
    sky = yaml.safe_load(b.files["sky_task.yaml"])
    assert sky["resources"]["accelerators"] == "H100:8" and sky["num_nodes"] == 2
    assert "--nnodes=2 --nproc_per_node=8" in b.files["launch.sh"]
    args = json.loads(b.files["training_args.json"])
    assert args["deepspeed"] == "ds_config.json" and args["gradient_checkpointing"] is True


def test_fsdp_bundle_carries_every_decision():
    b = export_resolved(resolve(FULL_16), backend="fsdp")
    assert "ds_config.json" not in b.files and "deepspeed" in b.skipped
    acc = yaml.safe_load(b.files["accelerate_config.yaml"])
    assert acc["distributed_type"] == "FSDP" and acc["num_processes"] == 16 and acc["num_machines"] == 2
    assert acc["fsdp_config"]["fsdp_sharding_strategy"] == "FULL_SHARD"
    assert acc["fsdp_config"]["fsdp_offload_params"] is True
    assert acc["fsdp_config"]["fsdp_activation_checkpointing"] is True
    args = json.loads(b.files["training_args.json"])
    assert "deepspeed" not in args and args["fsdp"] == "full_shard auto_wrap offload"
    assert args["fsdp_config"] == {"activation_checkpointing": True} and args["gradient_checkpointing"] is False


def test_a_muon_plan_is_exported_without_a_wrong_optimizer():
    """The Trainer has no ``optim`` for Muon and torchtune's recipes build one optimizer over every
    parameter (torch.optim.Muon refuses 1-D ones): the Trainer's arguments leave ``optim`` out and
    say what to pass instead; torchtune is skipped with the reason. No file names AdamW for it."""
    raw = {**FULL_16, "workload": {**FULL_16["workload"], "optimizer": "muon"}}
    b = _export(raw)
    args = json.loads(b.files["training_args.json"])
    assert "optim" not in args
    assert any(n.startswith("hf:") and "torch.optim.Muon" in n for n in b.fill_in)
    assert "torchtune" in b.skipped and "Muon" in b.skipped["torchtune"]
    plain = json.loads(_export(FULL_16).files["training_args.json"])
    assert plain["optim"] == "adamw_torch"


def _backends(bundle) -> set[str]:
    """The sharding back-ends the bundle's files point at."""
    found = set()
    acc = yaml.safe_load(bundle.files.get("accelerate_config.yaml", "{}"))
    args = json.loads(bundle.files.get("training_args.json", "{}"))
    if acc.get("distributed_type") == "FSDP" or args.get("fsdp"):
        found.add("fsdp")
    if acc.get("distributed_type") == "DEEPSPEED" or args.get("deepspeed"):
        found.add("deepspeed")
    ds = json.loads(bundle.files.get("ds_config.json", "{}"))
    if ds.get("zero_optimization", {}).get("stage", 0) > 0:
        found.add("deepspeed")
    return found


@pytest.mark.parametrize("backend", [None, "deepspeed", "fsdp"])
@pytest.mark.parametrize("zero, offload", [(0, "none"), (1, "none"), (2, "none"), (2, "optimizer"), (3, "none"),
                                           (3, "optimizer+params")])
def test_one_bundle_points_at_one_sharding_backend(zero, offload, backend):
    raw = {**FULL_16, "layout": {**FULL_16["layout"], "zero": zero, "offload": offload}}
    b = export_resolved(resolve(raw), backend=backend)
    found = _backends(b)
    assert len(found) <= 1, found
    if zero == 0:
        assert not found
    elif zero == 1 or offload == "optimizer":  # FSDP has neither: DeepSpeed whatever was asked
        assert found == {"deepspeed"}
    else:
        assert found == {backend or "deepspeed"}


def test_the_plans_stack_picks_the_backend(tmp_path):
    pinned = {**FULL_16, "layout": {**FULL_16["layout"], "offload": "none"}}
    for stack, expected in (("hf-fsdp", "fsdp"), ("hf-deepspeed", "deepspeed"), ("torchtune", "fsdp")):
        path = tmp_path / f"{stack}.json"
        path.write_text(json.dumps({"plans": [{"rank": 1, "stack": stack, "pinned_scenario": pinned}]}))
        res = runner.invoke(app, ["export", str(path), "--json", "--format", "accelerate,hf,deepspeed"])
        assert res.exit_code == 0, res.output
        files = json.loads(res.output)["files"]
        assert _backends(_Files(files)) == {expected}, stack
        assert f"stack {stack}" in files["PLAN.md"]
    res = runner.invoke(app, ["export", str(tmp_path / "hf-fsdp.json"), "--json", "--backend", "deepspeed"])
    assert res.exit_code == 0 and _backends(_Files(json.loads(res.output)["files"])) == {"deepspeed"}
    res = runner.invoke(app, ["export", str(tmp_path / "hf-fsdp.json"), "--backend", "megatron"])
    assert res.exit_code == 2 and "backend: 'megatron'" in res.output


class _Files:
    def __init__(self, files):
        self.files = files


def test_torchtune_gets_one_config_and_key_value_overrides():
    b = _export(FULL_16)
    run = b.files["torchtune_run.sh"]
    command = run.split("\n", 3)[3]
    assert command.count("--config") == 1  # a second --config replaces the first in `tune run`
    assert "torchtune_override.yaml" not in command
    for override in ("batch_size=2", "gradient_accumulation_steps=4", "tokenizer.max_seq_len=4096",
                     "optimizer._component_=torch.optim.AdamW", "fsdp_cpu_offload=True",
                     "enable_activation_checkpointing=True", "dtype=bf16"):
        assert override in command, override
    assert "full_finetune_distributed" in command and "--nproc_per_node=8" in command


@pytest.mark.parametrize("grad_accum", [1, 4])
def test_torchtune_optimizer_in_bwd_is_off_with_gradient_accumulation(grad_accum):
    raw = {**FULL_16, "workload": {**FULL_16["workload"], "grad_accum": grad_accum}}
    b = _export(raw)
    tt = yaml.safe_load(b.files["torchtune_override.yaml"])
    assert tt["optimizer_in_bwd"] is False  # base configs (8B_full_single_device) turn it on
    assert "optimizer_in_bwd=False" in b.files["torchtune_run.sh"]
    assert any("optimizer_in_bwd is off" in n for n in b.notes) == (grad_accum > 1)
    lora = _export(QLORA)  # LoRA recipes have no optimizer_in_bwd
    assert "optimizer_in_bwd" not in yaml.safe_load(lora.files["torchtune_override.yaml"])


@pytest.mark.parametrize("gpus, zero, backend, storage", [
    (1, 0, None, None), (4, 2, "deepspeed", None), (4, 3, "deepspeed", "bfloat16"),
    (4, 2, "fsdp", "bfloat16"), (4, 3, "fsdp", "bfloat16")])
def test_sharded_qlora_stores_4bit_weights_in_the_compute_dtype(gpus, zero, backend, storage):
    raw = {**QLORA, "layout": {"gpu": "a100-80gb", "gpus": gpus, "zero": zero, "checkpointing": "full"}}
    b = export_resolved(resolve(raw), backend=backend)
    bnb = json.loads(b.files["bnb_config.json"])
    assert bnb.get("bnb_4bit_quant_storage") == storage
    if storage:
        assert bnb["bnb_4bit_quant_storage"] == bnb["bnb_4bit_compute_dtype"]


@pytest.mark.parametrize("model, gpu, expected", [
    ("llama-3.1-8b", "h100", "sdpa"), ("llama-3.1-8b", "a100-80gb", "sdpa"), ("llama-3.1-8b", "t4", "sdpa"),
    ("gemma-2-9b", "h100", "flash_attention_2"), ("gemma-2-9b", "l4", "flash_attention_2"),
    ("gemma-2-9b", "t4", "sdpa"), ("gemma-2-9b", "v100-32gb", "sdpa")])
def test_sdpa_unless_the_plan_needs_flash_attention_2(model, gpu, expected):
    raw = {"name": "a", "profile": "seed", "model": model, "workload": {"method": "lora", "seq_len": 1024},
           "layout": {"gpu": gpu, "gpus": 1, "attention": "flash"}}
    b = export_resolved(resolve(raw))
    assert json.loads(b.files["model_kwargs.json"])["attn_implementation"] == expected
    if model.startswith("gemma") and expected == "sdpa":
        assert any("soft-caps" in n for n in b.notes)


def test_nothing_undecided_is_invented_and_the_gaps_are_listed():
    b = _export(FULL_16)
    text = "\n".join(t for name, t in b.files.items() if name != "PLAN.md").lower()
    for invented in ("learning_rate", "\"lr\"", "gradient_clipping\":", "scheduler\":", "output_dir",
                     "\"optimizer\":"):
        assert invented not in text, invented
    readme = b.files["PLAN.md"]
    assert "learning rate" in readme and "MASTER_ADDR" in readme and "machine_rank" in readme
    assert "output_dir" in readme  # said, not written


def test_a_fused_optimizer_step_is_exported_as_the_fused_adamw():
    """A plan whose AdamW steps in one fused kernel says so to the Trainer, and reading the
    exported arguments back gives the same step."""
    from planner.launch.importers.hf_trainer import HF_OPTIM_STEP

    fused = {**FULL_16, "recipe": {"optimizer_step": "fused"}}
    assert json.loads(_export(fused).files["training_args.json"])["optim"] == "adamw_torch_fused"
    assert HF_OPTIM_STEP["adamw_torch_fused"] == "fused"
    assert json.loads(_export(FULL_16).files["training_args.json"])["optim"] == "adamw_torch"


def test_qlora_recipe_files():
    b = _export(QLORA)
    bnb = json.loads(b.files["bnb_config.json"])
    assert bnb == {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                   "bnb_4bit_compute_dtype": "bfloat16"}
    lora = json.loads(b.files["lora_config.json"])
    assert lora["r"] == 8 and lora["lora_alpha"] == 16
    assert lora["target_modules"] == ["q_proj", "v_proj", "down_proj"]
    args = json.loads(b.files["training_args.json"])
    assert args["optim"] == "paged_adamw_8bit" and "deepspeed" not in args
    tt = yaml.safe_load(b.files["torchtune_override.yaml"])
    assert tt["model"]["lora_attn_modules"] == ["q_proj", "v_proj"] and tt["model"]["apply_lora_to_mlp"]
    assert "model.lora_attn_modules=[q_proj,v_proj]" in b.files["torchtune_run.sh"]
    assert tt["optimizer"]["_component_"] == "bitsandbytes.optim.PagedAdamW8bit"
    assert tt["tokenizer"]["max_seq_len"] == 1024 and tt["gradient_accumulation_steps"] == 16
    assert "megatron" in b.skipped and "megatron_args.txt" not in b.files
    assert any("whole MLP" in n for n in b.notes)  # down only cannot be said in torchtune


def test_model_parallel_plan_goes_to_megatron_and_says_why_not_elsewhere():
    b = _export(TP_PP)
    margs = b.files["megatron_args.txt"].splitlines()
    for arg in ("--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 2", "--sequence-parallel",
                "--micro-batch-size 1", "--global-batch-size 64", "--seq-length 8192", "--bf16",
                "--recompute-granularity selective", "--use-distributed-optimizer", "--num-layers 80",
                "--group-query-attention", "--num-query-groups 8"):
        assert arg in margs, arg
    for fmt in ("deepspeed", "accelerate", "hf"):
        assert fmt in b.skipped and "Megatron" in b.skipped[fmt]
    assert "ds_config.json" not in b.files


def test_megatron_args_keep_the_gradient_dtype_the_plan_counted():
    """Megatron-LM under --bf16 reduces gradients in FP32 buffers unless --grad-reduce-in-bf16
    (arguments.py, the megatron stack's source mg-bf16-grads): a plan that counted 16-bit gradients
    asks for that flag; one on the megatron stack's FP32 gradients does not."""
    bf16_grads = _export(TP_PP).files["megatron_args.txt"].splitlines()
    fp32_grads = _export({**TP_PP, "recipe": {"grad_dtype": "fp32"}}).files["megatron_args.txt"].splitlines()
    assert "--grad-reduce-in-bf16" in bf16_grads and "--grad-reduce-in-bf16" not in fp32_grads
    assert "--bf16" in fp32_grads


def test_bf16_adam_moments_export_megatrons_precision_aware_optimizer():
    """A plan counted with Adam's moments in BF16 (``recipe.optimizer_moments: bf16``) asks
    Megatron-LM for them; one with FP32 moments does not."""
    plain = _export(TP_PP).files["megatron_args.txt"].splitlines()
    bf16 = _export({**TP_PP, "recipe": {"optimizer_moments": "bf16"}}).files["megatron_args.txt"].splitlines()
    for flag in ("--use-precision-aware-optimizer", "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"):
        assert flag in bf16 and flag not in plain


def test_an_fp8_plan_exports_transformer_engines_fp8_recipe():
    """FP8 linears, FP8-stored weights and FP8 attention: ``--fp8-format hybrid``,
    ``--fp8-param-gather`` and cuDNN's fused attention backend; the two TransformerConfig fields
    Megatron-LM's command line leaves out (FP8 attention, the FP8 activation store) are named."""
    raw = {**TP_PP, "workload": {**TP_PP["workload"], "fp8": True},
           "recipe": {"kernels": "transformer_engine", "fp8_params": True, "fp8_attention": True,
                      "fp8_activation_store": True}}
    b = _export(raw)
    margs = b.files["megatron_args.txt"].splitlines()
    for arg in ("--fp8-format hybrid", "--fp8-param-gather", "--attention-backend fused"):
        assert arg in margs, arg
    assert any("fp8_dot_product_attention and activation_func_fp8_input_store" in n for n in b.notes)
    # Megatron-LM keeps FP8 weights only with its distributed optimizer: added at ZeRO-0, and said
    zero0 = _export({**raw, "layout": {**raw["layout"], "zero": 0}})
    assert "--use-distributed-optimizer" in zero0.files["megatron_args.txt"].splitlines()
    assert any("needs Megatron's distributed optimizer" in n for n in zero0.notes)
    plain = _export(TP_PP).files["megatron_args.txt"].splitlines()
    assert "--attention-backend flash" in plain and not any(a.startswith("--fp8") for a in plain)


def test_fp16_on_a_card_without_bf16():
    raw = {**QLORA, "layout": {"gpu": "t4", "gpus": 1, "checkpointing": "full", "attention": "eager"}}
    b = _export(raw)
    assert json.loads(b.files["training_args.json"])["fp16"] is True
    assert json.loads(b.files["bnb_config.json"])["bnb_4bit_compute_dtype"] == "float16"
    assert json.loads(b.files["model_kwargs.json"])["attn_implementation"] == "eager"
    assert "torchtune" in b.skipped  # torchtune has no fp16


def test_cli_exports_plan_json_and_scenario_rank(tmp_path):
    plan = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--method", "lora", "--global-batch", "16",
                               "--gpu-types", "a100-80gb", "--profile", "seed", "--top", "2", "--json"])
    assert plan.exit_code == 0, plan.output
    (tmp_path / "plan.json").write_text(plan.output)
    plans = json.loads(plan.output)["plans"]
    res = runner.invoke(app, ["export", str(tmp_path / "plan.json"), "--rank", "2", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    ds = json.loads((tmp_path / "o" / "ds_config.json").read_text())
    assert ds["train_micro_batch_size_per_gpu"] == plans[1]["micro_batch"]
    assert ds["zero_optimization"]["stage"] == plans[1]["zero"]
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump(QLORA))
    res = runner.invoke(app, ["export", str(scen), "--json", "--format", "hf"])
    assert res.exit_code == 0, res.output
    files = json.loads(res.output)["files"]
    assert set(files) >= {"training_args.json", "lora_config.json", "bnb_config.json", "PLAN.md"}
    assert "sky_task.yaml" not in files and "megatron_args.txt" not in files
    uses_ds = "deepspeed" in json.loads(files["training_args.json"])
    assert ("ds_config.json" in files) == uses_ds


def test_plan_json_without_pinned_scenario_still_exports(tmp_path):
    plan = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--method", "qlora", "--global-batch", "8",
                               "--profile", "seed", "--top", "1", "--json"])
    data = json.loads(plan.output)
    data["plans"][0].pop("pinned_scenario", None)
    (tmp_path / "p.json").write_text(json.dumps(data))
    res = runner.invoke(app, ["export", str(tmp_path / "p.json"), "--json"])
    assert res.exit_code == 0, res.output
    args = json.loads(json.loads(res.output)["files"]["training_args.json"])
    assert args["gradient_accumulation_steps"] == data["plans"][0]["grad_accum"]


def test_bad_export_input_is_one_line_per_problem(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"plans": [], "status": "infeasible"}))
    res = runner.invoke(app, ["export", str(tmp_path / "p.json")])
    assert res.exit_code == 2 and "no feasible plan" in res.output
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump(QLORA))
    res = runner.invoke(app, ["export", str(scen), "--rank", "9"])
    assert res.exit_code == 2 and "rank: 9" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["export", str(scen), "--format", "deepspeed,slurm"])
    assert res.exit_code == 2 and "format: 'slurm'" in res.output
    res = runner.invoke(app, ["export", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "no such file" in res.output


@pytest.mark.parametrize("name, content, field", [
    ("bin.json", bytes(range(200, 256)) * 4, "not a UTF-8 text file"),
    ("p1.json", b'{"plans": "abc"}', "plans: must be a list of plans"),
    ("p2.json", b'{"plans": [null]}', "plans: must be a list of plans"),
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, "nest"),  # our depth limit, or PyYAML's own
])
def test_an_export_source_that_is_no_plan_is_one_line_exit_2(tmp_path, name, content, field):
    """A binary file, a plan list that is not a list of plans, or JSON nested 100,000 deep were
    exit 3 (UnicodeDecodeError, AttributeError, RecursionError); the source is now read within the
    scenario loader's limits."""
    src = tmp_path / name
    src.write_bytes(content)
    out = CliRunner().invoke(app, ["export", str(src), "--out", str(tmp_path / "launch")])
    assert out.exit_code == 2, out.output
    assert field in one_line(out.output), out.output


def test_export_to_a_file_is_refused_before_any_work(tmp_path):
    target = tmp_path / "taken.txt"
    target.write_text("x")
    out = CliRunner().invoke(app, ["export", str(ROOT / "scenarios" / "case-b-7b-full-zero3-plan.yaml"),
                                   "--out", str(target)])
    assert out.exit_code == 2 and "--out:" in out.output and "is a file" in out.output
    assert target.read_text() == "x"
