"""Topology graph and group_link: bandwidths and latencies derived from the graph."""
from __future__ import annotations

import math
import textwrap
from collections import Counter

import pytest

from clusters import load_cluster
from planner.topology import (Link, _group_link, _shared_router, _window_link, build_topology,
                              clear_caches, group_link)
from planner.errors import ErrorKind, PlannerError

H100_NVLINK = 450e9 * 0.8
H100_NIC = 50e9 * 0.9


def cluster_file(tmp_path, *, nics=None, gpn=8, nodes=4, su=32, oversub=1.0, name="c"):
    nics = gpn if nics is None else nics
    text = textwrap.dedent(f"""\
        shardplan_cluster: 1
        name: {name}
        gpu: h100-sxm
        gpus_per_node: {gpn}
        num_nodes: {nodes}
        nics_per_node: {nics}
        scalable_unit_nodes: {su}
        spine_oversubscription: {oversub}
        tiers:
          - {{name: nvlink, bandwidth_gbytes_per_s: 450, latency_us: 2.0, efficiency: 0.8}}
          - {{name: infiniband, bandwidth_gbytes_per_s: 50, latency_us: 5.0, efficiency: 0.9}}
        """)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return load_cluster(str(path))


def test_tp8_inside_a_dgx_uses_nvlink():
    link = group_link(load_cluster("dgx-h100", nodes=4), 8, 1)
    assert link.tier == "nvlink" and not link.crosses_nodes
    assert link.bandwidth_bytes_per_s == pytest.approx(H100_NVLINK)
    assert link.latency_s == pytest.approx(2e-6)


@pytest.mark.parametrize("size", [2, 4])
def test_dp_stride_8_across_nodes_uses_one_nic(size):
    link = group_link(load_cluster("dgx-h100", nodes=4), size, 8)
    assert link.tier == "infiniband" and link.crosses_nodes
    assert link.bandwidth_bytes_per_s == pytest.approx(H100_NIC)
    assert link.latency_s == pytest.approx(5e-6)  # same rail: NIC -> leaf -> NIC


def test_a100_dp_group_gets_an_hdr_nic():
    link = group_link(load_cluster("dgx-a100-80g", nodes=8), 8, 8)
    assert link.bandwidth_bytes_per_s == pytest.approx(25e9 * 0.9)


def test_size_one_is_free():
    link = group_link(load_cluster("dgx-h100"), 1, 1)
    assert link.bandwidth_bytes_per_s == math.inf and link.latency_s == 0
    assert not link.crosses_nodes and link.tier == "nvlink"


@pytest.mark.parametrize("size, stride", [(4, 8), (8, 4), (16, 2), (32, 1), (2, 16)])
def test_four_nics_for_eight_gpus_halve_inter_node_bandwidth(tmp_path, size, stride):
    shared = group_link(cluster_file(tmp_path, nics=4, name="four"), size, stride)
    own = group_link(cluster_file(tmp_path, nics=8, name="eight"), size, stride)
    assert shared.crosses_nodes and own.crosses_nodes
    assert shared.bandwidth_bytes_per_s == pytest.approx(own.bandwidth_bytes_per_s / 2)


def test_nic_count_does_not_matter_inside_a_node(tmp_path):
    for size in (2, 4, 8):
        shared = group_link(cluster_file(tmp_path, nics=4, name="four"), size, 1)
        assert shared.bandwidth_bytes_per_s == pytest.approx(H100_NVLINK)


def test_two_group_gpus_per_node_sharing_one_nic_get_one_nic(tmp_path):
    """2 GPUs per node, 1 NIC: a group holding both GPUs of each node gets one NIC's bandwidth
    in total, i.e. half per GPU of what it gets with one NIC per GPU."""
    one_nic = cluster_file(tmp_path, gpn=2, nics=1, name="one")
    two_nics = cluster_file(tmp_path, gpn=2, nics=2, name="two")
    both = group_link(one_nic, 8, 1)  # 2 members on each of 4 nodes
    assert both.channels == 2
    assert both.bandwidth_bytes_per_s == pytest.approx(H100_NIC)
    assert group_link(two_nics, 8, 1).bandwidth_bytes_per_s == pytest.approx(2 * H100_NIC)
    # one member per node: its NIC is shared with the concurrent group on the other GPU
    assert group_link(one_nic, 4, 2).bandwidth_bytes_per_s == pytest.approx(H100_NIC / 2)
    assert group_link(two_nics, 4, 2).bandwidth_bytes_per_s == pytest.approx(H100_NIC)


