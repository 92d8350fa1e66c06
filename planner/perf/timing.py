"""Time and cost of a training job: FLOPs, utilisation, pipeline bubble, communication, offload.

Pure formulas on numpy arrays or scalars (the search evaluates many layouts at once; a single
plan is the same code on scalars). Every constant is named here with its source; the few that
were fitted to measured runs say so, with the fitted value and the data
(``planner validate --kind throughput data/measured_throughput.csv`` refits and scores them).
The FLOPs a token costs are planner.perf.flops; a GPU's figures and the collectives over its
links, planner.perf.hardware.

**One definition of utilisation.** ``utilization`` (the catalog's ``utilization_low/high``
band, its geometric middle used by default) is the *hardware-FLOPs utilisation of the
tensor-core work*: FLOPs the GPU actually executes in matrix multiplies and attention —
recomputation included, causal attention counted as executed (half the s² square) — divided
by the time those kernels take and the card's dense 16-bit peak. Everything else a step spends
is modelled on its own, never folded into that number: the memory-bound element-wise work
(norms, activations, residuals, rotary, casts) over the card's memory bandwidth, exposed
communication, the pipeline bubble, the optimizer step, offload, QLoRA dequantisation.
Recomputation is therefore charged once, as the FLOPs it executes. FP8 runs execute their
linear layers at the card's FP8 peak (× :data:`TimeParams.fp8_efficiency`); attention stays
16-bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.core.codes import FULL, QLORA
from planner.core.units import nodes_for, zero_degree
from planner.perf.flops import (
    CAUSAL_SHARE,
    FORWARD_FLOPS_PER_PARAM,
    FORWARD_SHARE,
    ModelFlops,
    attention_flops_per_token,
    expert_active_share,
    gemm_width_efficiency,
    linear_flops_per_token,
)
from planner.perf.hardware import GpuPerf, group_collective_s, ring_allreduce_s

# --------------------------------------------------------------------------------------------
# Named constants (physics and stated priors)

#: Memory-bound element-wise work per token and layer, in units of one hidden vector of 16-bit
#: values (2·d bytes) read or written, forward + backward: RMSNorm/LayerNorm, SwiGLU/GELU,
#: residual adds, rotary, dropout, casts. A count of the tensors each op touches gives ≈ 60–90
#: (forward ≈ 25, backward about twice); the fitted value is in :data:`FITTED`. Full
#: recomputation repeats the forward's third. Sequence parallelism (any TP here) splits it by tp.
#: QLoRA dequantisation: every frozen 4-bit weight is read (0.5 B), written as 16 bits (2 B) and
#: read again by the GEMM (2 B) in each pass that uses it: forward, backward, and the
#: recomputed forward. Memory-bound, so charged over the card's bandwidth (bitsandbytes
#: ``dequantize_4bit``, torchao NF4, GPTQ's dequantising kernels all move these bytes).
DEQUANT_BYTES_PER_PARAM = 4.5
#: Bytes per parameter of the stored weights that ZeRO-3 gathers and parameter offload move: 16
#: bits, or the 4-bit base of QLoRA (method code 2; its quantization scales, under 13 % more, are
#: left out of the traffic).
WEIGHT_BYTES_16BIT, WEIGHT_BYTES_4BIT = 2.0, 0.5


def stored_weight_bytes(method: Any) -> Any:
    """Bytes per parameter of the weights a ZeRO-3 gather or an offload moves, by method code."""
    return np.where(np.asarray(method) == 2, WEIGHT_BYTES_4BIT, WEIGHT_BYTES_16BIT)
#: Eager (unfused) attention materialises the s×s scores: bytes moved per score element, forward
#: and backward: the scores written (2) and read by softmax (2), probabilities written (2) and read
#: by the AV GEMM (2); backward reads them (2), writes and reads dP (4) and dS (4) and the
#: softmax backward reads P again (2) ≈ 20 (16-bit).
EAGER_SCORE_BYTES = 20.0
#: Bytes the optimizer step moves per trainable parameter (of this GPU's shard): mixed-precision
#: AdamW reads FP32 master, m, v and the gradient and writes master, m, v and the 16-bit weight
#: (4·3 + 2 read, 4·3 + 2 written ≈ 28). Memory-bound, once per optimizer step.
OPTIMIZER_BYTES_PER_PARAM = 28.0
#: torch's default (``foreach``, not fused) AdamW: eight ``_foreach_`` kernels per step, each a
#: pass over a state-sized tensor list — decay (read/write the weight: 2), lerp of m (3), scale
#: and addcmul of v (2 + 3), sqrt, divide and add into a temporary (2 + 2 + 2), addcdiv into the
#: weight (4): 20 element reads and writes per parameter (torch/optim/adamw.py,
#: ``_multi_tensor_adamw``). The profile of an 8B and a 1B step on an H200 (data/README.md, "Where
#: an H200 step's time goes") shows those kernels at 8 × 384 launches moving 3.2 of the card's
#: nominal 4.8 TB/s: :data:`FOREACH_BANDWIDTH_SHARE`, a measured share (physical range 0.5–0.95:
#: a plain device copy reaches 0.9).
FOREACH_ADAMW_PASSES = 20.0
#: A fused AdamW kernel reads weight, gradient, m and v and writes weight, m and v: 7 passes
#: (with 16-bit states, 14 bytes; with FP32 states and a 16-bit weight copy,
#: :data:`OPTIMIZER_BYTES_PER_PARAM`).
FUSED_ADAMW_PASSES = 7.0
FOREACH_BANDWIDTH_SHARE = 0.67
#: torch's AdamW stepping one tensor at a time (``_single_tensor_adamw``: ``fused`` or ``foreach``
#: given False, or torch before 2.0) launches about eight kernels per parameter tensor — decay,
#: lerp of m, scale and addcmul of v, sqrt, divide and add into the denominator, addcdiv into the
#: weight — each from Python; :data:`HOST_S_PER_LAUNCH` of host time each. Foreach and fused
#: steps launch a few per group of tensors, negligible.
FOR_LOOP_LAUNCHES_PER_TENSOR = 8
#: Host time of one eager PyTorch op launch (Python, dispatcher, CUDA launch): 10–20 µs on current
#: CPUs (PyTorch's own per-op overhead benchmarks); 15 µs, a stated guess, not fitted.
HOST_S_PER_LAUNCH = 15e-6


def optimizer_bytes_per_param(implementation: str, state_bytes: float) -> float:
    """Bytes at the card's nominal bandwidth the AdamW step costs per trainable parameter:
    ``fused`` (one kernel: :data:`OPTIMIZER_BYTES_PER_PARAM`, a mixed-precision step) or
    ``foreach`` (torch's default: :data:`FOREACH_ADAMW_PASSES` passes over states of
    ``state_bytes`` each, at :data:`FOREACH_BANDWIDTH_SHARE` of the bandwidth)."""
    if implementation == "foreach":
        return FOREACH_ADAMW_PASSES * state_bytes / FOREACH_BANDWIDTH_SHARE
    return OPTIMIZER_BYTES_PER_PARAM if state_bytes >= 4 else FUSED_ADAMW_PASSES * state_bytes


#: LoRA adapters' own memory traffic per token and per unit of adapted width (the sum of in and
#: out features over the adapted linear layers, n_lora / rank), as bytes at the card's nominal
#: bandwidth. The side path of each adapted layer is memory-bound: its rank-r GEMMs read the
#: layer's input and write its output width (forward), read the output gradient twice and the
#: input again and write an input gradient (backward), and the scaling and the two adds each read
#: and write the output or input width — about 8 passes of an element, 16 bytes in BF16.
#: Measured from the kernel profiles of 1B and 8B steps on an H200 (data/README.md, "Where an
#: H200 step's time goes"): ``compute`` (adapters in the 16-bit compute dtype) 19; ``fp32``
#: (PEFT's default: FP32 adapters, the layer's input cast to FP32 for them, the rank-r GEMMs on
#: CUDA cores) 76 — the same passes at 4 bytes plus the casts both ways (≈ 62 counted) and the
#: FP32 GEMMs' time. Physical range: 16–24 and 62–90.
ADAPTER_BYTES_PER_WIDTH = {"compute": 19.0, "fp32": 76.0}


def adapter_bytes_per_token(n_lora: float, rank: int, adapter_dtype: str) -> float:
    """Adapter traffic per token (bytes), from the adapted width n_lora / rank."""
    return n_lora / max(rank, 1) * ADAPTER_BYTES_PER_WIDTH[adapter_dtype]
#: Host link for offload traffic: PCIe 4.0 x16, ~25 GB/s per direction (PCI-SIG spec, 2 GB/s
#: per lane raw, minus protocol overhead).
PCIE_HOST_GBPS = 25.0
#: CPU Adam throughput per GPU process: the ZeRO-Offload paper (Ren et al. 2021, §5) reports
#: DeepSpeed's CPU-Adam updating about 1 billion parameters in roughly 1 s on a server CPU
#: shared by its GPUs; 1e9 parameters per second per process is the figure used.
CPU_ADAM_PARAMS_PER_S = 1.0e9
#: Share of the compute a collective can hide behind. Data-parallel gradient all-reduce (ZeRO
#: 0–2) overlaps the backward of the step's last micro-batch (PyTorch DDP buckets, Megatron
#: ``--overlap-grad-reduce``, DeepSpeed ``overlap_comm``); ZeRO-3/FSDP all-gathers and
#: reduce-scatters overlap each micro-batch's forward and backward (FSDP prefetch, DeepSpeed
#: ``overlap_comm``); ring context parallelism overlaps the K/V exchange with attention
#: (Liu et al. 2023, Ring Attention; Megatron-Core CP). Only this share of that compute can hide
#: traffic: kernels slow down while NCCL shares the SMs and memory (Megatron-LM 530B at DP 8 lost
#: 56.0 → 54.2 % MFU without overlap; catalog-facts §9). Stated, not fitted.
COMM_OVERLAP_SHARE = 0.8
#: Host synchronisations per MoE layer pass that expose the layer's kernel launches: 1. The
#: dropless token dispatchers size their all-to-all and grouped GEMMs from the routed tokens'
#: counts on the host: Megatron-Core's all-to-all dispatcher copies them to the CPU and
#: synchronises (``_maybe_dtoh_and_synchronize``; its inference dispatcher exists to keep them on
#: the GPU "without host synchronization"), DeepEP's normal kernels return them as a Python list
#: (Primus-Turbo's sync-free MoE replaces that list to "eliminate host synchronization between
#: DeepEP dispatch and groupedgemm"), NCCL's all_to_all_single takes host split sizes
#: (torchtitan's expert parallelism), and Transformer Engine's GroupedLinear takes ``m_splits``
#: as a host list; Hugging Face's MoE blocks loop over the experts hit. Stated, not fitted: a
#: sync-free stack (CUDA-graphed MoE, torch._grouped_mm with device offsets at ep 1) is faster.
MOE_HOST_SYNCS = 1.0
#: Element-wise traffic that hand-written fused kernels (Liger, Unsloth, fms-acceleration's
#: fused ops and kernels, flash-attn's fused RMSNorm and rotary, xformers' SwiGLU) take out of an
#: eager layer, in hidden vectors per token and layer, forward and backward: the bytes every
#: aten op of the eager module and its autograd backward reads and writes (transformers' Llama
#: modules in 16 bits; a vector = hidden 16-bit elements, an FP32 one two) against the fused
#: kernel's one read and one write of each tensor. Stated from that count, not fitted;
#: ``tests/truth/test_fused_kernel_traffic.py`` recounts it on the CPU. Two RMSNorms: the FP32
#: upcast, pow, mean, scale, cast back and weight multiply move 18 vectors forward and 48 backward
#: (pow's backward alone three kernels, the two gradient paths' sum), a fused kernel 2 and 3.5:
#: 121 saved per layer.
FUSED_NORM_SAVED_VECTORS = 121.0
#: Rotary embedding by concatenation (``rotate_half``: negate, concatenate; two products and a
#: sum): 10.1 vectors forward and 14.1 backward per width of q and k (the slices' backward writes
#: zero-filled whole tensors, the three gradients into q two sums), a fused kernel 2 and 2: 20
#: saved per hidden width of q and k together (25 for Llama 3 8B's q of 4096 and k of 1024).
FUSED_ROPE_SAVED_VECTORS = 20.0
#: A gated MLP's SwiGLU: SiLU and the product move 5 inner-width vectors forward and 9 backward,
#: a fused kernel (the gate and up read, one output; backward recomputing the SiLU) 3 and 5: 6
#: saved per hidden width of the MLP's inner width (21 for Llama 3 8B's 14,336).
FUSED_SWIGLU_SAVED_VECTORS = 6.0
#: Which of those kernels a stack's ``Recipe.kernels`` names: a fused RMSNorm alone
#: (``fused_rmsnorm``: torchtitan's, or Liger's RMSNorm patched on its own), Liger's patches as a
#: whole and Unsloth's kernels (norm, rotary and SwiGLU). Transformer Engine fuses everything
#: (``fused_elementwise_share``).
KERNEL_FUSIONS: dict[str, tuple[bool, bool, bool]] = {
    "fused_rmsnorm": (True, False, False), "liger": (True, True, True), "unsloth": (True, True, True)}


def fused_kernel_vectors(mf: ModelFlops, norm: bool, rope: bool, swiglu: bool) -> float:
    """Hidden vectors per token and layer that fused norm, rotary and SwiGLU kernels save
    (:data:`FUSED_NORM_SAVED_VECTORS` and the others), for this model's q, k and MLP widths."""
    h = float(mf.hidden)
    saved = FUSED_NORM_SAVED_VECTORS if norm else 0.0
    if h <= 0:  # no architecture: the norms' count alone
        return saved
    if rope:
        saved += FUSED_ROPE_SAVED_VECTORS * (mf.attn_width + mf.kv_width) / h
    if swiglu and mf.gated:
        # the inner width a token passes through, averaged over the layers: the dense MLP's, or a
        # MoE layer's active experts' and shared experts' together
        moe_inner = mf.expert_ffn * mf.experts_per_token + mf.shared_width
        inner = ((mf.layers - mf.moe_layers) * mf.ffn + mf.moe_layers * moe_inner) / max(mf.layers, 1)
        saved += FUSED_SWIGLU_SAVED_VECTORS * inner / h
    return saved


