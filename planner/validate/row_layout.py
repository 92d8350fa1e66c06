"""A measured run's layout as its row states it: degrees, ZeRO/FSDP stage, offload, checkpointing,
attention and sequence parallelism; and, as recipe keys, what the named ZeRO/FSDP implementation
and release do beyond the stage (DeepSpeed's buckets and overflow check, ZeRO-Offload's GPU copy,
FSDP1's full state dict and unsharded accumulation, FSDP2).
"""

from __future__ import annotations

import re
from typing import Any

from planner.validate.cells import (
    HF_FRAMEWORKS,
    NOT_OFFLOADED,
    RowText,
    cell,
    expert_degree,
    expert_tensor_degree,
    no,
    num,
    version_of,
)
from planner.validate.sharding import names_deepspeed_stage, zero_stage_of

#: DeepSpeed 0.13.3 (2024-02, PR #5115) checks a gradient for inf/NaN with masks on the device
#: (11 bytes per element; ``x.float().sum()``, 4, before): a row's ``deepspeed`` release before
#: it sets ``zero_overflow_check_bytes`` 4.
DEEPSPEED_MASKED_OVERFLOW_CHECK = (0, 13, 3)
#: DeepSpeed 0.14.1 (2024-04, PR #5301) copies ZeRO-Offload's FP32 partition to the GPU at the
#: step; PR #7309 (merged 2025-05-23) casts it on the host again, taken as from 0.17.0, the first
#: minor release after it (``zero_offload_gpu_copy``).
DEEPSPEED_OFFLOAD_GPU_COPY = ((0, 14, 1), (0, 17, 0))
#: The first DeepSpeed release whose ``deepspeed.initialize`` installs ZeRO-3's memory-efficient
#: linear on a model built outside ``zero.Init`` (PR #8189, 2026-07-31; tag v0.19.4).
DEEPSPEED_LINEAR_WRAPS_BUILT_MODELS = (0, 19, 4)


def _checkpointing(text: str, peft_prepared: bool = False) -> str:
    """``full``, ``selective`` or ``none`` as the ``grad_ckpt`` cell says (``text`` as
    :func:`cell` reads it); an unstated cell is ``none``, except
    over a base readied by PEFT's ``prepare_model_for_kbit_training`` (``kbit_prep: peft``), whose
    ``use_gradient_checkpointing`` defaults to true and turns full recomputation on."""
    if text == "" and peft_prepared:
        return "full"
    if text.startswith("selective"):
        return "selective"
    # "no (the flag was not passed)": a qualified no is still no
    return "none" if text == "" or re.match(r"(no|off|false|none)\b", text) else "full"


def fsdp2(t: RowText, row: dict[str, str]) -> bool:
    """FSDP2 (``fully_shard``): named in the sharding cell, or torchtitan's and torchtune's
    distributed recipes (FSDP2 since v0.3), unless the cell says FSDP1."""
    fsdp = cell(row, "zero_or_fsdp")
    return "fsdp1" not in fsdp and ("fsdp2" in fsdp or t.framework in ("torchtitan", "torchtune"))


def deepspeed_zero(row: dict[str, str], *stages: int) -> bool:
    """The row's sharding cell names a DeepSpeed ZeRO stage (any of ``stages``, default every one:
    ``zero1``, ``zero2 (...)``, ...), not as the FSDP it names ("fsdp2 zero2 (fully_shard ...)":
    FSDP2 resharding like ZeRO-2)."""
    text = cell(row, "zero_or_fsdp")
    fsdp_named = re.search(r"fsdp|fully_shard", text) and "deepspeed" not in text
    return names_deepspeed_stage(text, *stages) and not fsdp_named


#: Activation offloading named in a checkpointing cell, and the same said not to happen.
ACTIVATION_OFFLOAD = r"activation[ _]offload"
NO_ACTIVATION_OFFLOAD = (r"\b(no|not|without)\s+activation[ _]offload"
                         r"|activation[ _]offload\w*\s*[=:]?\s*(false|no|off|0)\b")


