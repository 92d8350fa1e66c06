"""Training recipes: Hugging Face Trainer + PEFT + bitsandbytes, torchtune, Megatron-LM."""

from __future__ import annotations

import shlex

from planner.core.codes import FSDP_STRATEGY_OF_STAGE, PEFT_MODULES
from planner.launch.exporters.common import Bundle, Ctx


def hf_files(ctx: Ctx, out: Bundle, ds_file: str | None) -> dict[str, dict]:
    """TrainingArguments, from_pretrained kwargs, LoraConfig and BitsAndBytesConfig (name -> JSON)."""
    fmt = "hf"
    wl, lay = ctx.wl, ctx.lay
    if wl.method == "inference":
        out.skipped[fmt] = "an inference plan has no TrainingArguments"
        return {}
    if lay.tp > 1 or lay.pp > 1 or lay.cp > 1:
        out.skipped[fmt] = (f"the Trainer has no tensor/pipeline/context parallelism of its own "
                            f"(tp={lay.tp} pp={lay.pp} cp={lay.cp}); use the Megatron-LM arguments")
        return {}
    args: dict = {
        "per_device_train_batch_size": wl.micro_batch,
        "gradient_accumulation_steps": ctx.grad_accum,
        "bf16": ctx.half == "bf16",
        "fp16": ctx.half == "fp16",
        "gradient_checkpointing": lay.checkpointing == "full",
    }
    if wl.optimizer == "muon":
        out.need(fmt, "a Muon optimizer for the Trainer (Trainer(optimizers=(optimizer, None)) with "
                      "torch.optim.Muon on the 2-D hidden weights and torch.optim.AdamW on embeddings, "
                      "head, norms and biases): TrainingArguments has no optim for Muon")
    else:
        args["optim"] = ctx.hf_optim
    if wl.eval_micro_batch:
        # the plan sized an evaluation phase at this batch; how often and on what data is the user's
        args["eval_strategy"] = "steps"
        args["per_device_eval_batch_size"] = wl.eval_micro_batch
        out.need(fmt, "eval_steps in training_args.json and an eval dataset (the plan evaluates at "
                      f"per_device_eval_batch_size {wl.eval_micro_batch})")
    if lay.checkpointing == "selective":
        out.note(fmt, "the Trainer has no selective recomputation: gradient_checkpointing is off, "
                      "enable it in the model code if it supports selective recompute")
    if ctx.backend == "deepspeed":
        if ds_file is None:
            out.skipped[fmt] = "ZeRO needs the DeepSpeed config, which was not written"
            return {}
        args["deepspeed"] = ds_file
    elif ctx.backend == "fsdp":
        # the same sharding as accelerate_config.yaml (the Trainer's option is the strategy's name,
        # lower-case); `accelerate launch` with it, or torchrun
        args["fsdp"] = " ".join([FSDP_STRATEGY_OF_STAGE[lay.zero].lower(), "auto_wrap",
                                 *(["offload"] if lay.offload != "none" else [])])
        if lay.checkpointing == "full":  # FSDP's own; the Trainer refuses both at once
            args["gradient_checkpointing"] = False
            args["fsdp_config"] = {"activation_checkpointing": True}
    files = {"training_args.json": args}
    if wl.algorithm == "dpo":
        dpo = dpo_config(ctx, out, args)
        if dpo is not None:
            files = {"dpo_config.json": dpo}
    elif wl.algorithm == "grpo":
        files = {"grpo_config.json": grpo_config(ctx, out, args)}
    out.need(fmt, f"output_dir, learning_rate, num_train_epochs or max_steps in {next(iter(files))}")

    kwargs: dict = {"attn_implementation": ctx.hf_attention}
    if ctx.needs_fa2 and not ctx.has_fa2:
        out.note(fmt, f"{ctx.model.id} soft-caps its attention logits, which SDPA cannot do and "
                      f"FlashAttention-2 does not run on {ctx.gpu.name}: transformers may fall back "
                      "to eager attention, which needs more memory than planned")
    if ctx.model.hf_repo:
        kwargs = {"pretrained_model_name_or_path": ctx.model.hf_repo, **kwargs}
    else:
        out.need(fmt, "pretrained_model_name_or_path in model_kwargs.json (the plan's model has no "
                      "Hugging Face repository in the catalog)")
    if wl.method == "full":
        kwargs["dtype"] = "bfloat16" if wl.precision == "bf16" else "float32"
    else:
        kwargs["dtype"] = ctx.torch_dtype  # the frozen base in the compute dtype
    if wl.method == "qlora":
        bnb = bnb_config(ctx, out)
        if bnb is not None:
            files["bnb_config.json"] = bnb
    files["model_kwargs.json"] = kwargs
    if ctx.lora:
        files["lora_config.json"] = lora_config(ctx, out)
    return files