#: Backward's share of a micro-batch's compute (4 of 6 FLOPs per parameter).
BACKWARD_SHARE = 2.0 / 3.0
#: Fixed cost of starting a job, billed on every GPU: provisioning and booting the nodes,
#: pulling the container, loading and sharding the weights, NCCL initialisation, the first
#: compiled steps. 15 minutes: MegaScale (Jiang et al. 2024, §3.5) measured 1,047 s of
#: initialisation on 2,048 GPUs before its optimisations; cloud VM boot + image pull + a
#: checkpoint load of tens of GB take several minutes on their own. A stated guess, not fitted.
JOB_STARTUP_S = 900.0
#: Bytes per trainable parameter a rollout offload moves besides the weights: the FP32 master
#: copy and Adam's two FP32 moments.
ROLLOUT_STATE_BYTES_PER_PARAM = 12.0
#: vLLM's default cap on the sequences one engine decodes together (``max_num_seqs``, 256).
VLLM_MAX_NUM_SEQS = 256
#: Host time per decode step of a vLLM engine (scheduling, sampling, detokenising, with CUDA
#: graphs replayed for the forward): a guess of 2 ms in a 1–5 ms range, which the step time of a
#: small model decoding a small batch is made of.
DECODE_STEP_HOST_S = 0.002
#: Default global batch (sequences per optimizer step) when a scenario gives neither
#: ``global_batch`` nor ``grad_accum``: without one, more GPUs always mean more tokens per step
#: and the search would spread a short job over a thousand GPUs for a few optimizer steps.
#: Pre-training (full training on at least :data:`PRETRAIN_MIN_TOKENS` tokens): 4M tokens per
#: step, as Llama 2 (Touvron et al. 2023, §2.2: "global batch-size of 4M tokens") and GPT-3 175B
#: (3.2M) trained, rounded to a power of two sequences. Fine-tuning: 64 sequences (the QLoRA
#: paper's Guanaco runs used 16–64, Alpaca 128, NeMo's LoRA recipes 32).
PRETRAIN_GLOBAL_BATCH_TOKENS = 4 * 2**20
PRETRAIN_MIN_TOKENS = 1e10
FINETUNE_GLOBAL_BATCH = 64