def test_multi_node_tp_uses_one_ring_per_nic():
    """TP=16 over 2 DGX nodes: NCCL runs 8 rings, one per NIC, so busbw ~ 8 NICs."""
    link = group_link(load_cluster("dgx-h100", nodes=2), 16, 1)
    assert link.channels == 8 and link.tier == "infiniband"
    assert link.bandwidth_bytes_per_s == pytest.approx(min(8 * H100_NIC, H100_NVLINK))
    assert link.latency_s == pytest.approx(7e-6)  # NVLink to the rail's GPU (PXN), then IB


def test_all_to_all_is_bounded_by_each_gpus_nic():
    """EP=16 over 2 nodes: each GPU sends 8 of its 15 shares off-node, all 8 GPUs through the
    8 NICs, so B = 15 * 45 GB/s / 8."""
    link = group_link(load_cluster("dgx-h100", nodes=2), 16, 1)
    assert link.all_to_all_bandwidth_bytes_per_s == pytest.approx(15 * H100_NIC / 8)
    inside = group_link(load_cluster("dgx-h100"), 8, 1)
    assert inside.all_to_all_bandwidth_bytes_per_s == pytest.approx(H100_NVLINK)


def test_full_mesh_gives_small_groups_few_links():
    mi = load_cluster("mi300x", nodes=2)
    per_link = 448e9 * 0.7 / 7
    for size in (2, 4, 8):
        link = group_link(mi, size, 1)
        assert link.tier == "infinity_fabric"
        assert link.bandwidth_bytes_per_s == pytest.approx((size - 1) * per_link)
    assert group_link(mi, 2, 8).bandwidth_bytes_per_s == pytest.approx(H100_NIC)


def test_spine_oversubscription_only_hits_cross_unit_traffic(tmp_path):
    flat = cluster_file(tmp_path, gpn=2, nodes=8, su=2, oversub=1.0, name="flat")
    thin = cluster_file(tmp_path, gpn=2, nodes=8, su=2, oversub=2.0, name="thin")
    # one GPU per scalable unit: every hop crosses the spine
    assert group_link(thin, 4, 4).bandwidth_bytes_per_s == pytest.approx(
        group_link(flat, 4, 4).bandwidth_bytes_per_s / 2)
    assert group_link(thin, 4, 4).latency_s == pytest.approx(5.5e-6)
    # inside one scalable unit the spine is not used
    assert group_link(thin, 2, 2).bandwidth_bytes_per_s == pytest.approx(H100_NIC)
    assert group_link(thin, 2, 2).latency_s == pytest.approx(5e-6)


def test_tiny_cluster_numbers():
    tiny = load_cluster("tiny")
    assert group_link(tiny, 4, 1).bandwidth_bytes_per_s == pytest.approx(50e9)
    assert group_link(tiny, 2, 4).bandwidth_bytes_per_s == pytest.approx(5e9)
    assert group_link(tiny, 8, 1).bandwidth_bytes_per_s == pytest.approx(4 * 5e9)


@pytest.mark.parametrize("nodes", [1, 2, 3, 5, 7])
def test_any_node_count_works(nodes):
    cluster = load_cluster("dgx-b200", nodes=nodes)
    for size, stride in [(8, 1), (nodes, 8), (2 * nodes, 4), (8 * nodes, 1)]:
        link = group_link(cluster, size, stride)
        if size == 1:
            continue
        assert 0 < link.bandwidth_bytes_per_s < math.inf and link.latency_s > 0
        assert link.crosses_nodes == (nodes > 1 and size * stride > 8)


def test_irregular_strides_are_answered():
    cluster = load_cluster("dgx-h100", nodes=3)
    for size, stride in [(3, 3), (5, 5), (7, 3), (2, 12)]:
        link = group_link(cluster, size, stride)
        crosses = (size - 1) * stride >= 8  # ranks 0 .. (size-1) x stride span nodes
        assert link.crosses_nodes == crosses
        assert link.tier == ("infiniband" if crosses else "nvlink")
        # a group is never faster than its slowest tier's per-GPU share
        assert link.bandwidth_bytes_per_s <= (H100_NIC * 8 if crosses else H100_NVLINK) * 1.000001
        assert link.latency_s >= (5e-6 if crosses else 0.0)


