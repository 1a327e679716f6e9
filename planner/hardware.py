"""Hardware vocabulary: GPU specs, network tiers and clusters (plain data, units in names).

Bandwidths are **gigabytes (1e9 bytes) per second per GPU per direction**; NIC line rates quoted
in Gb/s must be divided by 8 (400 Gb/s NDR = 50 GB/s), NVLink figures quoted as bidirectional
totals must be halved (A100: 600 GB/s total = 300 GB/s per direction). Memory is GiB (2**30
bytes). Latency is microseconds. Peak throughput is dense (no 2:4 sparsity) TFLOP/s per dtype.

Produced by ``clusters/`` (loader and presets); consumed by ``planner/cost``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

GIB = 2**30
GB = 10**9


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    hbm_bandwidth_gbytes_per_s: float
    peak_tflops: Mapping[str, float]  # dtype -> dense TFLOP/s, e.g. {"bf16": 312, "fp16": 312}
    num_sms: int  # streaming multiprocessors / compute units: sets GEMM wave quantization
    vendor: str = "nvidia"
    # Fraction of dense peak that a large, well-shaped GEMM reaches with the vendor BLAS (cuBLAS /
    # hipBLASLt). Shape effects (tiles, waves, small K) come on top, in planner/cost/compute.py.
    matmul_efficiency: float = 0.80
    # Memory a device shows in use before any tensor exists: CUDA context, cuBLAS/cuDNN
    # workspaces, NCCL channel buffers (CUDA context alone is ~0.5 GiB on A100/H100; a 3-D
    # parallel job holds several NCCL communicators). Calibrated in docs/accuracy.md.
    reserve_gib: float = 2.5
    # Fraction of dense peak the fused (flash) attention kernels reach in forward; backward
    # reaches FLASH_BWD_RATIO of that (planner/cost/compute.py). FlashAttention-2 (Dao 2023 §4)
    # reaches 50-73 % of peak forward on A100 but only ~35-40 % on H100 (FlashAttention-3 paper,
    # Shah et al. 2024, Fig. 1 baseline). None: 80 % of matmul_efficiency.
    attention_efficiency: float | None = None

    def __hash__(self) -> int:  # peak_tflops is a mapping: hash its items (cost caches key on Gpu)
        return hash((self.name, self.memory_gib, self.hbm_bandwidth_gbytes_per_s,
                     tuple(sorted(self.peak_tflops.items())), self.num_sms, self.matmul_efficiency,
                     self.reserve_gib, self.attention_efficiency))

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (raises KeyError when the GPU has no such unit)."""
        return self.peak_tflops[dtype] * 1e12


@dataclass(frozen=True)
class NetworkTier:
    """One level of the interconnect, innermost first.

    ``domain_gpus`` is how many GPUs this tier connects directly (8 for an NVLink node, the whole
    cluster for a fat tree). ``bandwidth_gbytes_per_s`` is per GPU per direction; ``efficiency``
    the fraction of it NCCL's bus bandwidth reaches for large messages (nccl-tests busbw / link).
    For the inter-node tier it is per NIC per direction (the NIC line rate): equal to per GPU
    when each GPU has its own NIC; with fewer NICs than GPUs, GPUs share it. Use
    :func:`clusters.topology.group_link` for the bandwidth a communication group actually gets.
    """

    name: str
    domain_gpus: int
    bandwidth_gbytes_per_s: float
    latency_us: float
    efficiency: float = 1.0

    @property
    def effective_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_gbytes_per_s * self.efficiency * GB


@dataclass(frozen=True)
class Cluster:
    """A homogeneous pool: ``num_nodes`` nodes of ``gpus_per_node`` identical GPUs.

    ``tiers`` lists the interconnect levels innermost first: tier 0 joins the GPUs of one node
    (NVLink / NVSwitch / Infinity Fabric), the last tier the whole cluster (InfiniBand, RoCE).
    ``nics_per_node`` NICs share the node's traffic on the inter-node tier (one per GPU on DGX).
    """

    name: str
    gpu: Gpu
    gpus_per_node: int
    num_nodes: int
    tiers: tuple[NetworkTier, ...]
    nics_per_node: int = 0  # 0: one per GPU
    source: str = ""
    description: str = ""
    extra: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    # Fabric shape above the NICs (see docs/clusters.md and clusters/topology.py): rail-optimized
    # leaves per scalable unit of this many nodes, a spine above them when there is more than one
    # unit, its oversubscription (>= 1) and the extra latency of a path through it.
    scalable_unit_nodes: int = 32
    spine_oversubscription: float = 1.0
    spine_latency_us: float = 0.5
    # How tier 0 joins the GPUs of a node: "switch" (NVSwitch: every GPU has its full tier-0
    # bandwidth to any peer) or "full_mesh" (AMD Infinity Fabric: the tier-0 bandwidth is split
    # over gpus_per_node - 1 point-to-point links).
    intra_node_topology: str = "switch"

    def __hash__(self) -> int:
        return hash((self.name, self.gpu, self.gpus_per_node, self.num_nodes, self.tiers,
                     self.nics_per_node))

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def memory_bytes_per_gpu(self) -> float:
        return self.gpu.memory_gib * GIB
