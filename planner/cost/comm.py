"""Communication time: alpha-beta collectives over a group's link, and the volumes each kind of
parallelism moves.

Consumes byte counts, group sizes and a :class:`planner.topology.Link` (per-GPU bus bandwidth and
latency of the slowest tier the group spans, derived from the topology graph); produces seconds.

Collective model (NVIDIA nccl-tests ``doc/PERFORMANCE.md``; Thakur et al. 2005 for ring and tree
algorithms): a ring all-reduce of ``S`` bytes over ``n`` ranks takes
``2(n-1)/n * S / B + 2(n-1) * alpha``; a double binary tree has the same bandwidth term and
``(2 ceil(log2 n) + 2) * alpha`` latency (reduce up and broadcast down a tree of depth
``ceil(log2 n)``, plus a hop each way at the root), and NCCL picks the faster, so we take the
minimum. All-gather and
reduce-scatter move ``(n-1)/n * S`` (``S`` the full gathered buffer), all-to-all the same.
Volumes per layer follow Narayanan et al. 2021 §3.2 / Korthikanti et al. 2022 §4.2.2 (TP),
§4.1 (PP point-to-point), ZeRO §7 (DP and ZeRO-3), Llama 3 §3.3.2 (context parallel ring).
"""
from __future__ import annotations

import math

from planner.topology import Link


def all_reduce_s(size_bytes: float, n: int, link: Link) -> float:
    if n <= 1 or size_bytes <= 0:
        return 0.0
    bandwidth = 2 * (n - 1) / n * size_bytes / link.bandwidth_bytes_per_s
    latency = min(2 * (n - 1), 2 * math.ceil(math.log2(n)) + 2) * link.latency_s
    return bandwidth + latency


def all_gather_s(size_bytes: float, n: int, link: Link) -> float:
    """All-gather (or reduce-scatter) where ``size_bytes`` is the full, gathered buffer."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return (n - 1) / n * size_bytes / link.bandwidth_bytes_per_s + (n - 1) * link.latency_s


reduce_scatter_s = all_gather_s


def all_to_all_s(size_bytes: float, n: int, link: Link) -> float:
    """All-to-all where each rank holds ``size_bytes`` and keeps 1/n of it (uses the link's
    all-to-all bandwidth: across nodes every member talks to every other node)."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    bandwidth = link.all_to_all_bandwidth_bytes_per_s or link.bandwidth_bytes_per_s
    return (n - 1) / n * size_bytes / bandwidth + (n - 1) * link.latency_s


def p2p_s(size_bytes: float, link: Link) -> float:
    if size_bytes <= 0:
        return 0.0
    return size_bytes / link.bandwidth_bytes_per_s + link.latency_s


def ring_hop_s(size_bytes: float, link: Link) -> float:
    """One step of a point-to-point ring in which every member sends ``size_bytes`` to its
    neighbour at once (context parallelism's KV exchange: Transformer Engine
    ``AttnFuncWithCPAndKVP2P`` sends the KV chunk, or the KV and its gradient, to the next CP
    rank each step). Each hop is one send between two GPUs, so it gets one of the channels the
    group's ring bandwidth sums (``Link.channels``: across nodes one NIC, as NCCL gives a
    point-to-point connection to a remote peer the GPU's own NIC; inside an NVSwitch node the
    whole NVLink bandwidth), and the step lasts as long as its slowest hop."""
    if size_bytes <= 0:
        return 0.0
    return size_bytes / (link.bandwidth_bytes_per_s / max(link.channels, 1)) + link.latency_s


def tp_collective_s(size_bytes: float, tp: int, link: Link, sp: bool) -> float:
    """One TP synchronisation point: an all-reduce, or with sequence parallelism an all-gather
    plus a reduce-scatter of the same total volume (Korthikanti et al. 2022 §4.2.2)."""
    if sp:
        return all_gather_s(size_bytes, tp, link) + reduce_scatter_s(size_bytes, tp, link)
    return all_reduce_s(size_bytes, tp, link)
