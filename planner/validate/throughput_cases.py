"""A row of the measured-throughput files (the columns of ``data/measured_throughput.csv``) read
into the arguments of :func:`planner.perf.timing.step_time_s` (:class:`ThroughputCase`): the
model, card, layout, batch, method, precision and recompute it states, and what its notes say of
the stack (fused element-wise ops, fused attention, the optimizer step, LoRA targets, virtual
pipeline stages).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from planner import catalog
from planner.core.arch import (
    LORA_TARGETS,
    has_full_architecture,
    lora_param_counts,
    seed_lora_params,
)
from planner.core.entries import GpuSpec, ModelSpec
from planner.perf import timing
from planner.perf.flops import ModelFlops, model_flops
from planner.validate.before import THROUGHPUT_COLUMN, THROUGHPUT_SCALE, recorded
from planner.validate.cells import NOT_OFFLOADED, Unmodelable, expert_degree, expert_tensor_degree
from planner.validate.rows import model_of
from planner.validate.sharding import zero_stage_of

#: LoRA rank where a row does not state it (NeMo's LoRA recipes use 32; PEFT's default is 8).
DEFAULT_LORA_RANK = 16
#: Words that name a stack fusing element-wise ops into its GEMMs and neighbours: torch.compile,
#: and Megatron-Core's Transformer Engine layers (fused norm-linear, bias-activation, FP8 casts),
#: which NeMo and Megatron-Bridge run and which any FP8 recipe needs. Stacks that use a few TE
#: modules inside Hugging Face model code (NeMo AutoModel) keep their unfused element-wise ops.
#: Tensor-parallel communication overlap through userbuffers (``ub_tp_comm_overlap``) is a
#: Transformer Engine feature: a run that uses it runs TE layers.
#: Phrases that say a run was *not* compiled (removed before :data:`FUSED_WORDS` are looked for).
NOT_COMPILED = r"compile\s*[=:]\s*(no|false|off)|\b(no|not|without)\s+(torch\.)?compile\b"
#: Phrases that say a run did *not* use FP8 ("model.fp8=False", "fp8 false", "FP8 off", "no FP8";
#: a value, not a number that starts with 0 such as a scale of 0.5), removed before the precision
#: cell is searched for "fp8".
NOT_FP8 = r"\bfp8\s*[=:]?\s*(no|false|off|none|0(?!\.\d))\b|\b(no|not|without)\s+fp8\b"
FUSED_WORDS = (r"\bcompile\b", r"transformer engine", r"\(te\)", r"fp8", r"^nemo-perf", r"^megatron-bridge",
               r"userbuffers", r"ub_tp_comm_overlap")
#: Words that name a stack running the card generation's own fused attention kernels
#: (``native_attention``): Transformer Engine's DotProductAttention (Megatron-Core, NeMo,
#: Megatron-Bridge) prefers cuDNN's fused attention on Hopper, and rows that name such kernels.
#: Everything else runs a portable kernel (FlashAttention-2, SDPA's flash backend).
NATIVE_ATTENTION_WORDS = (r"transformer engine", r"\(te\)", r"megatron-core", r"^nemo-", r"^megatron-bridge",
                          r"flash-?attention-?3", r"\bfa3\b", r"cudnn")
#: Sources whose runs predate fused attention kernels (FlashAttention appeared in May 2022 and
#: reached Megatron-LM in 2023): their attention ran the unfused math path (the whole s×s
#: square and its softmax in memory). Cards without FlashAttention-2 run it too. Megatron-LM and
#: Megatron-DeepSpeed runs of 2021–2022 on A100s: Narayanan et al. 2021, MT-NLG (trained 2021),
#: NeMo Megatron's launcher tables of 2022-06 and 2022-09, BLOOM's tr11 (2022: its logs, and its
#: layout search of 2022-02 on the same Megatron-DeepSpeed fork), GLM-130B (2022).
PRE_FLASH_SOURCES = ("megatron-korthikanti-2022", "oneflow-dlperf-megatron-v100", "megatron-narayanan-2021",
                     "mt-nlg-530b-2022", "nemo-megatron-launcher-readme-2022-06",
                     "nemo-megatron-launcher-readme-2022-09", "bloom-tr11-logs", "bigscience-tr11-prequel-2022",
                     "glm-130b-paper-2022")


@dataclass(frozen=True)
class ThroughputCase:
    """One measured run, read into the time model's arguments."""

    id: str
    source: str
    model: str
    gpu: str
    method: str
    measured: float  # tokens/s per GPU
    before: float | None  # the prediction recorded when the row was added (planner.validate.before)
    mf: ModelFlops
    gpu_spec: GpuSpec
    x: dict[str, Any]
    tokens_per_step: float
    gpus: int
    gpus_per_node: int


