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

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (raises KeyError when the GPU has no such unit)."""
        return self.peak_tflops[dtype] * 1e12


@dataclass(frozen=True)
class NetworkTier:
    """One level of the interconnect, innermost first.

    ``domain_gpus`` is how many GPUs this tier connects directly (8 for an NVLink node, the whole
    cluster for a fat tree). ``bandwidth_gbytes_per_s`` is per GPU per direction; ``efficiency``
    the fraction of it NCCL's bus bandwidth reaches for large messages (nccl-tests busbw / link).
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

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def memory_bytes_per_gpu(self) -> float:
        return self.gpu.memory_gib * GIB