@dataclass(frozen=True)
class TimeParams:
    """The fitted parameters of the time model. The defaults here are the *priors* every fit
    starts from (physics estimates); :data:`FITTED` holds the values fitted to the measured runs.
    ``planner validate --kind throughput FILE [--loso]`` refits and scores them."""

    #: Hardware-FLOPs utilisation of the 16-bit tensor-core work (GEMMs and attention kernels).
    #: Prior 0.65; fit bound 0.70 (cuBLAS reaches 0.7–0.85 of the dense peak on large GEMMs).
    gemm_hfu: float = 0.65
    #: Memory-bound time per token and layer, as 16-bit hidden vectors moved at the card's
    #: nominal memory bandwidth, of a stack that does not fuse its element-wise ops (eager
    #: PyTorch modeling code: RMSNorm in FP32, rotary by concatenation, unfused SwiGLU, residual
    #: adds, casts, the FP32 logits). Physical range 250–600: a count of those ops' reads and
    #: writes at full bandwidth gives ≈ 250; kernel profiles of eager Hugging Face steps on an
    #: H200 measure 440–490 at 1B and 8B and 460 at 135M (data/README.md, "Where an H200 step's
    #: time goes"). Prior 450. Fusing stacks keep :attr:`fused_elementwise_share` of it.
    elementwise_vectors: float = 450.0
    #: FP8 linear layers: share of the FP8 peak reached, relative to ``gemm_hfu`` of the 16-bit
    #: peak (scaling casts, amax bookkeeping, smaller tiles). Prior 0.6.
    fp8_efficiency: float = 0.6
    #: Tokens per GEMM (a micro-batch's tokens on this GPU; a routed expert's share of them in
    #: MoE layers) at which GEMMs lose half their speed to small shapes: efficiency t/(t + t½).
    #: The same d½ applies to each of a GEMM's weight widths after tensor parallelism splits them
    #: (:func:`planner.perf.flops.gemm_width_efficiency`): a GEMM's tiles and waves do not care
    #: which of its three dimensions is narrow. Physical estimate 150–270: cuBLAS runs square
    #: BF16 GEMMs of side 1,024 at about half and of side 4,096 at about 0.9 of its large-shape
    #: rate, (d/(d + d½))³ (d½ ≈ 266 and 146); the fit is bound to that range. Prior 200, its
    #: middle.
    microbatch_half_tokens: float = 200.0
    #: MoE layers: memory-bound traffic per token per routed expert copy (permute, the expert's
    #: activation, unpermute and the weighted sum), in hidden vectors. Prior 20; physical range
    #: 5–60 (a fused permute moves ≈ 4 vectors each way; unfused gathers, scatters and the
    #: router's FP32 softmax a few times more).
    moe_route_vectors: float = 20.0
    #: Share of the memory-bound traffic left where the stack fuses element-wise ops into
    #: neighbouring kernels (torch.compile; Megatron-Core's Transformer Engine layers). Prior 0.6;
    #: physical range 0.1–1 (a fused norm-linear-activation chain keeps ≈ one read and one write
    #: of the ≈ 10 its unfused ops make).
    fused_elementwise_share: float = 0.6
    #: Fused attention kernels (FlashAttention, cuDNN/SDPA flash) run at this share of the GEMMs'
    #: utilisation on Ampere-class cards: their FLOPs sit in softmax-interleaved tiles, the
    #: backward recomputes the scores, and small head dimensions (64) halve the tile work per
    #: load. Physical range 0.4–1.0: FlashAttention-2 reaches 50–73 % of an A100's peak forward +
    #: backward, about the GEMMs' own share (Dao 2023). On Hopper (FlashAttention-2 at 35 % of an
    #: H100's peak, FlashAttention-3 and cuDNN 1.5–2× that)
    #: :data:`planner.perf.hardware.PORTABLE_ATTENTION_SHARE` and ``NATIVE_ATTENTION_SHARE`` scale
    #: it. Prior 1.0:
    #: the GEMMs' rate. The eager math path is GEMMs (``attention`` 0): 1.
    attention_efficiency: float = 1.0
    #: Host time per layer per micro-batch (forward and backward) of a stack that launches its
    #: kernels one by one from Python: about 100–150 kernels per layer pass (a SmolLM2-135M step
    #: on an H200 launched 4,087 for 30 layers), each costing the host 5–30 µs of Python, autograd
    #: and dispatch. When it exceeds the card's work the card waits: a micro-batch takes the
    #: longer of the two. Physical range 0.0005–0.005 s (measured 3.5–4.5 ms per layer for
    #: transformers 5 with PEFT on an H200: data/README.md, third session); a fusing stack
    #: launches :attr:`fused_elementwise_share` as many. Prior 0.001 (100 kernels at 10 µs).
    launch_s_per_layer: float = 0.001


