"""Cluster topology graph and the bandwidth/latency a communication group gets on it.

Consumes: a :class:`~planner.hardware.Cluster`.
Produces: :func:`build_topology` -> a ``networkx.Graph`` of GPUs, switches and NICs; and
:func:`group_link` -> a :class:`Link`, the bus bandwidth (bytes/s, per GPU per direction, the
``B`` of nccl-tests' busbw and of the alpha-beta collective formulas) and per-step latency (s)
of a group of ranks ``base + i * stride``, derived from that graph.

Graph (vertex ids are tuples; every edge has ``bandwidth_bytes_per_s`` -- effective capacity
*per direction*, efficiency applied -- ``latency_s`` and an integer ``route_cost``):

* ``("gpu", node, local)``: ranks are node-major, rank = node * gpus_per_node + local;
* ``("switch", node)``: the node's NVSwitch, edge to each GPU at the tier-0 per-GPU bandwidth
  (latency split half/half so GPU -> switch -> GPU sums to the tier-0 latency). With
  ``intra_node_topology: full_mesh`` (AMD Infinity Fabric) there is no switch: each GPU pair
  has a direct edge of tier-0 bandwidth / (gpus_per_node - 1);
* ``("nic", node, k)``: ``nics_per_node`` NICs (0 = one per GPU); GPU ``local`` attaches to NIC
  ``local * nics // gpus_per_node``, so with 4 NICs for 8 GPUs GPUs 0-1 share NIC 0;
* ``("leaf", su, k)``: rail-optimized leaves (DGX SuperPOD RA, NVIDIA DGX datasheets and the DGX SuperPOD reference architecture): NIC k of every
  node in scalable unit ``su = node // scalable_unit_nodes`` connects to leaf k of that unit.
  NIC edges carry the inter-node tier bandwidth and latency (half on each NIC -> leaf edge);
* ``("spine",)``: present when the cluster has more than one scalable unit; each leaf's uplink
  carries (nodes under the leaf) x NIC bandwidth / ``spine_oversubscription`` and adds
  ``spine_latency_us`` per traversal.

Group bandwidth: every group of the same (size, stride) runs its collective at the same time
(all TP groups, all DP groups, ...), each as NCCL-style rings ("channels"): a group that spans
nodes with ``m`` members per node runs ``m`` rings, rotated so that each leaves the node from a
different member (NCCL uses one channel per NIC); a group inside one full-mesh node runs
``k - 1`` shifted rings over its ``k`` members so all its direct links are used; otherwise one
ring in rank order. Each ring hop is routed on the graph by least ``route_cost`` (NVLink hops
cost 1, network hops 2, so traffic stays on NVLink inside a node and, across rails, moves to
the destination's rail over NVLink first -- NCCL's PXN -- rather than crossing the spine; ties
go to the path that stays longest in the source node). Each hop loads every directed edge on its
path with 1/channels; the group's bus bandwidth is min over the directed edges its own hops use
of capacity / load, and its latency the largest path latency of its hops.

All-to-all (MoE) traffic is modelled separately: every member sends 1/n of its buffer to
every other member; see :func:`_all_to_all_bandwidth`.

Scale: rings are periodic, so the ring computation runs on a window of at most
``min(2 * scalable_unit_nodes, MAX_WINDOW_GPUS / gpus_per_node, MAX_WINDOW_HOPS /
gpus_per_node**2)`` (at least 2) nodes touched by the first group (a longer ring is closed
inside the window; leaf uplinks get the window's share of their capacity). Paths are routed
once per (local src, local dst, same node / same unit / other unit) class and relabelled (one
router for all clusters that differ only in size, bandwidths or tier names), and results are
memoised per (topology, size, stride), and across node counts where the size does not enter
(same spine presence, same groups in the window): about 50 ms uncached and 30 us cached for
the largest groups of a 16,384-GPU cluster.
"""
from __future__ import annotations

import math
import numbers
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, NamedTuple

import networkx as nx

from planner.errors import invalid
from planner.hardware import Cluster

MAX_WINDOW_GPUS = 1024
# Rings with up to gpus_per_node channels over the window's GPUs: bounds the routing work on
# nodes with very many GPUs (an NVL72 rack as one node gets a window of 3 nodes).
MAX_WINDOW_HOPS = 16384

# route_cost per edge kind: NVLink-domain hops are cheaper than network hops.
_COST_NVLINK = 1
_COST_NETWORK = 2


