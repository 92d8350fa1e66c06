"""A GPU type as the time model sees it (:class:`GpuPerf`: dense peaks, utilisation, the
bandwidths of its links and memory), and the time of collectives over those links: ring
all-reduce and all-gather, and hierarchical collectives across nodes as NCCL runs them.

Where the catalog gives no bandwidth, the stated defaults below stand in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.core.entries import GpuSpec

#: Bandwidth assumed where the catalog has none: PCIe 4.0 x16 (~25 GB/s usable per direction)
#: inside a node, 100 Gb/s Ethernet (12.5 GB/s) between nodes, and 1 TB/s device memory.
DEFAULT_INTRA_NODE_GBPS = 25.0
DEFAULT_INTER_NODE_GBPS = 12.5
DEFAULT_MEMORY_GBPS = 1000.0

#: Fused attention's rate relative to the GEMMs' on a card generation, as a share of what it is on
#: Ampere, by architecture (1 where not listed). On an A100, FlashAttention-2 reaches 50–73 % of
#: the peak forward + backward, about the GEMMs' own share (Dao 2023); call it 0.6. On an H100
#: the GEMMs keep their share but FlashAttention-2 and SDPA's flash backend (written for Ampere's
#: synchronous ``mma.sync``) reach 35 % of the peak, and the kernels written for Hopper (TMA,
#: ``wgmma``: FlashAttention-3, cuDNN's fused attention) are 1.5–2.0× faster than that (Shah et
#: al. 2024, arXiv 2407.08608, abstract). Portable kernels: 0.35/0.6 ≈ 0.6; Hopper's own: 1.5 ×
#: 0.35/0.6 ≈ 0.85, the low end, as the backward is the slower half. Stated, not fitted.
#: On the data-centre Blackwell cards (compute capability 10.x: B200, B300; 2,250 dense BF16
#: TFLOPS) the portable kernels fall further behind: FlashAttention 2.7.4 measured 259–346 TFLOPS
#: forward + backward at head dim 64 on a B200 (Dao-AILab/flash-attention issue #1589, 2025-04),
#: 0.12–0.15 of the peak, and tritonbench's FlashAttention-2 forward 315–362 at head dim 128,
#: 1K–16K tokens (meta-pytorch/tritonbench PR #171, 2025-03): 0.15/0.6 ≈ 0.25. Their own kernels,
#: derived: cuDNN 9.13's forward ≈ 1,240 TFLOPS (the FlashAttention-4 paper's abstract: up to
#: 1,613, up to 1.3× cuDNN 9.13) and its backward ≈ 1,000 (flash-attention PR #1945: the first
#: Blackwell FlashAttention backward ≈ 1.1× cuDNN's at 8K tokens, head dim 128, which later reached
#: 1,118–1,248 TFLOPS, PR #2280), so forward + backward (the backward 2.5× the forward's FLOPs)
#: ≈ 1,060 TFLOPS, 0.47 of the peak: 0.47/0.6 ≈ 0.8. Stated, not fitted. The consumer Blackwell
#: cards (12.x) run other instructions and have no measurement: 1 there, as unlisted generations.
PORTABLE_ATTENTION_SHARE: dict[str, float] = {"hopper": 0.6, "blackwell": 0.25}
NATIVE_ATTENTION_SHARE: dict[str, float] = {"hopper": 0.85, "blackwell": 0.8}


def attention_generation(gpu: GpuSpec) -> str:
    """The key of :data:`PORTABLE_ATTENTION_SHARE` and :data:`NATIVE_ATTENTION_SHARE` for a card:
    its architecture, but for Blackwell only the data-centre parts (compute capability 10.x)."""
    cc = gpu.compute_capability
    if gpu.architecture == "blackwell" and (cc is None or not 10.0 <= cc < 11.0):
        return "blackwell-consumer"
    return gpu.architecture


#: The matmul efficiency (largest measured BF16 matmul rate / dense peak,
#: :attr:`~planner.core.entries.GpuSpec.matmul_efficiency`) of the card the fitted GEMM
#: utilisation (``gemm_hfu``) stands for: the H100 SXM's 80.3 % (Bekman, ml-engineering's MAMF
#: table: 794.5 of 989 TFLOPS). A card's GEMMs run at its own efficiency over this one times the
#: fitted rate (the A100 SXM's 86.9 %: 1.08×; the B200's 77.6 %: 0.97×); a card without a
#: catalog value at 1× (the AMD cards, whose utilisation comes from their own runs; the GH200
#: 96 GB, as the table's GH200 is the 141 GB 900 W part). FP8 GEMMs take the BF16 ratio: the
#: table's FP8 ceilings (H100 70.9 %, H200 73.4 %, B200 76.3 %) are not used. Fused attention keeps
#: the generation shares above, which are shares of the peak; eager attention, batched GEMMs,
#: takes the card's ratio.
REFERENCE_MATMUL_EFFICIENCY = 0.803


@dataclass(frozen=True)
class GpuPerf:
    """What the time model needs of a GPU type (arrays over GPU types, or scalars)."""

    peak_flops: Any  # dense 16-bit FLOP/s
    utilization: Any  # hardware-FLOPs utilisation of the tensor-core work (planner.perf.timing)
    intra_bps: Any  # bytes/s between GPUs of a node
    inter_bps: Any  # bytes/s between nodes
    gpus_per_node: Any
    price_usd_per_hour: Any  # per GPU; NaN if unknown
    memory_bps: Any = DEFAULT_MEMORY_GBPS * 1e9  # device memory bandwidth, bytes/s
    peak_fp8_flops: Any = float("nan")  # dense FP8 FLOP/s; NaN where the card has none
    #: Speed of the memory-bound kernels relative to the band's middle: u / u_mid when a
    #: utilisation other than the middle is asked for (the band's slow and fast ends), so that the
    #: band moves all of the GPU's own work, not only its GEMMs.
    kernel_speed: Any = 1.0
    #: Device memory, bytes (what a generation engine's share is taken of).
    memory_capacity: Any = 80e9
    #: Fused attention's rate relative to the GEMMs', as a share of Ampere's, for portable kernels
    #: and for the generation's own (:data:`PORTABLE_ATTENTION_SHARE`, :data:`NATIVE_ATTENTION_SHARE`).
    portable_attention: Any = 1.0
    native_attention: Any = 1.0
    #: The card's matmul efficiency over :data:`REFERENCE_MATMUL_EFFICIENCY`: its GEMMs' rate
    #: relative to the fitted one.
    matmul_scale: Any = 1.0

    @classmethod
    def of(cls, gpu: GpuSpec, utilization: float | None = None) -> GpuPerf:
        mid = utilization_mid(gpu)
        util = utilization if utilization is not None else mid
        price = gpu.price_on_demand_usd_per_hour
        return cls(
            peak_flops=(gpu.peak_tflops_16bit or 0.0) * 1e12,
            utilization=util,
            intra_bps=(gpu.intra_node_gbps or DEFAULT_INTRA_NODE_GBPS) * 1e9,
            inter_bps=(gpu.inter_node_gbps or DEFAULT_INTER_NODE_GBPS) * 1e9,
            gpus_per_node=gpu.gpus_per_node,
            price_usd_per_hour=float("nan") if price is None else price,
            memory_bps=(gpu.memory_bandwidth_gbps or DEFAULT_MEMORY_GBPS) * 1e9,
            peak_fp8_flops=float("nan") if gpu.fp8_dense_tflops is None else gpu.fp8_dense_tflops * 1e12,
            kernel_speed=util / mid,
            memory_capacity=float(gpu.memory_bytes),
            portable_attention=PORTABLE_ATTENTION_SHARE.get(attention_generation(gpu), 1.0),
            native_attention=NATIVE_ATTENTION_SHARE.get(attention_generation(gpu), 1.0),
            matmul_scale=(gpu.matmul_efficiency or REFERENCE_MATMUL_EFFICIENCY) / REFERENCE_MATMUL_EFFICIENCY,
        )


def utilization_mid(gpu: GpuSpec) -> float:
    """The catalog band's middle: the geometric mean of ``utilization_low`` and ``_high``."""
    return math.sqrt(gpu.utilization_low * gpu.utilization_high)


