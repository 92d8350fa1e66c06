"""A torchtune recipe config: the model builder (method, catalog model, QLoRA base), LoRA, batch,
dtype, checkpointing, optimizer and loss, and the sharding of the recipe its header names (FSDP2 on
a distributed recipe, none on a single device)."""

from __future__ import annotations

import re

from planner import catalog
from planner.catalog.store import UnknownName
from planner.launch.importers.common import bad_optimizer, count, is_int, is_true, scenario_fields
from planner.launch.importers.found import Found
from planner.launch.importers.peft import read_lora, read_targets

TT_OPTIM = {"AdamW": "adamw", "Adam": "adamw", "AdamW8bit": "adam8bit", "PagedAdamW8bit": "paged_adamw8bit",
            "SGD": "sgd", "PagedAdamW": "adamw", "PagedAdamW32bit": "adamw", "Adafactor": "adafactor",
            "Lion32bit": "lion", "Lion": "lion"}
#: torchtune's losses: the chunked cross-entropy over whole logits, and the one that runs the head per
#: chunk of tokens (memory/logits.py: ``chunked_head``).
TT_LOSS = {"CEWithChunkedOutputLoss": "chunked", "LinearCrossEntropyLoss": "chunked_head",
           "CrossEntropyLoss": "standard"}
#: torchtune keys that leave memory per GPU alone, and tuning the planner does not model.
TT_IGNORED = (
    "output_dir", "checkpointer", "resume_from_checkpoint", "save_adapter_weights_only", "dataset",
    "dataset_val", "run_val_every_n_steps", "batch_size_val", "seed", "shuffle", "epochs",
    "max_steps_per_epoch", "clip_grad_norm", "metric_logger", "log_every_n_steps", "log_peak_memory_stats",
    "log_level", "profiler", "lr_scheduler", "device", "optimizer.lr", "optimizer.weight_decay",
    "optimizer.betas", "optimizer.eps", "optimizer.momentum", "optimizer.amsgrad", "optimizer.optimizer_kwargs",
    "tokenizer._component_", "tokenizer.path", "tokenizer.merges_file", "tokenizer.prompt_template",
    "tokenizer.special_tokens_path", "tokenizer.truncation_type", "tokenizer.image_size", "tokenizer.max_num_tiles",
    "tokenizer.patch_size", "tokenizer.tile_size", "loss.num_output_chunks", "collate_fn", "inference",
    "tensor_parallel_plan", "data_parallel_shard_dim", "save_every_n_steps", "keep_last_n_checkpoints",
    "quantizer.groupsize", "tokenizer.vocab_path", "tokenizer.tokenizer_json_path",
    "tokenizer.merges_path", "tokenizer.vocab_file", "model.image_size", "tokenizer.max_image_tokens",
    "model.tile_size", "model.patch_size", "model.max_num_tiles", "model.decoder_trainable",
    "model.encoder_trainable", "model.fusion_trainable", "low_cpu_ram",
)
TT_TUNING = (
    "custom_sharded_layers", "optimizer.fused", "optimizer.foreach", "activation_offloading_use_streams",
    "loss.ignore_index", "loss.tp_enabled", "fsdp.fsdp_sharding_strategy",
)


def torchtune_model_name(component: str) -> tuple[str | None, list[str]]:
    """``torchtune.models.llama3_1.qlora_llama3_1_8b`` -> (``qlora``, name candidates)."""
    builder = component.rsplit(".", 1)[-1]
    method = None
    for prefix in ("qlora_", "lora_"):
        if builder.startswith(prefix):
            method, builder = prefix[:-1], builder[len(prefix):]
    return method, [re.sub(r"(\d)_(\d)", r"\1.\2", builder), builder]


TUNE_RECIPE = re.compile(r"\b([a-z0-9_]+_(?:distributed|single_device))(?:\.py)?\b")


def torchtune_launch(text: str, stem: str) -> tuple[str | None, int | None, str]:
    """The recipe a torchtune config's header comment names (``tune run --nproc_per_node 4
    full_finetune_distributed --config …``): distributed or single-device, and its process count."""
    header = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    recipes = TUNE_RECIPE.findall(header)
    kind = None
    if recipes:
        kind = "distributed" if any(r.endswith("distributed") for r in recipes) else "single_device"
    elif stem.endswith("single_device"):
        kind = "single_device"
    nproc = re.search(r"--nproc[_-]per[_-]node[ =](\d+)", header)
    nnodes = re.search(r"--nnodes[ =](\d+)", header)
    gpus = int(nproc.group(1)) * (int(nnodes.group(1)) if nnodes else 1) if nproc else None
    return kind, gpus, (recipes[0] if recipes else stem)


