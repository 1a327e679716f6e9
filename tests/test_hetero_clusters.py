"""Multi-pool cluster files: schema and errors, pool data, the joined topology and the links of
groups that span pools."""
from __future__ import annotations

import math
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import networkx as nx
import pytest
import yaml

from clusters import list_pool_presets, load_cluster, pool_preset_names
from planner.pool_topology import (INTER_POOL_VERTEX, Segment, build_pool_topology,
                                    cross_pool_link, pool_group_link)
from planner.topology import group_link
from planner.errors import ErrorKind, PlannerError
from planner.hardware import GIB, Cluster, MultiPoolCluster, Pool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timeouts import deadline  # noqa: E402

TWO_POOLS = textwrap.dedent("""\
    shardplan_cluster: 1
    name: mixed
    pools:
      - name: fast
        preset: dgx-h100
        num_nodes: 2
      - name: slow
        gpu: a100-sxm4-80gb
        gpus_per_node: 8
        num_nodes: 4
        nics_per_node: 4
        scalable_unit_nodes: 2
        tiers:
          - {name: nvlink, bandwidth_gbytes_per_s: 300, latency_us: 2.0, efficiency: 0.8}
          - {name: ib, bandwidth_gbytes_per_s: 25, latency_us: 5.0, efficiency: 0.9}
    inter_pool: {bandwidth_gbytes_per_s: 40, latency_us: 10.0, efficiency: 0.5}
    """)


def write(tmp_path, text, name="pools.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def load(tmp_path, text=TWO_POOLS):
    return load_cluster(write(tmp_path, text), multi_pool=True)


def error_of(tmp_path, text, **kwargs) -> PlannerError:
    with pytest.raises(PlannerError) as info:
        load_cluster(write(tmp_path, text), **({"multi_pool": True} | kwargs))
    return info.value


# -- schema ----------------------------------------------------------------------------------

def test_two_pools_load_pool_major_with_their_own_gpus_and_tiers(tmp_path):
    cluster = load(tmp_path)
    assert isinstance(cluster, MultiPoolCluster)
    fast, slow = cluster.pools
    assert (fast.name, fast.gpu.name, fast.num_gpus, fast.first_rank) == ("fast", "h100-sxm", 16, 0)
    assert (slow.name, slow.gpu.name, slow.num_gpus, slow.first_rank) == \
        ("slow", "a100-sxm4-80gb", 32, 16)
    assert cluster.num_gpus == 48 and cluster.num_nodes == 6
    assert fast.tiers[1].domain_gpus == 16 and slow.tiers[1].domain_gpus == 32
    assert slow.nics_per_node == 4 and slow.scalable_unit_nodes == 2
    assert cluster.pool_of_rank(15) is fast and cluster.pool_of_rank(16) is slow
    assert cluster.pool_index(47) == 1
    with pytest.raises(IndexError):
        cluster.pool_of_rank(48)
    link = cluster.inter_pool
    assert link.effective_bandwidth_bytes_per_s == pytest.approx(20e9)
    assert link.latency_us == 10.0


def test_per_pool_memory_compute_and_bandwidth(tmp_path):
    fast, slow = load(tmp_path).pools
    assert fast.memory_bytes_per_gpu == 80 * GIB == slow.memory_bytes_per_gpu
    assert fast.peak_flops("bf16") == pytest.approx(989.4e12)
    assert slow.peak_flops("bf16") == pytest.approx(312e12)
    assert fast.hbm_bandwidth_bytes_per_s == pytest.approx(3350e9)
    assert slow.hbm_bandwidth_bytes_per_s == pytest.approx(2039e9)
    with pytest.raises(KeyError):
        slow.peak_flops("fp8")  # A100 has no FP8 tensor cores


def test_a_pool_as_a_cluster_is_the_preset(tmp_path):
    fast = load(tmp_path).pools[0]
    preset = load_cluster("dgx-h100", nodes=2)
    # the pool file describes no host memory (the preset does: its host: section)
    assert fast.as_cluster("dgx-h100") == replace(preset, source="", description="", cpu_memory=None)
    assert fast.as_cluster(num_nodes=1).tiers[1].domain_gpus == 8


def test_one_pool_cluster_has_itself_as_its_pool():
    cluster = load_cluster("dgx-a100-80g", nodes=4)
    (pool,) = cluster.pools
    assert cluster.inter_pool is None
    assert isinstance(pool, Pool) and pool.ranks == range(32)
    assert pool.as_cluster(cluster.name) == replace(cluster, source="", description="")


def test_a_pools_file_with_one_pool_is_an_ordinary_cluster(tmp_path):
    text = textwrap.dedent("""\
        shardplan_cluster: 1
        name: only
        pools:
          - {preset: dgx-h100, num_nodes: 4}
        """)
    cluster = load_cluster(write(tmp_path, text))  # no multi_pool needed
    assert isinstance(cluster, Cluster) and cluster.name == "only" and cluster.num_gpus == 32
    assert load_cluster(write(tmp_path, text), nodes=2).num_gpus == 16
    assert group_link(cluster, 4, 8) == group_link(load_cluster("dgx-h100", nodes=4), 4, 8)


def test_preset_with_16_h100_and_32_a100_nodes():
    assert "h100-a100" in pool_preset_names()
    cluster = load_cluster("h100-a100", multi_pool=True)
    assert [c.name for c in list_pool_presets()] == pool_preset_names()
    assert [(p.name, p.num_nodes, p.gpu.name) for p in cluster.pools] == \
        [("h100", 16, "h100-sxm"), ("a100", 32, "a100-sxm4-80gb")]
    assert cluster.num_gpus == 384 and cluster.source and cluster.description


def test_multi_pool_file_refused_by_one_pool_callers(tmp_path):
    error = error_of(tmp_path, TWO_POOLS, multi_pool=False)
    assert error.kind is ErrorKind.INVALID_INPUT
    assert "2 pools" in error.message and "fast (2 x 8 h100-sxm)" in error.message
    error = error_of(tmp_path, TWO_POOLS, nodes=4)
    assert "--nodes cannot scale" in error.message


def test_cli_refuses_a_multi_pool_cluster_with_exit_2(tmp_path, capsys):
    from cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["evaluate", "-m", "tiny", "-c", write(tmp_path, TWO_POOLS), "--global-batch", "8",
              "--tp", "1", "--pp", "1",
              "--json"])
    out, _ = capsys.readouterr()
    assert done.value.code == 2 and "2 pools" in out and "Traceback" not in out
    # the hint names the commands that do read it (it said 'a command that reads multi-pool
    # clusters' and left the reader to find which)
    import json
    assert "`shardplan plan` and `shardplan plan-pools`" in json.loads(out)["error"]["hints"][0]


