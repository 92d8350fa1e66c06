"""Measured-run rows (the columns of ``data/measured_calibration.csv``) -> scenario mappings.

Each row describes a real run in words; this module reads the recipe those words state (precision,
optimizer, loss, checkpointing, sharding, quantization) into scenario keys. It knows no per-row or
per-source figure: only architecture facts of the models (from their published configs) and what
the named frameworks do by default when the row names the framework's setting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from planner import catalog
from planner.catalog.store import UnknownName

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
    # transformers' LlamaForCausalLM built from a LlamaConfig (bench/gpu_memory.py): RMSNorm,
    # SwiGLU, no biases, untied head; the dimensions come from the row's columns.
    "llama": {"tied_embeddings": False},
}

#: Words that put a row on the Hugging Face stack (transformers Trainer, PEFT, TRL, and the
#: tools built on them), whose bitsandbytes QLoRA casts norms to FP32 (``kbit_prep``).
HF_STACK_WORDS = ("hf trainer", "transformers", "peft", "trl", "sfttrainer", "qlora.py",
                  "axolotl", "llama-factory", "llamafactory", "prepare_model_for_kbit_training")

#: Row model names that are catalog entries under another name.
CATALOG_NAMES = {"phi-3-mini-4k": "phi-3-mini"}

#: litgpt's GPT: one fused QKV linear (``attn.qkv``) and its own ``lm_head`` even for models that
#: tie it (``convert_hf_checkpoint`` copies the embedding into ``lm_head.weight``).
LITGPT_MODEL = {"fused_qkv": True, "tied_embeddings": False, "impl": "litgpt"}
#: lit-gpt commits the rows name from before 2023-10-24. They predate PR #606 ("Half precision
#: fixes"), which made RMSNorm upcast to FP32 (before it, RMSNorm computed in the input dtype),
#: and PR #667, which expanded multi-query K/V for SDPA's fused kernels. Their fine-tuning
#: scripts take ``batch_size = 128`` samples per optimizer step and accumulate
#: ``batch_size // micro_batch_size`` micro-batches (``finetune/lora.py``).
LITGPT_2023_COMMITS = ("8641822", "29de2828")
LITGPT_2023_BATCH_SIZE = 128
#: litgpt's LoRA recipes (``config_hub/finetune/*/lora.yaml``, ``finetune/lora.py``): dropout 0.05.
LITGPT_LORA_DROPOUT = 0.05

#: ``global_batch_size`` of the litgpt config-hub recipes the benchmark rows name (yaml files in
#: ``config_hub/finetune/`` at litgpt commits 26857050 and 58c5b188; devices and micro-batch as in
#: the rows). litgpt accumulates ``global_batch_size // devices // micro_batch_size``
#: micro-batches per optimizer step (``TrainArgs.gradient_accumulation_iters``).
LITGPT_CONFIG_GLOBAL_BATCH = {
    "falcon-7b/lora.yaml": 8, "gemma-2b/full.yaml": 16, "gemma-2b/lora.yaml": 6,
    "gemma-2b/qlora.yaml": 6, "gemma-7b/qlora.yaml": 6, "gemma2-2b/lora.yaml": 6,
    "gemma2-2b/qlora.yaml": 6, "llama-2-7b/full.yaml": 64, "llama-2-7b/lora.yaml": 8,
    "llama-2-7b/qlora.yaml": 8, "llama-3-8b/full.yaml": 64, "llama-3-8b/qlora.yaml": 8,
    "llama-3.2-1B/lora.yaml": 8, "llama-3.2-3B/lora.yaml": 8, "llama-3.2-3B/qlora.yaml": 8,
    "mistral-7b/lora.yaml": 8, "phi-2/full.yaml": 8, "phi-2/lora.yaml": 8, "phi-2/qlora.yaml": 8,
    "phi-3/qlora.yaml": 8, "stablelm-base-alpha-3b/full.yaml": 8,
    "stablelm-base-alpha-3b/lora.yaml": 8, "tiny-llama/full.yaml": 32,
    "tiny-llama/lora.yaml": 8, "tiny-llama/qlora.yaml": 8,
}

#: Qwen (v1) ``finetune/ds_config_zero2.json`` (commit e8e15962): reduce_bucket_size 2e8 with
#: overlap_comm and contiguous_gradients on, so DeepSpeed holds two buckets during backward.
QWEN_DS_ZERO2_BUCKET_ELEMENTS = 2 * 200_000_000

#: TRL's ``peft_module_casting_to_bf16`` (embeddings and lm_head back to 16 bits after
#: ``prepare_model_for_kbit_training``) from Dec 2023; TRL 0.26 (PR #4577, Dec 2025) stopped
#: calling ``prepare_model_for_kbit_training`` and casts the adapters to bf16.
TRL_CASTS_BACK_SINCE = (2023, 12)
TRL_STOPPED_KBIT_PREP = (2025, 12)
#: bitsandbytes 0.43.2 (released 2024-07, PR #1270) stopped keeping a 4-bit matmul's input.
BNB_DROPPED_MATMUL_INPUT = (2024, 7)
#: torchtitan commits the rows name that compile the loss with ``--training.compile``
#: (``build_cross_entropy_loss``: ``torch.compile(loss_fn)``, since PR #1033, 2025-04-02).
TORCHTITAN_COMPILED_LOSS_COMMITS = ("e7c0cae",)
#: torchtune's recipes held FP32 logits through backward until its chunked loss landed (PR #1390,
#: merged 2024-08-28): rows dated before this month (year, month) run that loss.
TORCHTUNE_CHUNKED_LOSS_SINCE = (2024, 8)
_MONTHS = {m: i for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}

_TARGETS = {"q": "q", "k": "k", "v": "v", "o": "o", "proj": "o", "output": "lm_head",
            "lm_head": "lm_head"}


class Unmodelable(ValueError):
    """A row the planner cannot express; the message says why."""


def _num(row: dict[str, str], key: str, default: float | None = None) -> float | None:
    text = (row.get(key) or "").strip()
    return float(text) if text else default


def model_of(row: dict[str, str]) -> dict[str, Any]:
    """The model's architecture: the row's columns, over the catalog entry or the facts above."""
    name = row["model"].strip()
    key = name.lower()
    base: dict[str, Any] = {}
    try:
        base = catalog.get_model(CATALOG_NAMES.get(key, key)).model_dump(
            exclude={"aliases", "id", "name", "hf_repo"})
    except UnknownName:
        facts = ARCHITECTURES.get(key) or ARCHITECTURES.get(key.split("-")[0])
        if facts is None:
            raise Unmodelable(f"model {name!r}: architecture unknown beyond the CSV columns") from None
        base = dict(facts)
    for col in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
        value = _num(row, col)
        if value is not None:
            base[col] = int(value)
    base.pop("params_b", None)
    base.pop("official_params_b", None)
    base["id"] = key
    if _is_litgpt(row):
        base.update(LITGPT_MODEL)
        if any(c in row.get("notes", "") for c in LITGPT_2023_COMMITS):
            base["norm_upcast"] = False
            base["mqa_sdpa_math"] = True  # PR #667 (expanded K/V) landed the same day
    return base


def _is_litgpt(row: dict[str, str]) -> bool:
    return row.get("source", "").lower().startswith(("litgpt", "lit-gpt"))


def _row_date(row: dict[str, str]) -> tuple[int, int] | None:
    """(year, month) a row's source or notes date it by ("(Apr 2024)", "Oct 2023", "2024-03")."""
    text = " ".join((row.get("source", ""), row.get("notes", ""))).lower()
    found = re.search(r"\b(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)\w* (20\d\d)\b", text)
    if found:
        return int(found.group(2)), _MONTHS[found.group(1)]
    found = re.search(r"\b(20\d\d)-(0[1-9]|1[0-2])\b", text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _kbit_prep(text: str, dated: tuple[int, int] | None) -> str:
    """How a Hugging Face QLoRA row readied its 4-bit model: peft's
    ``prepare_model_for_kbit_training`` alone ("peft"), followed by TRL's casting of embeddings
    and lm_head back to 16 bits ("trl", TRL from Dec 2023, and qlora.py), or, with TRL from
    0.26 (Dec 2025), no FP32 norms at all ("none")."""
    trl = re.search(r"\btrl\b|sfttrainer", text)
    if trl and dated is not None and dated >= TRL_STOPPED_KBIT_PREP:
        return "none"
    if trl and dated is not None and dated < TRL_CASTS_BACK_SINCE:
        return "peft"
    if trl or "qlora.py" in text:
        return "trl"
    return "peft" if "prepare_model_for_kbit_training" in text else "trl"


def _torchtune_before_chunked_loss(row: dict[str, str]) -> bool:
    """A torchtune row dated (its source's "(Apr 2024)") before the chunked loss."""
    dated = _row_date({"source": row.get("source", "")})
    return (row.get("source", "").lower().startswith("torchtune") and dated is not None
            and dated < TORCHTUNE_CHUNKED_LOSS_SINCE)


def _litgpt_config(row: dict[str, str]) -> str | None:
    """The config-hub recipe a litgpt row names ("(gemma-2b/full.yaml)" in its source)."""
    found = re.search(r"\(([\w.-]+/\w+\.yaml)\)", row.get("source", ""))
    return found.group(1) if found and _is_litgpt(row) else None


def lay_flash(row: dict[str, str]) -> bool:
    """The row's attention is a FlashAttention kernel (FA2 named, or SDPA's flash path)."""
    return (row.get("flash_attn") or "").strip().lower() in ("fa2", "fa3", "flash", "yes")


def lora_targets(text: str) -> list[str]:
    """'q,v' -> [q, v]; 'mlp(...)' adds gate, up and down; 'all linear' -> all."""
    text = text.lower()
    if "all linear" in text:
        out = ["all"]
        return out + (["lm_head"] if "except lm_head" not in text and "lm_head" in text else [])
    out: list[str] = []
    if "mlp" in text:
        out += ["gate", "up", "down"]
        text = re.sub(r"mlp\([^)]*\)|mlp", "", text)
    for part in re.split(r"[,\s]+", text):
        if part in _TARGETS and _TARGETS[part] not in out:
            out.append(_TARGETS[part])
    return out


def _checkpointing(text: str) -> str:
    text = text.lower()
    if text.startswith("selective"):
        return "selective"
    return "none" if text in ("", "no") else "full"


def _zero(text: str) -> int:
    """ZeRO stage of a ``zero_or_fsdp`` cell: FSDP full/hybrid shard and Megatron's FSDP are
    stage 3, Megatron's distributed optimizer stage 1; FSDP ``NO_SHARD`` is plain data parallel."""
    text = text.lower()
    if "no_shard" in text:
        return 0
    if "zero3" in text or "full_shard" in text or "fsdp=1" in text:
        return 3
    if "zero2" in text or "shard_grad_op" in text:
        return 2
    if "zero1" in text or "distributed optimizer" in text or "dist-opt" in text:
        return 1
    return 0


#: ``framework`` column values (a documented recipe fact) on the Hugging Face stack, and those
#: that run their own loop or patched kernels.
HF_FRAMEWORKS = frozenset({"hf-trainer", "hf-accelerate", "trl", "axolotl", "llama-factory", "peft"})
OWN_LOOP_FRAMEWORKS = frozenset({"litgpt", "torchtune", "torchtitan", "unsloth", "nemo", "megatron"})


@dataclass(frozen=True)
class RowText:
    """The words of a row the readers below look at, lower-cased once."""

    method: str
    notes: str  # as written (commit hashes are matched case-sensitively)
    low: str  # the notes, lower-cased
    opt: str
    prec: str
    every: str  # source, optimizer, precision and notes
    framework: str  # the ``framework`` column
    hf_stack: bool  # the Hugging Face stack (Trainer, PEFT, TRL and the tools built on them)


def _text_of(row: dict[str, str]) -> RowText:
    method = row["method"].strip()
    if method not in ("full", "lora", "qlora"):
        raise Unmodelable(f"method {method!r}: only full, lora and qlora runs are modelled")
    if method == "lora" and (row.get("quant_bits") or "").strip() == "8":
        raise Unmodelable("an 8-bit base (LLM.int8 LoRA): not modelled")
    notes = row.get("notes", "")
    opt, prec, low = row["optimizer"].lower(), row["precision"].lower(), notes.lower()
    every = " ".join((row.get("source", ""), opt, prec, low)).lower()
    # Frameworks with their own loops or kernels (Unsloth patches the model's layers) are not
    # the plain Hugging Face stack, whatever libraries their rows mention.
    framework = (row.get("framework") or "").strip().lower()
    own_loop = framework in OWN_LOOP_FRAMEWORKS or re.search(
        r"lit-?gpt|torchtune|torchtitan|unsloth", row.get("source", "").lower())
    hf_stack = framework in HF_FRAMEWORKS or any(word in every for word in HF_STACK_WORDS)
    return RowText(method, notes, low, opt, prec, every, framework, bool(hf_stack and not own_loop))


def _precision_and_optimizer(t: RowText) -> dict[str, Any]:
    # Precision: FP32 master weights ("mixed") only where the row says so.
    if "fp32 master" in t.prec or "deepspeed" in t.opt and t.method == "full":
        precision = "mixed"
    elif "-mixed" in t.prec and "fp16" not in t.prec:
        precision = "mixed"  # Lightning's "bf16-mixed": FP32 weights, 16-bit autocast
    elif "fp16" in t.prec:
        precision = "fp16"
    elif t.method != "full" and t.hf_stack and "bf16" in t.prec:
        precision = "mixed"  # the Trainer's bf16 runs the forward under torch.autocast
    else:
        precision = "bf16"
    wl: dict[str, Any] = {"precision": precision,
                          "optimizer": "adam8bit" if "8bit" in t.opt or "8-bit" in t.opt else "adamw",
                          "optimizer_paged": "paged" in t.opt}
    if "optimizer_in_bwd" in t.opt or re.search(r"optimizer_in_bwd\s*=\s*(yes|true)", t.low):
        wl["optimizer_step"] = "in_backward"
    elif "fused" in t.opt or "deepspeed" in t.opt:
        wl["optimizer_step"] = "fused"  # torch fused AdamW; DeepSpeed's fused Adam kernels
    return wl


def _adapters(t: RowText, row: dict[str, str]) -> dict[str, Any]:
    """Adapters: FP32 under Hugging Face PEFT (its default) and with FP16 AMP; otherwise the
    framework keeps them in the parameter dtype ("states in param dtype", torchtune bf16)."""
    hf_peft = "hf trainer" in t.opt or "deepspeed" in t.opt or "fp16 amp" in t.prec
    drop = re.search(r"dropout\s*=?\s*([0-9.]+)", t.low)
    default = LITGPT_LORA_DROPOUT if _is_litgpt(row) else 0.0
    return {"adapter_dtype": "fp32" if hf_peft else "compute",
            "lora_rank": int(_num(row, "lora_rank", 8)),
            "lora_targets": lora_targets(row.get("lora_targets", "")) or ["all"],
            "lora_dropout": float(drop.group(1)) if drop else default}


def _quantized_base(t: RowText, row: dict[str, str], adapter_dtype: str) -> dict[str, Any]:
    """The 4-bit base of a QLoRA row and how its stack readied it."""
    if "gptq" in t.prec or "gptq" in t.low:
        quant = "gptq"
    elif "nf4 base" in t.prec and not (t.hf_stack or t.framework == "unsloth"):
        quant = "torchao-nf4"  # torchtune: torchao's NF4Tensor
    else:
        quant = "nf4"  # bitsandbytes
    # litgpt's QLoRA ran bitsandbytes before 0.43.2 for every row here (its pyproject pinned
    # ``bitsandbytes==0.42.0`` from 2024-03 to 2024-12; the 2023 rows predate 0.43.2).
    # Elsewhere a run dated before bitsandbytes 0.43.2 ran the old matmul too.
    dated = _row_date(row)
    wl: dict[str, Any] = {"quant_type": quant, "bnb_keeps_input": quant == "nf4" and (
        _is_litgpt(row) or dated is not None and dated < BNB_DROPPED_MATMUL_INPUT)}
    # Hugging Face QLoRA scripts cast the norms to FP32: peft's
    # prepare_model_for_kbit_training casts every 16-bit weight, and the QLoRA reference
    # script (qlora.py) and TRL cast embeddings and lm_head back to 16 bits.
    sharded = _zero(row.get("zero_or_fsdp", "")) == 3 and int(_num(row, "gpus", 1)) > 1
    if quant == "nf4" and t.hf_stack and sharded:
        # TRL skips prepare_model_for_kbit_training for a sharded QLoRA model (its 4-bit
        # weights loaded on CPU/meta for FSDP or ZeRO-3, ``is_sharded_qlora``), and the
        # FSDP/ZeRO-3 QLoRA guides keep every weight in the quant-storage dtype: no FP32 norms.
        wl["kbit_prep"] = "none"
    elif quant == "nf4" and t.framework == "axolotl" and lay_flash(row):
        # axolotl casts norms, embeddings and lm_head back to the training dtype after
        # prepare_model_for_kbit_training when FlashAttention is on (its loader, since 2023-08).
        wl["kbit_prep"] = "none"
    elif quant == "nf4" and t.hf_stack:
        wl["kbit_prep"] = _kbit_prep(t.every, dated)
        if wl["kbit_prep"] == "none":  # TRL since 0.26 casts the adapters to bf16 instead
            adapter_dtype = "compute"
    wl["adapter_dtype"] = adapter_dtype
    # torchao NF4 (torchtune) always quantizes its scales; bitsandbytes only with "-dq".
    wl["double_quant"] = "nf4-dq" in t.low or "double quant)" in t.low or quant == "torchao-nf4"
    return wl


def _loss(t: RowText, row: dict[str, str]) -> dict[str, Any]:
    """The loss's implementation, and torch.compile, as the row states them."""
    wl: dict[str, Any] = {}
    low = t.low
    loss_impl = (row.get("loss_impl") or "").strip().lower()
    if loss_impl in ("chunked", "chunked-ce"):
        wl["loss"] = "chunked"
    elif loss_impl in ("fused-linear-ce", "fused") or t.framework == "unsloth" and not loss_impl:
        # Liger / Cut Cross-Entropy: no full logits. Unsloth computes its loss with Apple's Cut
        # Cross-Entropy for every model since its Llama 3.3 release (Unsloth blog "llama3-3", Dec
        # 2024) unless a cell says otherwise.
        wl["loss"] = "fused"
    elif _torchtune_before_chunked_loss(row) and "chunk" not in low:
        wl["loss"] = "held_fp32"
    elif re.search(r"chunked_ce\s*=\s*(no|false)", low):
        pass
    elif "full-ft script does not chunk" in low:  # litgpt: only its LoRA script chunks
        wl["loss"] = "chunked" if t.method != "full" else "standard"
    elif re.search(r"chunked[ _]ce|cewithchunkedoutputloss", low):
        wl["loss"] = "chunked"
    if not re.search(r"compile\s*=\s*(no|false)|\bno (torch\.)?compile\b", low) \
            and re.search(r"\bcompile\b", low):
        wl["compile"] = True
        if any(c in t.notes for c in TORCHTITAN_COMPILED_LOSS_COMMITS) and "loss" not in wl:
            wl["loss"] = "compiled"
    return wl


def _grad_accum(t: RowText, row: dict[str, str]) -> int | None:
    """Micro-batches per optimizer step: the column, the notes, or the recipe the row names."""
    accum = re.search(r"grad(?:ient)? accumulation (\d+)", t.low)
    micro = re.search(r"split into (\d+) micro-batches", t.low)
    if _num(row, "grad_accum") is not None:  # the column, where a file has it
        return int(_num(row, "grad_accum"))
    if micro:
        return int(micro.group(1))
    if accum:
        return int(accum.group(1))
    if "no grad accumulation" in t.low:
        return 1
    if _litgpt_config(row) in LITGPT_CONFIG_GLOBAL_BATCH:
        per_step = int(_num(row, "micro_batch", 1)) * int(_num(row, "gpus", 1))
        return max(1, LITGPT_CONFIG_GLOBAL_BATCH[_litgpt_config(row)] // per_step)
    if _is_litgpt(row) and any(c in t.notes for c in LITGPT_2023_COMMITS):
        return max(1, LITGPT_2023_BATCH_SIZE // int(_num(row, "micro_batch", 1)))
    return None


def _workload(t: RowText, row: dict[str, str]) -> dict[str, Any]:
    wl: dict[str, Any] = {"method": t.method, "seq_len": int(_num(row, "seq_len")),
                          "micro_batch": int(_num(row, "micro_batch")), **_precision_and_optimizer(t)}
    if t.method != "full":
        wl.update(_adapters(t, row))
    if t.method == "qlora":
        wl.update(_quantized_base(t, row, wl["adapter_dtype"]))
    # litgpt before 2024 put the longest training sample into the first batch ("forces [it] into
    # the first batch" in the notes): the peak step has no earlier step's logits beside it.
    if _is_litgpt(row) and re.search(r"into (the )?first batch", t.low):
        wl["peak_at_first_step"] = True
    wl.update(_loss(t, row))
    wl["fp8"] = "float8" in t.prec
    accum = _grad_accum(t, row)
    if accum is not None:
        wl["grad_accum"] = accum
    return wl


def _layout(t: RowText, row: dict[str, str], grad_accum: int) -> dict[str, Any]:
    """Degrees, sharding, offload, checkpointing and attention as the row states them."""
    offload = row.get("cpu_offload", "").lower()
    lay: dict[str, Any] = {
        "gpus": int(_num(row, "gpus", 1)), "tp": int(_num(row, "tp", 1)),
        "pp": int(_num(row, "pp", 1)), "cp": int(_num(row, "cp", 1)),
        "zero": _zero(row.get("zero_or_fsdp", "")),
        "checkpointing": _checkpointing(row.get("grad_ckpt", "")),
        "attention": "eager" if row.get("flash_attn", "").strip() == "eager" else "flash",
        "activation_offload": "activations" in offload,
    }
    if lay["gpus"] == 1 and lay["zero"] and "optimizer" not in offload:
        lay["zero"] = 0 if lay["zero"] < 3 else 3
    if "params" in offload:
        lay["offload"] = "optimizer+params"
        lay["zero"] = 3
    elif "optimizer" in offload and "paged" not in offload:  # ZeRO-Offload: states and step on CPU
        lay["offload"] = "optimizer"
        lay["zero"] = max(lay["zero"], 1)
    lay.update(_sharding_recipe(t, row, lay, grad_accum))
    if int(_num(row, "layers", 1)) % lay["pp"]:
        lay["uneven_pp"] = True  # the run split its layers over stages of unequal size
    if lay["tp"] > 1:
        lay["sp"] = True  # torchtitan's TP shards norms and dropout regions (sequence parallel)
    return lay


def _sharding_recipe(t: RowText, row: dict[str, str], lay: dict[str, Any], grad_accum: int) -> dict[str, Any]:
    """What the row's ZeRO/FSDP implementation does beyond its stage."""
    out: dict[str, Any] = {}
    fsdp = row.get("zero_or_fsdp", "").lower()
    zero = lay["zero"]
    # Qwen's scripts run ZeRO-2 with ``finetune/ds_config_zero2.json`` (the only ZeRO-2 config).
    if _zero(fsdp) == 2 and row.get("source", "").lower().startswith("qwen"):
        out["zero_bucket_elements"] = QWEN_DS_ZERO2_BUCKET_ELEMENTS
    # FSDP1 with a full state dict (litgpt's FSDPStrategy always uses state_dict_type="full")
    # gathers it at saves, one unit at a time (the detailed profile's "full state dict" phase).
    if zero == 3 and ("state_dict_type=full" in fsdp or "fsdp1" in fsdp or "lightning fsdpstrategy" in fsdp):
        out["full_state_dict"] = True
    # Lightning Fabric's ``no_backward_sync`` (litgpt's loop between optimizer steps) is FSDP1's
    # ``no_sync``: gradients accumulate unsharded, the whole model's on every GPU.
    if _is_litgpt(row) and zero == 3 and grad_accum > 1:
        out["unsharded_grad_accumulation"] = True
    # Lightning's FSDPStrategy sets ``use_orig_params=True`` (torch >= 2.0) and litgpt wraps each
    # ``Block`` whole, so a LoRA layer's frozen weights share its flat parameter's gradient.
    if _is_litgpt(row) and zero == 3 and t.method == "lora":
        out["fsdp_mixed_units"] = True
    # FSDP2 (``fully_shard``): torchtitan always, torchtune's distributed recipes since v0.3.
    if zero == 3 and ("fsdp2" in fsdp or t.framework in ("torchtitan", "torchtune")
                      or re.match(r"torchtitan", row.get("source", "").lower())):
        out["fsdp_version"] = 2
    return out


def scenario_of(row: dict[str, str]) -> dict[str, Any]:
    """The scenario mapping a row describes (raises :class:`Unmodelable`)."""
    t = _text_of(row)
    wl = _workload(t, row)
    lay = _layout(t, row, wl.get("grad_accum", 1))
    return {"name": f"row-{row['id']}", "profile": "detailed", "model": model_of(row),
            "workload": wl, "layout": lay}


def measured_bytes(row: dict[str, str]) -> float:
    """The measured peak in bytes: GiB where the notes say so, else GB = 1e9."""
    value = float(row["measured_gb"])
    return value * 2**30 if "gib" in row.get("notes", "").lower() else value * 1e9