#: The priors (the fit's starting point).
PRIOR = TimeParams()
#: Fitted on 414 measured runs: data/measured_throughput.csv (124 runs, 11 sources: torchtitan,
#: Qwen v1, NeMo 24.07, Megatron-Bridge 25.11, NeMo AutoModel, the PyTorch/IBM FSDP blog, XTuner,
#: torchtune, Korthikanti et al. 2022, OneFlow DLPerf, FlagPerf), the 113 runs of five H200
#: sessions (data/measured_throughput_h200.csv, _h200_time.csv to _h200_time4.csv), and 177
#: published runs added with their predictions recorded first
#: (data/measured_throughput_published2.csv: Narayanan et al. 2021, Megatron-LM, MegaScale,
#: MT-NLG, InternEvo, a torchtitan H200 benchmark, Thunder, TinyLlama;
#: data/measured_throughput_fms.csv: fms-acceleration), by minimising the mean absolute log
#: error from the previous constants, each within its physical range
#: (planner.validate.throughput.fit, FIT_BOUNDS). Not read: the held-out tables
#: (data/heldout_throughput.csv), which judge it, and torchao's float8 tables
#: (data/measured_throughput_offcatalog.csv), whose cards the catalog cannot pin: B200s
#: power-limited to an unstated limit, an H100 of unstated variant, MI300X under ROCm.
#: ``moe_route_vectors`` sits at its lower bound (the MoE rows want less routing traffic than a
#: fused permute moves); ``launch_s_per_layer`` lands at 4 ms, within the 3–4.5 ms the H200
#: sessions' small models measured once an AdamW stepping one tensor at a time is charged its own
#: launches (:data:`FOR_LOOP_LAUNCHES_PER_TENSOR`). Refitted when the GEMMs' speed came to
#: depend on their weights' widths (:func:`planner.perf.flops.gemm_width_efficiency`), a routed
#: expert's GEMMs counted the tokens its whole ep group sends it, a MoE layer's host
#: synchronisation was charged (:data:`MOE_HOST_SYNCS`) and a MoE model's LoRA its experts'
#: adapters: ``elementwise_vectors`` went from 368 to
#: 272, near the op count's 250 and below the H200 kernel profiles' 440–490 (the narrow GEMMs of
#: small models now carry part of what it stood for), ``fused_elementwise_share`` from 0.225 to
#: its lower bound, 0.10 (fusing stacks keep one read and one write of the ten); the others moved
#: by 6 % or less. On the held-out tables, which no fit reads, the median error went from 16.2 %
#: to 15.3 %. Refitted again when fused norm, rotary and SwiGLU kernels came to take their ops'
#: traffic out of eager stacks (:data:`FUSED_NORM_SAVED_VECTORS`): ``microbatch_half_tokens``
#: 205 → 215, the others within 1 %; the held-out tables 15.3 → 15.7 %. Refitted when a card's
#: GEMMs came to run at its own measured matmul efficiency over the H100's
#: (:data:`planner.perf.hardware.REFERENCE_MATMUL_EFFICIENCY`: the A100's 1.08×) and the fit was
#: bound to ``microbatch_half_tokens``' physical range (150–270; unbounded it went to 337):
#: ``microbatch_half_tokens`` 215 → 270 (its bound), ``elementwise_vectors`` 272 → 282,
#: ``fused_elementwise_share`` 0.10 → 0.12, ``fp8_efficiency`` 0.69 → 0.72,
#: ``attention_efficiency`` 0.92 → 0.95; leave-one-source-out 9.8 → 8.2 %, the held-out tables
#: 15.7 → 14.5 %, the published files' rows (not fitted) 10.1 → 10.3 %. With the A100s' network
#: corrected to one 200 Gb/s NIC per GPU (25 GB/s, was 50) ``fused_elementwise_share`` went
#: 0.119 → 0.118, the others within 0.1 %.
#: Reproduce: ``planner validate --kind throughput data/measured_throughput.csv
#: data/measured_throughput_h200*.csv data/measured_throughput_published2.csv
#: data/measured_throughput_fms.csv [--loso]``.
FITTED = TimeParams(
    gemm_hfu=0.70,
    elementwise_vectors=282.1,
    fp8_efficiency=0.718,
    microbatch_half_tokens=270.0,
    moe_route_vectors=5.0,
    fused_elementwise_share=0.118,
    attention_efficiency=0.948,
    launch_s_per_layer=0.00409,
)


def microbatch_efficiency(tokens_per_microbatch: Any, half_tokens: float | None = None) -> Any:
    """GEMM efficiency of small micro-batches: t/(t + t½), 1 for large ones (→ 1 from ~4K)."""
    half = FITTED.microbatch_half_tokens if half_tokens is None else half_tokens
    t = np.asarray(tokens_per_microbatch, dtype=float)
    return t / (t + half)


def exposed_s(comm: Any, compute: Any) -> Any:
    """Communication left after hiding up to :data:`COMM_OVERLAP_SHARE` of ``compute`` behind it."""
    return np.maximum(comm - COMM_OVERLAP_SHARE * compute, 0.0)


def step_time_s(mf: ModelFlops, perf: GpuPerf, params: TimeParams | None = None, **x: Any) -> Any:
    """Wall-clock seconds of one optimizer step (arrays broadcast).

    Arguments: ``method``, ``checkpointing``, ``offload``, ``zero`` (codes as in
    planner.memory.seed), ``seq_len``, ``micro_batch``, ``grad_accum``, ``tp``, ``pp``, ``cp``, ``dp``,
    ``ep`` (expert parallelism: all-to-all per MoE layer), ``n_lora`` (trainable adapter
    parameters; optional ``n_lora_active``, those a token passes through: a MoE model's active
    experts' only, and ``n_lora_experts``, the routed experts' that ep divides); optional ``etp`` (the
    experts' own tensor parallelism; 0 or unset: tp), ``n_saved`` and
    ``saved_head`` (parameters of the modules a LoRA run trains in full, and of its LM head among
    them: gradients to reduce, optimizer work, a weight-gradient GEMM), ``weight_bytes``
    (bytes per parameter of the stored weights; default :func:`stored_weight_bytes`), ``vp``
    (virtual pipeline stages of an interleaved 1F1B schedule, default 1), ``fp8`` (linear layers in FP8, default off), ``quant`` (0 none,
    1 a 4-bit base; default: QLoRA has one), ``attention`` (0 eager, 1 fused; default fused),
    ``native_attention`` (the fused kernel is the card generation's own: cuDNN's fused attention or
    FlashAttention-3 on Hopper, as Transformer Engine runs them; default off: a portable
    FlashAttention-2-class kernel),
    ``fused`` (the stack fuses element-wise ops: torch.compile, Transformer Engine; default off),
    ``reference_forward`` (forwards without gradients on every token beside training: DPO's and
    GRPO's reference policy, GRPO's old log-probs; default 0; DPO's ``micro_batch`` then counts
    sequences, two per pair), ``adapter_bytes`` (LoRA's side-path traffic per token, :func:`adapter_bytes_per_token`;
    default 0), ``optimizer_bytes`` (per trainable parameter, :func:`optimizer_bytes_per_param`;
    default :data:`OPTIMIZER_BYTES_PER_PARAM`), ``optimizer_flops`` (Muon's Newton–Schulz FLOPs
    per step over the whole model, :func:`planner.perf.flops.muon_step_flops`; default none) and
    ``optimizer_expert_flops`` (the routed experts' part of them; default 0).

    step = (m + (pp − 1)/vp) · t_microbatch   (1F1B, interleaved over vp virtual stages: the
                                              bubble is (pp − 1)/vp micro-batch slots;
                                              Narayanan et al. 2021, §2.2)
         + data-parallel traffic not hidden behind compute: the gradient all-reduce (ZeRO 0–2,
           once per step, behind the last backward) or, with ZeRO-3/FSDP, per micro-batch an
           all-gather of the weights for the forward, another for the backward and a
           reduce-scatter of the gradients (3 × the 16-bit parameter bytes, as FSDP and
           DeepSpeed move them), behind that micro-batch's compute
         + the optimizer step (memory-bound) and offload (PCIe and CPU Adam).
    t_microbatch = (linear FLOPs / (peak · u) [FP8: FP8 peak · u · fp8_efficiency]
                    + attention FLOPs / (peak · u · attention_efficiency
                                         · the generation's share for the kernel)) / micro-batch efficiency
                   + memory-bound bytes (element-wise ops, MoE routing, eager attention scores)
                     / memory bandwidth + QLoRA dequantisation
                   + TP all-reduces (4 per layer, 6 with full recomputation; Korthikanti et al.
                     2022) + PP activation sends + EP all-to-alls
                   + the ring-CP K/V exchange not hidden behind attention.
    Traffic between GPUs of one node uses the node's link (NVLink, or PCIe on cards without it);
    TP, PP and CP groups that span nodes run at one NIC's speed; an EP all-to-all sends the share
    bound for other nodes over the NIC while the rest crosses the node's link; data-parallel
    collectives are hierarchical (:func:`group_collective_s`).
    """
    p = FITTED if params is None else params
    # intra_only: price every group at the in-node link, no optimizer step (the search's bound);
    # the EP all-to-all, whose ranks per node do not depend on dp, is priced as it runs.
    node = np.inf if x.get("intra_only") else perf.gpus_per_node
    tokens_gpu = x["micro_batch"] * x["seq_len"] / x["cp"]  # tokens of one micro-batch this GPU processes
    compute, t_att = _microbatch_compute_s(mf, perf, p, x)
    tp_comm, pp_comm, cp_comm, ep_comm = _model_parallel_comm_s(mf, perf, x, tokens_gpu, t_att, node)
    # an overlapping stack (``ep_overlap``) runs one micro-batch's all-to-alls during another's compute
    ep_comm = np.where(np.asarray(x.get("ep_overlap", 0)) > 0, exposed_s(ep_comm, compute), ep_comm)
    t_microbatch = compute + tp_comm + pp_comm + cp_comm + ep_comm
    pipeline = (x["grad_accum"] + (x["pp"] - 1) / np.maximum(x.get("vp", 1), 1)) * t_microbatch
    dp_comm, optimizer, offload_opt, offload_params = _data_parallel_and_optimizer_s(mf, perf, p, x, compute, node)
    train = pipeline + dp_comm + optimizer + offload_opt + offload_params
    load, work = _generation_parts(mf, perf, p, x)
    # An engine apart generating the next step's completions meanwhile (``gen_async``): the step
    # takes the longer of the two; the weights' transfer to it still comes between steps.
    overlap = (np.asarray(x.get("gen_async", 0)) > 0) & (np.asarray(x.get("gen_gpus", 0)) > 0)
    return np.where(overlap, np.maximum(train, work), train + work) + load