def lenient_num(row: dict[str, str], key: str, default: float | None = None) -> float | None:
    """A cell as a number; ``default`` where it is blank or not a number."""
    text = (row.get(key) or "").strip()
    try:
        return float(text) if text else default
    except ValueError:
        return default


def _model(row: dict[str, str]) -> ModelSpec:
    """The catalog model the row names, else its architecture (rows.model_of), else its columns."""
    name = row.get("planner_model", "").strip()
    if name and name != "explicit":
        try:
            return catalog.get_model(name)
        except catalog.UnknownName as exc:
            raise Unmodelable(str(exc)) from None
    try:
        return ModelSpec.model_validate(model_of(row))
    except Unmodelable:
        pass
    cols = {k: int(lenient_num(row, k)) for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
            if lenient_num(row, k) is not None}
    if not {"layers", "hidden"} <= set(cols):
        raise Unmodelable("model: neither a catalog name nor layers and hidden")
    gated = row.get("gated_mlp", "").strip().lower() in ("yes", "true", "1")
    tied = row.get("tied_embeddings", "").strip().lower() in ("yes", "true", "1")
    spec = {"id": row["model"].strip().lower(), **cols, "gated_mlp": gated, "tied_embeddings": tied}
    if not gated:  # GPT-style: LayerNorm, learned positions
        spec.update(norm="layernorm", position="learned", max_position=int(lenient_num(row, "seq_len")))
    if lenient_num(row, "params_b") is not None and not {"heads", "vocab"} <= set(cols):
        spec["params_b"] = lenient_num(row, "params_b")
    return ModelSpec.model_validate(spec)


def checkpointing_of(text: str) -> int:
    """0 none, 1 selective, 2 full; an unstated recipe default is read as none."""
    t = text.strip().lower()
    if t.startswith("selective"):
        return 1
    if t.startswith("full"):
        return 2
    return 0


def _virtual_stages(row: dict[str, str], model: ModelSpec) -> int:
    notes = row.get("notes", "")
    found = re.search(r"\bVP\s*=\s*(\d+)", notes)
    if found:
        return int(found.group(1))
    # Korthikanti et al.: "interleaved schedule m=3 for 175B/530B".
    found = re.search(r"interleaved schedule m=(\d+) for ([\w/]+)", notes)
    if found and any(size.lower() in row.get("model", "").lower() + row.get("planner_model", "")
                     for size in found.group(2).split("/")):
        return int(found.group(1))
    return 1


def _stack_text(row: dict[str, str]) -> str:
    """What a row says of its stack: source, precision and notes, lower case; NeMo AutoModel's
    "TE +" (a few Transformer Engine modules inside Hugging Face model code) left out."""
    text = " ".join((row.get("source", ""), row.get("precision", ""), row.get("notes", ""))).lower()
    if row.get("source", "").startswith("nemo-automodel"):
        text = text.replace("nemo-automodel", "automodel").replace("te +", "")
    return text


def _fused(row: dict[str, str]) -> bool:
    text = re.sub(NOT_FP8, "", re.sub(NOT_COMPILED, "", _stack_text(row)))
    return any(re.search(w, text) for w in FUSED_WORDS)


#: Words that name hand-written fused kernels a stack swaps into eager model code (the time
#: model's ``kernel_vectors``): a fused RMSNorm (fms-acceleration's Unsloth-derived
#: ``fast_rms_layernorm``, flash-attn's, torchtitan's or Liger's fused RMSNorm), a fused rotary
#: embedding (``fast_rope_embeddings``, flash-attn's rotary kernel), a fused SwiGLU (xformers');
#: Liger's kernels switched on as a whole all three, as a plan's ``kernels: liger`` (its loss
#: alone names nothing). A word inside another ("unfused", ``use_fused_rms_norm``), after "non-",
#: "no" or "without", or followed by a false or off value names nothing.
_NOT_BEFORE = r"(?<![\w-])(?<!non-)(?<!no )(?<!without )"
_NOT_AFTER = r"(?!\w)(?!\s*[:=]\s*(?:false|0|off|no)\b)(?!\s+off\b)"


