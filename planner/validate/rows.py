"""Measured-run rows (the columns of ``data/measured_calibration.csv``) -> scenario mappings.

Each row describes a real run in columns: the layout, and the recipe facts of its stack
(``framework``, ``hf_model``, ``loss_impl``, ``compile``, ``grad_accum``, ``lora_dropout``,
``adapter_dtype``, ``quant_impl``, ``double_quant``, ``kbit_prep``, ``bitsandbytes``,
``optimizer_in_bwd``, ``norm_fp32``, ``qk_norm``, ``algorithm``, ``mqa_sdpa_math``, ``zero_reduce_bucket``, ``deepspeed``,
``modules_to_save``, ``eval_batch``, ``measured_unit``; ``data/README.md`` documents each and how it was read from its source). This
module reads those columns into scenario keys. It reads no source name, date, commit or prose
``notes``, and knows no per-row figure: only architecture facts of the models (their published
configs) and what a named framework does (litgpt's modules, FSDP2 in torchtitan and torchtune).
The file and its cells are read in planner.validate.cells; the layout and what the sharding
implementation does, in planner.validate.row_layout.
"""

from __future__ import annotations

import re
from typing import Any, get_args

from planner import catalog
from planner.catalog.store import UnknownName
from planner.core.values import Kernels
from planner.validate.cells import (
    RowText,
    Unmodelable,
    cell,
    framework_of,
    no,
    num,
    text_of,
    version_of,
    yes,
)
from planner.validate.row_layout import deepspeed_zero, fsdp2, layout, sharding_recipe

#: Architecture facts the CSV columns lack, from each model's published Hugging Face config.json
#: (norm type, gated MLP, biases, tied embeddings, head size, norms per layer).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    # microsoft/phi-1_5, phi-2: parallel attention+MLP on one LayerNorm, GELU MLP, biases.
    "phi-1.5": {"norm": "layernorm", "norms_per_layer": 1, "gated_mlp": False, "qkv_bias": True,
                "o_bias": True, "mlp_bias": True, "tied_embeddings": False},
    "phi-2": {"norm": "layernorm", "norms_per_layer": 1, "gated_mlp": False, "qkv_bias": True,
              "o_bias": True, "mlp_bias": True, "tied_embeddings": False},
    # stabilityai/stablelm-base-alpha-3b: GPT-NeoX, two LayerNorms, GELU MLP, biases, untied.
    "stablelm-base-alpha-3b": {"norm": "layernorm", "gated_mlp": False, "qkv_bias": True,
                               "o_bias": True, "mlp_bias": True, "tied_embeddings": False},
    # tiiuae/falcon-7b: multi-query, one LayerNorm (parallel attention), GELU MLP, tied, no bias.
    "falcon-7b": {"norm": "layernorm", "norms_per_layer": 1, "gated_mlp": False,
                  "tied_embeddings": True},
    # google/gemma-2b, gemma-7b: GeGLU, RMSNorm, head_dim 256, tied embeddings.
    "gemma-2b": {"head_dim": 256, "tied_embeddings": True},
    "gemma-7b": {"head_dim": 256, "tied_embeddings": True},
    # Qwen/Qwen-*: RMSNorm, SwiGLU (w1, w2 branches of intermediate_size/2), QKV bias, untied.
    "qwen": {"qkv_bias": True, "tied_embeddings": False, "fused_qkv": True},
    # Megatron-LM's GPT-2 (the ZeRO-Offload tutorial's 10B model): LayerNorm, GELU MLP of 4x
    # hidden, biases, learned positions, embedding tied to the output layer.
    "gpt": {"norm": "layernorm", "gated_mlp": False, "qkv_bias": True, "o_bias": True, "mlp_bias": True,
            "tied_embeddings": True, "position": "learned"},
    # transformers' LlamaForCausalLM built from a LlamaConfig (bench/gpu_memory.py): RMSNorm,
    # SwiGLU, no biases, untied head; the dimensions come from the row's columns.
    "llama": {"tied_embeddings": False},
    # EleutherAI's GPT-NeoX family (gpt-neox-20b, pythia-*; GPTNeoXForCausalLM): two LayerNorms,
    # GELU MLP, biases, rotary positions, an untied ``embed_out``.
    "gpt-neox-20b": {"norm": "layernorm", "gated_mlp": False, "qkv_bias": True, "o_bias": True,
                     "mlp_bias": True, "tied_embeddings": False},
    # THUDM/chatglm-6b (the first ChatGLM; ChatGLM2/3 are catalog entries): GLM blocks of two
    # LayerNorms, a fused QKV and a GELU MLP, all with biases, rotary positions, and an lm_head
    # tied to the word embeddings (6.2B parameters with its 130,528-token vocabulary).
    "chatglm": {"norm": "layernorm", "gated_mlp": False, "qkv_bias": True, "o_bias": True,
                "mlp_bias": True, "tied_embeddings": True, "fused_qkv": True},
    # baichuan-inc/Baichuan-7B: LLaMA's layers with one fused ``W_pack`` QKV, untied head.
    "baichuan": {"tied_embeddings": False, "fused_qkv": True},
}
ARCHITECTURES["pythia"] = ARCHITECTURES["gpt-neox-20b"]