def read_torchtune(cfg: dict, f: Found, where: str, text: str = "", stem: str = "") -> None:
    model = cfg.get("model") or {}
    method = _read_tt_model(model, f, where)
    if method:
        _read_tt_lora(model, f, where)
    f.take(cfg, "batch_size", "micro_batch", 1, where, "torchtune")
    f.take(cfg, "gradient_accumulation_steps", "grad_accum", 1, where, "torchtune")
    dtype = str(cfg.get("dtype", "bf16"))
    f.set("precision", "fp32" if dtype == "fp32" else "bf16", where + ".dtype")
    if dtype != "fp32":
        f.facts["asks_bf16"] = where + ".dtype"
    f.set("checkpointing", "full" if is_true(cfg.get("enable_activation_checkpointing")) else "none",
          where + ".enable_activation_checkpointing")
    if is_true(cfg.get("enable_activation_offloading")):
        f.set("activation_offload", True, where + ".enable_activation_offloading")
    f.set("attention", "flash", where + " (torchtune uses SDPA)")
    _read_tt_optimizer(cfg, f, where)
    if is_true(cfg.get("compile")):
        f.set("compile", True, where + ".compile")
    _read_tt_loss(cfg, f, where)
    tokenizer = cfg.get("tokenizer")
    seq = count(tokenizer, "max_seq_len", f, where + ".tokenizer") if isinstance(tokenizer, dict) else None
    if seq is not None:
        f.set("seq_len", seq, where + ".tokenizer.max_seq_len")
    for key in ("teacher_model", "ref_policy_model", "reward_and_value_model", "ref_model", "quantizer"):
        if cfg.get(key):
            f.warn(f"{where}.{key}", "a second model or a quantizer beside the one trained is not "
                   "modelled (errs low)" if key != "quantizer" else
                   "quantization-aware training's fake-quantized weights and activations are not modelled")
    _read_tt_sharding(cfg, f, where, text, stem)


def _read_tt_model(model: dict, f: Found, where: str) -> str | None:
    """The model builder (``model._component_``): the method, the catalog's model, a QLoRA base.
    Returns the adapter method (None for a full fine-tune)."""
    method, names = torchtune_model_name(str(model.get("_component_", "")))
    if method and is_true(model.get("quantize_base")):
        method = "qlora"
    f.set("method", method or "full", where + ".model._component_")
    for name in names:
        try:
            f.set("model", catalog.get_model(name).id, where + ".model._component_")
            break
        except UnknownName:
            continue
    else:
        f.notes.append(f"{where}.model._component_: {model.get('_component_')!r} is not a model the "
                       "planner knows; give --model")
    if method == "qlora":
        f.set("quant_type", "torchao-nf4", where + ".model._component_")
        f.set("quant_bits", 4, where + ".model._component_")
    return method


def _read_tt_lora(model: dict, f: Found, where: str) -> None:
    """A LoRA builder's rank, alpha, dropout and the modules it adapts (attention, MLP, output)."""
    read_lora({"r": model.get("lora_rank"), "lora_alpha": model.get("lora_alpha"), "target_modules": [],
               "lora_dropout": model.get("lora_dropout")}, f, where + ".model", scenario_fields())
    f.where["lora_rank"] = where + ".model.lora_rank"
    mods = list(model.get("lora_attn_modules") or [])
    mods += ["gate_proj", "up_proj", "down_proj"] if is_true(model.get("apply_lora_to_mlp")) else []
    mods += ["lm_head"] if is_true(model.get("apply_lora_to_output")) else []
    read_targets(mods, f, where + ".model.lora_attn_modules")
    if is_true(model.get("use_dora")):
        f.warn(where + ".model.use_dora", "DoRA's magnitude vectors and its extra activations are not "
               "modelled; read as LoRA (errs low)")