def _named(*words: str) -> tuple[str, ...]:
    return tuple(_NOT_BEFORE + w + _NOT_AFTER for w in words)


_LIGER = (r"liger kernels? on", r"(?:use|enable)_liger_kernel\s*[=:]?\s*true")


KERNEL_WORDS = {
    "norm": _named(r"fast_rms_layernorm", r"fused[-_ ]?rms[-_ ]?norm", r"rms[-_ ]?norm fusion", *_LIGER),
    "rope": _named(r"fast_rope(?:_embeddings)?", r"fused[-_ ]?rotary", r"fused[-_ ]?rope", *_LIGER),
    "swiglu": _named(r"fused[-_ ]?swiglu", *_LIGER)}


def _kernel_vectors(row: dict[str, str], mf: ModelFlops) -> float:
    """The element-wise traffic the fused kernels a row names save (:data:`KERNEL_WORDS`)."""
    text = _stack_text(row)
    named = {k: any(re.search(w, text) for w in words) for k, words in KERNEL_WORDS.items()}
    return timing.fused_kernel_vectors(mf, named["norm"], named["rope"], named["swiglu"])


#: Stacks whose selective checkpointing is op-level (torchtitan's ``selective_ac_option: op``
#: policy: every second matmul rerun), named in a row's source, precision or notes; elsewhere it
#: is Megatron's core-attention recomputation (Korthikanti et al. 2022).
OP_SELECTIVE_WORDS = (r"torchtitan", r"torchao")


def _selective_op(row: dict[str, str]) -> bool:
    return any(re.search(w, _stack_text(row)) for w in OP_SELECTIVE_WORDS)


#: Words by which a row says its expert-parallel all-to-alls overlapped another micro-batch's
#: compute (Megatron-Core's batch-level overlap; DeepSeek's DualPipe).
EP_OVERLAP_WORDS = ("overlap_moe_expert_parallel_comm", "ep a2a overlap", "dualpipe")


def _ep_overlap(row: dict[str, str]) -> bool:
    return any(w in _text(row) for w in EP_OVERLAP_WORDS)


def _native_attention(row: dict[str, str]) -> bool:
    return any(re.search(w, _stack_text(row)) for w in NATIVE_ATTENTION_WORDS)


def _text(row: dict[str, str]) -> str:
    return " ".join((row.get("precision", ""), row.get("notes", ""))).lower()


def adapter_dtype_of(row: dict[str, str]) -> str:
    """``fp32`` where the row says its adapters were FP32 (PEFT's default), else ``compute``:
    the LoRA rows of the other sources run their adapters in the 16-bit compute dtype
    (DeepSpeed's and Megatron's BF16 engines cast every parameter; torchtune builds them so)."""
    return "fp32" if re.search(r"fp32 (peft )?adapters", _text(row)) else "compute"


def optimizer_bytes_of(row: dict[str, str]) -> float:
    """Bytes per parameter of the row's optimizer step: torch's foreach AdamW where the row says
    so, else a fused step; states in BF16 where the row says they are (in the parameters' dtype,
    the parameters BF16), else FP32 beside a 16-bit weight copy."""
    text = _text(row)
    bf16_states = bool(re.search(r"states in (the parameters' dtype|bf16)", text)) and "bf16" in text
    # one tensor at a time: the foreach step's passes, kernel by kernel
    stepwise = "foreach" in text or "one tensor at a time" in text
    return timing.optimizer_bytes_per_param("foreach" if stepwise else "fused", 2.0 if bf16_states else 4.0)


def named_lora_targets(row: dict[str, str]) -> tuple[str, ...] | None:
    """The LoRA-adapted modules the row's notes name ("LoRA rank 16 on q,v", "on all linear"),
    the ones a dense layer has; None where the notes name none."""
    found = re.search(r"lora rank \d+ on (all linear|[a-z]+(?:,[a-z]+)*)", row.get("notes", "").lower())
    if found is None:
        return None
    named = found.group(1)
    targets = LORA_TARGETS if named == "all linear" else tuple(t for t in named.split(",") if t in LORA_TARGETS)
    return targets or LORA_TARGETS