@dataclass(frozen=True)
class Link:
    """What one communication group gets: bus bandwidth and per-step latency.

    ``bandwidth_bytes_per_s``: effective bus bandwidth per GPU per direction (link bandwidth x
    efficiency, with shared-NIC, concurrent-group and oversubscription effects applied; for a
    group spanning nodes with several members per node this is the sum over its rings, as in
    nccl-tests busbw). ``latency_s``: latency of one ring step on the slowest path.
    ``tier``: name of the outermost tier the group crosses. ``channels``: rings the bandwidth
    assumes.
    """

    bandwidth_bytes_per_s: float
    latency_s: float
    tier: str
    crosses_nodes: bool
    channels: int = 1
    # All-to-all (MoE expert parallel) bus bandwidth, t = (n-1)/n * S / B: lower than the ring
    # bandwidth across nodes, since every member sends to every other node. None: same as
    # bandwidth_bytes_per_s (group_link always fills it in).
    all_to_all_bandwidth_bytes_per_s: float | None = None


class _Topo(NamedTuple):
    """The hashable, topology-relevant part of a Cluster (the memoisation key)."""

    gpus_per_node: int
    num_nodes: int
    nics: int
    su_nodes: int
    full_mesh: bool
    tier0_bytes_per_s: float  # effective, per GPU per direction
    tier0_latency_s: float
    tier0_name: str
    net_bytes_per_s: float  # effective, per NIC per direction (0 without an inter-node tier)
    net_latency_s: float
    net_name: str
    oversubscription: float
    spine_latency_s: float

    @property
    def has_spine(self) -> bool:
        return self.num_nodes > self.su_nodes

    def nic_of(self, local: int) -> int:
        return local * self.nics // self.gpus_per_node

    def su_of(self, node: int) -> int:
        return node // self.su_nodes


def _topo(cluster: Cluster) -> _Topo:
    if not isinstance(cluster, Cluster):
        raise invalid(f"expected a Cluster, got {type(cluster).__name__}")
    t0 = cluster.tiers[0]
    net = cluster.tiers[-1] if len(cluster.tiers) > 1 else None
    gpn = cluster.gpus_per_node
    return _Topo(
        gpus_per_node=gpn, num_nodes=cluster.num_nodes,
        nics=cluster.nics_per_node or gpn,
        su_nodes=max(1, cluster.scalable_unit_nodes),
        full_mesh=cluster.intra_node_topology == "full_mesh" and gpn > 1,
        tier0_bytes_per_s=t0.effective_bandwidth_bytes_per_s,
        tier0_latency_s=t0.latency_us * 1e-6, tier0_name=t0.name,
        net_bytes_per_s=net.effective_bandwidth_bytes_per_s if net else 0.0,
        net_latency_s=net.latency_us * 1e-6 if net else 0.0,
        net_name=net.name if net else t0.name,
        oversubscription=max(1.0, cluster.spine_oversubscription),
        spine_latency_s=cluster.spine_latency_us * 1e-6)


# -- graph -----------------------------------------------------------------------------------

def build_topology(cluster: Cluster) -> nx.Graph:
    """The whole cluster as a graph (see the module docstring for vertices and attributes)."""
    topo = _topo(cluster)
    graph = _build_graph(topo, range(topo.num_nodes))
    graph.graph.update(name=cluster.name, gpus_per_node=topo.gpus_per_node,
                       num_nodes=topo.num_nodes)
    return graph