def ring_allreduce_s(n_bytes: Any, group: Any, bps: Any) -> Any:
    """Ring all-reduce: each GPU sends and receives 2·(g−1)/g of the buffer."""
    return np.where(group > 1, 2.0 * (group - 1) / np.maximum(group, 1) * n_bytes / bps, 0.0)


def ring_allgather_s(n_bytes: Any, group: Any, bps: Any) -> Any:
    """All-gather (or reduce-scatter) of a buffer of ``n_bytes`` in total: (g−1)/g of it moves."""
    return np.where(group > 1, (group - 1) / np.maximum(group, 1) * n_bytes / bps, 0.0)


def group_collective_s(n_bytes: Any, group: Any, inner: Any, node: Any, intra_bps: Any, inter_bps: Any,
                       factor: float) -> Any:
    """A collective over ``group`` GPUs whose members are ``inner`` ranks apart (the degrees laid
    out inside it: tp·cp for data parallelism), ``factor`` 2 for an all-reduce, 1 for an
    all-gather or a reduce-scatter. Hierarchical, as NCCL runs it across nodes: the members
    inside a node exchange over the node's link, and the nodes exchange (n−1)/n of the buffer
    over the NICs of the group's members in each node (one NIC per GPU, all used at once:
    NCCL's rings and trees run one channel per NIC)."""
    group = np.asarray(group, dtype=float)
    per_node = np.minimum(np.maximum(np.floor(node / np.maximum(inner, 1)), 1.0), group)
    nodes = np.ceil(group / per_node)
    intra = np.where(per_node > 1, factor * (per_node - 1) / per_node * n_bytes / intra_bps, 0.0)
    inter = np.where(nodes > 1, factor * (nodes - 1) / nodes * n_bytes / (per_node * inter_bps), 0.0)
    return np.where(group > 1, intra + inter, 0.0)