def targets_of(row: dict[str, str]) -> int:
    """LoRA-adapted linear modules per layer the row's notes name (all linear: 7; "q,v": 2)."""
    return len(named_lora_targets(row) or LORA_TARGETS)


def optimizer_host_s_of(row: dict[str, str], model: ModelSpec, method: str, targets: int) -> float:
    """Host seconds of an AdamW step that goes one tensor at a time (where the row says so):
    :data:`~planner.perf.timing.FOR_LOOP_LAUNCHES_PER_TENSOR` launches per trainable tensor —
    a full run's nine per layer (four attention and three MLP weights, two norms) and its
    embedding, head and final norm; a LoRA run's A and B per adapted module."""
    if "one tensor at a time" not in _text(row):
        return 0.0
    tensors = model.layers * 9 + 3 if method == "full" else model.layers * 2 * targets
    return tensors * timing.FOR_LOOP_LAUNCHES_PER_TENSOR * timing.HOST_S_PER_LAUNCH


def lora_params_of(row: dict[str, str], model: ModelSpec, rank: int) -> tuple[float, float, float]:
    """Adapter parameters, those a token passes through (a MoE model's active experts' only) and
    the routed experts' (0 where the count is not exact): exact over the modules the notes name
    ("LoRA rank 16 on q,v", "on all linear") for a model the catalog describes in full, else
    L·18·r·H."""
    targets = named_lora_targets(row)
    if targets is None or not has_full_architecture(model):
        rule = float(seed_lora_params(model, rank))
        return rule, rule, 0.0
    c = lora_param_counts(model, rank, targets)
    return float(c.total), float(c.active), float(c.experts)


#: The generation arguments of a row that generates nothing (every row carries the same keys, so
#: rows stack into arrays): no completions, and harmless sizes.
NO_GENERATION = {"gen_completion_len": 0, "gen_completion_cap": 0, "gen_prompt_len": 1, "gen_num_generations": 1, "gen_tp": 1, "gen_gpus": 0,
                 "gen_fraction": 0.3, "gen_weight_bytes": 1.0, "gen_kv_bytes_per_token": 1.0, "reference_forward": 0,
                 "gen_sleep": 0, "gen_sleep_level": 2, "gen_rollout_offload": 0, "gen_async": 0}


def _generation(row: dict[str, str], model: ModelSpec, seq: int) -> dict[str, Any]:
    """A GRPO row's generation arguments (planner.perf.timing.generation_s), read as the memory
    rows read it (planner.validate.rows) into the scenario's own models: its completions (at the
    length the row gives: a mean where the source states one, the cap bounding the longest), the
    group, the engine's GPUs (0: colocated), share and tensor parallelism, the phases that swap,
    and the forwards beside training: the reference's where beta > 0, the old log-probs'."""
    from pydantic import ValidationError

    from planner.core.specs import Layout, Recipe, Workload
    from planner.perf.arguments import forwards_beside_training, generation_arguments
    from planner.validate.rows import grpo_engine, grpo_phases, grpo_workload

    keys = {k: v for k, v in grpo_workload(row).items() if k != "global_batch"}
    completion = keys["completion_len"]
    if completion >= seq:
        raise Unmodelable("completion_len: a GRPO row needs a completion shorter than seq_len")
    prompt = int(lenient_num(row, "prompt_len", seq - completion))  # seq_len: prompt + completion, capped
    try:
        wl = Workload(**keys, seq_len=prompt + completion)
        lay, recipe = Layout(**grpo_engine(row)), Recipe(**grpo_phases(row))
    except ValidationError as exc:
        raise Unmodelable(f"generation: {exc.errors()[0]['msg']}") from None
    return {**generation_arguments(model, wl, lay, recipe), "gen_completion_cap": max(completion, seq - prompt),
            "reference_forward": int(forwards_beside_training(wl, recipe.logprob_forward))}