@pytest.mark.parametrize("size, stride", [(0, 1), (2, 0), (True, 1), (2, 1.0), (9, 1), (2, 8)])
def test_invalid_groups(size, stride):
    with pytest.raises(PlannerError) as info:
        group_link(load_cluster("dgx-h100"), size, stride)
    assert info.value.kind is ErrorKind.INVALID_INPUT


def test_deterministic_and_memoised():
    cluster = load_cluster("dgx-h100", nodes=64)
    first = group_link(cluster, 64, 8)
    clear_caches()
    second = group_link(cluster, 64, 8)
    assert first == second
    hits = _group_link.cache_info().hits
    group_link(cluster, 64, 8)
    assert _group_link.cache_info().hits == hits + 1  # memoised (timings: bench/topology.py)
    # an equal cluster loaded again hits the same cache entry
    assert group_link(load_cluster("dgx-h100", nodes=64), 64, 8) is group_link(cluster, 64, 8)


def test_links_shared_across_clusters_equal_a_fresh_computation(tmp_path):
    # Routers, window graphs and links are shared by clusters that differ only in size (same
    # spine presence, same groups in the window), bandwidths or names: exactly equal floats.
    clusters = [load_cluster("dgx-h100", nodes=n) for n in (40, 3, 2, 1)]
    clusters += [cluster_file(tmp_path, nodes=n, su=2, oversub=2.0, nics=4, name=f"s{n}")
                 for n in (5, 3)]
    clusters += [load_cluster("mi300x", nodes=2), load_cluster("dgx-a100-80g", nodes=3)]
    groups = [(2, 1), (3, 1), (8, 1), (4, 2), (3, 4), (3, 8), (16, 8), (2, 16), (5, 4)]
    cases = [(c, size, stride) for c in clusters for size, stride in groups
             if (size - 1) * stride < c.num_gpus]
    clear_caches()
    shared = [group_link(*case) for case in cases]
    assert _window_link.cache_info().hits > 0 and _shared_router.cache_info().hits > 0
    fresh = []
    for case in cases:
        clear_caches()
        fresh.append(group_link(*case))
    assert shared == fresh


def test_16k_gpu_cluster():
    # how fast this is: bench/topology.py (wall-clock numbers do not belong in a test)
    cluster = load_cluster("dgx-h100", nodes=2048)
    clear_caches()
    links = [group_link(cluster, size, stride) for size, stride in
             [(8, 1), (2048, 8), (256, 64), (16, 1), (4096, 4), (2, 8192), (16384, 1)]]
    assert links[0].tier == "nvlink" and links[1].tier == "infiniband"
    assert links[1].bandwidth_bytes_per_s == pytest.approx(H100_NIC)
    assert links[1].latency_s == pytest.approx(5.5e-6)  # the ring crosses the spine


def test_graph_structure_and_attributes():
    graph = build_topology(load_cluster("dgx-h100", nodes=64))  # 2 scalable units
    kinds = Counter(data["kind"] for _, data in graph.nodes(data=True))
    assert kinds == {"gpu": 512, "switch": 64, "nic": 512, "leaf": 16, "spine": 1}
    for _, _, data in graph.edges(data=True):
        assert data["bandwidth_bytes_per_s"] > 0 and data["latency_s"] >= 0
    assert graph.edges[("gpu", 3, 5), ("switch", 3)]["bandwidth_bytes_per_s"] == \
        pytest.approx(H100_NVLINK)
    assert graph.edges[("nic", 40, 5), ("leaf", 1, 5)]["bandwidth_bytes_per_s"] == \
        pytest.approx(H100_NIC)
    assert graph.edges[("leaf", 1, 5), ("spine",)]["bandwidth_bytes_per_s"] == \
        pytest.approx(32 * H100_NIC)
    assert graph.nodes[("gpu", 3, 5)]["rank"] == 29


def test_shared_nic_graph():
    graph = build_topology(load_cluster("tiny"))
    assert not graph.has_node(("spine",))  # one scalable unit
    assert graph.has_edge(("gpu", 1, 3), ("nic", 1, 3))


def test_single_node_graph_has_no_network():
    graph = build_topology(load_cluster("dgx-h100"))
    assert graph.number_of_nodes() == 8 + 1 + 8 + 8  # GPUs, switch, NICs, leaves


def test_link_is_frozen():
    link = Link(1.0, 2.0, "x", False)
    with pytest.raises(AttributeError):
        link.latency_s = 3.0  # type: ignore[misc]
    assert link.channels == 1 and link.all_to_all_bandwidth_bytes_per_s is None