# llm-foundry's MPT as its throughput benchmarks build it (MPTConfig defaults: learned positions,
# biases, LayerNorm, GELU MLP of 4x hidden, tied embeddings): the GPT facts.
ARCHITECTURES["mpt"] = ARCHITECTURES["gpt"]

#: Row model names that are catalog entries under another name.
CATALOG_NAMES = {"phi-3-mini-4k": "phi-3-mini"}

#: litgpt's GPT: one fused QKV linear (``attn.qkv``) and its own ``lm_head`` even for models that
#: tie it (``convert_hf_checkpoint`` copies the embedding into ``lm_head.weight``).
LITGPT_MODEL = {"fused_qkv": True, "tied_embeddings": False, "impl": "litgpt"}
#: bitsandbytes 0.43.2 (2024-07, PR #1270) stopped keeping a 4-bit matmul's input on its autograd
#: context: a row's ``bitsandbytes`` version before it keeps the inputs (``bnb_keeps_input``).
BNB_DROPPED_MATMUL_INPUT = (0, 43, 2)
#: bitsandbytes 0.40.0 (2023-07) made the LLM.int8 matmul keep its input too
#: (``ctx.tensors = (CAt, subA, A)``, was ``(CAt, subA)``); 0.45.0 (2024-12) keeps ``CAt``, the
#: int8 copy of the input, only for a trainable weight.
BNB_INT8_KEEPS_INPUT = (0, 40, 0)
BNB_INT8_DROPPED_TRANSPOSE = (0, 45, 0)

_TARGETS = {"q": "q", "k": "k", "v": "v", "o": "o", "proj": "o", "output": "lm_head",
            "lm_head": "lm_head", "gate": "gate", "up": "up", "down": "down"}
#: Module names of fused or differently named projections -> the targets they are.
_FUSED_TARGETS = {"query_key_value": ("q", "k", "v"), "c_attn": ("q", "k", "v"), "qkv": ("q", "k", "v"),
                  "qkv_proj": ("q", "k", "v"), "gate_up_proj": ("gate", "up"),
                  # GPT-2 / GPTBigCode: ``c_proj`` names both attn.c_proj and mlp.c_proj
                  "c_proj": ("o", "down"), "c_fc": ("up",)}


def model_of(row: dict[str, str]) -> dict[str, Any]:
    """The model's architecture: the row's columns, over the catalog entry or the facts above."""
    name = row["model"].strip()
    key = name.lower()
    if not key:
        raise Unmodelable("model: empty")
    base: dict[str, Any] = {}
    try:
        entry = catalog.get_model(CATALOG_NAMES.get(key, key))
        base = entry.model_dump(exclude={"aliases", "id", "name", "hf_repo"})
        if entry.heads and entry.head_dim == entry.hidden // entry.heads:
            # a head width that is only hidden / heads follows the row's own hidden and heads
            # (a resized model named after its family: "gpt-neox-20b" at hidden 4096)
            base.pop("head_dim")
    except UnknownName:
        # the whole cell, its first word where that is a hyphenated name ("gpt-neox-20b (...)"),
        # or the family before the first hyphen ("pythia-1b-deduped", not "gpt" for GPT-NeoX)
        first = key.split()[0] if key.split() else key
        facts = (ARCHITECTURES.get(key) or (ARCHITECTURES.get(first) if "-" in first else None)
                 or ARCHITECTURES.get(key.split("-")[0]))
        if facts is None:
            raise Unmodelable(f"model {name!r}: architecture unknown beyond the CSV columns") from None
        base = dict(facts)
    for col in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_position"):
        value = num(row, col)
        if value is not None:
            base[col] = int(value)
    base.pop("params_b", None)
    base.pop("official_params_b", None)
    base["id"] = key
    if framework_of(row) == "litgpt":
        base.update(LITGPT_MODEL)
    if no(row, "qk_norm"):
        base["qk_norm"] = False  # the run's model had no per-head q/k norm (a Llama-shaped stand-in)
    if no(row, "norm_fp32"):
        base["norm_upcast"] = False  # RMSNorm computed in the input dtype (lit-gpt before PR #606)
    if yes(row, "mqa_sdpa_math"):
        base["mqa_sdpa_math"] = True  # multi-query K/V not expanded: SDPA's math path
    if yes(row, "mask_clamp"):
        base["eager_mask_clamp"] = True  # the stack's eager attention clamps with torch.max
    return base