def case_of(row: dict[str, str]) -> ThroughputCase:
    """The time model's arguments a row describes (raises :class:`Unmodelable`)."""
    method = row["method"].strip().lower()
    if method not in ("full", "lora", "qlora"):
        raise Unmodelable(f"method {method!r}: only full, lora and qlora runs are modelled")
    try:
        gpu = catalog.get_gpu(row["planner_gpu"].strip())
    except catalog.UnknownName as exc:
        raise Unmodelable(str(exc)) from None
    model = _model(row)
    mf = model_flops(model)
    notes = row.get("notes", "")
    tp, pp, cp = (int(lenient_num(row, k, 1)) for k in ("tp", "pp", "cp"))
    gpus = int(lenient_num(row, "gpus", 1))
    grpo = row.get("algorithm", "").strip().lower() == "grpo"
    served = int(lenient_num(row, "generation_gpus", 0)) if grpo else 0  # an engine's own GPUs, among gpus
    dp = int(lenient_num(row, "dp", (gpus - served) // (tp * pp * cp)))
    ep = expert_degree(notes) if model.moe is not None else 1
    seq, mb = int(lenient_num(row, "seq_len")), int(lenient_num(row, "micro_batch", 1))
    # unstated accumulation: what the stated global batch implies (global = mb·dp·ga), else 1
    ga = int(lenient_num(row, "grad_accum", max(1, int(lenient_num(row, "global_batch", 0)) // (mb * dp))))
    mbs = re.search(r"micro_batch column holds LBS.*?MBS\s*=\s*(\d+)", notes)
    if mbs and int(mbs.group(1)) < mb and mb % int(mbs.group(1)) == 0:  # NeMo AutoModel: LBS, MBS
        ga, mb = ga * (mb // int(mbs.group(1))), int(mbs.group(1))
    sharding = row.get("zero_fsdp", "")
    zero = zero_stage_of(sharding)
    offload = 2 if re.search(r"offload", re.sub(NOT_OFFLOADED, "", sharding.lower())) else 0
    if offload:
        zero = 3
    code = {"full": 0, "lora": 1, "qlora": 2}[method]
    rank = int(lenient_num(row, "lora_rank", DEFAULT_LORA_RANK))
    n_lora, n_active, n_experts = (0.0, 0.0, 0.0) if code == 0 else lora_params_of(row, model, rank)
    fp8 = "fp8" in re.sub(NOT_FP8, "", row.get("precision", "").lower())
    x = {"method": code, "checkpointing": checkpointing_of(row.get("checkpointing", "")), "offload": offload,
             "zero": zero, "seq_len": seq, "micro_batch": mb, "grad_accum": ga, "tp": tp, "pp": pp, "cp": cp, "dp": dp, "ep": ep,
             "n_lora": n_lora, "n_lora_active": n_active, "n_lora_experts": n_experts, "weight_bytes": 0.5 if code == 2 else 2.0, "vp": _virtual_stages(row, model),
             "fp8": int(fp8 and gpu.fp8_dense_tflops is not None), "quant": int(code == 2),
             "fused": int(_fused(row)), "native_attention": int(_native_attention(row)),
             "ep_overlap": int(_ep_overlap(row)),
             "selective_op": int(_selective_op(row)), "kernel_vectors": _kernel_vectors(row, mf),
             "adapter_bytes": 0.0 if code == 0 else timing.adapter_bytes_per_token(n_active, rank, adapter_dtype_of(row)),
             "optimizer_bytes": optimizer_bytes_of(row),
             "optimizer_host_s": optimizer_host_s_of(row, model, method, targets_of(row)),
             "attention": int(gpu.supports_flash_attn2 and row["source"].strip() not in PRE_FLASH_SOURCES)}
    # the experts' own TP where the row states one (MoE parallel folding; 0: split like tp)
    x["etp"] = expert_tensor_degree(notes) or 0
    if grpo:
        gen = _generation(row, model, seq)
        # trained on the tokens generated (prompt + completion as the row gives them: a mean where
        # it states one), the cap only bounding the longest completion
        seq = gen["gen_prompt_len"] + gen["gen_completion_len"]
        x.update(gen, seq_len=seq)
    else:
        x.update(NO_GENERATION)
    node = int(lenient_num(row, "gpus_per_node", gpu.gpus_per_node) or gpu.gpus_per_node)
    measured = lenient_num(row, "tokens_per_s_per_gpu")
    if measured is None or measured <= 0:
        raise Unmodelable("tokens_per_s_per_gpu: missing")
    return ThroughputCase(row["id"], row["source"].strip(), row["model"].strip(), gpu.id, method,
                          measured, recorded(row, THROUGHPUT_COLUMN, THROUGHPUT_SCALE), mf, gpu, x, float(mb * dp * ga * seq), gpus, min(node, gpus))