def generation_s(mf: ModelFlops, perf: GpuPerf, p: TimeParams, x: dict[str, Any]) -> Any:
    """GRPO: seconds a step spends generating its completions before it trains on them (0 without
    ``gen_completion_len``): :func:`_generation_parts`, the weights' load and the rest."""
    load, work = _generation_parts(mf, perf, p, x)
    return load + work


def _generation_parts(mf: ModelFlops, perf: GpuPerf, p: TimeParams, x: dict[str, Any]) -> tuple[Any, Any]:
    """GRPO: (the policy's weights loaded into the engine, the rest of generating the step's
    completions) in seconds, both 0 without ``gen_completion_len``, as vLLM runs them: each
    engine of ``gen_tp`` GPUs (all the training
    GPUs' engines when colocated, ``gen_gpus`` / ``gen_tp`` when served apart) takes its share of
    the step's completions (micro-batch · dp · grad_accum) and

    - prefills each prompt once (its ``num_generations`` samples share it): 2·N_active FLOPs per
      prompt token at the GEMMs' rate;
    - decodes ``gen_completion_len`` tokens per sequence in waves of at most
      :data:`VLLM_MAX_NUM_SEQS` sequences, or as many full sequences as its KV cache holds, and
      never in fewer steps than the longest completion (``gen_completion_cap``, default the
      length itself: a batch ends with its longest sequence): each step reads the 16-bit
      weights and the batch's KV cache (the prompt and half the completion on average) at the
      memory bandwidth, or computes 2·N_active FLOPs per sequence if that takes longer, plus
      :data:`DECODE_STEP_HOST_S` of scheduling;
    - loads the policy's weights first: a copy in the GPU's memory when colocated, a broadcast
      over the network to an engine served apart;
    - where a colocated engine sleeps at level 1 while the step trains (``gen_sleep`` with
      ``gen_sleep_level`` 1; level 2 drops the weights, which the load above replaces anyway),
      moves its weights to host memory and back over PCIe each step, and where the trainer's
      states leave for generation (``gen_rollout_offload``, colocated), moves them (the weights
      and, for trainable parameters, the FP32 master and Adam moments) out and back too.

    Plans give one length, the cap: runs whose completions stop early generate faster. Measured runs
    give the mean generated (``gen_completion_len``) and the cap apart.
    The engine's tensor-parallel all-reduces are not counted."""
    completion = np.asarray(x.get("gen_completion_len", 0), dtype=float)
    if not np.any(completion > 0):
        return 0.0, 0.0
    gtp = np.maximum(np.asarray(x["gen_tp"], dtype=float), 1.0)
    served = np.asarray(x["gen_gpus"], dtype=float)
    training_gpus = x["dp"] * x["tp"] * x["pp"] * x["cp"]
    engines = np.maximum(np.where(served > 0, served, training_gpus) / gtp, 1.0)
    sequences = x["micro_batch"] * x["dp"] * x["grad_accum"] / engines  # completions per engine
    prompts = sequences / np.maximum(x["gen_num_generations"], 1)
    prompt = np.asarray(x["gen_prompt_len"], dtype=float)
    weights, kv_token = x["gen_weight_bytes"], x["gen_kv_bytes_per_token"]
    rate = perf.peak_flops * _gemm_utilization(perf, p) * gtp
    bandwidth = perf.memory_bps * gtp * perf.kernel_speed
    kv_tokens = np.maximum(x["gen_fraction"] * perf.memory_capacity * gtp - weights, 0.0) / kv_token
    batch = np.clip(np.minimum(np.minimum(sequences, VLLM_MAX_NUM_SEQS),
                               np.floor(kv_tokens / np.maximum(prompt + completion, 1.0))), 1.0, None)
    waves = np.ceil(sequences / batch)
    cap = np.asarray(x.get("gen_completion_cap", completion), dtype=float)
    decode_steps = np.maximum(cap, waves * completion)
    prefill = 2.0 * mf.active_params * prompt * prompts / rate
    read = (weights + batch * (prompt + completion / 2.0) * kv_token) / bandwidth
    step = np.maximum(read, 2.0 * mf.active_params * batch / rate) + DECODE_STEP_HOST_S
    load = np.where(served > 0, weights / perf.inter_bps, 2.0 * weights / bandwidth)
    pcie = PCIE_HOST_GBPS * 1e9
    colocated = served == 0  # an engine apart neither sleeps beside training nor swaps its states
    level_one = np.asarray(x.get("gen_sleep_level", 2)) == 1
    swap = np.where(colocated & (np.asarray(x.get("gen_sleep", 0)) > 0) & level_one, 2.0 * weights / gtp / pcie, 0.0)
    _, _, weight_gpu, shard = _parameters_on_gpu(mf, x)
    states = np.where(np.asarray(x["zero"]) >= 3, weight_gpu / np.maximum(zero_degree(x["dp"], x["cp"]), 1), weight_gpu)
    states = states + shard * ROLLOUT_STATE_BYTES_PER_PARAM
    swap = swap + np.where(colocated & (np.asarray(x.get("gen_rollout_offload", 0)) > 0), 2.0 * states / pcie, 0.0)
    on = completion > 0
    return np.where(on, load, 0.0), np.where(on, prefill + decode_steps * step + swap, 0.0)