def lora_targets(text: str) -> list[str]:
    """'q,v' or 'q_proj,v_proj' -> [q, v]; 'gate,up,down' and 'mlp(...)' -> the MLP's three;
    fused projections ('query_key_value', 'c_attn') -> q, k, v; 'all linear' / 'all-linear' /
    'all' -> all. Words in parentheses after a name only explain it."""
    text = text.lower().strip()
    if re.match(r"all\b", text) or "all linear" in text or "all-linear" in text:
        out = ["all"]
        return out + (["lm_head"] if "except lm_head" not in text and "lm_head" in text else [])
    out: list[str] = []
    if "mlp" in text:
        out += ["gate", "up", "down"]
        text = re.sub(r"mlp\([^)]*\)|mlp", "", text)
    text = re.sub(r"\(([^)]*)\)", lambda m: "" if "," not in m.group(1) else m.group(0), text)
    for part in re.split(r"[,\s()]+", text):
        names = _FUSED_TARGETS.get(part) or (_TARGETS.get(part.removesuffix("_proj")),)
        out += [n for n in names if n and n not in out]
    return out


#: ``kernels`` cells: the layer kernels a run used (Recipe.kernels); blank = standard.
KERNELS = get_args(Kernels)
#: ``loss_impl`` cells -> the workload's ``loss`` (and the names other files use for them).
LOSS_IMPLS = {"standard": "standard", "chunked": "chunked", "chunked-ce": "chunked", "fused": "fused",
              "fused-linear-ce": "fused", "held_fp32": "held_fp32", "compiled": "compiled",
              "cce": "cce", "in-forward": "in_forward", "inplace": "inplace",
              "chunked-head": "chunked_head", "linear-ce": "chunked_head",
              "chunked-head-in-forward": "chunked_head_in_forward", "rowwise": "rowwise",
              "rowwise-fp32": "rowwise_fp32", "vocab-parallel": "vocab_parallel",
              "compute-dtype": "compute_dtype", "xentropy": "xentropy"}
#: AutoAWQ's GEMM checkpoints pack int4 weights with an FP16 scale and an int4 zero point per group
#: of 128 inputs, as GPTQ does: the same bytes per weight (``awq`` reads as ``gptq``).
QUANT_IMPLS = {"bnb-nf4": "nf4", "torchao-nf4": "torchao-nf4", "gptq": "gptq", "awq": "gptq"}


#: An FP32 master copy named in a precision cell, and the same said to be absent.
FP32_MASTER = r"fp32 (?:(?!no\b|not\b)\w+ ){0,3}(?:master|main param|main weight)"
NO_FP32_MASTER = (r"\b(no|without|not)\b(?:[ -]\w+){0,2}[ -]fp32 (?:\w+ )?(?:master|main param)"
                  r"|fp32 master\w*\s*[:=]\s*(no|none|false)\b")
#: FP32 base weights named in a precision cell ("fp32 weights, bf16 autocast", Lightning's
#: bf16-mixed: "fp32 weights", "fp32 base weights frozen"): with autocast, a LoRA base kept in FP32.
FP32_BASE = r"(?<!no )(?<!not )\bfp32 (?:base )?weights\b|\bfp32 base\b"
#: A cell that says autocast was not used.
NO_AUTOCAST = r"no autocast|autocast\s*(off|disabled|false)|without autocast"
#: FP16 throughout, without autocast or an FP32 master: Lightning's ``16-true``, "fp16-true", "pure
#: fp16", FP16 weights trained with autocast off. Weights, gradients and the torch optimizer's
#: states (``zeros_like``) are all 16-bit: the pure 16-bit recipe (``bf16``), not AMP's ``fp16``.
PURE_FP16 = r"\b(?:fp)?16-true\b|\bpure (?:fp16|float16|half)\b"


#: A 16-bit dtype a precision cell names only to say it was not used ("sets neither bf16 nor
#: fp16", "no fp16 autocast", the Trainer's flags "no --bf16/--fp16").
NEGATED_DTYPE = (r"\b(?:neither|nor|no|not|without)\s+(?:\w+\s+){0,1}(?:--)?(?:bf16|fp16)\b"
                 r"(?:\s*(?:/|or|nor)\s*(?:--)?(?:bf16|fp16)\b)?")