def _build_graph(topo: _Topo, nodes: Iterable[int]) -> nx.Graph:
    """The sub-graph of ``nodes`` (their GPUs, switches, NICs and leaves, and the spine).

    Leaf uplinks get the capacity share of the nodes present, so a window of a large cluster
    sees the per-node spine capacity of the full fabric.
    """
    g = nx.Graph()
    gpn = topo.gpus_per_node
    nodes = list(nodes)
    half0 = topo.tier0_latency_s / 2
    for node in nodes:
        gpus = [("gpu", node, local) for local in range(gpn)]
        for local, gpu in enumerate(gpus):
            g.add_node(gpu, kind="gpu", rank=node * gpn + local, node=node)
        if topo.full_mesh:
            per_link = topo.tier0_bytes_per_s / (gpn - 1)
            for i in range(gpn):
                for j in range(i + 1, gpn):
                    g.add_edge(gpus[i], gpus[j], bandwidth_bytes_per_s=per_link,
                               latency_s=topo.tier0_latency_s, route_cost=2 * _COST_NVLINK,
                               tier=topo.tier0_name)
        elif gpn > 1:
            switch = ("switch", node)
            g.add_node(switch, kind="switch", node=node)
            for gpu in gpus:
                g.add_edge(gpu, switch, bandwidth_bytes_per_s=topo.tier0_bytes_per_s,
                           latency_s=half0, route_cost=_COST_NVLINK, tier=topo.tier0_name)
    if topo.net_bytes_per_s <= 0:
        return g
    half_net = topo.net_latency_s / 2
    window_nodes_per_su: dict[int, int] = defaultdict(int)
    for node in nodes:
        su = topo.su_of(node)
        window_nodes_per_su[su] += 1
        for k in range(topo.nics):
            nic, leaf = ("nic", node, k), ("leaf", su, k)
            g.add_node(nic, kind="nic", node=node)
            g.add_node(leaf, kind="leaf", su=su)
            g.add_edge(nic, leaf, bandwidth_bytes_per_s=topo.net_bytes_per_s,
                       latency_s=half_net, route_cost=_COST_NETWORK, tier=topo.net_name)
        for local in range(gpn):
            # PCIe between GPU and NIC: not the bottleneck, no extra latency (in the NIC tier's)
            g.add_edge(("gpu", node, local), ("nic", node, topo.nic_of(local)),
                       bandwidth_bytes_per_s=topo.net_bytes_per_s, latency_s=0.0,
                       route_cost=_COST_NETWORK, tier=topo.net_name)
    if topo.has_spine:
        g.add_node(("spine",), kind="spine")
        for su, count in sorted(window_nodes_per_su.items()):
            for k in range(topo.nics):
                g.add_edge(("leaf", su, k), ("spine",),
                           bandwidth_bytes_per_s=count * topo.net_bytes_per_s / topo.oversubscription,
                           latency_s=topo.spine_latency_s / 2, route_cost=_COST_NETWORK,
                           tier=topo.net_name)
    return g


# -- routing ---------------------------------------------------------------------------------

class _Router:
    """Routes GPU-to-GPU hops, computing each class of path once.

    A path depends only on the two GPUs' local indices and whether they share a node, a
    scalable unit, or neither: a detour through a third node always costs more. So each class
    is routed once on a prototype graph of two such nodes (built like the cluster's graph) and
    relabelled for every hop of that class.
    """

    def __init__(self, topo: _Topo) -> None:
        self.topo = topo
        self.templates: dict[tuple[int, int, int], tuple[tuple, float]] = {}
        self.prototypes: dict[int, tuple[nx.Graph, int, int]] = {}

    def relation(self, a: int, b: int) -> int:
        """0: same node, 1: same scalable unit, 2: different units."""
        if a == b:
            return 0
        return 1 if self.topo.su_of(a) == self.topo.su_of(b) else 2

    def route(self, src: tuple, dst: tuple) -> tuple[list[tuple], float]:
        """Vertices of the path from GPU ``src`` to GPU ``dst`` and its latency in seconds."""
        a, b = src[1], dst[1]
        key = (src[2], dst[2], self.relation(a, b))
        template = self.templates.get(key)
        if template is None:
            self._add_templates(src[2], key[2])
            template = self.templates[key]
        ids = {"leaf": (self.topo.su_of(a), self.topo.su_of(b))}
        nodes = (a, b)
        path = [v if v[0] == "spine" else (v[0], ids.get(v[0], nodes)[v[1]]) + v[2:]
                for v in template[0]]
        return path, template[1]

    def _add_templates(self, i: int, relation: int) -> None:
        """Route from local GPU ``i`` to every local GPU j of the ``relation`` class (one
        Dijkstra), keeping one least-cost path per j."""
        graph, a, b = self._prototype(relation)
        src = ("gpu", a, i)
        pred, _ = nx.dijkstra_predecessor_and_distance(graph, src, weight="route_cost")
        sa = self.topo.su_of(a)

        # Prefer the path that stays longest inside the source node (NCCL PXN: move to the
        # destination's rail over NVLink, then use the network), then a fixed order.
        def rank(path: list[tuple]) -> tuple:
            inside = next((n for n, v in enumerate(path)
                           if v[0] not in ("gpu", "switch") or v[1] != a), len(path))
            return (-inside, path)

        def abstract(v: tuple) -> tuple:  # node / unit numbers -> 0 (source side), 1 (dest)
            if v[0] == "leaf":
                return (v[0], 0 if v[1] == sa else 1, v[2])
            if v[0] == "spine":
                return v
            return (v[0], 0 if v[1] == a else 1) + v[2:]

        for j in range(self.topo.gpus_per_node):
            dst = ("gpu", b, j)
            if dst == src or dst not in pred:
                continue
            path = min(_paths_from_predecessors(pred, src, dst), key=rank)
            latency = round(sum(graph.edges[u, v]["latency_s"]
                                for u, v in zip(path, path[1:])), 12)
            self.templates[(i, j, relation)] = (tuple(abstract(v) for v in path), latency)

    def _prototype(self, relation: int) -> tuple[nx.Graph, int, int]:
        if relation not in self.prototypes:
            other = (0, 1, self.topo.su_nodes)[relation]
            nodes = sorted({0, other})
            self.prototypes[relation] = (_build_graph(self.topo, nodes), 0, other)
        return self.prototypes[relation]