def _utilization(perf: GpuPerf, p: TimeParams) -> Any:
    """The card's utilisation of the tensor-core work, the fitted ``gemm_hfu`` where it has none."""
    util = np.asarray(perf.utilization, dtype=float)
    return np.where(np.isfinite(util) & (util > 0), util, p.gemm_hfu)


def _gemm_utilization(perf: GpuPerf, p: TimeParams) -> Any:
    """The share of the dense peak the card's GEMMs reach: :func:`_utilization` at the card's own
    matmul efficiency (``matmul_scale``), which fused attention does not take."""
    return _utilization(perf, p) * perf.matmul_scale


def executed_flops_per_token(mf: ModelFlops, x: dict[str, Any]) -> tuple[Any, Any]:
    """FLOPs the hardware executes per trained token, before any parallelism divides them: the
    linear layers' (weights, adapters, the recomputed forward, forwards without gradients beside
    training) and attention's (causal for a fused kernel, the whole square for eager attention, its
    rerun under op-level selective checkpointing). Arguments as :func:`step_time_s`."""
    method, ckpt, seq = x["method"], x["checkpointing"], x["seq_len"]
    attention_kernel = x.get("attention", 1)  # 0 eager (math path), 1 fused (flash)
    # Forwards without gradients beside training, per token: DPO's and GRPO's reference policy, and
    # GRPO's old log-probs where the stack scores its completions apart (``logprob_forward``).
    ref = np.asarray(x.get("reference_forward", 0), dtype=float)
    op = x.get("selective_op", 0)
    op_selective = (ckpt == 1) & (np.asarray(op) > 0)  # op-level selective checkpointing
    lin = (linear_flops_per_token(mf, method=method, checkpointing=ckpt, n_lora=x.get("n_lora_active", x.get("n_lora", 0.0)),
                                  saved_head=x.get("saved_head", 0.0), selective_op=op)
           + ref * FORWARD_FLOPS_PER_PARAM * mf.active_params)
    att = (attention_flops_per_token(mf, seq_len=seq, checkpointing=ckpt, selective_op=op)
           + ref * attention_flops_per_token(mf, seq_len=seq, checkpointing=0) * FORWARD_SHARE)
    att = att * np.where(attention_kernel == 0, 1.0 / CAUSAL_SHARE, 1.0)  # eager runs the whole square
    # op-level selective checkpointing keeps a fused kernel's output but not eager attention's
    # matmuls and softmax, which rerun with the forward
    att = att * np.where(op_selective & (attention_kernel == 0), 4.0 / 3.0, 1.0)
    return lin, att


def _microbatch_compute_s(mf: ModelFlops, perf: GpuPerf, p: TimeParams, x: dict[str, Any]) -> tuple[Any, Any]:
    """One micro-batch's compute on one GPU (GEMMs and attention, memory-bound element-wise
    traffic and QLoRA dequantisation), and its attention part."""
    method, ckpt = x["method"], x["checkpointing"]
    seq, mb = x["seq_len"], x["micro_batch"]
    tp, pp, cp = x["tp"], x["pp"], x["cp"]
    fp8 = np.asarray(x.get("fp8", 0)) > 0
    quant = x.get("quant", np.where(method == QLORA, 1, 0))
    tokens_mb = mb * seq
    tokens_gpu = tokens_mb / cp  # tokens of one micro-batch this GPU processes
    mp = tp * pp * cp
    util = _utilization(perf, p)

    attention_kernel = x.get("attention", 1)  # 0 eager (math path), 1 fused (flash)
    ref = np.asarray(x.get("reference_forward", 0), dtype=float)
    op_selective = (ckpt == 1) & (np.asarray(x.get("selective_op", 0)) > 0)  # op-level selective
    lin_token, att_token = executed_flops_per_token(mf, x)
    lin = lin_token * tokens_mb / mp
    att = att_token * tokens_mb / mp
    has_fp8 = np.isfinite(perf.peak_fp8_flops)  # a card without FP8 runs the 16-bit GEMMs
    fp8_peak = np.where(has_fp8, perf.peak_fp8_flops, perf.peak_flops)
    # at the card's own matmul efficiency, FP8 too
    lin_rate = np.where(fp8 & has_fp8, fp8_peak * p.fp8_efficiency, perf.peak_flops) * _gemm_utilization(perf, p)
    # Small GEMMs: a dense layer's GEMMs see the micro-batch's tokens on this GPU; a routed
    # expert's see its share of the tokens of its ep group, tokens · top-k · ep / experts.
    eff = microbatch_efficiency(tokens_gpu, p.microbatch_half_tokens)
    expert_share = np.where(mf.experts > 0, expert_active_share(mf), 0.0)
    # Each of the ep ranks dispatches its tokens (its 1/tp share where the experts have a TP of
    # their own, etp < tp) to the experts they are routed to.
    expert_tp = _expert_layout(mf, x)[0]
    ep = np.maximum(x.get("ep", 1), 1)
    expert_tokens = tokens_gpu * mf.experts_per_token / np.maximum(mf.experts, 1) * ep * expert_tp / tp
    eff_expert = microbatch_efficiency(np.maximum(expert_tokens, 1e-9), p.microbatch_half_tokens)
    # and narrow weights lose speed as few tokens do, with the same d½ (a GEMM's tiles do not care
    # which of its dimensions is narrow)
    width_dense, width_expert = gemm_width_efficiency(mf, tp, expert_tp, p.microbatch_half_tokens)
    lin_eff = (1.0 - expert_share) / (eff * width_dense) + expert_share / (eff_expert * width_expert)
    # Fused kernels: attention_efficiency of the fitted GEMM rate (before the card's own matmul
    # efficiency, which attention does not take), times the card generation's share for
    # a portable kernel (FlashAttention-2) or for its own (FlashAttention-3, cuDNN).
    native = np.asarray(x.get("native_attention", 0)) > 0
    generation = np.where(native, perf.native_attention, perf.portable_attention)
    # eager attention is batched GEMMs, at the card's own matmul efficiency as the linear layers
    att_share = np.where(attention_kernel == 0, perf.matmul_scale, p.attention_efficiency * generation)
    t_att = att / (perf.peak_flops * util * att_share) / eff
    t_gemm = lin / lin_rate * lin_eff + t_att
    # Forward passes per micro-batch, in thirds of a step (recompute, the reference's forward),
    # and what a fusing stack keeps of its unfused element-wise work and launches.
    # full checkpointing reruns the forward's element-wise work; so does op-level selective
    # checkpointing, which saves only matmul and attention outputs
    forward_passes: Any = np.where((ckpt == 2) | op_selective, 4.0 / 3.0, 1.0) + ref * FORWARD_SHARE
    fused = np.asarray(x.get("fused", 0)) > 0
    # Hand-written fused kernels (norm, rotary, SwiGLU) take their ops' traffic and launches out
    # of an eager stack's (``kernel_vectors``); a fusing stack keeps its own share of all of it.
    kernel_kept = np.clip(1.0 - np.asarray(x.get("kernel_vectors", 0.0)) / p.elementwise_vectors,
                          p.fused_elementwise_share, 1.0)
    fused_share = np.where(fused, p.fused_elementwise_share, kernel_kept)
    vectors = p.elementwise_vectors * fused_share
    vectors = (vectors + p.moe_route_vectors * mf.experts_per_token * mf.moe_layers / mf.layers
               * np.where(fused, p.fused_elementwise_share, 1.0)) * forward_passes
    t_elem = vectors * 2.0 * mf.hidden * tokens_gpu * mf.layers / (pp * tp) / perf.memory_bps
    # Eager attention writes and reads the s×s scores (:data:`EAGER_SCORE_BYTES` per score).
    scores = np.where(attention_kernel == 0, mf.heads * seq * tokens_gpu * mf.layers / (pp * tp), 0.0)
    t_elem = t_elem + scores * EAGER_SCORE_BYTES * np.where(ckpt >= 1, 4.0 / 3.0, 1.0) / perf.memory_bps
    # LoRA's side path: memory-bound traffic over the adapted widths (repeated by full recompute).
    # A fusing stack (torch.compile; fused LoRA kernels) fuses its casts, scaling and adds as it
    # does the other element-wise ops.
    adapter = np.where(method == FULL, 0.0, x.get("adapter_bytes", 0.0)) * tokens_gpu / (tp * pp)
    adapter = adapter * np.where(fused, p.fused_elementwise_share, 1.0)
    t_elem = t_elem + adapter * np.where(ckpt == 2, 4.0 / 3.0, 1.0) / perf.memory_bps
    frozen = np.where(method == FULL, 0.0, mf.params) / (tp * pp)
    passes = np.where(ckpt == 2, 3.0, 2.0)
    t_dequant = np.where(quant > 0, passes * frozen * DEQUANT_BYTES_PER_PARAM / perf.memory_bps, 0.0)
    device = t_gemm + (t_elem + t_dequant) / perf.kernel_speed
    # The host's launches: the card waits when they take longer than its work.
    host = p.launch_s_per_layer * mf.layers / pp * forward_passes * fused_share
    # A MoE layer's launches are not hidden behind the card's work: sizing its all-to-all and
    # grouped GEMMs copies the routed tokens' counts to the CPU (:data:`MOE_HOST_SYNCS`), so the card
    # drains its queue and then waits for the host, charged as a layer's unfused launches (router,
    # permutation, per-expert GEMMs and casts are not fused into the neighbouring kernels) per pass
    # of the layer, the recomputed forward and a reference's forward included. Where the host
    # already binds, the card waits for it anyway.
    moe_sync = MOE_HOST_SYNCS * p.launch_s_per_layer * mf.moe_layers / pp * forward_passes
    return np.maximum(device + moe_sync, host), t_att