def _precision_and_optimizer(t: RowText, row: dict[str, str]) -> dict[str, Any]:
    # Precision: FP32 master weights ("mixed") only where the row says so.
    # "fp32 master", "fp32 sharded master", "FP32 master weights", Megatron's "fp32 main params";
    # never where the cell says there is none ("no fp32 master", "without an fp32 master", "fp32
    # master: no", "no separate fp32 master")
    fp32_master = bool(re.search(FP32_MASTER, t.prec)) and not re.search(NO_FP32_MASTER, t.prec)
    # autocast over FP32 weights (HF Trainer's --bf16 on an FP32 model, "bf16 autocast, fp32
    # weights"): the optimizer steps FP32 weights, the forward computes in 16 bits; not a run
    # in FP32 throughout ("fp32 weights and compute (autocast off)")
    fp32_master = fp32_master or (re.search(r"\bautocast\b", t.prec) is not None
                                  and re.search(FP32_BASE, t.prec) is not None
                                  and not re.search(NO_AUTOCAST, t.prec)
                                  and not (t.prec.startswith(("fp32", "float32"))
                                           and not re.search(r"\b(bf16|fp16) autocast\b", t.prec)))
    # DeepSpeed's ZeRO optimizers keep FP32 partitions of the weights they train, whatever the
    # 16-bit dtype (its bf16 as its fp16 mode); FP32 training keeps them as the weights.
    deepspeed = "deepspeed" in t.opt or deepspeed_zero(row)
    stated = re.sub(NEGATED_DTYPE, "", t.prec)  # the 16-bit dtypes the cell says were used
    if fp32_master or deepspeed and t.method == "full" and not t.prec.startswith(("fp32", "float32")):
        precision = "mixed"
    elif ((re.search(r"-mixed|\bbf16 mixed\b", t.prec) or t.prec.startswith("amp_bf16"))
          and "fp16" not in stated):
        precision = "mixed"  # Lightning's "bf16-mixed", Composer's amp_bf16: FP32 weights, autocast
    elif t.prec.startswith(("fp32", "float32")) or (
            re.search(r"unquantized weights[^;]*\bfp32\b", t.prec) and "no autocast" in t.prec):
        # FP32 weights and compute; a quantized base loaded with its other weights in FP32 and run
        # without autocast computes in FP32 too (a 4-bit matmul returns its input's dtype)
        precision = "fp32"
    elif "fp16" in stated and (re.search(PURE_FP16, t.prec) or re.search(NO_AUTOCAST, t.prec)):
        precision = "bf16"  # pure FP16 keeps the same bytes as pure BF16
    elif "fp16" in stated:
        precision = "fp16"
    elif t.method != "full" and t.hf_stack and "bf16" in stated:
        precision = "mixed"  # the Trainer's bf16 runs the forward under torch.autocast
    else:
        precision = "bf16"
    out = {"precision": precision, "optimizer": _optimizer(t.opt)}
    if t.method == "lora" and precision in ("mixed", "fp16") and re.search(FP32_BASE, t.prec):
        out["base_dtype"] = "fp32"
    return out


#: Optimizers whose states the planner does not model (it models AdamW, 8-bit AdamW, SGD,
#: Adafactor without momentum, 32-bit Lion and Muon): named as a row's optimizer, before any
#: parenthesis, the row is not modelled rather than read as AdamW, whose 8 bytes per parameter
#: would stand in for Sophia's or Adam-mini's; nor are the variants of a modelled one that the
#: whole cell names (an 8-bit Lion, Adafactor with a first moment).
UNMODELLED_OPTIMIZERS = r"\b(sophia|came|adam-?mini|galore|lomo|apollo|shampoo|soap)\b"
UNMODELLED_VARIANTS = r"\blion[ _-]?8[ _-]?bit|8[ _-]?bit[ _-]?lion|\badafactor\b.*\bbeta1\s*[=:]\s*0?\.\d"


def _optimizer(opt: str) -> str:
    """The modelled optimizer a row's optimizer cell (``RowText.opt``, lower-cased) names."""
    named = opt.split("(")[0]
    found = re.search(UNMODELLED_OPTIMIZERS, named) or re.search(UNMODELLED_VARIANTS, opt)
    if found:
        raise Unmodelable(f"optimizer {found.group(0)!r}: the planner models AdamW, 8-bit AdamW, SGD, "
                          "Adafactor without momentum, 32-bit Lion and Muon")
    for name in ("adafactor", "lion", "muon"):
        if re.search(rf"\b{name}\b", named):
            return name
    if "8bit" in opt or "8-bit" in opt:
        return "adam8bit"
    return "sgd" if re.match(r"\s*sgd\b", named) else "adamw"