def dpo_config(ctx: Ctx, out: Bundle, args: dict) -> dict | None:
    """TRL's DPOConfig (TrainingArguments and the preference keys) for a DPO plan: a pair is one
    example, so the batch sizes count pairs as the plan's do; ``max_length`` caps each sequence
    (prompt and completion) at the plan's sequence length. LoRA and QLoRA name no reference model:
    DPOTrainer with a ``peft_config`` takes the base with the adapters disabled as the reference,
    which is what the plan sized. A reference-free plan (ORPO, SimPO) is TRL's ORPOTrainer or
    CPOTrainer, whose configs take the same TrainingArguments (``training_args.json``)."""
    wl = ctx.wl
    if wl.reference == "none":
        out.note("hf", "a reference-free plan (ORPO, SimPO) runs on TRL's ORPOTrainer or CPOTrainer "
                       "(loss_type='simpo'): pass training_args.json to ORPOConfig or CPOConfig")
        return None
    out.need("hf", "beta in dpo_config.json (TRL's default is 0.1); the dataset's prompt, chosen "
                   "and rejected columns")
    return {**args, "max_length": wl.seq_len, "precompute_ref_log_probs": wl.reference == "precomputed",
            "padding_free": False}


#: The KL coefficient written where a GRPO plan keeps a reference model (any value above 0 loads
#: it; 0.04 was TRL's default before it became 0).
GRPO_BETA_WITH_REFERENCE = 0.04


def grpo_config(ctx: Ctx, out: Bundle, args: dict) -> dict:
    """TRL's GRPOConfig for a GRPO plan: the batch sizes count completions as the plan's do (one
    generation batch per optimizer step, TRL's default ``steps_per_generation``), the group size,
    the prompt and completion caps, ``beta`` 0 unless the plan keeps a reference model, and the
    vLLM engine where the plan put it (colocated: an engine per ``vllm_tensor_parallel_size``
    training GPUs at ``vllm_gpu_memory_utilization``; server: ``trl vllm-serve`` on GPUs of its
    own)."""
    wl, lay = ctx.wl, ctx.lay
    beta = 0.0 if wl.reference == "none" else GRPO_BETA_WITH_REFERENCE
    if beta:
        out.need("hf", f"beta in grpo_config.json ({beta} written: any value above 0 loads the reference "
                       "model the plan sized)")
    out.need("hf", f"reward_funcs for GRPOTrainer, and the dataset's prompt column (prompts of at most "
                   f"{wl.prompt_len} tokens, as planned: GRPOConfig has no prompt cap)")
    config = {**args, "num_generations": wl.num_generations, "max_completion_length": wl.completion_len,
              "beta": beta, "use_vllm": True,
              "vllm_mode": "server" if lay.generation_gpus else "colocate",
              "vllm_gpu_memory_utilization": lay.engine_memory_fraction,
              "vllm_tensor_parallel_size": lay.generation_tp}
    if not lay.generation_gpus:  # the engine asleep while the step trains, as the plan fitted it
        config["vllm_enable_sleep_mode"] = ctx.rs.recipe.generation_sleep
        if ctx.rs.recipe.rollout_offload:
            out.note("hf", "the plan moves the trainer's states to host memory while the engine generates "
                           "(recipe.rollout_offload), which GRPOTrainer does not do: it needs more memory there")
    if lay.generation_gpus:
        out.note("hf", f"start the engine on the {lay.generation_gpus} generation GPUs first: trl vllm-serve "
                       f"--model <model> --tensor-parallel-size {lay.generation_tp} "
                       f"--gpu-memory-utilization {lay.engine_memory_fraction}")
    return config