def _read_tt_optimizer(cfg: dict, f: Found, where: str) -> None:
    """``optimizer._component_`` (paged or not), and the optimizer stepped in backward."""
    opt = cfg.get("optimizer") or {}
    comp = str(opt.get("_component_", "")).rsplit(".", 1)[-1]
    if comp in TT_OPTIM:
        f.set("optimizer", TT_OPTIM[comp], where + ".optimizer._component_")
        if comp in ("PagedAdamW", "PagedAdamW32bit"):
            f.set("optimizer_paged", True, where + ".optimizer._component_")
    elif opt:
        bad_optimizer(f, where + ".optimizer._component_", opt.get("_component_"), "AdamW, 8-bit or paged AdamW, SGD")
    if is_true(cfg.get("optimizer_in_bwd")):
        f.set("optimizer_step", "in_backward", where + ".optimizer_in_bwd")


def _read_tt_loss(cfg: dict, f: Found, where: str) -> None:
    """``loss._component_``: the standard, chunked or fused cross-entropy; any other is warned about."""
    loss = cfg.get("loss") or {}
    lname = str(loss.get("_component_", "")).rsplit(".", 1)[-1]
    if lname in TT_LOSS:
        f.set("loss", TT_LOSS[lname], where + ".loss._component_")
    elif lname:
        cfg.whole("loss")
        f.warn(where + ".loss._component_", f"{lname}: a loss the planner does not model"
               + ("; preference training (a reference model, chosen and rejected sequences) is read as "
                  "supervised fine-tuning (errs low)" if "rlhf" in str(loss.get("_component_")) else ""))


def _read_tt_sharding(cfg: dict, f: Found, where: str, text: str, stem: str) -> None:
    """FSDP sharding and CPU offload, tensor parallelism and the GPU count of a distributed recipe;
    none on a single device."""
    # one GPU or many: the recipe the header names, else the distributed-only keys
    kind, header_gpus, recipe = torchtune_launch(text, stem)
    nested = cfg.get("fsdp") if isinstance(cfg.get("fsdp"), dict) else {}
    dist_keys = [k for k in ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "tensor_parallel_dim",
                             "data_parallel_shard_dim", "data_parallel_replicate_dim",
                             "custom_sharded_layers", "fsdp") if dict.__contains__(cfg, k)]
    if kind is None:
        kind = "distributed" if dist_keys else "single_device"
        why = f"{where}.{dist_keys[0]}" if dist_keys else f"{where} (no recipe named, no FSDP key)"
    else:
        why = f"{where} (header: {recipe})"
    offload = is_true(cfg.get("fsdp_cpu_offload")) or is_true(nested.get("cpu_offload"))
    if is_true(nested.get("cpu_offload")) and not is_true(cfg.get("fsdp_cpu_offload")):
        f.notes.append(f"{where}.fsdp.cpu_offload: the key of torchtune's FSDP2 dev recipes (before "
                       "September 2024); today's recipes read fsdp_cpu_offload")
    if kind == "distributed":
        _read_tt_distributed(cfg, f, where, why, offload, nested, header_gpus)
    else:
        f.set("zero", 0, why)
        f.set("offload", "none", why)
        if offload:
            f.warn(where + ".fsdp_cpu_offload", "set on a single-device recipe, which does not read it")


def _read_tt_distributed(cfg: dict, f: Found, where: str, why: str, offload: bool, nested: dict,
                         header_gpus: int | None) -> None:
    """A distributed recipe: FSDP2 (resharded after forward unless told not to: ZeRO-3, else 2),
    its CPU offload, the header's GPU count, tensor parallelism, and HSDP replicas (warned about)."""
    reshard = cfg.get("fsdp_reshard_after_forward", True)
    stage = 3 if is_true(reshard) else 2
    f.set("zero", stage, why)
    f.set("offload", ("optimizer+params" if stage == 3 else "optimizer") if offload else "none",
          where + (".fsdp.cpu_offload" if is_true(nested.get("cpu_offload")) else ".fsdp_cpu_offload"))
    f.set("fsdp_version", 2, why)
    if header_gpus:
        f.set("gpus", header_gpus, where + " (header: --nproc_per_node)")
        f.notes.append(f"{where}: {header_gpus} GPUs from the launch command in its header comment")
    tp = cfg.get("tensor_parallel_dim")
    if is_int(tp) and tp > 1:
        f.set("tp", tp, where + ".tensor_parallel_dim")
    rep = cfg.get("data_parallel_replicate_dim")
    if is_int(rep) and rep > 1:
        f.warn(where + ".data_parallel_replicate_dim", f"{rep}: HSDP (replicas of a sharded group): "
               "the planner shards over all data-parallel GPUs (errs low)")