#: Adam's moments stated in BF16 in an optimizer cell ("exp_avg and exp_avg_sq in bf16",
#: Megatron's ``--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``).
BF16_MOMENTS = r"exp_avg(?:_sq)?(?: and exp_avg_sq)?(?: dtypes?)? (?:in|=|:) ?bf16|exp[_-]avg[_-]dtype[ =]bf16"


def _step_recipe(t: RowText, row: dict[str, str]) -> dict[str, Any]:
    """The recipe of the row's step: paged optimizer states, how the optimizer steps (and the
    torch release behind it), per-layer rotary tables and a returned KV cache."""
    rec: dict[str, Any] = {"optimizer_paged": "paged" in t.opt}
    if re.search(BF16_MOMENTS, t.opt):
        rec["optimizer_moments"] = "bf16"  # Megatron's precision-aware optimizer
    if yes(row, "rope_cache"):
        rec["rope_cache_per_layer"] = True
    if yes(row, "kv_cache"):
        rec["keeps_kv_cache"] = True
    if yes(row, "optimizer_in_bwd"):
        rec["optimizer_step"] = "in_backward"
    elif ("fused" in t.opt or "hybridadam" in t.opt or t.framework in MEGATRON_FRAMEWORKS
          or "deepspeed" in t.opt and not _torch_adamw(t.opt)):
        # torch fused AdamW; DeepSpeed's fused Adam kernels; ColossalAI's HybridAdam (its CUDA
        # multi-tensor kernel on the GPU); Megatron's optimizer (apex's or Transformer Engine's
        # FusedAdam)
        rec["optimizer_step"] = "fused"
    elif "decoupled" in t.opt or "adamw_hf" in t.opt or "one tensor at a time" in t.opt:
        # Composer's DecoupledAdamW and transformers' own AdamW step one tensor at a time
        # (composer/optim/decoupled_weight_decay.py ``adamw``: ``for i, param in
        # enumerate(params)``; transformers.optimization.AdamW likewise); torch's AdamW asked
        # ``fused=False`` with ``foreach`` unset (its default is chosen only when both are None)
        rec["optimizer_step"] = "for_loop"
    else:
        step = _torch_step(t, row)
        if step:
            rec["optimizer_step"] = step
    return rec


#: Frameworks whose optimizer is Megatron's (apex or Transformer Engine FusedAdam).
MEGATRON_FRAMEWORKS = ("megatron", "nemo", "megatron-deepspeed")
#: Megatron-LM's own training loop, whose arguments turn FP32 gradient accumulation and reduction
#: on under bf16 (``accumulate_allreduce_grads_in_fp32``; NeMo's recipes set their own
#: ``grad_reduce_in_fp32``, Megatron-DeepSpeed steps with DeepSpeed's optimizer).
MEGATRON_LM_FRAMEWORKS = ("megatron",)
#: Frameworks whose optimizer offload is Megatron-Core's own (``--optimizer-cpu-offload``, which
#: keeps the gradient buffers on the GPU); Megatron-DeepSpeed offloads through DeepSpeed.
MEGATRON_CORE_OPTIMIZER = ("megatron", "nemo")
#: The flags that reduce Megatron's gradients in 16 bits, wherever a row states them.
BF16_GRAD_FLAGS = r"grad[-_]reduce[-_]in[-_]bf16|grad_reduce_in_fp32\s*[=:]\s*false"
#: What a precision cell says of 16-bit gradient buffers under Megatron: those flags (their words
#: spaced too), or the buffers named.
BF16_GRADS = (BF16_GRAD_FLAGS + r"|grad[-_ ]reduce[-_ ]in[-_ ]bf16"
              r"|(?<!no )\bbf16 (main )?grad(s|ients)?\b(?! clip)|\bgrad(s|ients)? in bf16")