@pytest.mark.parametrize("edit, path, needle", [
    (lambda d: d.pop("inter_pool"), "inter_pool", "missing required key 'inter_pool'"),
    (lambda d: d["pools"][1].update(name="fast"), "pools[1].name", "duplicate pool name"),
    (lambda d: d["pools"][1].update(tirs=1), "pools[1].tirs", "Did you mean 'tiers'"),
    (lambda d: d["pools"][1]["tiers"][1].update(bandwidth_gbytes_per_s=-5),
     "pools[1].tiers[1].bandwidth_gbytes_per_s", "must be positive"),
    (lambda d: d["pools"][1].update(num_nodes=True), "pools[1].num_nodes", "expected an integer"),
    (lambda d: d["pools"][1].update(num_nodes=2.0), "pools[1].num_nodes", "expected an integer"),
    (lambda d: d["pools"][0].update(num_nodes=0), "pools[0].num_nodes", ">= 1"),
    (lambda d: d["pools"][0].update(tiers=[]), "pools[0].tiers", "unknown key"),
    (lambda d: d["pools"][1].update(gpu="a100"), "pools[1].gpu", "unknown GPU preset"),
    (lambda d: d["pools"][1]["tiers"].pop(), "pools[1].num_nodes", "no inter-node tier"),
    (lambda d: (d["pools"][1]["tiers"].pop(), d["pools"][1].update(num_nodes=1)),
     "pools[1].tiers", "every pool reaches the others through its NICs"),
    (lambda d: d["pools"][1].update(nics_per_node=16), "pools[1].nics_per_node", "16 NICs"),
    (lambda d: d.update(gpu="h100-sxm"), "gpu", "per pool"),
    (lambda d: d.update(pools=[]), "pools", "non-empty list"),
    (lambda d: d.update(pools={"a": 1}), "pools", "non-empty list"),
    (lambda d: d["pools"].append(5), "pools[2]", "expected a mapping"),
    (lambda d: d["inter_pool"].update(efficiency=1.5), "inter_pool.efficiency", "implausibly"),
    (lambda d: d["inter_pool"].update(latency_us=-1), "inter_pool.latency_us", ">= 0"),
    (lambda d: d["inter_pool"].pop("bandwidth_gbytes_per_s"), "inter_pool.bandwidth_gbytes_per_s",
     "missing required key"),
    (lambda d: d["inter_pool"].update(bandwidth_gbps=1), "inter_pool.bandwidth_gbps",
     "unknown key"),
    (lambda d: d.update(shardplan_cluster=2), "shardplan_cluster", "unsupported schema"),
])
def test_bad_multi_pool_files_name_the_field(tmp_path, edit, path, needle):
    doc = yaml.safe_load(TWO_POOLS)
    edit(doc)
    error = error_of(tmp_path, yaml.safe_dump(doc))
    assert error.kind in (ErrorKind.INVALID_INPUT, ErrorKind.UNKNOWN_PRESET)
    assert path in error.message or error.details.get("field") == path, error.message
    assert needle.lower() in (error.message + " ".join(error.hints)).lower(), error.message