def lora_target_modules(ctx: Ctx, out: Bundle, fmt: str) -> str | list[str]:
    """PEFT's ``target_modules`` for the plan's LoRA targets: ``all-linear``, or the modules' names
    (Llama's: a note for ``fmt`` where the model family may name them otherwise)."""
    wl = ctx.wl
    targets = [t for t in wl.lora_targets if t != "lm_head"]
    extra = ["lm_head"] if "lm_head" in wl.lora_targets else []
    if ctx.all_targets and not extra:
        return "all-linear"
    if ctx.model.family not in (None, "llama", "mistral", "qwen", "gemma"):
        out.note(fmt, f"target_modules use Llama names; check them against {ctx.model.id}'s modules")
    return [PEFT_MODULES[t] for t in ctx.targets if t in targets or ctx.all_targets] + extra


def lora_config(ctx: Ctx, out: Bundle) -> dict:
    wl = ctx.wl
    modules = lora_target_modules(ctx, out, "hf")
    cfg: dict = {"r": wl.lora_rank, "target_modules": modules, "task_type": "CAUSAL_LM",
                 "lora_dropout": ctx.detail("lora_dropout", 0.0)}
    if wl.modules_to_save:
        cfg["modules_to_save"] = list(wl.modules_to_save)
        if ctx.model.family not in (None, "llama", "mistral", "qwen", "gemma"):
            out.note("hf", f"modules_to_save uses Llama names; check them against {ctx.model.id}'s modules")
    if wl.lora_alpha is not None:
        cfg["lora_alpha"] = wl.lora_alpha
    else:
        out.need("hf", "lora_alpha in lora_config.json (the plan did not set it; PEFT's default is 8)")
    return cfg


def bnb_config(ctx: Ctx, out: Bundle) -> dict | None:
    wl = ctx.wl
    quant = ctx.detail("quant_type", "nf4")
    if quant != "nf4":
        out.note("hf", f"the plan's 4-bit base is {quant}, not bitsandbytes: no BitsAndBytesConfig")
        return None
    if wl.quant_bits == 8:
        return {"load_in_8bit": True}
    cfg = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
           "bnb_4bit_use_double_quant": wl.double_quant, "bnb_4bit_compute_dtype": ctx.torch_dtype}
    if ctx.backend == "fsdp" or ctx.lay.zero == 3:
        # FSDP flattens (and ZeRO-3 partitions) parameters of one dtype: the packed 4-bit weights
        # are stored in the compute dtype so that they flatten with the rest
        cfg["bnb_4bit_quant_storage"] = ctx.torch_dtype
    return cfg


TORCHTUNE_OPTIMIZERS = {"adamw": "torch.optim.AdamW", "adam8bit": "bitsandbytes.optim.AdamW8bit",
                        "paged_adamw8bit": "bitsandbytes.optim.PagedAdamW8bit", "sgd": "torch.optim.SGD",
                        "adafactor": "transformers.optimization.Adafactor",
                        "lion": "bitsandbytes.optim.Lion32bit"}
TORCHTUNE_ATTN = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "output_proj"}


