"""Topology of a multi-pool cluster, and the links of groups inside one pool or across pools.

Consumes: a :class:`~planner.hardware.MultiPoolCluster`.
Produces: :func:`build_pool_topology` -> one ``networkx.Graph`` of every pool's GPUs, switches,
NICs, leaves and spine plus the inter-pool switch; :func:`pool_group_link` -> the
:class:`~planner.topology.Link` of a group inside one pool; :func:`cross_pool_link` -> the
Link of a group whose ring visits several pools (a data-parallel group over replicas in two
pools, or the point-to-point transfers of a pipeline boundary between pools).

Graph. Each pool's part is the one-pool graph of :func:`planner.topology.build_topology` for
that pool (same edge attributes: ``bandwidth_bytes_per_s`` per direction with efficiency,
``latency_s``, ``route_cost``, ``tier``), relabelled to be unique across pools:
``("gpu", node, local)`` and ``("switch", node)`` / ``("nic", node, k)`` use *global* node
numbers (pools in file order, each pool's nodes after the previous pool's), GPU vertices carry
``rank`` (global, pool-major), ``node`` and ``pool``; leaves become ``("leaf", pool, su, k)``
and every pool has a spine ``("spine", pool)`` (also with one scalable unit: the pool's exit),
whose leaf uplinks carry (nodes under the leaf) x NIC bandwidth / ``spine_oversubscription``
as in one pool. Each spine joins ``("inter_pool",)`` by an edge of the inter-pool link's
bandwidth (x efficiency) with half its latency, so a path between pools crosses it once.

Groups across pools. A ring that visits pools ``P1 .. Pk`` in order leaves each pool once and
enters it once, per channel (NCCL ring). With ``concurrent`` such groups running at once, each
pool's uplink to the inter-pool switch carries ``concurrent x channels`` channels each way, so
the bus bandwidth (the sum over a group's channels) is at most uplink / ``concurrent``. The
crossing hops of the concurrent groups are assumed spread evenly over the pool's leaves and
NICs (one crossing hop per GPU at most): each leaf uplink carries
``ceil(concurrent x channels / leaves)`` of them, each NIC ``ceil(concurrent x channels /
NICs)``. Inside each pool the group's members are a group of that pool's (size, stride) layout,
costed by :func:`planner.topology.group_link` on the pool (its concurrent in-pool groups
loading the pool's links); the crossing hop replaces that ring's closing hop, so it adds no
NIC load there. Bandwidth: the minimum of those bounds; latency: the largest of the segments'
and of the crossing path's (NIC, leaf, spine, inter-pool switch and back down), read off the
graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import networkx as nx

from planner.topology import Link, _build_graph, _topo, group_link
from planner.errors import invalid
from planner.hardware import MultiPoolCluster, Pool

_COST_NETWORK = 2  # as planner.topology: network hops cost more than NVLink hops
INTER_POOL_VERTEX = ("inter_pool",)


@dataclass(frozen=True)
class Segment:
    """The members of a cross-pool group inside one pool: ``size`` ranks ``base + i * stride``
    of pool ``pool`` (ranks relative to the pool's first rank)."""

    pool: str
    size: int
    stride: int = 1
    base: int = 0


def _pool_index(cluster: MultiPoolCluster, pool: str | int | Pool) -> int:
    if isinstance(pool, Pool):
        pool = pool.name
    if isinstance(pool, int) and not isinstance(pool, bool):
        if 0 <= pool < len(cluster.pools):
            return pool
    else:
        for index, p in enumerate(cluster.pools):
            if p.name == pool:
                return index
    raise invalid(f"cluster {cluster.name!r} has no pool {pool!r}; pools: "
                  f"{', '.join(p.name for p in cluster.pools)}")


def _check(cluster: MultiPoolCluster) -> None:
    if not isinstance(cluster, MultiPoolCluster):
        raise invalid(f"expected a MultiPoolCluster, got {type(cluster).__name__}")


def _pool_graph(cluster: MultiPoolCluster, index: int) -> nx.Graph:
    """One pool's graph, relabelled (see the module docstring)."""
    pool = cluster.pools[index]
    topo = _topo(pool.as_cluster())
    node_offset = sum(p.num_nodes for p in cluster.pools[:index])
    local = _build_graph(topo, range(pool.num_nodes))

    def label(v: tuple) -> tuple:
        if v[0] in ("gpu", "switch", "nic"):
            return (v[0], v[1] + node_offset) + v[2:]
        if v[0] == "leaf":
            return ("leaf", pool.name) + v[1:]
        return ("spine", pool.name)

    g = nx.relabel_nodes(local, label, copy=True)
    for v, data in g.nodes(data=True):
        data["pool"] = pool.name
        if data.get("kind") == "gpu":
            data["rank"] += pool.first_rank
            data["node"] += node_offset
    spine = ("spine", pool.name)
    if spine not in g:  # one scalable unit: add the spine the pool's traffic leaves through
        g.add_node(spine, kind="spine", pool=pool.name)
        per_su: dict[int, int] = {}
        for node in range(pool.num_nodes):
            per_su[topo.su_of(node)] = per_su.get(topo.su_of(node), 0) + 1
        for su, count in sorted(per_su.items()):
            for k in range(topo.nics):
                g.add_edge(("leaf", pool.name, su, k), spine,
                           bandwidth_bytes_per_s=count * topo.net_bytes_per_s / topo.oversubscription,
                           latency_s=topo.spine_latency_s / 2, route_cost=_COST_NETWORK,
                           tier=topo.net_name)
    return g


@lru_cache(maxsize=4)
def build_pool_topology(cluster: MultiPoolCluster) -> nx.Graph:
    """Every pool and the inter-pool switch as one graph (see the module docstring).

    The result is cached and shared: do not modify it."""
    _check(cluster)
    graph = nx.Graph(name=cluster.name, pools=tuple(p.name for p in cluster.pools))
    link = cluster.inter_pool
    graph.add_node(INTER_POOL_VERTEX, kind="inter_pool")
    for index, pool in enumerate(cluster.pools):
        graph.update(_pool_graph(cluster, index))
        graph.add_edge(("spine", pool.name), INTER_POOL_VERTEX,
                       bandwidth_bytes_per_s=link.effective_bandwidth_bytes_per_s,
                       latency_s=link.latency_us * 1e-6 / 2, route_cost=_COST_NETWORK,
                       tier=link.name)
    return graph


def pool_group_link(cluster: MultiPoolCluster, pool: str | int, size: int, stride: int) -> Link:
    """The link of the group of ranks ``i * stride`` (i < size) of one pool, ranks relative
    to the pool (the pool's own layout: every group like it runs at once)."""
    _check(cluster)
    return group_link(cluster.pools[_pool_index(cluster, pool)].as_cluster(), size, stride)


def _crossing_path(cluster: MultiPoolCluster, a: int, b: int) -> list[tuple]:
    """Vertices of the path from the first GPU of pool ``a`` to the first GPU of pool ``b``."""
    def side(index: int) -> list[tuple]:
        pool = cluster.pools[index]
        node = sum(p.num_nodes for p in cluster.pools[:index])
        return [("gpu", node, 0), ("nic", node, 0), ("leaf", pool.name, 0, 0),
                ("spine", pool.name)]

    return side(a) + [INTER_POOL_VERTEX] + side(b)[::-1]


def cross_pool_link(cluster: MultiPoolCluster, segments: Sequence[Segment],
                    concurrent: int = 1) -> Link:
    """The link of one group whose ring visits ``segments`` (in order, at least two pools),
    with ``concurrent`` groups like it running their collective at once.

    Examples: the DP group of a replica on pool A and one on pool B is
    ``[Segment("a", 1, s), Segment("b", 1, s)]`` with ``concurrent`` the number of such groups
    (tp x pp); a pipeline boundary from a stage on pool A to one on pool B moves tp x dp
    transfers at once: ``[Segment("a", 1), Segment("b", 1)]`` with ``concurrent = tp * dp``.
    """
    _check(cluster)
    if isinstance(concurrent, bool) or not isinstance(concurrent, int) or concurrent < 1:
        raise invalid(f"concurrent must be an integer >= 1, got {concurrent!r}")
    indices = [_pool_index(cluster, s.pool) for s in segments]
    if len(set(indices)) < 2:
        raise invalid("a cross-pool group needs members in at least two pools",
                      "use pool_group_link for a group inside one pool")
    if len(set(indices)) != len(indices):
        raise invalid("each pool may appear once in a cross-pool group's ring")
    graph = build_pool_topology(cluster)
    bandwidth = math.inf
    latency_s = 0.0
    channels = 1
    for seg, index in zip(segments, indices):
        pool = cluster.pools[index]
        if seg.size < 1 or seg.stride < 1 or seg.base < 0 or \
                seg.base + (seg.size - 1) * seg.stride >= pool.num_gpus:
            raise invalid(f"segment of {seg.size} ranks with stride {seg.stride} from "
                          f"{seg.base} does not fit pool {pool.name!r} ({pool.num_gpus} GPUs)")
        if seg.size > 1:
            inside = group_link(pool.as_cluster(), seg.size, seg.stride)
            bandwidth = min(bandwidth, inside.bandwidth_bytes_per_s)
            latency_s = max(latency_s, inside.latency_s)
            channels = max(channels, inside.channels)
    flows = concurrent * channels  # crossing channels per pool and direction
    for index in indices:
        pool = cluster.pools[index]
        topo = _topo(pool.as_cluster())
        spine = ("spine", pool.name)
        uplink = graph.edges[spine, INTER_POOL_VERTEX]["bandwidth_bytes_per_s"]
        bandwidth = min(bandwidth, uplink / concurrent)
        leaves = [v for v in graph.neighbors(spine) if v[0] == "leaf"]
        leaf_capacity = min(graph.edges[v, spine]["bandwidth_bytes_per_s"] for v in leaves)
        bandwidth = min(bandwidth, channels * leaf_capacity / math.ceil(flows / len(leaves)))
        nics = pool.num_nodes * topo.nics
        bandwidth = min(bandwidth, channels * topo.net_bytes_per_s / math.ceil(flows / nics))
    # all-to-all: of every member's S, the share (members elsewhere) / n leaves its pool
    total = sum(s.size for s in segments)
    a2a = math.inf
    for seg, index in zip(segments, indices):
        inside = group_link(cluster.pools[index].as_cluster(), seg.size, seg.stride)
        a2a = min(a2a, inside.all_to_all_bandwidth_bytes_per_s or math.inf)
        uplink = graph.edges[("spine", cluster.pools[index].name), INTER_POOL_VERTEX][
            "bandwidth_bytes_per_s"]
        a2a = min(a2a, (total - 1) * uplink / (concurrent * seg.size * (total - seg.size)))
        # each member's NIC carries its (total - size) / total share to the other pools
        nic = _topo(cluster.pools[index].as_cluster()).net_bytes_per_s
        a2a = min(a2a, (total - 1) * nic / (total - seg.size))
    for a, b in zip(indices, indices[1:] + indices[:1]):
        path = _crossing_path(cluster, a, b)
        latency_s = max(latency_s, sum(graph.edges[u, v]["latency_s"]
                                       for u, v in zip(path, path[1:])))
    return Link(bandwidth_bytes_per_s=bandwidth, latency_s=round(latency_s, 12),
                tier=cluster.inter_pool.name, crosses_nodes=True, channels=channels,
                all_to_all_bandwidth_bytes_per_s=a2a)