def test_unknown_pool_preset_suggests_the_closest(tmp_path):
    text = TWO_POOLS.replace("preset: dgx-h100", "preset: dgx-h10")
    error = error_of(tmp_path, text)
    assert error.kind is ErrorKind.UNKNOWN_PRESET and "dgx-h100" in " ".join(error.hints)
    assert error.details["field"] == "pools[0].preset"


def test_one_pool_with_an_inter_pool_link_is_refused(tmp_path):
    doc = yaml.safe_load(TWO_POOLS)
    doc["pools"].pop()
    error = error_of(tmp_path, yaml.safe_dump(doc))
    assert "one pool has no inter-pool link" in error.message


# -- topology --------------------------------------------------------------------------------

def test_graph_joins_the_pools_through_the_inter_pool_switch(tmp_path):
    cluster = load(tmp_path)
    graph = build_pool_topology(cluster)
    gpus = sorted((d["rank"], v, d["pool"]) for v, d in graph.nodes(data=True)
                  if d.get("kind") == "gpu")
    assert [r for r, _, _ in gpus] == list(range(48))
    assert all(pool == ("fast" if rank < 16 else "slow") for rank, _, pool in gpus)
    assert gpus[16][1] == ("gpu", 2, 0)  # global node numbers: the slow pool starts at node 2
    assert nx.is_connected(graph)
    edge = graph.edges[("spine", "fast"), INTER_POOL_VERTEX]
    assert edge["bandwidth_bytes_per_s"] == pytest.approx(20e9)
    assert edge["latency_s"] == pytest.approx(5e-6)
    # a path between pools crosses the inter-pool switch once; inside a pool it never does
    path = nx.shortest_path(graph, ("gpu", 0, 3), ("gpu", 5, 1), weight="route_cost")
    assert path.count(INTER_POOL_VERTEX) == 1
    inside = nx.shortest_path(graph, ("gpu", 2, 0), ("gpu", 5, 0), weight="route_cost")
    assert INTER_POOL_VERTEX not in inside
    # a one-unit pool still gets a spine, its leaf uplinks at (nodes x NIC) / oversubscription
    uplink = graph.edges[("leaf", "fast", 0, 0), ("spine", "fast")]["bandwidth_bytes_per_s"]
    assert uplink == pytest.approx(2 * 45e9)
    # the slow pool has two scalable units of 2 nodes and 4 NICs per node
    assert {v for v in graph.nodes if v[0] == "leaf" and v[1] == "slow"} == \
        {("leaf", "slow", su, k) for su in (0, 1) for k in range(4)}


def test_group_inside_a_pool_is_costed_on_that_pool(tmp_path):
    cluster = load(tmp_path)
    slow = pool_group_link(cluster, "slow", 4, 8)
    assert slow == group_link(cluster.pools[1].as_cluster(), 4, 8)
    # one member per node, but GPUs 2k and 2k+1 share NIC k (4 NICs for 8 GPUs) and their
    # groups run at once: half of 22.5 GB/s each
    assert slow.bandwidth_bytes_per_s == pytest.approx(11.25e9)
    assert pool_group_link(cluster, "fast", 8, 1).bandwidth_bytes_per_s == pytest.approx(360e9)
    with pytest.raises(PlannerError, match="no pool 'medium'"):
        pool_group_link(cluster, "medium", 2, 1)


def test_cross_pool_point_to_point_shares_the_inter_pool_link(tmp_path):
    cluster = load(tmp_path)
    pair = [Segment("fast", 1), Segment("slow", 1)]
    one = cross_pool_link(cluster, pair, concurrent=1)
    # one flow: the NICs (45 and 22.5 GB/s) are faster than the 20 GB/s inter-pool link
    assert one.bandwidth_bytes_per_s == pytest.approx(20e9)
    assert one.tier == "inter-pool" and one.crosses_nodes
    # latency: NIC->leaf 2.5 + leaf->spine 0.25 + spine->switch 5, and back down on the other side
    assert one.latency_s == pytest.approx((2.5 + 0.25 + 5) * 2 * 1e-6)
    eight = cross_pool_link(cluster, pair, concurrent=8)
    assert eight.bandwidth_bytes_per_s == pytest.approx(20e9 / 8)