def torchtune_override(ctx: Ctx, out: Bundle) -> tuple[dict, str] | None:
    """A torchtune config override and the ``tune run`` command, or None (reason in skipped)."""
    fmt = "torchtune"
    wl, lay = ctx.wl, ctx.lay
    reason = _torchtune_unsupported(ctx)
    if reason is not None:
        out.skipped[fmt] = reason
        return None
    cfg: dict = {
        "batch_size": wl.micro_batch,
        "gradient_accumulation_steps": ctx.grad_accum,
        "dtype": "fp32" if ctx.half is None else "bf16",
        "enable_activation_checkpointing": lay.checkpointing == "full",
        "enable_activation_offloading": bool(ctx.detail("activation_offload", False)),
        "tokenizer": {"max_seq_len": wl.seq_len},
        "optimizer": {"_component_": TORCHTUNE_OPTIMIZERS[wl.optimizer]},
    }
    if not ctx.lora:
        _torchtune_optimizer_in_bwd(ctx, out, cfg)
    if wl.precision == "mixed":
        out.note(fmt, "torchtune's dtype bf16 keeps no FP32 master copy: it needs less memory than "
                      "the plan's mixed precision")
    distributed = lay.gpus > 1
    _torchtune_sharding(ctx, out, cfg, distributed)
    if ctx.lora:
        cfg["model"] = _torchtune_lora_model(ctx, out)
    return cfg, _torchtune_command(ctx, out, cfg, distributed)


def _torchtune_unsupported(ctx: Ctx) -> str | None:
    """Why torchtune cannot run the plan, or None."""
    wl, lay = ctx.wl, ctx.lay
    if wl.method == "inference":
        return "an inference plan has no torchtune training recipe"
    if ctx.half == "fp16":
        return "torchtune trains in bf16 or fp32 only; the plan needs FP16 (no BF16 on this GPU)"
    if lay.pp > 1 or lay.cp > 1:
        return f"torchtune's recipes have no pipeline/context parallelism (pp={lay.pp} cp={lay.cp})"
    if lay.tp > 1 and ctx.lora:
        return "torchtune's LoRA recipes have no tensor parallelism"
    if wl.optimizer == "muon":
        return ("torchtune's recipes build one optimizer over every parameter; Muon steps only 2-D "
                "hidden weights (torch.optim.Muon refuses the rest) and needs AdamW beside it")
    return None


def _torchtune_optimizer_in_bwd(ctx: Ctx, out: Bundle, cfg: dict) -> None:
    """``optimizer_in_bwd`` of a full fine-tune."""
    # torchtune refuses optimizer_in_bwd with gradient accumulation; base configs turn it on
    in_bwd = ctx.grad_accum == 1 and ctx.detail("optimizer_step", "foreach") == "in_backward"
    cfg["optimizer_in_bwd"] = in_bwd
    if ctx.grad_accum > 1:
        out.note("torchtune", f"optimizer_in_bwd is off: torchtune refuses it with gradient accumulation "
                              f"({ctx.grad_accum} steps)")


def _torchtune_sharding(ctx: Ctx, out: Bundle, cfg: dict, distributed: bool) -> None:
    """FSDP2 offload and tensor parallelism of the distributed recipes; what the plan loses."""
    lay = ctx.lay
    if distributed:
        cfg["fsdp_cpu_offload"] = lay.offload != "none"
        if lay.zero < 3:
            out.note("torchtune", f"torchtune's distributed recipes shard fully (FSDP2): ZeRO {lay.zero} "
                                  "becomes full sharding, no more memory than planned")
        if lay.tp > 1:
            cfg["tensor_parallel_dim"] = lay.tp
    elif lay.offload != "none":
        out.note("torchtune", "single-device recipes offload nothing: the plan's offload has no equivalent")


def _torchtune_lora_model(ctx: Ctx, out: Bundle) -> dict:
    """The ``model`` overrides of a LoRA recipe: adapted modules, rank and alpha."""
    fmt = "torchtune"
    wl = ctx.wl
    attn = [TORCHTUNE_ATTN[t] for t in ctx.targets if t in TORCHTUNE_ATTN]
    mlp = {t for t in ctx.targets if t in ("gate", "up", "down")}
    if mlp and mlp != {"gate", "up", "down"}:
        out.note(fmt, "torchtune adapts the whole MLP or none of it: apply_lora_to_mlp is on")
    model = {"lora_attn_modules": attn, "apply_lora_to_mlp": bool(mlp),
             "apply_lora_to_output": "lm_head" in wl.lora_targets, "lora_rank": wl.lora_rank}
    if wl.lora_alpha is not None:
        model["lora_alpha"] = wl.lora_alpha
    else:
        out.need(fmt, "model.lora_alpha (the plan did not set it)")
    if wl.modules_to_save:
        out.need(fmt, f"a way to train {', '.join(wl.modules_to_save)} in full: torchtune's LoRA "
                      "builders train the adapters only")
    if wl.method == "qlora":
        out.need(fmt, "model._component_: the qlora_* builder of your model (e.g. "
                      "torchtune.models.llama3_1.qlora_llama3_1_8b)")
    return model


