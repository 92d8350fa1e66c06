"""The value types every schema shares: counts that accept YAML's ``1e9``, the bounds that catch
absurd input, the categorical names of the scenario format, and the strict base model (unknown
keys are errors).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)


def parse_number(value: Any) -> Any:
    """Accept ``"1e9"`` and ``"7_000"`` (YAML reads both as strings); reject booleans."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")  # noqa: TRY004 - pydantic reports ValueErrors
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"must be a number, got {value!r}") from None
    return value


def parse_count(value: Any) -> Any:
    value = parse_number(value)
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"must be a whole number, got {value:g}")
        value = int(value)
    return value


#: A positive whole number (accepts ``1e9``).
Count = Annotated[int, BeforeValidator(parse_count), Field(ge=1)]
#: A non-negative whole number.
NonNegCount = Annotated[int, BeforeValidator(parse_count), Field(ge=0)]
#: A non-negative real number (accepts ``4e9``).
NonNegFloat = Annotated[float, BeforeValidator(parse_number), Field(ge=0, allow_inf_nan=False)]
PosFloat = Annotated[float, BeforeValidator(parse_number), Field(gt=0, allow_inf_nan=False)]
#: Upper bounds that catch absurd input (a typo of three extra zeros) without limiting real use.
MAX_GPUS = 1_000_000
#: "Up to 1,024 GPUs" unless the scenario says otherwise (``search.max_gpus``).
DEFAULT_MAX_GPUS = 1024
#: Share of a node's host RAM that offloaded states may take (the OS, data loaders and pinned
#: buffers need the rest): a guess, stated.
HOST_RAM_USABLE_SHARE = 0.8
MAX_SEQ_LEN = 16 * 1024 * 1024
#: The largest token budget a scenario may ask for: 10^15, about 28 times the largest published
#: pre-training run (Qwen3, 36 trillion tokens; Qwen3 technical report, Yang et al. 2025). A
#: larger figure is a typo (``1e300``), and would plan jobs of 10^295 days.
MAX_TOKENS = 1e15
MAX_MICRO_BATCH = 1_000_000
Method = Literal["full", "lora", "qlora", "inference"]
Optimizer = Literal["adamw", "adam8bit", "paged_adamw8bit", "sgd", "adafactor", "lion", "muon"]
Precision = Literal["mixed", "bf16", "fp16", "fp32"]
Checkpointing = Literal["none", "selective", "full"]
Attention = Literal["eager", "flash"]
Offload = Literal["none", "optimizer", "optimizer+params"]
ZeroImpl = Literal["fsdp", "deepspeed"]
Profile = Literal["seed", "detailed"]
Objective = Literal["gpus", "hourly", "cost", "time"]
Vendor = Literal["nvidia", "amd", "huawei", "intel", "google"]
QuantType = Literal["nf4", "torchao-nf4", "gptq"]
#: Linear layers LoRA can adapt, in PEFT's Llama naming (``all`` = every one of them).
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: The loss's implementation (``Recipe.loss``) and the layer kernels (``Recipe.kernels``).
Loss = Literal["standard", "chunked", "fused", "held_fp32", "compiled", "cce", "in_forward", "inplace",
               "chunked_head", "chunked_head_in_forward", "rowwise", "rowwise_fp32", "vocab_parallel",
               "compute_dtype", "xentropy"]
Kernels = Literal["standard", "fused_rmsnorm", "liger", "unsloth", "transformer_engine"]
#: What selective activation checkpointing reruns (``Recipe.selective``).
Selective = Literal["op", "core_attention"]
#: The dtype of the gradients a step accumulates and reduces (``Recipe.grad_dtype``): the
#: parameters' own, or FP32 main gradients (Megatron under bf16).
GradDtype = Literal["param", "fp32"]
#: How the optimizer steps its tensors (``Recipe.optimizer_step``).
OptimizerStep = Literal["foreach", "foreach_torch20", "fused", "in_backward", "for_loop"]