def _model_parallel_comm_s(mf: ModelFlops, perf: GpuPerf, x: dict[str, Any], tokens_gpu: Any, t_att: Any,
                           node: Any) -> tuple[Any, Any, Any, Any]:
    """One micro-batch's TP all-reduces, PP sends, the ring-CP K/V exchange not hidden behind
    attention, and EP all-to-alls."""
    tp, pp, cp, dp, ckpt = x["tp"], x["pp"], x["cp"], x["dp"], x["checkpointing"]
    act_bytes = tokens_gpu * mf.hidden * 2.0  # one layer's 16-bit activations
    tp_bps = np.where(tp <= node, perf.intra_bps, perf.inter_bps)
    # Half of a layer's TP collectives are its attention's, half its MLP's (2 and 2 per micro-batch,
    # 3 and 3 with full recomputation). A MoE layer's experts run theirs over their own TP
    # (``etp``) on the tokens dispatched to the group, none at etp 1 (Megatron-Core's folded layout
    # sends each rank's sequence shard through the all-to-all instead); unset, etp is tp.
    per_half = np.where(ckpt == 2, 3.0, 2.0)
    expert_tp, _, _, stride = _expert_layout(mf, x)
    expert_bps = np.where(expert_tp <= node, perf.intra_bps, perf.inter_bps)
    halves_at_tp = mf.layers + (mf.layers - mf.moe_layers)  # every attention, the dense layers' MLPs
    tp_comm = per_half * (halves_at_tp / pp * ring_allreduce_s(act_bytes, tp, tp_bps)
                          + mf.moe_layers / pp * ring_allreduce_s(act_bytes * expert_tp / tp, expert_tp, expert_bps))
    pp_bps = np.where(tp * cp * dp * pp <= node, perf.intra_bps, perf.inter_bps)
    pp_comm = np.where(pp > 1, 2.0 * act_bytes / tp / pp_bps, 0.0)
    cp_bps = np.where(tp * cp <= node, perf.intra_bps, perf.inter_bps)
    kv_bytes = tokens_gpu * 2.0 * mf.kv_width * 2.0 / tp  # K and V, 16-bit, one layer
    cp_comm = np.where(cp > 1, 3.0 * (cp - 1) * kv_bytes * mf.layers / pp / cp_bps, 0.0)
    cp_comm = exposed_s(cp_comm, t_att)
    ep = x.get("ep", 1)
    # Expert parallelism: each MoE layer sends every token's hidden state to its top-k experts and
    # back, forward and backward (4 all-to-alls), (ep−1)/ep of it leaving the GPU. Under tensor
    # parallelism (sequence-parallel, as everywhere here) a GPU dispatches its 1/tp of the tokens
    # (Megatron-Core's all-to-all dispatcher over the TP×EP ranks). The group's ranks sit
    # :func:`_expert_layout`'s stride apart, so a node of the card's size holds ``in_node`` of
    # them, whatever ``node`` the other groups are priced at: the share bound for those crosses
    # the node's link, the share bound for other nodes the GPU's NIC, both at once (the slower
    # decides), as NCCL's and DeepEP's all-to-alls run.
    a2a_bytes = tokens_gpu / tp * mf.hidden * 2.0 * mf.experts_per_token / np.maximum(ep, 1)
    in_node = np.minimum(np.maximum(np.floor(perf.gpus_per_node / np.maximum(stride, 1)), 1.0), ep)
    a2a_s = np.maximum(a2a_bytes * (in_node - 1) / perf.intra_bps, a2a_bytes * (ep - in_node) / perf.inter_bps)
    ep_comm = np.where(ep > 1, 4.0 * a2a_s * mf.moe_layers / pp, 0.0)
    return tp_comm, pp_comm, cp_comm, ep_comm


