"""Validate multi-pool cluster documents (``pools:`` plus ``inter_pool:``).

Consumes: a parsed cluster document that has a ``pools`` key (schema in docs/clusters.md,
"Several pools"), the GPU presets, and a way to read a cluster preset (for pools written as
``preset: dgx-h100`` plus ``num_nodes``).
Produces: a :class:`~planner.hardware.MultiPoolCluster` (ranks pool-major, in file order), or,
for a document with a single pool, that pool as a :class:`~planner.hardware.Cluster`; or a
:class:`~planner.errors.PlannerError` (INVALID_INPUT / UNKNOWN_PRESET) naming the file and the
field path, e.g. ``pools[1].tiers[1].bandwidth_gbytes_per_s``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

from clusters.schema import (CLUSTER_OPTIONAL, MAX_BANDWIDTH_GBYTES_PER_S, MAX_LATENCY_US,
                             MAX_NODES, _fail, _show, check_keys, check_version,
                             fabric_from_mapping, number, text, unknown_preset, with_nodes)
from planner.hardware import Cluster, InterPoolLink, MultiPoolCluster, Pool

MAX_POOLS = 64
MULTI_REQUIRED = ("shardplan_cluster", "name", "pools")
MULTI_OPTIONAL = ("inter_pool", "description", "source")
# A pool written out: the one-pool cluster keys minus the document-level ones.
POOL_REQUIRED = ("gpu", "gpus_per_node", "num_nodes", "tiers")
# gpus_per_host (launch lines) is one-pool only: a Pool does not carry it.
POOL_OPTIONAL = ("name",) + tuple(k for k in CLUSTER_OPTIONAL if k != "gpus_per_host")
PRESET_POOL_REQUIRED = ("preset", "num_nodes")
PRESET_POOL_OPTIONAL = ("name", "description")
INTER_REQUIRED = ("bandwidth_gbytes_per_s", "latency_us")
INTER_OPTIONAL = ("efficiency", "name")
# Keys of a one-pool document that make no sense next to ``pools``.
ONE_POOL_ONLY = ("gpu", "gpu_overrides", "gpus_per_node", "num_nodes", "nics_per_node",
                 "gpus_per_host",
                 "scalable_unit_nodes", "spine_oversubscription", "spine_latency_us",
                 "intra_node_topology", "tiers")

ClusterPreset = Callable[[str], Cluster]

RESERVED = ("+", ":")  # planner/hetero/layout.py: a split stage is "pool:replicas+..."


def multi_pool_from_mapping(data: dict[str, Any], where: str,
                            gpu_presets: Mapping[str, dict[str, Any]],
                            cluster_preset: ClusterPreset,
                            preset_names: list[str]) -> MultiPoolCluster | Cluster:
    """Build the cluster a ``pools:`` document describes (see the module docstring)."""
    for key in ONE_POOL_ONLY:
        if key in data:
            raise _fail(where, key, f"a cluster with 'pools' describes {key!r} per pool, not at "
                                    f"the top level", f"Move {key!r} into each entry of 'pools'.")
    check_keys(data, where, "", MULTI_REQUIRED, MULTI_OPTIONAL)
    check_version(data, where)
    name = text(data["name"], where, "name")
    items = data["pools"]
    if not isinstance(items, list) or not items:
        raise _fail(where, "pools", f"expected a non-empty list of pools, got {_show(items)}")
    if len(items) > MAX_POOLS:
        raise _fail(where, "pools", f"{len(items)} pools (limit {MAX_POOLS})")
    pools: list[Pool] = []
    first_rank = 0
    for index, item in enumerate(items):
        pool = _pool(item, where, f"pools[{index}]", gpu_presets, cluster_preset, preset_names,
                     first_rank)
        for other in pools:
            if other.name == pool.name:
                raise _fail(where, f"pools[{index}].name",
                            f"duplicate pool name {pool.name!r} (pools[{pools.index(other)}])",
                            "Give each pool its own 'name'.")
        pools.append(pool)
        first_rank += pool.num_gpus
    total_nodes = sum(p.num_nodes for p in pools)
    if total_nodes > MAX_NODES:
        raise _fail(where, "pools", f"{total_nodes} nodes in all is implausibly large "
                                    f"(limit {MAX_NODES})")
    description = text(data.get("description", ""), where, "description", allow_empty=True)
    source = text(data.get("source", ""), where, "source", allow_empty=True)
    if len(pools) == 1:
        if "inter_pool" in data:
            raise _fail(where, "inter_pool", "a cluster with one pool has no inter-pool link",
                        "Remove 'inter_pool', or add a second pool.")
        only = pools[0].as_cluster(name)
        return replace(only, description=description, source=source)
    if "inter_pool" not in data:
        raise _fail(where, "inter_pool", f"missing required key 'inter_pool': {len(pools)} "
                                         f"pools need the link that joins them "
                                         f"(bandwidth_gbytes_per_s, latency_us)")
    for index, pool in enumerate(pools):
        if len(pool.tiers) < 2:
            raise _fail(where, f"pools[{index}].tiers",
                        f"pool {pool.name!r} has no inter-node tier; in a cluster of several "
                        f"pools every pool reaches the others through its NICs",
                        "Add a second entry to 'tiers' (the pool's scale-out network).")
    return MultiPoolCluster(name=name, pools=tuple(pools),
                            inter_pool=_inter_pool(data["inter_pool"], where),
                            source=source, description=description)


def _pool(item: Any, where: str, path: str, gpu_presets: Mapping[str, dict[str, Any]],
          cluster_preset: ClusterPreset, preset_names: list[str], first_rank: int) -> Pool:
    if isinstance(item, dict) and "preset" in item:
        check_keys(item, where, path, PRESET_POOL_REQUIRED, PRESET_POOL_OPTIONAL)
        spec = item["preset"]
        key = spec.strip().lower() if isinstance(spec, str) else spec
        if key not in preset_names:
            raise unknown_preset("cluster", spec, preset_names, where=where,
                                 field=f"{path}.preset")
        base = cluster_preset(key)
        name = text(item.get("name", key), where, f"{path}.name")
        text(item.get("description", ""), where, f"{path}.description", allow_empty=True)
        cluster = with_nodes(base, item["num_nodes"], where, f"{path}.num_nodes")
    else:
        check_keys(item, where, path, POOL_REQUIRED, POOL_OPTIONAL)
        cluster = fabric_from_mapping(item, where, gpu_presets, "pool", path)
        name = text(item.get("name", cluster.gpu.name), where, f"{path}.name")
        cluster = with_nodes(replace(cluster, name=name), cluster.num_nodes, where,
                             f"{path}.num_nodes")
    if any(ch in name for ch in RESERVED):
        raise _fail(where, f"{path}.name", f"pool name {name!r} contains "
                                           f"{' or '.join(repr(c) for c in RESERVED)}",
                    "Those spell a stage split over pools in a plan (h100:8+a100:24); "
                    "rename the pool.")
    return Pool.from_cluster(cluster, name=name, first_rank=first_rank)


def _inter_pool(value: Any, where: str) -> InterPoolLink:
    check_keys(value, where, "inter_pool", INTER_REQUIRED, INTER_OPTIONAL)
    return InterPoolLink(
        bandwidth_gbytes_per_s=number(value["bandwidth_gbytes_per_s"], where,
                                      "inter_pool.bandwidth_gbytes_per_s", minimum=0,
                                      maximum=MAX_BANDWIDTH_GBYTES_PER_S),
        latency_us=number(value["latency_us"], where, "inter_pool.latency_us", minimum=0,
                          maximum=MAX_LATENCY_US, allow_min=True),
        efficiency=number(value.get("efficiency", 1.0), where, "inter_pool.efficiency",
                          minimum=0, maximum=1),
        name=text(value.get("name", "inter-pool"), where, "inter_pool.name"))
