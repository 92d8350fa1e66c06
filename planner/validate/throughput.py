"""``planner validate --kind throughput``: predict the tokens/s per GPU of measured training runs.

Each row of ``data/measured_throughput.csv`` states a run's model, card, layout, batch, method,
precision and recompute; this module reads them into the arguments of
:func:`planner.perf.timing.step_time_s` and predicts tokens/s per GPU =
micro_batch · dp · grad_accum · seq_len / (step time · GPUs). The figures: median absolute
percentage error (MdAPE), shares within 10 % and 25 %, the share of measured values inside the
band the catalog's utilisation priors give, per source; and the same on the same rows for the
naive baseline "6N FLOPs per token at 40 % of the dense 16-bit peak".

``fit`` refits the time model's few parameters (:class:`planner.perf.timing.TimeParams`) by
minimising the median absolute log error (Nelder–Mead on log-parameters, pure numpy);
``--loso`` predicts each source with parameters fitted on the other sources only.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from planner import catalog
from planner.core.arch import LORA_TARGETS, exact_lora_params, has_full_architecture, seed_lora_params
from planner.core.errors import InputError
from planner.core.specs import GpuSpec, ModelSpec
from planner.perf import timing
from planner.perf.flops import ModelFlops, model_flops
from planner.perf.hardware import GpuPerf
from planner.perf.timing import PRIOR, TimeParams, step_time_s
from planner.validate.before import THROUGHPUT_COLUMN, THROUGHPUT_SCALE, figures, recorded
from planner.validate.cells import Unmodelable, read_csv
from planner.validate.rows import model_of
from planner.validate.sharding import zero_stage_of

REQUIRED_COLUMNS = ("id", "source", "model", "planner_model", "method", "planner_gpu", "gpus", "tp",
                    "pp", "cp", "dp", "seq_len", "micro_batch", "grad_accum", "tokens_per_s_per_gpu")
#: The naive baseline: 6N FLOPs per token (N: active parameters) at 40 % of the dense 16-bit peak.
BASELINE_MFU = 0.40
#: LoRA rank where a row does not state it (NeMo's LoRA recipes use 32; PEFT's default is 8).
DEFAULT_LORA_RANK = 16
#: Parameters the fit moves, each within bounds (the fit works on their logarithms).
#: Each is the physical range its docstring in :class:`planner.perf.timing.TimeParams` gives.
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_hfu": (0.2, 0.70),
    "elementwise_vectors": (250.0, 600.0),
    "fp8_efficiency": (0.3, 1.0),
    "microbatch_half_tokens": (1.0, 4096.0),
    "moe_route_vectors": (5.0, 60.0),
    "fused_elementwise_share": (0.1, 1.0),
    "attention_efficiency": (0.4, 1.0),
    "launch_s_per_layer": (0.0005, 0.005),
}
#: Words that name a stack fusing element-wise ops into its GEMMs and neighbours: torch.compile,
#: and Megatron-Core's Transformer Engine layers (fused norm-linear, bias-activation, FP8 casts),
#: which NeMo and Megatron-Bridge run and which any FP8 recipe needs. Stacks that use a few TE
#: modules inside Hugging Face model code (NeMo AutoModel) keep their unfused element-wise ops.
#: Phrases that say a run was *not* compiled (removed before :data:`FUSED_WORDS` are looked for).
NOT_COMPILED = r"compile\s*[=:]\s*(no|false|off)|\b(no|not|without)\s+(torch\.)?compile\b"
#: Phrases that say a run did *not* offload ("no CPU offload", "offload: false"), removed before
#: the sharding cell is searched for "offload".
NOT_OFFLOADED = r"\b(no|not|without)\s+(cpu\s+)?offload\w*|offload\w*\s*[=:]\s*(no|false|off|none)"
FUSED_WORDS = (r"\bcompile\b", r"transformer engine", r"\(te\)", r"fp8", r"^nemo-perf", r"^megatron-bridge")
#: Sources whose runs predate fused attention kernels (FlashAttention appeared in May 2022 and
#: reached Megatron-LM in 2023): their attention ran the unfused math path (the whole s×s
#: square and its softmax in memory). Cards without FlashAttention-2 run it too.
PRE_FLASH_SOURCES = ("megatron-korthikanti-2022", "oneflow-dlperf-megatron-v100")


# --------------------------------------------------------------------------------------------
# Rows -> step-time arguments


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


def _num(row: dict[str, str], key: str, default: float | None = None) -> float | None:
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
    cols = {k: int(_num(row, k)) for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
            if _num(row, k) is not None}
    if not {"layers", "hidden"} <= set(cols):
        raise Unmodelable("model: neither a catalog name nor layers and hidden")
    gated = row.get("gated_mlp", "").strip().lower() in ("yes", "true", "1")
    tied = row.get("tied_embeddings", "").strip().lower() in ("yes", "true", "1")
    spec = {"id": row["model"].strip().lower(), **cols, "gated_mlp": gated, "tied_embeddings": tied}
    if not gated:  # GPT-style: LayerNorm, learned positions
        spec.update(norm="layernorm", position="learned", max_position=int(_num(row, "seq_len")))
    if _num(row, "params_b") is not None and not {"heads", "vocab"} <= set(cols):
        spec["params_b"] = _num(row, "params_b")
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


def _fused(row: dict[str, str]) -> bool:
    text = " ".join((row.get("source", ""), row.get("precision", ""), row.get("notes", ""))).lower()
    if row.get("source", "").startswith("nemo-automodel"):
        text = text.replace("te +", "")
    text = re.sub(NOT_COMPILED, "", text)
    return any(re.search(w, text) for w in FUSED_WORDS)


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


def lora_params_of(row: dict[str, str], model: ModelSpec, rank: int) -> float:
    """Adapter parameters: exact over the modules the notes name ("LoRA rank 16 on q,v", "on all
    linear") for a dense model the catalog describes in full, else L·18·r·H."""
    targets = named_lora_targets(row)
    if targets is None or model.moe is not None or not has_full_architecture(model):
        return float(seed_lora_params(model, rank))
    return float(exact_lora_params(model, rank, targets))


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
    tp, pp, cp = (int(_num(row, k, 1)) for k in ("tp", "pp", "cp"))
    gpus = int(_num(row, "gpus", 1))
    dp = int(_num(row, "dp", gpus // (tp * pp * cp)))
    ep_found = re.search(r"\bEP\s*=\s*(\d+)", notes)
    ep = int(ep_found.group(1)) if ep_found and model.moe is not None else 1
    seq, mb = int(_num(row, "seq_len")), int(_num(row, "micro_batch", 1))
    # unstated accumulation: what the stated global batch implies (global = mb·dp·ga), else 1
    ga = int(_num(row, "grad_accum", max(1, int(_num(row, "global_batch", 0)) // (mb * dp))))
    mbs = re.search(r"micro_batch column holds LBS.*?MBS\s*=\s*(\d+)", notes)
    if mbs and int(mbs.group(1)) < mb and mb % int(mbs.group(1)) == 0:  # NeMo AutoModel: LBS, MBS
        ga, mb = ga * (mb // int(mbs.group(1))), int(mbs.group(1))
    sharding = row.get("zero_fsdp", "")
    zero = zero_stage_of(sharding)
    offload = 2 if re.search(r"offload", re.sub(NOT_OFFLOADED, "", sharding.lower())) else 0
    if offload:
        zero = 3
    code = {"full": 0, "lora": 1, "qlora": 2}[method]
    rank = int(_num(row, "lora_rank", DEFAULT_LORA_RANK))
    n_lora = 0.0 if code == 0 else lora_params_of(row, model, rank)
    fp8 = "fp8" in row.get("precision", "").lower()
    x = {"method": code, "checkpointing": checkpointing_of(row.get("checkpointing", "")), "offload": offload,
             "zero": zero, "seq_len": seq, "micro_batch": mb, "grad_accum": ga, "tp": tp, "pp": pp, "cp": cp, "dp": dp, "ep": ep,
             "n_lora": n_lora, "weight_bytes": 0.5 if code == 2 else 2.0, "vp": _virtual_stages(row, model),
             "fp8": int(fp8 and gpu.fp8_dense_tflops is not None), "quant": int(code == 2),
             "fused": int(_fused(row)),
             "adapter_bytes": 0.0 if code == 0 else timing.adapter_bytes_per_token(n_lora, rank, adapter_dtype_of(row)),
             "optimizer_bytes": optimizer_bytes_of(row),
             "optimizer_host_s": optimizer_host_s_of(row, model, method, targets_of(row)),
             "attention": int(gpu.supports_flash_attn2 and row["source"].strip() not in PRE_FLASH_SOURCES)}
    node = int(_num(row, "gpus_per_node", gpu.gpus_per_node) or gpu.gpus_per_node)
    measured = _num(row, "tokens_per_s_per_gpu")
    if measured is None or measured <= 0:
        raise Unmodelable("tokens_per_s_per_gpu: missing")
    return ThroughputCase(row["id"], row["source"].strip(), row["model"].strip(), gpu.id, method,
                          measured, recorded(row, THROUGHPUT_COLUMN, THROUGHPUT_SCALE), mf, gpu, x, float(mb * dp * ga * seq), gpus, min(node, gpus))


# --------------------------------------------------------------------------------------------
# Vectorised prediction over many cases


@dataclass
class Batch:
    """Cases stacked into arrays, so one call of the time model predicts them all."""

    cases: list[ThroughputCase]
    mf: ModelFlops
    perf: GpuPerf
    x: dict[str, np.ndarray]
    tokens_per_step: np.ndarray
    gpus: np.ndarray
    measured: np.ndarray
    util_low: np.ndarray
    util_high: np.ndarray
    peak: np.ndarray

    @classmethod
    def of(cls, cases: list[ThroughputCase]) -> Batch:
        mf = ModelFlops(*(np.array([getattr(c.mf, f.name) for c in cases], dtype=float)
                          for f in fields(ModelFlops)))
        perfs = [replace(GpuPerf.of(c.gpu_spec), gpus_per_node=c.gpus_per_node) for c in cases]
        perf = GpuPerf(*(np.array([getattr(p, f.name) for p in perfs], dtype=float) for f in fields(GpuPerf)))
        x = {k: np.array([c.x[k] for c in cases]) for k in cases[0].x}
        return cls(cases, mf, perf, x, np.array([c.tokens_per_step for c in cases]),
                   np.array([c.gpus for c in cases], dtype=float), np.array([c.measured for c in cases]),
                   np.array([c.gpu_spec.utilization_low for c in cases]),
                   np.array([c.gpu_spec.utilization_high for c in cases]),
                   np.array([(c.gpu_spec.peak_tflops_16bit or 0.0) * 1e12 for c in cases]))

    def predict(self, params: TimeParams, utilization: np.ndarray | None = None) -> np.ndarray:
        """Tokens/s per GPU; ``utilization`` per case (default: the fitted ``gemm_hfu``; another
        value moves the memory-bound kernels by the same ratio, as the catalog band does)."""
        util = np.full(len(self.cases), params.gemm_hfu) if utilization is None else utilization
        perf = replace(self.perf, utilization=util, kernel_speed=util / params.gemm_hfu)
        step = step_time_s(self.mf, perf, params, **self.x)
        return self.tokens_per_step / (step * self.gpus)

    def baseline(self) -> np.ndarray:
        """6N at 40 % of the dense 16-bit peak."""
        return BASELINE_MFU * self.peak / (6.0 * self.mf.active_params)

    def take(self, mask: np.ndarray) -> Batch:
        idx = np.flatnonzero(mask)
        pick = lambda v: v[idx]
        return Batch([self.cases[i] for i in idx],
                     ModelFlops(*(pick(getattr(self.mf, f.name)) for f in fields(ModelFlops))),
                     GpuPerf(*(pick(np.asarray(getattr(self.perf, f.name))) for f in fields(GpuPerf))),
                     {k: pick(v) for k, v in self.x.items()}, pick(self.tokens_per_step), pick(self.gpus),
                     pick(self.measured), pick(self.util_low), pick(self.util_high), pick(self.peak))


# --------------------------------------------------------------------------------------------
# Fitting


def _nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, *, iters: int = 400,
                 step: float = 0.3, tol: float = 1e-6) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (the textbook simplex method; a few hundred evaluations)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(s) for s in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        reflected = centroid + (centroid - worst)
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - worst)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (worst - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (s - best) for s in simplex[1:]]
                values = [values[0]] + [f(s) for s in simplex[1:]]
    return simplex[int(np.argmin(values))]


def fit(batch: Batch, start: TimeParams = PRIOR, names: tuple[str, ...] | None = None) -> TimeParams:
    """Parameters minimising the mean absolute log error of the predictions (a median-like,
    outlier-robust loss), each kept within :data:`FIT_BOUNDS`. A parameter the rows cannot
    inform (FP8 efficiency without FP8 rows) keeps its starting value."""
    names = names or tuple(FIT_BOUNDS)
    if not bool(np.any(batch.x["fp8"])):
        names = tuple(n for n in names if n != "fp8_efficiency")
    lo = np.log([FIT_BOUNDS[n][0] for n in names])
    hi = np.log([FIT_BOUNDS[n][1] for n in names])
    log_measured = np.log(batch.measured)

    def params_of(v: np.ndarray) -> TimeParams:
        v = np.clip(v, lo, hi)
        return replace(start, **{n: float(math.exp(val)) for n, val in zip(names, v)})

    def loss(v: np.ndarray) -> float:
        pred = batch.predict(params_of(v))
        err = np.abs(np.log(pred) - log_measured)
        return float(np.mean(err)) + 1e-3 * float(np.sum(np.maximum(np.abs(v - np.clip(v, lo, hi)), 0)))

    x0 = np.clip(np.log(np.maximum([getattr(start, n) for n in names], 1e-12)), lo, hi)
    best = _nelder_mead(loss, x0)
    best = _nelder_mead(loss, best, step=0.1)  # restart: the simplex may have collapsed early
    return params_of(best)


# --------------------------------------------------------------------------------------------
# Scoring


@dataclass(frozen=True)
class ThroughputResult:
    id: str
    source: str
    model: str
    gpu: str
    method: str
    measured: float
    predicted: float | None
    low: float | None  # band: the catalog's utilisation_low
    high: float | None
    baseline: float | None
    reason: str | None = None
    before: float | None = None  # the prediction recorded when the row was added

    @property
    def signed_error(self) -> float | None:
        return None if self.predicted is None else (self.predicted - self.measured) / self.measured

    @property
    def ape(self) -> float:
        return 1.0 if self.predicted is None else abs(self.predicted - self.measured) / self.measured

    @property
    def baseline_ape(self) -> float:
        return 1.0 if self.baseline is None else abs(self.baseline - self.measured) / self.measured

    @property
    def in_band(self) -> bool:
        return self.low is not None and min(self.low, self.high) <= self.measured <= max(self.low, self.high)


def read_rows(path: str | Path) -> list[dict[str, str]]:
    return read_csv(path, REQUIRED_COLUMNS)


def cases_of(rows: list[dict[str, str]]) -> tuple[list[ThroughputCase], list[ThroughputResult]]:
    """The modelled cases, and a result (with its reason) for every row that is not."""
    cases, unmodelled = [], []
    for row in rows:
        try:
            cases.append(case_of(row))
        except (Unmodelable, InputError, ValueError) as exc:
            reason = "; ".join(exc.problems) if isinstance(exc, InputError) else str(exc)
            unmodelled.append(ThroughputResult(row["id"], row.get("source", ""), row.get("model", ""),
                                               row.get("planner_gpu", ""), row.get("method", ""),
                                               _num(row, "tokens_per_s_per_gpu", 0.0) or 0.0,
                                               None, None, None, None, reason,
                                               recorded(row, THROUGHPUT_COLUMN, THROUGHPUT_SCALE)))
    return cases, unmodelled


def band_utilizations(batch: Batch, params: TimeParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(middle, low, high) utilisation per case: the catalog's band moved so that its middle is
    ``params.gemm_hfu`` (the band keeps the catalog's relative width)."""
    mid_catalog = np.sqrt(batch.util_low * batch.util_high)
    scale = params.gemm_hfu / mid_catalog
    return np.full(len(batch.cases), params.gemm_hfu), batch.util_low * scale, batch.util_high * scale


def results_of(batch: Batch, params: TimeParams) -> list[ThroughputResult]:
    mid, low, high = band_utilizations(batch, params)
    pred = batch.predict(params, mid)
    slow = batch.predict(params, low)
    fast = batch.predict(params, high)
    base = batch.baseline()
    return [ThroughputResult(c.id, c.source, c.model, c.gpu, c.method, c.measured, float(pred[i]),
                             float(slow[i]), float(fast[i]), float(base[i]), before=c.before)
            for i, c in enumerate(batch.cases)]


def summarize(results: list[ThroughputResult]) -> dict[str, Any]:
    if not results:
        return {"rows": 0}
    apes = [r.ape for r in results]
    base = [r.baseline_ape for r in results]
    signed = [r.signed_error for r in results if r.signed_error is not None]
    return {
        "rows": len(results),
        "modelled": len(signed),
        "median_ape": statistics.median(apes),
        "within_10": sum(a <= 0.10 for a in apes) / len(apes),
        "within_25": sum(a <= 0.25 for a in apes) / len(apes),
        "band_coverage": sum(r.in_band for r in results) / len(results),
        "median_signed": statistics.median(signed) if signed else None,
        "baseline_median_ape": statistics.median(base),
        "baseline_within_25": sum(a <= 0.25 for a in base) / len(base),
    }


def loso_results(batch: Batch, start: TimeParams = PRIOR) -> tuple[list[ThroughputResult], dict[str, TimeParams]]:
    """Each source predicted with the parameters fitted on all the other sources."""
    sources = sorted({c.source for c in batch.cases})
    out: dict[str, ThroughputResult] = {}
    fitted: dict[str, TimeParams] = {}
    src = np.array([c.source for c in batch.cases])
    for s in sources:
        params = fit(batch.take(src != s), start)
        fitted[s] = params
        for r in results_of(batch.take(src == s), params):
            out[r.id] = r
    return [out[c.id] for c in batch.cases], fitted


def report(results: list[ThroughputResult], unmodelled: list[ThroughputResult], params: TimeParams,
           *, loso: bool, fitted: dict[str, TimeParams] | None = None) -> dict[str, Any]:
    every = results + unmodelled
    sources = sorted({r.source for r in every})
    out = {
        "kind": "throughput",
        "mode": "leave-one-source-out" if loso else "in-sample",
        "params": asdict(params),
        **summarize(every),
        "by_source": {s: summarize([r for r in every if r.source == s]) for s in sources},
        "by_method": {m: summarize([r for r in every if r.method == m])
                      for m in sorted({r.method for r in every})},
        "unmodelled": [{"id": r.id, "reason": r.reason} for r in unmodelled],
        "before": before_figures(every),
        "results": [{**asdict(r), "signed_error": r.signed_error, "in_band": r.in_band} for r in every],
    }
    if fitted:
        out["params_by_held_out_source"] = {s: asdict(p) for s, p in fitted.items()}
    return out


def before_figures(results: list[ThroughputResult]) -> dict[str, Any] | None:
    """The error of the predictions recorded when the rows were added, beside the current one and
    the 6N@40 % baseline on the same rows, overall and per source (None: no row recorded one)."""
    def of(rs: list[ThroughputResult]) -> dict[str, Any] | None:
        out = figures((r.measured, r.before, r.predicted) for r in rs)
        if out is not None:
            out["baseline_median_ape"] = statistics.median(r.baseline_ape for r in rs if r.before is not None)
        return out

    overall = of(results)
    if overall is None:
        return None
    groups = {s: of([r for r in results if r.source == s]) for s in sorted({r.source for r in results})}
    return {**overall, "groups": {k: v for k, v in groups.items() if v is not None}}


def validate_file(path: str | Path | list[str | Path], *, loso: bool = False,
                  params: TimeParams | None = None) -> dict[str, Any]:
    """Score the time model on CSVs of measured runs (columns of data/measured_throughput.csv;
    several files are scored, and left out source by source, together)."""
    paths = path if isinstance(path, list) else [path]
    cases, unmodelled = cases_of([row for p in paths for row in read_rows(p)])
    if not cases:
        raise InputError([f"{', '.join(map(str, paths))}: no row could be modelled"])
    batch = Batch.of(cases)
    params = params or timing.FITTED
    if loso:
        results, fitted = loso_results(batch, timing.PRIOR)
        return report(results, unmodelled, params, loso=True, fitted=fitted)
    return report(results_of(batch, params), unmodelled, params, loso=False)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def render_tables(result: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    title = f"Throughput ({result['mode']}): tokens/s per GPU, model vs 6N at 40 % of peak"
    t = Table(title=title)
    for col in ("rows", "scope", "MdAPE", "≤10 %", "≤25 %", "in band", "signed", "6N@40 % MdAPE"):
        t.add_column(col, justify="right" if col not in ("scope",) else "left")
    scopes = [("all", result)] + [(s, v) for s, v in result["by_source"].items()]
    scopes += [(f"method {m}", v) for m, v in result["by_method"].items()]
    for name, s in scopes:
        t.add_row(str(s["rows"]), name, _pct(s["median_ape"]), _pct(s["within_10"]), _pct(s["within_25"]),
                  _pct(s["band_coverage"]), _pct(s["median_signed"]), _pct(s["baseline_median_ape"]))
    out: list[Any] = [t]
    if result["unmodelled"]:
        u = Table(title="Rows not modelled")
        u.add_column("id")
        u.add_column("reason")
        for r in result["unmodelled"]:
            u.add_row(r["id"], r["reason"])
        out.append(u)
    if result.get("before"):
        b = Table(title="Before any fit: the prediction recorded when each row was added (an unseen error) "
                        "vs now and vs 6N@40 %, on the same rows")
        for col in ("rows", "scope", "MdAPE before", "≤10 %", "≤25 %", "signed", "MdAPE now", "6N@40 % MdAPE"):
            b.add_column(col, justify="right" if col != "scope" else "left")
        for name, s in [("all", result["before"]), *result["before"]["groups"].items()]:
            b.add_row(str(s["rows"]), name, _pct(s["before_median_ape"]), _pct(s["before_within_10"]),
                      _pct(s["before_within_25"]), _pct(s["before_median_signed"]), _pct(s["now_median_ape"]),
                      _pct(s["baseline_median_ape"]))
        out.append(b)
    p = Table(title="Time-model parameters used" + (" (LOSO refits them per held-out source)"
                                                    if result["mode"] != "in-sample" else ""))
    p.add_column("parameter")
    p.add_column("value", justify="right")
    for k, v in result["params"].items():
        p.add_row(k, f"{v:.4g}")
    out.append(p)
    return out