def _torch_step(t: RowText, row: dict[str, str]) -> str | None:
    """How torch's AdamW stepped under the row's ``torch`` release (blank: the current one,
    foreach with one intermediate). Before 2.0 the default was one tensor at a time
    (``if foreach is None: foreach = False``); 2.0 chose foreach only for plain Tensors and
    Parameters (``_default_to_fused_or_foreach``), so FSDP1's FlatParameter subclass (FSDP1
    without ``use_orig_params``, the default then) stepped one at a time, and its foreach AdamW
    kept two intermediates (``exp_avg_sq_sqrt`` and ``denom``; PyTorch PR #104898 kept one
    from 2.1). ``<2.1`` (a run before 2.1's release, 1.x or 2.0)
    reads as one at a time: 1.x's default and 2.0's under FSDP1, the least memory of the two."""
    text = cell(row, "torch")
    if not text:
        return None
    if text in ("<2.0", "<2.1"):
        return "for_loop"
    try:
        major, minor = (int(x) for x in text.split(".")[:2])
    except ValueError:
        raise Unmodelable(f"torch {text!r}: a release (2.0.1), <2.0 or <2.1") from None
    if (major, minor) < (2, 0):
        return "for_loop"
    if (major, minor) == (2, 0):
        fsdp1 = cell(row, "zero_or_fsdp").startswith("fsdp") and not fsdp2(t, row)
        return "for_loop" if fsdp1 else "foreach_torch20"
    return None


def _torch_adamw(opt: str) -> bool:
    """torch's AdamW named in an optimizer cell ("torch AdamW", the Hugging Face Trainer's
    ``adamw_torch``): under DeepSpeed, whose config then names no optimizer, the Trainer's
    optimizer steps on the flat FP32 partition with torch's default foreach kernels, not
    DeepSpeed's fused Adam."""
    return "torch" in opt or "hf trainer" in opt


def _adapters(t: RowText, row: dict[str, str], *, fp32_model: bool) -> dict[str, Any]:
    """Adapters in the row's ``adapter_dtype`` (unstated: FP32 under Hugging Face PEFT, its
    default, or in a model kept in FP32, ``fp32_model``; else the parameter dtype), rank, targets
    and dropout (unstated: none)."""
    dtype = cell(row, "adapter_dtype") or ("fp32" if t.hf_stack or fp32_model else "compute")
    return {"adapter_dtype": dtype, "lora_rank": int(num(row, "lora_rank", 8)),
            "lora_targets": lora_targets(row.get("lora_targets", "")) or ["all"],
            "lora_dropout": float(num(row, "lora_dropout", 0.0)),
            "modules_to_save": modules_to_save(cell(row, "modules_to_save"))}


def _evaluation(row: dict[str, str]) -> dict[str, Any]:
    """``eval_batch``: the per-GPU batch of the evaluation passes the run makes during training
    (blank: none, or not known from the source)."""
    n = num(row, "eval_batch")
    return {"eval_micro_batch": int(n)} if n else {}


def modules_to_save(text: str) -> list[str]:
    """A ``modules_to_save`` cell ('embed_tokens,lm_head'; blank: none) as the workload's list."""
    names = [p for p in re.split(r"[,\s]+", text) if p]
    unknown = [n for n in names if n not in ("embed_tokens", "lm_head")]
    if unknown:
        raise Unmodelable(f"modules_to_save {', '.join(unknown)!r}: embed_tokens or lm_head")
    return names