def test_cross_pool_ring_is_bound_by_both_pools_and_the_link(tmp_path):
    cluster = load(tmp_path)
    ring = [Segment("fast", 2, 8), Segment("slow", 4, 8)]
    link = cross_pool_link(cluster, ring, concurrent=1)
    inside = min(pool_group_link(cluster, "fast", 2, 8).bandwidth_bytes_per_s,
                 pool_group_link(cluster, "slow", 4, 8).bandwidth_bytes_per_s)
    assert link.bandwidth_bytes_per_s == pytest.approx(min(inside, 20e9))
    # 8 concurrent rings (one per TP rank): the 20 GB/s link is shared 8 ways
    assert cross_pool_link(cluster, ring, concurrent=8).bandwidth_bytes_per_s == \
        pytest.approx(20e9 / 8)
    # all-to-all over the 6 members: each pool's uplink carries size x (6 - size) / 6 buffers
    a2a = cross_pool_link(cluster, ring, concurrent=1).all_to_all_bandwidth_bytes_per_s
    inside = min(pool_group_link(cluster, name, size, 8).all_to_all_bandwidth_bytes_per_s
                 for name, size in (("fast", 2), ("slow", 4)))
    assert a2a == pytest.approx(min(inside, 5 * 20e9 / (2 * 4), 5 * 22.5e9 / 2))


def test_a_fast_link_leaves_the_pools_as_the_bottleneck(tmp_path):
    text = TWO_POOLS.replace("bandwidth_gbytes_per_s: 40, latency_us: 10.0, efficiency: 0.5",
                             "bandwidth_gbytes_per_s: 100000, latency_us: 1.0")
    cluster = load(tmp_path, text)
    link = cross_pool_link(cluster, [Segment("fast", 1), Segment("slow", 1)], concurrent=1)
    assert link.bandwidth_bytes_per_s == pytest.approx(22.5e9)  # the slow pool's NIC


def test_cross_pool_link_rejects_bad_groups(tmp_path):
    cluster = load(tmp_path)
    with pytest.raises(PlannerError, match="at least two pools"):
        cross_pool_link(cluster, [Segment("fast", 2)])
    with pytest.raises(PlannerError, match="does not fit"):
        cross_pool_link(cluster, [Segment("fast", 3, 8), Segment("slow", 1)])
    with pytest.raises(PlannerError, match="concurrent"):
        cross_pool_link(cluster, [Segment("fast", 1), Segment("slow", 1)], concurrent=0)
    with pytest.raises(PlannerError, match="MultiPoolCluster"):
        cross_pool_link(load_cluster("tiny"), [Segment("tiny", 1)])


def test_preset_topology_is_fast_and_cached():
    cluster = load_cluster("h100-a100", multi_pool=True)
    with deadline(10):
        graph = build_pool_topology(cluster)
        assert sum(1 for _, d in graph.nodes(data=True) if d.get("kind") == "gpu") == 384
        dp = cross_pool_link(cluster, [Segment("h100", 16, 8), Segment("a100", 32, 8)],
                             concurrent=8)
    assert build_pool_topology(cluster) is graph
    assert math.isfinite(dp.bandwidth_bytes_per_s) and dp.bandwidth_bytes_per_s <= 22.5e9


# -- fuzz ------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

POOL_KEYS = ["name", "preset", "gpu", "gpus_per_node", "num_nodes", "nics_per_node", "tiers",
             "bandwidth_gbytes_per_s", "latency_us", "efficiency", "pools", "inter_pool"]
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10),
              st.sampled_from(["dgx-h100", "a100-sxm4-80gb", "fast", "nvlink"])),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(POOL_KEYS), st.text(max_size=6)), children,
                        max_size=5)),
    max_leaves=20)
PATHS = [("pools",), ("pools", 0), ("pools", 1), ("pools", 1, "tiers"), ("pools", 0, "num_nodes"),
         ("inter_pool",), ("inter_pool", "bandwidth_gbytes_per_s"), ("pools", 1, "gpu")]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.sampled_from(PATHS), values)
def test_fuzzed_multi_pool_files_load_or_fail_cleanly(tmp_path, path, value):
    doc = yaml.safe_load(TWO_POOLS)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        result = load_cluster(write(tmp_path, yaml.safe_dump(doc)), multi_pool=True)
    except PlannerError as error:
        assert error.message
        return
    assert isinstance(result, (Cluster, MultiPoolCluster))
    if isinstance(result, MultiPoolCluster):
        ranks = [r for p in result.pools for r in p.ranks]
        assert ranks == list(range(result.num_gpus))