def _torchtune_command(ctx: Ctx, out: Bundle, cfg: dict, distributed: bool) -> str:
    """The ``tune run`` command of the recipe, with ``cfg`` as overrides of the user's base config."""
    recipe = ("lora" if ctx.lora else "full") + "_finetune_" + ("distributed" if distributed else "single_device")
    head = ["tune", "run"]
    if distributed:
        head += [f"--nnodes={ctx.nodes}", f"--nproc_per_node={ctx.per_node or ctx.lay.gpus}"]
    # One --config (a second would replace the first): the plan's settings as key=value overrides
    command = " \\\n    ".join([" ".join([*head, recipe, "--config", '"${BASE_CONFIG}"']),
                                 *(shlex.quote(o) for o in torchtune_cli_overrides(cfg))])
    out.need("torchtune", f"BASE_CONFIG: the {recipe} config of your model (tune ls), which holds the "
                          "checkpointer, dataset and learning rate")
    return command


def torchtune_cli_overrides(cfg: dict, prefix: str = "") -> list[str]:
    """``{"tokenizer": {"max_seq_len": 1024}}`` -> ``["tokenizer.max_seq_len=1024"]``: the
    key=value overrides ``tune run`` merges over its one ``--config`` (OmegaConf dot-list)."""
    items: list[str] = []
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            items += torchtune_cli_overrides(value, name + ".")
        elif isinstance(value, list):
            items.append(f"{name}=[{','.join(_tt_scalar(v) for v in value)}]")
        else:
            items.append(f"{name}={_tt_scalar(value)}")
    return items