def _quantized_base(row: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The quantized base of a row: 4-bit (``quant_impl``, ``double_quant``) or LLM.int8
    (``quant_bits`` 8); and, as recipe keys, how its script readied it (``kbit_prep``) and what
    its bitsandbytes kept on the matmuls' contexts (``bitsandbytes``)."""
    quant = QUANT_IMPLS.get(cell(row, "quant_impl") or "bnb-nf4")
    if quant is None:
        raise Unmodelable(f"quant_impl {row.get('quant_impl')!r}: one of {', '.join(QUANT_IMPLS)}")
    version = version_of(cell(row, "bitsandbytes"))
    if cell(row, "quant_bits") == "8":  # LLM.int8; a blank version is the current release
        return ({"quant_bits": 8},
                {"kbit_prep": cell(row, "kbit_prep") or "none",
                 "bnb_keeps_input": None if version is None else version >= BNB_INT8_KEEPS_INPUT,
                 "int8_keeps_transposed": version is not None and version < BNB_INT8_DROPPED_TRANSPOSE})
    return ({"quant_type": quant, "double_quant": yes(row, "double_quant")},
            {"kbit_prep": cell(row, "kbit_prep") or "none",
             "bnb_keeps_input": (quant == "nf4" and version is not None
                                 and version < BNB_DROPPED_MATMUL_INPUT)})


def _loss(row: dict[str, str]) -> dict[str, Any]:
    """The loss's implementation (``loss_impl``), torch.compile (``compile``) and the layer
    kernels (``kernels``), as recipe keys."""
    rec: dict[str, Any] = {}
    impl = cell(row, "loss_impl")
    if impl:
        if impl not in LOSS_IMPLS:
            raise Unmodelable(f"loss_impl {impl!r}: one of {', '.join(LOSS_IMPLS)}")
        if LOSS_IMPLS[impl] != "standard":
            rec["loss"] = LOSS_IMPLS[impl]
    if yes(row, "compile"):
        rec["compile"] = True
    kernels = cell(row, "kernels")
    if kernels:
        if kernels not in KERNELS:
            raise Unmodelable(f"kernels {kernels!r}: one of {', '.join(KERNELS)}")
        rec["kernels"] = kernels
    return rec


def _workload(t: RowText, row: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row's workload, and the recipe keys of its step (those of its sharding aside)."""
    for key in ("seq_len", "micro_batch"):
        if num(row, key) is None:
            raise Unmodelable(f"{key}: not stated")
    wl: dict[str, Any] = {"method": t.method, "seq_len": int(num(row, "seq_len")),
                          "micro_batch": int(num(row, "micro_batch")), **_precision_and_optimizer(t, row)}
    rec = _step_recipe(t, row)
    if t.method != "full":
        wl.update(_adapters(t, row, fp32_model=wl.get("base_dtype") == "fp32"))
    if t.method == "qlora":
        base, base_recipe = _quantized_base(row)
        wl.update(base)
        rec.update(base_recipe)
    # The row's peak came at its first step: no earlier step's logits beside it (litgpt before
    # 2024 put the longest sample into the first batch).
    if yes(row, "peak_at_first_step"):
        rec["peak_at_first_step"] = True
    rec.update(_loss(row))
    if t.framework in MEGATRON_FRAMEWORKS:
        rec.setdefault("loss", "vocab_parallel")  # Megatron's cross-entropy (cross_entropy_loss_fusion off)
        rec["selective"] = "core_attention"  # recompute_granularity selective: core_attn
    if t.framework in MEGATRON_CORE_OPTIMIZER:
        rec["offload_keeps_grads"] = True  # optimizer CPU offload: gradients copied from GPU buffers
    if t.framework in MEGATRON_LM_FRAMEWORKS and wl["precision"] == "mixed" and "fp16" not in t.prec \
            and not re.search(BF16_GRADS, t.prec) and not re.search(BF16_GRAD_FLAGS, cell(row, "notes")):
        # Megatron-LM under bf16 accumulates and reduces gradients in FP32 buffers
        # (``accumulate_allreduce_grads_in_fp32`` forced on unless --grad-reduce-in-bf16)
        rec["grad_dtype"] = "fp32"
    wl.update(_evaluation(row))
    wl["fp8"] = "float8" in t.prec
    rec.update(transformer_engine_recipe(t, row, fp8=wl["fp8"]))
    if num(row, "grad_accum") is not None:
        wl["grad_accum"] = int(num(row, "grad_accum"))
    return wl, rec


#: Frameworks built on Megatron-Core whose layers are Transformer Engine's where the row says so.
TE_FRAMEWORKS = ("nemo", "megatron")
#: What a row's precision or notes say of a Transformer Engine FP8 recipe, as recipe keys:
#: FP8 dot-product attention (Megatron ``fp8_dot_product_attention``, NeMo ``FP8_DPA=1``), the
#: activation's FP8 input store (``activation_func_fp8_input_store``, ``FP8_ACT=1``), FP8-stored
#: weights (``fp8_params``), and a disabled weight-transpose cache.
TE_FP8_WORDS = {
    "fp8_attention": r"fp8 (dot-product )?attention|fp8_dpa=1",
    "fp8_activation_store": r"fp8_act(ivation)?=(1|true)|activation_func_fp8_input_store on"
                            r"|fp8 activation-function input store",
    "fp8_params": r"fp8 (params|weights|base)",
}
#: A transpose cache disabled: Megatron's ``disable_parameter_transpose_cache`` under Transformer
#: Engine 1.x (the 24.x containers every such row ran; TE 2.x keeps a primary FP8 weight's copy).
TE_NO_TRANSPOSE_CACHE = r"disable_parameter_transpose_cache[ =:]+true|transpose cache disabled"
#: Cards on which Transformer Engine keeps no FP8 weight transpose (data-center Blackwell), by the
#: words a row's card cell uses (the catalog's ``GpuSpec.keeps_fp8_transpose`` where
#: ``planner_gpu`` names the card).
NO_TRANSPOSE_CARD_WORDS = r"\bg?b[123]00\b"


def transformer_engine_recipe(t: RowText, row: dict[str, str], *, fp8: bool) -> dict[str, Any]:
    """Recipe keys of a run on Transformer Engine layers (``kernels`` transformer_engine): a
    ``kernels`` cell naming it, or a NeMo/Megatron row whose precision or notes name Transformer
    Engine; with FP8 linears, what its FP8 recipe stores in FP8 (:data:`TE_FP8_WORDS`) and whether
    FP8 weights keep a transposed copy (none on Blackwell cards or where the row says the cache
    was disabled; else the recipe's default, kept)."""
    text = f"{t.prec} {cell(row, 'notes')}".lower()
    if not (cell(row, "kernels") == "transformer_engine"
            or t.framework in TE_FRAMEWORKS and "transformer engine" in text):
        return {}
    rec: dict[str, Any] = {"kernels": "transformer_engine"}
    if not fp8:
        return rec
    rec.update({key: True for key, words in TE_FP8_WORDS.items() if re.search(words, text)})
    if rec.get("fp8_params"):
        card = cell(row, "planner_gpu")
        any_layout = (not catalog.get_gpu(card).keeps_fp8_transpose if card
                      else re.search(NO_TRANSPOSE_CARD_WORDS, cell(row, "gpu_type").lower()))
        if any_layout or re.search(TE_NO_TRANSPOSE_CACHE, text):
            rec["fp8_transpose_cache"] = False
    return rec


def grpo_workload(row: dict[str, str]) -> dict[str, Any]:
    """A GRPO row's workload keys: completions per prompt, the completion's length (``seq_len``
    counts prompt + completion), the global batch in completions and the reference (``model``
    where beta > 0; blank: TRL's beta 0)."""
    out: dict[str, Any] = {"algorithm": "grpo"}
    for key in ("num_generations", "completion_len", "global_batch"):
        if num(row, key) is not None:
            out[key] = int(num(row, key))
    if "completion_len" not in out:
        raise Unmodelable("completion_len: a GRPO row needs its completion length")
    reference = cell(row, "reference")
    if reference:
        if reference not in ("model", "none"):
            raise Unmodelable(f"reference {reference!r}: model (beta > 0) or none")
        out["reference"] = reference
    return out


def grpo_engine(row: dict[str, str]) -> dict[str, Any]:
    """A GRPO row's engine: GPUs of its own (0: colocated), its memory share and tensor parallelism."""
    out: dict[str, Any] = {}
    for key, kind in (("generation_gpus", int), ("generation_memory_fraction", float), ("generation_tp", int)):
        if num(row, key) is not None:
            out[key] = kind(num(row, key))
    return out


def grpo_phases(row: dict[str, str]) -> dict[str, Any]:
    """A GRPO row's recipe keys: the engine asleep while the step trains, the trainer's states in
    host memory while it generates, a forward over the completions for their old log-probs, and
    generation overlapping training (off-policy steps)."""
    return {"generation_sleep": yes(row, "generation_sleep"), "rollout_offload": yes(row, "param_offload_rollout"),
            "logprob_forward": yes(row, "logprob_forward"), "async_generation": yes(row, "async_generation"),
            "sleep_level": 1 if num(row, "sleep_level") == 1 else 2}


def scenario_of(row: dict[str, str]) -> dict[str, Any]:
    """The scenario mapping a row describes (raises :class:`Unmodelable`)."""
    t = text_of(row)
    wl, rec = _workload(t, row)
    algorithm = cell(row, "algorithm").lower()
    if algorithm == "dpo":  # chosen/rejected pairs against a reference (micro_batch: pairs)
        wl["algorithm"] = "dpo"
        reference = cell(row, "reference")
        if reference:  # model (blank), precomputed log-probabilities, or none (ORPO, SimPO)
            if reference not in ("model", "precomputed", "none"):
                raise Unmodelable(f"reference {reference!r}: model, precomputed or none")
            wl["reference"] = reference
    elif algorithm == "grpo":
        wl.update(grpo_workload(row))
    elif algorithm not in ("", "sft"):  # PPO, KTO, ...: not read as supervised steps
        raise Unmodelable(f"algorithm {algorithm!r}: only sft, dpo and grpo steps are modelled")
    lay = layout(row)
    if algorithm == "grpo":
        lay.update(grpo_engine(row))
        rec.update(grpo_phases(row))
    rec.update(sharding_recipe(t, row, lay["zero"], wl.get("grad_accum", 1)))
    return {"name": f"row-{row['id']}", "profile": "detailed", "model": model_of(row),
            "workload": wl, "layout": lay, "recipe": rec}


def measured_bytes(row: dict[str, str]) -> float:
    """The measured peak in bytes: ``measured_unit`` GiB, or GB = 1e9 (the default)."""
    value = float(row["measured_gb"])
    return value * 2**30 if cell(row, "measured_unit") == "gib" else value * 1e9