def _attention(text: str) -> str:
    """``eager`` where the attention cell starts by naming the unfused path ("eager", "eager (TE
    UnfusedDotProductAttention, ...)", "math", "unfused (TE)", "none (attention_backend unfused)"):
    the whole score matrix kept; every fused kernel (FlashAttention, SDPA's, cuDNN's, Triton's) is
    ``flash``, whatever its cell says after ("sdpa (... no eager flag)")."""
    text = text.strip().lower()
    return "eager" if re.match(r"(eager|math|unfused)\b|(none|no)\b[^;]*\b(unfused|eager)\b", text) else "flash"


#: An ``optimizer_offload`` / ``param_offload`` cell saying that state went to the host ("yes",
#: "yes (fraction 1)", "cpu").
STATED_OFFLOADED = r"(yes|true|on|cpu)\b"


def layout(row: dict[str, str]) -> dict[str, Any]:
    """Degrees, sharding, offload, checkpointing and attention as the row states them."""
    offload = re.sub(NOT_OFFLOADED, "", row.get("cpu_offload", "").lower())  # what it says is offloaded
    # the optimizer_offload / param_offload columns, where the cpu_offload cell does not say what
    # ("yes" under DeepSpeed's offload_optimizer)
    for key, part in (("optimizer_offload", "optimizer"), ("param_offload", "params")):
        if re.match(STATED_OFFLOADED, cell(row, key)) and part[:5] not in offload:
            offload += f" {part}"
    zero = zero_stage_of(row.get("zero_or_fsdp", ""))
    if re.match(r"(yes|true|on)\b", offload) and not re.search(r"param|optim|activation|grad", offload) \
            and zero == 3 and not deepspeed_zero(row):
        offload += " params+grads+optimizer"  # FSDP's CPU offload moves all three (CPUOffload/CPUOffloadPolicy)
    ckpt = cell(row, "grad_ckpt")
    if re.search(ACTIVATION_OFFLOAD, ckpt) and not re.search(NO_ACTIVATION_OFFLOAD, ckpt):
        offload += " activations"  # checkpointed layer inputs offloaded, stated with the checkpointing
    lay: dict[str, Any] = {
        "gpus": int(num(row, "gpus", 1)), "tp": int(num(row, "tp", 1)),
        "pp": int(num(row, "pp", 1)), "cp": int(num(row, "cp", 1)),
        "zero": zero,
        "checkpointing": _checkpointing(ckpt, cell(row, "kbit_prep") == "peft"),
        "attention": _attention(row.get("flash_attn", "")),
        "activation_offload": "activations" in offload,
    }
    # One GPU shards nothing, but DeepSpeed's ZeRO-1/2 optimizer still flattens the gradients
    # and copies them to FP32 at the step (its recipe, :func:`sharding_recipe`): only other
    # stage-1/2 cells drop.
    deepspeed_12 = deepspeed_zero(row) and lay["zero"] < 3
    if lay["gpus"] == 1 and lay["zero"] and "optimizer" not in offload and not deepspeed_12:
        lay["zero"] = 0 if lay["zero"] < 3 else 3
    if "params" in offload:
        lay["offload"] = "optimizer+params"
        lay["zero"] = 3
    elif "optimizer" in offload and "paged" not in offload:  # ZeRO-Offload: states and step on CPU
        lay["offload"] = "optimizer"
        lay["zero"] = max(lay["zero"], 1)
    if int(num(row, "layers", 1)) % lay["pp"]:
        lay["uneven_pp"] = True  # the run split its layers over stages of unequal size
    virtual = int(num(row, "pp_virtual") or 1)
    if virtual > 1:  # interleaved 1F1B over that many chunks per stage
        lay["pp_schedule"] = "interleaved"
        lay["pp_virtual_stages"] = virtual
    # routed experts split over ranks of the data-parallel group: an ``ep`` column, else the
    # degree the sharding cell states ("megatron-dist-opt (expert parallel 8)", "EP8")
    ep = int(num(row, "ep") or expert_degree(row.get("zero_or_fsdp", "")))
    if ep > 1:
        lay["ep"] = ep
        # the experts' own TP where the row states one (MoE parallel folding: "ETP1")
        etp = num(row, "etp") or expert_tensor_degree(row.get("zero_or_fsdp", ""), row.get("notes", ""))
        if etp is not None:
            lay["etp"] = int(etp)
    if lay["tp"] > 1:
        # sequence parallelism (TP also shards the norm and dropout regions): on unless the
        # row says the run had none (torchtitan, NeMo and Megatron-Bridge recipes use it)
        lay["sp"] = not no(row, "sequence_parallel")
    return lay