def _tt_scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def megatron_args(ctx: Ctx, out: Bundle) -> list[str] | None:
    fmt = "megatron"
    wl, lay, m = ctx.wl, ctx.lay, ctx.model
    if wl.method != "full":
        out.skipped[fmt] = f"Megatron-LM trains full models only (the plan's method is {wl.method})"
        return None
    args = [
        f"--tensor-model-parallel-size {lay.tp}",
        f"--pipeline-model-parallel-size {lay.pp}",
        f"--context-parallel-size {lay.cp}",
        f"--micro-batch-size {wl.micro_batch}",
        f"--global-batch-size {ctx.global_batch}",
        f"--seq-length {wl.seq_len}",
    ]
    if lay.ep > 1:
        args.append(f"--expert-model-parallel-size {lay.ep}")
    if lay.etp is not None:
        args.append(f"--expert-tensor-parallel-size {lay.etp}")
    if lay.ep > 1 and ctx.rs.recipe.ep_overlap:
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    vpp = ctx.detail("pp_virtual_stages", 1)
    if lay.pp > 1 and vpp > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {m.layers // (lay.pp * vpp)}")
    if lay.sp:
        args.append("--sequence-parallel")
    args.append({"bf16": "--bf16", "fp16": "--fp16", None: ""}[ctx.half])
    if ctx.half == "bf16" and ctx.rs.recipe.grad_dtype == "param":
        # the plan counts 16-bit gradient buffers: Megatron's bf16 default is FP32 ones
        # (accumulate_allreduce_grads_in_fp32), turned off by this flag
        args.append("--grad-reduce-in-bf16")
    if lay.checkpointing == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    elif lay.checkpointing == "selective":
        args.append("--recompute-granularity selective")
    if lay.zero >= 1:
        args.append("--use-distributed-optimizer")
        if lay.zero > 1:
            out.note(fmt, f"Megatron's distributed optimizer shards optimizer states and master "
                          f"weights (ZeRO-1); the plan's ZeRO-{lay.zero} sharding of "
                          f"{'gradients' if lay.zero == 2 else 'gradients and weights'} needs "
                          "--use-torch-fsdp2 instead")
    rec = ctx.rs.recipe
    if lay.offload != "none" or rec.optimizer_moments == "bf16":
        args.append("--use-precision-aware-optimizer")
    if lay.offload != "none":
        args.append("--optimizer-cpu-offload")
    if rec.optimizer_moments == "bf16":
        args += ["--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"]
    if lay.attention == "flash":
        # FP8 attention runs in cuDNN's fused attention (Transformer Engine's FusedAttention)
        args.append("--attention-backend fused" if wl.fp8 and rec.fp8_attention else "--attention-backend flash")
    if wl.fp8:
        args.append("--fp8-format hybrid")  # TransformerConfig.fp8 (e4m3 forward, e5m2 gradients)
        if rec.fp8_params:
            args.append("--fp8-param-gather")  # weights kept in FP8 (fp8_param)
            if lay.zero == 0:  # Megatron-LM keeps FP8 weights only with its distributed optimizer
                args.append("--use-distributed-optimizer")
                out.note(fmt, "--fp8-param-gather needs Megatron's distributed optimizer: added; it shards "
                              "the optimizer states (ZeRO-1), so the plan's ZeRO-0 memory is an upper bound")
        config_only = [name for name, on in (("fp8_dot_product_attention", rec.fp8_attention),
                                             ("activation_func_fp8_input_store", rec.fp8_activation_store)) if on]
        if config_only:
            out.note(fmt, f"the plan's memory assumes {' and '.join(config_only)}: TransformerConfig fields "
                          "Megatron-LM's command line leaves out; set them in the model's config (NeMo takes both)")
    if wl.optimizer != "adamw":
        if wl.optimizer == "sgd":
            args.append("--optimizer sgd")
        elif wl.optimizer == "muon":
            out.note(fmt, "Muon is Megatron-Core's layer-wise distributed optimizer where the version "
                          "has it (not an argument of every Megatron-LM): the arguments keep its Adam")
        else:
            out.note(fmt, f"Megatron-LM has no {wl.optimizer}: the arguments keep its Adam")
    args += _megatron_model(ctx, out)
    out.need(fmt, "--lr, --train-iters, --data-path, --tokenizer-type/--tokenizer-model, --save/--load")
    return [a for a in args if a]


def _megatron_model(ctx: Ctx, out: Bundle) -> list[str]:
    m = ctx.model
    args = [f"--num-layers {m.layers}", f"--hidden-size {m.hidden}"]
    if m.heads is None or m.ffn is None:
        out.need("megatron", "--num-attention-heads and --ffn-hidden-size (the plan's model gives "
                             "only its size)")
        return args
    args += [f"--num-attention-heads {m.heads}", f"--ffn-hidden-size {m.ffn}"]
    if m.kv_heads_eff != m.heads:
        args += ["--group-query-attention", f"--num-query-groups {m.kv_heads_eff}"]
    if m.head_dim is not None and m.head_dim * m.heads != m.hidden:
        args.append(f"--kv-channels {m.head_dim}")
    if m.gated_mlp:
        args.append("--swiglu")
    args.append("--normalization " + ("RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"))
    if m.position == "rope":
        args.append("--position-embedding-type rope")
    if m.max_position:
        args.append(f"--max-position-embeddings {m.max_position}")
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if m.qkv_bias:
        args.append("--add-qkv-bias")
    if not (m.qkv_bias or m.o_bias or m.mlp_bias):
        args.append("--disable-bias-linear")
    if m.moe is not None:
        args += [f"--num-experts {m.moe.experts}", f"--moe-router-topk {m.moe.active}"]
    return args