def _expert_layout(mf: ModelFlops, x: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """The routed experts' tensor parallelism (``etp``, else tp), their parameters on this GPU in
    tp-way shares (1/ep of them, each split etp ways), the ranks of their data-parallel group
    (a stage's dp·cp·tp GPUs regrouped as etp × ep × expert-dp: dp·cp / ep with the experts split
    like the dense layers), and how far apart the ranks of an ep group sit: tp·cp (ranks ordered
    tp, cp, ep, dp, pp), or etp where the experts have a TP of their own (MoE parallel folding
    orders the expert layers' ranks etp, ep, dp, pp)."""
    tp, ep = x["tp"], np.maximum(x.get("ep", 1), 1)
    etp = np.asarray(x.get("etp", 0))
    expert_tp = np.where(etp > 0, etp, tp)
    local_experts = mf.expert_params * (tp / expert_tp) / ep
    expert_dp = np.maximum(zero_degree(x["dp"], x["cp"]) * tp / (ep * expert_tp), 1)
    ep_stride = np.where(etp > 0, etp, tp * x["cp"])
    return expert_tp, local_experts, expert_dp, ep_stride


def _parameters_on_gpu(mf: ModelFlops, x: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """This GPU's parameters (expert parallelism shards the routed experts over ep ranks), the
    trainable ones among them, the bytes of its stored weights (divided by TP and PP) and its
    shard of the trainable parameters (divided further by the ZeRO degree from stage 1: the
    dense ones over dp·cp, the experts over their own data-parallel group)."""
    method, tp, pp, zero = x["method"], x["tp"], x["pp"], x["zero"]
    expert_tp, local_experts, expert_dp, _ = _expert_layout(mf, x)
    dense = mf.params - mf.expert_params
    local = dense + local_experts
    full = method == FULL
    # the routed experts' adapters (``n_lora_experts`` of ``n_lora``) sit 1/ep on a rank, split
    # as the experts are
    n_lora, n_lora_experts = x.get("n_lora", 0.0), x.get("n_lora_experts", 0.0)
    adapters = n_lora - n_lora_experts + n_lora_experts * tp / (expert_tp * np.maximum(x.get("ep", 1), 1))
    trainable = np.where(full, local, adapters + x.get("n_saved", 0.0))
    weight_bytes = local * x.get("weight_bytes", stored_weight_bytes(method)) / (tp * pp)
    sharded = zero >= 1
    d = np.where(sharded, np.maximum(zero_degree(x["dp"], x["cp"]), 1), 1)
    shard = np.where(full, dense / (tp * pp * d) + local_experts / (tp * pp * np.where(sharded, expert_dp, 1)),
                     trainable / (tp * pp * d))
    return local, trainable, weight_bytes, shard


def _data_parallel_and_optimizer_s(mf: ModelFlops, perf: GpuPerf, p: TimeParams, x: dict[str, Any],
                                   compute: Any, node: Any) -> tuple[Any, Any, Any, Any]:
    """Data-parallel traffic not hidden behind compute, the optimizer step and offload."""
    ga = x["grad_accum"]
    tp, pp, cp, dp, zero, offload = x["tp"], x["pp"], x["cp"], x["dp"], x["zero"], x["offload"]
    d = zero_degree(dp, cp)
    _, trainable, weight_bytes, shard = _parameters_on_gpu(mf, x)
    grad_bytes = trainable * 2.0 / (tp * pp)
    # The routed experts' gradients reduce over their own data-parallel group, whose ranks sit
    # one ep group further apart than an ep group's own.
    expert_tp, local_experts, expert_dp, ep_stride = _expert_layout(mf, x)
    expert_grad = np.where(x["method"] == FULL, local_experts * 2.0 / (tp * pp), 0.0)
    expert_stride = ep_stride * np.maximum(x.get("ep", 1), 1)

    def dp_collective(n_bytes: Any, factor: float) -> Any:
        return group_collective_s(n_bytes, d, tp, node, perf.intra_bps, perf.inter_bps, factor)

    expert_reduce = group_collective_s(expert_grad, expert_dp, expert_stride, node, perf.intra_bps,
                                       perf.inter_bps, 2.0)
    allreduce = exposed_s(dp_collective(grad_bytes - expert_grad, 2.0) + expert_reduce, BACKWARD_SHARE * compute)
    per_mb = 2.0 * dp_collective(weight_bytes, 1.0) + dp_collective(grad_bytes, 1.0)
    zero3 = ga * exposed_s(per_mb, compute)
    dp_comm = np.where(zero >= 3, zero3, allreduce)

    opt_bytes = x.get("optimizer_bytes", OPTIMIZER_BYTES_PER_PARAM)
    optimizer = 0.0 if x.get("intra_only") else shard * opt_bytes / perf.memory_bps
    if "optimizer_flops" in x and not x.get("intra_only"):
        # Muon's Newton–Schulz GEMMs: a rank orthogonalises its stage's matrices (its
        # tensor-parallel shards); sharded optimizers split the matrices over the data-parallel
        # ranks (DeepSpeed's and Megatron-Core's Muon, nanochat's DistMuon), DDP repeats them all.
        # A rank holds 1/ep of the routed experts, each split over their own TP, and a sharded
        # optimizer splits them over their own data-parallel group.
        owners = np.where(zero >= 1, np.maximum(d, 1), 1)
        expert_owners = np.where(zero >= 1, expert_dp, 1)
        experts = x.get("optimizer_expert_flops", 0.0)
        per_gpu = ((x["optimizer_flops"] - experts) / (tp * pp * owners)
                   + experts / (pp * np.maximum(x.get("ep", 1), 1) * expert_tp * expert_owners))
        optimizer = optimizer + per_gpu / (perf.peak_flops * _gemm_utilization(perf, p))
    # An AdamW stepping one tensor at a time waits on its launches where they outlast the traffic.
    optimizer = np.maximum(optimizer, 0.0 if x.get("intra_only") else x.get("optimizer_host_s", 0.0))
    offload_opt = np.where(offload >= 1, shard * 4.0 / (PCIE_HOST_GBPS * 1e9) + shard / CPU_ADAM_PARAMS_PER_S, 0.0)
    optimizer = np.where(offload >= 1, 0.0, optimizer)
    offload_params = np.where(offload >= 2, 2.0 * ga * weight_bytes / np.maximum(d, 1) / (PCIE_HOST_GBPS * 1e9), 0.0)
    return dp_comm, optimizer, offload_opt, offload_params


def job_time_s(step_s: Any, *, tokens: float, seq_len: Any, micro_batch: Any, dp: Any, grad_accum: Any,
               startup_s: float = JOB_STARTUP_S) -> Any:
    """Seconds to train on ``tokens`` tokens: the start-up cost plus steps × step time (a step
    trains mb·dp·ga·seq tokens)."""
    tokens_per_step = micro_batch * dp * grad_accum * seq_len
    return startup_s + tokens / tokens_per_step * step_s


def default_global_batch(method: str, seq_len: int, tokens: float | None, group: int = 1) -> int:
    """The global batch (sequences) a scenario without one gets (see :data:`FINETUNE_GLOBAL_BATCH`),
    rounded up to whole ``group``s (GRPO: the completions of one prompt)."""
    if method == "full" and tokens is not None and tokens >= PRETRAIN_MIN_TOKENS:
        batch = max(1, 2 ** round(math.log2(PRETRAIN_GLOBAL_BATCH_TOKENS / max(seq_len, 1))))
    else:
        batch = FINETUNE_GLOBAL_BATCH
    return -(-batch // group) * group


def billed_gpus(gpus: Any, gpus_per_node: Any, whole_node_only: Any) -> Any:
    """GPUs paid for: whole nodes where the type is rented only so, else the GPUs used."""
    return np.where(whole_node_only, nodes_for(gpus, gpus_per_node) * gpus_per_node, gpus)


def job_cost_usd(time_s: Any, *, gpus: Any, price_usd_per_hour: Any) -> Any:
    return time_s / 3600.0 * gpus * price_usd_per_hour