def sharding_recipe(t: RowText, row: dict[str, str], zero: int, grad_accum: int) -> dict[str, Any]:
    """What the row's ZeRO/FSDP implementation does beyond its stage (``zero``, the layout's):
    recipe keys."""
    out: dict[str, Any] = {}
    fsdp = row.get("zero_or_fsdp", "").lower()
    # DeepSpeed ZeRO-1/2 gradient buckets (reduce_bucket_size, twice with overlap_comm).
    if num(row, "zero_reduce_bucket"):
        out["zero_bucket_elements"] = int(num(row, "zero_reduce_bucket"))
    # FSDP1 with a full state dict (litgpt's FSDPStrategy always uses state_dict_type="full")
    # gathers it at saves, one unit at a time (the detailed profile's "full state dict" phase).
    if zero == 3 and ("state_dict_type=full" in fsdp or "fsdp1" in fsdp or "lightning fsdpstrategy" in fsdp):
        out["full_state_dict"] = True
    litgpt = t.framework == "litgpt"
    # Lightning Fabric's ``no_backward_sync`` (litgpt's loop between optimizer steps) is FSDP1's
    # ``no_sync``: gradients accumulate unsharded, the whole model's on every GPU. The Hugging
    # Face Trainer does the same under FSDP: ``model.no_sync()`` on every micro-batch but the
    # last (``_no_sync_in_gradient_accumulation``: all but DeepSpeed and SageMaker, 2023), then
    # accelerate's ``accumulate`` (no_sync unless ``sync_each_batch``, added in 2024).
    hf_loop = t.framework in HF_FRAMEWORKS and "fsdp" in fsdp and "sync_each_batch" not in fsdp
    if (litgpt and zero == 3 or hf_loop and zero >= 2) and grad_accum > 1:
        out["unsharded_grad_accumulation"] = True
    # Lightning's FSDPStrategy sets ``use_orig_params=True`` (torch >= 2.0) and litgpt wraps each
    # ``Block`` whole, so a LoRA layer's frozen weights share its flat parameter's gradient.
    if litgpt and zero == 3 and t.method == "lora":
        out["fsdp_mixed_units"] = True
    # What ZeRO-Offload (stage 1/2) holds on the GPU in the DeepSpeed release that ran.
    release = version_of(cell(row, "deepspeed"))
    if release is not None:
        if release < DEEPSPEED_MASKED_OVERFLOW_CHECK:
            out["zero_overflow_check_bytes"] = 4
        first, fixed = DEEPSPEED_OFFLOAD_GPU_COPY
        out["zero_offload_gpu_copy"] = first <= release < fixed
    # DeepSpeed's ZeRO-3 (its flat gradient partition, the FP32 copy at the step).
    if zero == 3 and (deepspeed_zero(row, 3) or "deepspeed" in fsdp):
        out["zero_impl"] = "deepspeed"
    # DeepSpeed's ZeRO-1/2 (stage_1_and_2.py; not Megatron-DeepSpeed's BF16_Optimizer, whose FP32
    # gradient buffer the row's precision cell states).
    if zero in (1, 2) and deepspeed_zero(row) and "bf16_optimizer" not in fsdp:
        out["zero_impl"] = "deepspeed"
    if zero == 3 and fsdp2(t, row):
        out["fsdp_version"] = 2
    # A model built before DeepSpeed's config was known (``zero_init`` "no": loaded before the
    # ``TrainingArguments``) runs stock F.linear under ZeRO-3, before the release that installs
    # the memory-efficient linear on such models as well.
    if (out.get("zero_impl") == "deepspeed" and zero == 3 and no(row, "zero_init")
            and (release is None or release < DEEPSPEED_LINEAR_WRAPS_BUILT_MODELS)):
        out["zero3_stock_linear"] = True
    return out