def _paths_from_predecessors(pred: dict, src: tuple, dst: tuple) -> list[list[tuple]]:
    """Every least-cost path src -> dst from Dijkstra's predecessor lists."""
    paths, stack = [], [[dst]]
    while stack:
        path = stack.pop()
        if path[-1] == src:
            paths.append(path[::-1])
            continue
        stack.extend(path + [previous] for previous in pred[path[-1]])
    return paths


# -- groups ----------------------------------------------------------------------------------

def _window_nodes(topo: _Topo, size: int, stride: int) -> list[int]:
    """Nodes touched by group 0 (ranks 0, stride, 2*stride, ...), at most the window cap."""
    gpn = topo.gpus_per_node
    cap = max(2, min(2 * topo.su_nodes, MAX_WINDOW_GPUS // gpn, MAX_WINDOW_HOPS // (gpn * gpn)))
    nodes: list[int] = []
    for i in range(size):
        node = i * stride // gpn
        if not nodes or nodes[-1] != node:
            if len(nodes) == cap:
                break
            nodes.append(node)
    return nodes


def _groups_in_window(topo: _Topo, size: int, stride: int, nodes: list[int],
                      last_base: int | None = None) -> dict[tuple[int, int], list[int]]:
    """Every group of this (size, stride) layout, restricted to ranks on ``nodes``.

    Groups: ranks ``block * size * stride + offset + i * stride`` for offset < stride, those
    with a first rank (base) up to ``last_base``: by default the last base of a group that
    fits the cluster. Returns group id -> its ranks in ring order (ascending i); group (0, 0)
    is the reference group.
    """
    gpn = topo.gpus_per_node
    span = size * stride
    if last_base is None:
        last_base = topo.num_nodes * gpn - 1 - (size - 1) * stride
    groups: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for node in nodes:
        for rank in range(node * gpn, (node + 1) * gpn):
            block, rest = divmod(rank, span)
            offset = rest % stride
            if block * span + offset > last_base:
                continue  # an incomplete trailing group: not part of the layout
            groups[(block, offset)].append((rest // stride, rank))
    return {gid: [rank for _, rank in sorted(members)] for gid, members in groups.items()}


def _channels(topo: _Topo, ranks: list[int]) -> list[list[tuple[tuple, tuple]]]:
    """The channels one group runs, each a list of (src GPU, dst GPU) hops.

    Inside one switch node: one ring in rank order. Inside one full-mesh node: k - 1 shifts,
    shift s sending member i -> member (i + s) mod k, so each directed link between the k
    members carries exactly one channel (an s sharing a factor with k is a union of shorter
    cycles: the same link usage as a ring would need, which is all the bandwidth model looks
    at). Across nodes with up to m members per node: m rings in node order, ring c entering
    each node at its member c (mod the node's member count), as NCCL runs one channel per NIC.
    """
    gpn = topo.gpus_per_node
    by_node: dict[int, list[tuple]] = {}
    for rank in ranks:
        node, local = divmod(rank, gpn)
        by_node.setdefault(node, []).append(("gpu", node, local))
    if len(by_node) == 1:
        members = next(iter(by_node.values()))
        k = len(members)
        if topo.full_mesh and k > 2:
            return [[(members[i], members[(i + s) % k]) for i in range(k)] for s in range(1, k)]
        return [_ring_hops(members)]
    per_node = list(by_node.values())
    count = max(len(m) for m in per_node)
    return [_ring_hops([v for m in per_node for v in _node_order(topo, m, c)])
            for c in range(count)]


def _node_order(topo: _Topo, members: list[tuple], channel: int) -> list[tuple]:
    """The order in which ring ``channel`` visits a node's ``members``, starting at member
    ``channel``. On a switch node: rank order rotated. On a full mesh: stepping by the
    channel's step among those coprime with the member count, so that channels spread over
    different direct links instead of all using member i -> i + 1."""
    k = len(members)
    start = channel % k
    if not topo.full_mesh or k <= 2:
        return members[start:] + members[:start]
    steps = [s for s in range(1, k) if math.gcd(s, k) == 1]
    step = steps[channel % len(steps)]
    return [members[(start + i * step) % k] for i in range(k)]


def _ring_hops(ring: list[tuple]) -> list[tuple[tuple, tuple]]:
    return list(zip(ring, ring[1:] + ring[:1])) if len(ring) > 1 else []


def _routing_part(topo: _Topo) -> _Topo:
    """``topo`` with the fields routing ignores set to fixed values, so clusters that differ
    only in size (beyond whether there is a spine), bandwidths, oversubscription or tier names
    share one router: paths are least ``route_cost`` on the prototype graphs (whose shape
    depends on the node shape, the scalable unit, the spine's presence and whether there is a
    network) and their latencies are sums of the edge latencies."""
    return topo._replace(
        num_nodes=_nodes_for_spine(topo), tier0_bytes_per_s=1.0, tier0_name="",
        net_bytes_per_s=1.0 if topo.net_bytes_per_s > 0 else 0.0, net_name="",
        oversubscription=1.0)


def _nodes_for_spine(topo: _Topo) -> int:
    """The smallest node count with the same spine presence as ``topo``."""
    return topo.su_nodes + 1 if topo.has_spine else 1


@lru_cache(maxsize=64)
def _shared_router(routing: _Topo) -> _Router:
    return _Router(routing)


def _router(topo: _Topo) -> _Router:
    return _shared_router(_routing_part(topo))


def _window_graph(topo: _Topo, nodes: tuple[int, ...]) -> nx.Graph:
    # The graph of a window depends on the cluster's size only through the spine's presence.
    return _shared_window_graph(topo._replace(num_nodes=_nodes_for_spine(topo)), nodes)


@lru_cache(maxsize=32)
def _shared_window_graph(topo: _Topo, nodes: tuple[int, ...]) -> nx.Graph:
    return _build_graph(topo, nodes)


@lru_cache(maxsize=4096)
def _group_link(topo: _Topo, size: int, stride: int) -> Link:
    groups = _groups_in_window(topo, size, stride, _window_nodes(topo, size, stride))
    last_base = max(block * size * stride + offset for block, offset in groups)
    return _window_link(topo._replace(num_nodes=_nodes_for_spine(topo)), size, stride,
                        last_base)


@lru_cache(maxsize=4096)
def _window_link(topo: _Topo, size: int, stride: int, last_base: int) -> Link:
    """The link of every cluster equal to ``topo`` but for its size (with the same spine
    presence) whose window holds the groups of bases up to ``last_base``: nothing else of the
    cluster's size enters the computation, so e.g. the tensor groups of one node shape and
    fabric are computed once for all node counts."""
    nodes = _window_nodes(topo, size, stride)
    router, graph = _router(topo), _window_graph(topo, tuple(nodes))
    groups = _groups_in_window(topo, size, stride, nodes, last_base)
    bandwidth, latency_s, channels = _ring_bandwidth(topo, router, graph, groups)
    crosses = len(nodes) > 1
    return Link(bandwidth_bytes_per_s=bandwidth, latency_s=latency_s,
                tier=topo.net_name if crosses else topo.tier0_name, crosses_nodes=crosses,
                channels=channels,
                all_to_all_bandwidth_bytes_per_s=_all_to_all_bandwidth(
                    topo, router, graph, size, stride, groups, nodes[0], nodes))


def clear_caches() -> None:
    """Forget every memoised router, window graph and link (to time or test a fresh
    computation)."""
    for cached in (_group_link, _window_link, _shared_router, _shared_window_graph):
        cached.cache_clear()


def _ring_bandwidth(topo: _Topo, router: _Router, graph: nx.Graph,
                    groups: dict[tuple[int, int], list[int]]) -> tuple[float, float, int]:
    """(bus bandwidth, step latency, channels) of group (0, 0) with every group's rings loaded."""
    loads: dict[tuple, float] = defaultdict(float)
    own_edges: set[tuple] = set()
    latency_s, channels = 0.0, 1
    for gid, ranks in groups.items():
        hop_lists = _channels(topo, ranks)
        if gid == (0, 0):
            channels = len(hop_lists)
        share = 1.0 / len(hop_lists)
        for hops in hop_lists:
            for src, dst in hops:
                path, path_latency = router.route(src, dst)
                edges = list(zip(path, path[1:]))
                for edge in edges:
                    loads[edge] += share
                if gid == (0, 0):
                    own_edges.update(edges)
                    latency_s = max(latency_s, path_latency)
    edges = graph.edges
    bandwidth = min(edges[e]["bandwidth_bytes_per_s"] / loads[e] for e in own_edges)
    return bandwidth, latency_s, channels


def _all_to_all_bandwidth(topo: _Topo, router: _Router, graph: nx.Graph, size: int, stride: int,
                          groups: Iterable[tuple[int, int]], first: int,
                          window: list[int]) -> float:
    """All-to-all bus bandwidth ``B`` with t = (n-1)/n * S / B (nccl-tests convention).

    Every ordered pair of members exchanges S/n bytes, so B = (n - 1) * min_e cap_e / flows_e.
    By symmetry only the flows sent from node ``first`` are counted -- from every group of the
    layout with members there, to all of its members (the whole group, not only the window) --
    and only edges leaving that node, plus its leaves' spine uplinks at that node's share, are
    checked. Flows of one class (source GPU, destination local index, same node / unit /
    neither) leave the node on the same edges, so each class is routed once, weighted by count.
    """
    gpn, span = topo.gpus_per_node, size * stride
    loads: dict[tuple, float] = defaultdict(float)
    own_edges: set[tuple] = set()
    for block, offset in groups:
        base = block * span + offset
        senders: list[int] = []
        destinations: dict[tuple[int, int], list] = {}
        for rank in range(base, base + span, stride):
            node, local = divmod(rank, gpn)
            if node == first:
                senders.append(local)
            entry = destinations.setdefault((local, router.relation(first, node)), [node, 0])
            entry[1] += 1
        for src_local in senders:
            src = ("gpu", first, src_local)
            for (local, relation), (node, count) in destinations.items():
                if relation == 0 and local == src_local:
                    continue  # no flow to itself (one member per local index on a node)
                path, _ = router.route(src, ("gpu", node, local))
                edges = list(zip(path, path[1:]))
                for edge in edges:
                    loads[edge] += count
                if (block, offset) == (0, 0):
                    own_edges.update(edges)
    su_share = sum(1 for node in window if topo.su_of(node) == topo.su_of(first))
    best = math.inf
    for edge in own_edges:
        u, v = edge
        if u[0] == "leaf" and v[0] == "spine":
            capacity = graph.edges[edge]["bandwidth_bytes_per_s"] / su_share
        elif u[0] in ("gpu", "switch", "nic") and u[1] == first:
            capacity = graph.edges[edge]["bandwidth_bytes_per_s"]
        else:
            continue  # inbound to other nodes: the mirror image of what leaves this one
        best = min(best, capacity / loads[edge])
    return (size - 1) * best


def group_link(cluster: Cluster, size: int, stride: int) -> Link:
    """Bus bandwidth and latency of the group of ranks ``base + i * stride``, i < ``size``.

    Ranks are node-major (rank r on node r // gpus_per_node). TP groups have stride 1, CP stride
    tp, DP stride tp*cp, PP stride tp*cp*dp. A group of size 1 communicates with nobody:
    infinite bandwidth, zero latency. Raises INVALID_INPUT when the group does not fit.
    """
    topo = _topo(cluster)
    checked = []
    for label, value in (("size", size), ("stride", stride)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise invalid(f"group {label} must be an integer >= 1, got {value!r}")
        checked.append(int(value))
    size, stride = checked
    if size == 1:
        return Link(math.inf, 0.0, topo.tier0_name, False, 1, math.inf)
    total = topo.num_nodes * topo.gpus_per_node
    if (size - 1) * stride >= total:
        raise invalid(f"a group of {size} ranks with stride {stride} needs "
                      f"{(size - 1) * stride + 1} GPUs; cluster {cluster.name!r} has {total}",
                      size=size, stride=stride, num_gpus=total)
    return _group_link(topo, size, stride)
