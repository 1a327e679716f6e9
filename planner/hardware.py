"""Hardware vocabulary: GPU specs, network tiers and clusters (plain data, units in names).

Bandwidths are **gigabytes (1e9 bytes) per second per GPU per direction**; NIC line rates quoted
in Gb/s must be divided by 8 (400 Gb/s NDR = 50 GB/s), NVLink figures quoted as bidirectional
totals must be halved (A100: 600 GB/s total = 300 GB/s per direction). Memory is GiB (2**30
bytes). Latency is microseconds. Peak throughput is dense (no 2:4 sparsity) TFLOP/s per dtype.

A cluster is one or more **pools**: a :class:`Cluster` is one homogeneous pool (what the
one-pool cost model and solver read); a :class:`MultiPoolCluster` is several pools (each its own
GPU type, node shape and fabric, a :class:`Pool`) joined by an :class:`InterPoolLink`. Global
ranks are pool-major: pool 0 holds ranks ``0 .. n0 - 1``, pool 1 the next ``n1``, and so on;
inside a pool ranks are node-major as in a :class:`Cluster`. ``Cluster.pools`` gives a
one-pool cluster's pools too, so per-pool code can read memory, compute and bandwidth the
same way for both.

Produced by ``clusters/`` (loader and presets); consumed by ``planner/cost``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import ClassVar, Mapping

from planner.hashing import cached_hash, state_without_hash

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
        return cached_hash(self, lambda g: (
            g.name, g.memory_gib, g.hbm_bandwidth_gbytes_per_s,
            tuple(sorted(g.peak_tflops.items())), g.num_sms, g.matmul_efficiency,
            g.reserve_gib, g.attention_efficiency))

    __getstate__ = state_without_hash

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
    :func:`planner.topology.group_link` for the bandwidth a communication group actually gets.
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
class HostMemory:
    """The host side of one GPU: its share of the node's CPU memory, memory bandwidth and
    cores, and its link to the host (PCIe, NVLink-C2C), all per GPU (the node's figure divided
    by its GPUs). What ZeRO-Offload-style optimizer offload (planner/cost/offload.py) reads."""

    memory_gib: float  # host memory per GPU
    link_gbytes_per_s: float  # GPU <-> host, per direction
    memory_bandwidth_gbytes_per_s: float  # host DRAM bandwidth per GPU
    cpu_cores: float  # host cores per GPU
    core_gflops: float  # FP32 FLOP/s of one core (vector units at base clock)
    link_efficiency: float = 0.8  # achieved share of the link for large pinned copies
    memory_efficiency: float = 0.8  # achieved share of the DRAM bandwidth (STREAM-like)
    link: str = ""  # PCIe Gen5 x16, NVLink-C2C, ...

    @property
    def capacity_bytes(self) -> float:
        return self.memory_gib * GIB

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbytes_per_s * self.link_efficiency * GB

    @property
    def memory_bytes_per_s(self) -> float:
        return self.memory_bandwidth_gbytes_per_s * self.memory_efficiency * GB

    @property
    def flops_per_s(self) -> float:
        return self.cpu_cores * self.core_gflops * 1e9


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
    # Fabric shape above the NICs (see docs/clusters.md and planner/topology.py): rail-optimized
    # leaves per scalable unit of this many nodes, a spine above them when there is more than one
    # unit, its oversubscription (>= 1) and the extra latency of a path through it.
    scalable_unit_nodes: int = 32
    spine_oversubscription: float = 1.0
    spine_latency_us: float = 0.5
    # How tier 0 joins the GPUs of a node: "switch" (NVSwitch: every GPU has its full tier-0
    # bandwidth to any peer) or "full_mesh" (AMD Infinity Fabric: the tier-0 bandwidth is split
    # over gpus_per_node - 1 point-to-point links).
    intra_node_topology: str = "switch"
    # The host memory, link and cores of each GPU (the cluster file's host: section; None:
    # not described, no offload options). Named for its memory: "host" reads as a machine name.
    cpu_memory: HostMemory | None = None
    # GPUs per host (one OS running one launcher; 0: the node is one host). Launch lines only
    # (planner/export): a GB200/GB300 NVL72 rack is one node (one NVLink domain, what the cost
    # model reads) of 18 compute trays of 4 GPUs, each tray its own host. Divides gpus_per_node.
    gpus_per_host: int = 0

    # Fields left out of the plain form (content hash, plan file) while at their default, so a
    # cluster that does not use them keeps the hash it had before they existed.
    PLAIN_OMIT_DEFAULT: ClassVar[tuple[str, ...]] = ("gpus_per_host",)

    def __hash__(self) -> int:  # computed once (cost caches key on clusters)
        return cached_hash(self, lambda c: (c.name, c.gpu, c.gpus_per_node, c.num_nodes,
                                            c.tiers, c.nics_per_node))

    __getstate__ = state_without_hash

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def host_gpus(self) -> int:
        """GPUs per host: the processes one launcher starts (``gpus_per_host``, else the node's)."""
        return self.gpus_per_host or self.gpus_per_node

    @property
    def num_hosts(self) -> int:
        return self.num_gpus // self.host_gpus

    @property
    def memory_bytes_per_gpu(self) -> float:
        return self.gpu.memory_gib * GIB

    @property
    def pools(self) -> tuple["Pool", ...]:
        """This cluster as its one pool (ranks 0 .. num_gpus - 1)."""
        return (Pool.from_cluster(self),)

    @property
    def inter_pool(self) -> None:
        """One pool: no inter-pool link."""
        return None


@dataclass(frozen=True)
class Pool:
    """One homogeneous pool of a cluster: ``num_nodes`` nodes of ``gpus_per_node`` GPUs of one
    type, with its own tiers and fabric (fields as in :class:`Cluster`), holding the global
    ranks ``first_rank .. first_rank + num_gpus - 1``.

    What the cost model reads per pool: memory (:attr:`memory_bytes_per_gpu`), compute
    (:meth:`peak_flops`, ``gpu.matmul_efficiency``), HBM bandwidth
    (:attr:`hbm_bandwidth_bytes_per_s`) and the network (``tiers``; :meth:`as_cluster` gives
    the pool as a :class:`Cluster`, which ``planner.topology.group_link`` costs groups on).
    """

    name: str
    gpu: Gpu
    gpus_per_node: int
    num_nodes: int
    tiers: tuple[NetworkTier, ...]
    nics_per_node: int = 0  # 0: one per GPU
    scalable_unit_nodes: int = 32
    spine_oversubscription: float = 1.0
    spine_latency_us: float = 0.5
    intra_node_topology: str = "switch"
    first_rank: int = 0

    def __hash__(self) -> int:
        return hash((self.name, self.gpu, self.gpus_per_node, self.num_nodes, self.tiers,
                     self.nics_per_node, self.first_rank))

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.num_gpus)

    @property
    def memory_bytes_per_gpu(self) -> float:
        return self.gpu.memory_gib * GIB

    @property
    def hbm_bandwidth_bytes_per_s(self) -> float:
        return self.gpu.hbm_bandwidth_gbytes_per_s * GB

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s per GPU for ``dtype`` (KeyError when the GPU lacks the unit)."""
        return self.gpu.peak_flops(dtype)

    def as_cluster(self, name: str | None = None, *, num_nodes: int | None = None) -> Cluster:
        """This pool as a homogeneous :class:`Cluster` (ranks renumbered from 0), optionally
        cut to its first ``num_nodes`` nodes (the tiers' ``domain_gpus`` follow)."""
        return _pool_cluster(self, name, num_nodes)

    def _as_cluster(self, name: str | None, num_nodes: int | None) -> Cluster:
        nodes = self.num_nodes if num_nodes is None else num_nodes
        domains = (self.gpus_per_node, self.gpus_per_node * nodes)
        tiers = tuple(NetworkTier(t.name, domains[min(i, 1)], t.bandwidth_gbytes_per_s,
                                  t.latency_us, t.efficiency) for i, t in enumerate(self.tiers))
        return Cluster(name=name or self.name, gpu=self.gpu, gpus_per_node=self.gpus_per_node,
                       num_nodes=nodes, tiers=tiers, nics_per_node=self.nics_per_node,
                       scalable_unit_nodes=self.scalable_unit_nodes,
                       spine_oversubscription=self.spine_oversubscription,
                       spine_latency_us=self.spine_latency_us,
                       intra_node_topology=self.intra_node_topology)

    @staticmethod
    def from_cluster(cluster: Cluster, name: str | None = None, first_rank: int = 0) -> "Pool":
        return Pool(name=name or cluster.name, gpu=cluster.gpu,
                    gpus_per_node=cluster.gpus_per_node, num_nodes=cluster.num_nodes,
                    tiers=cluster.tiers, nics_per_node=cluster.nics_per_node,
                    scalable_unit_nodes=cluster.scalable_unit_nodes,
                    spine_oversubscription=cluster.spine_oversubscription,
                    spine_latency_us=cluster.spine_latency_us,
                    intra_node_topology=cluster.intra_node_topology, first_rank=first_rank)


@lru_cache(maxsize=1024)
def _pool_cluster(pool: Pool, name: str | None, num_nodes: int | None) -> Cluster:
    return pool._as_cluster(name, num_nodes)


@dataclass(frozen=True)
class InterPoolLink:
    """How pools reach each other: each pool's fabric (its spine) has an uplink of
    ``bandwidth_gbytes_per_s`` per direction (the aggregate of the links between the pools,
    GB/s = 1e9 bytes/s) to one inter-pool switch; every flow between pools shares it. A path
    from one pool to another adds ``latency_us``. ``efficiency`` is the fraction of the
    bandwidth collectives reach, as for a tier."""

    bandwidth_gbytes_per_s: float
    latency_us: float
    efficiency: float = 1.0
    name: str = "inter-pool"

    @property
    def effective_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_gbytes_per_s * self.efficiency * GB


@dataclass(frozen=True)
class MultiPoolCluster:
    """Several pools joined by one inter-pool link (see the module docstring for rank order).

    It has no single ``gpu`` or ``gpus_per_node``: code that plans one homogeneous pool takes a
    :class:`Cluster` (one pool's :meth:`Pool.as_cluster`), code that plans across pools reads
    ``pools``.
    """

    name: str
    pools: tuple[Pool, ...]
    inter_pool: InterPoolLink
    source: str = ""
    description: str = ""

    @property
    def num_gpus(self) -> int:
        return sum(p.num_gpus for p in self.pools)

    @property
    def num_nodes(self) -> int:
        return sum(p.num_nodes for p in self.pools)

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def pool_of_rank(self, rank: int) -> Pool:
        for p in self.pools:
            if rank in p.ranks:
                return p
        raise IndexError(f"rank {rank} is not in cluster {self.name!r} "
                         f"({self.num_gpus} GPUs)")

    def pool_index(self, rank: int) -> int:
        return self.pools.index(self.pool_of_rank(rank))
