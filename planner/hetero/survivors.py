"""Where a plan's runtime ranks sit, and the cluster and stage pools a re-plan runs on.

A re-plan (:mod:`planner.hetero.replan`) speaks runtime ranks (the Megatron order of
:class:`~planner.mesh.Mesh`: ``r = stage x S + j``). On one pool they are the global GPU ranks;
across pools stage ``i``'s GPUs are those :mod:`planner.hetero.layout` gives it. This module
maps a runtime rank to its pool and node (what decides which link a state transfer crosses:
the node's tier, the pool's network, or the inter-pool link), and gives the cluster the new
plan runs on: on one pool the first nodes (renumbered, as a checkpoint is reloaded on the
survivors), across pools each pool cut to the nodes the new plan uses there, with every split
stage's shares recounted over the replicas that survive.

Consumes a cluster (one pool or a MultiPoolCluster), a ParallelConfig and the stage pools (None
on one pool); produces :class:`RankLayout`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from planner.config import ParallelConfig
from planner.hardware import Cluster, MultiPoolCluster, Pool
from planner.hetero.layout import (StagePools, gpus_by_pool, split_name, stage_ranks,
                                   stage_shares)


def shrunk_cluster(cluster: Cluster, gpus: int) -> Cluster:
    """The cluster cut to ``gpus`` GPUs (whole nodes; the plan's ranks are renumbered)."""
    nodes = max(1, math.ceil(gpus / cluster.gpus_per_node))
    if nodes == cluster.num_nodes:
        return cluster
    cut = Pool.from_cluster(cluster).as_cluster(cluster.name, num_nodes=nodes)
    # what a pool does not hold: the host memory per GPU (host offload) and the GPUs per host
    # (NVL72 trays: the exports' launch lines), besides the cluster's provenance
    return replace(cut, source=cluster.source, description=cluster.description,
                   extra=cluster.extra, cpu_memory=cluster.cpu_memory,
                   gpus_per_host=cluster.gpus_per_host)


def cut_pools(cluster: MultiPoolCluster, nodes: dict[str, int]) -> MultiPoolCluster:
    """``cluster`` with pool ``p`` cut to ``nodes[p]`` nodes (at least one), ranks renumbered."""
    pools, first = [], 0
    for pool in cluster.pools:
        n = max(1, min(pool.num_nodes, nodes.get(pool.name, pool.num_nodes)))
        pools.append(replace(pool, num_nodes=n, first_rank=first))
        first += n * pool.gpus_per_node
    return replace(cluster, pools=tuple(pools))


@dataclass(frozen=True)
class RankLayout:
    cluster: Cluster | MultiPoolCluster
    config: ParallelConfig
    stage_pools: StagePools | None  # None: one pool

    @property
    def across_pools(self) -> bool:
        return self.stage_pools is not None

    @property
    def gpus_per_node(self) -> int:
        """The most GPUs a node of the cluster holds (replicas leave with whole nodes)."""
        return max(p.gpus_per_node for p in self.cluster.pools)

    def _globals(self) -> list[int]:
        c = self.config
        if not self.across_pools:
            return list(range(c.num_gpus))
        return [r for stage in stage_ranks(self.cluster, self.stage_pools, c.dp, c.tp * c.cp)
                for r in stage]

    def locate(self, rank: int) -> tuple[str, int]:
        """(pool, node within the pool) of runtime rank ``rank``."""
        if not self.across_pools:
            return self.cluster.name, rank // self.cluster.gpus_per_node
        g = self._global_of[rank]
        pool = self.cluster.pool_of_rank(g)
        return pool.name, (g - pool.first_rank) // pool.gpus_per_node

    def link(self, a: int, b: int) -> str:
        """The tier a transfer from runtime rank ``a`` to ``b`` crosses."""
        (pa, na), (pb, nb) = self.locate(a), self.locate(b)
        if pa != pb:
            return "inter_pool"
        tiers = ({p.name: p for p in self.cluster.pools}[pa].tiers if self.across_pools
                 else self.cluster.tiers)
        return tiers[0].name if na == nb else tiers[-1].name

    def runtime_ranks(self, global_ranks: Sequence[int]) -> list[int]:
        """The runtime ranks of the plan on these GPUs (GPUs the plan leaves idle: none)."""
        where = {g: r for r, g in enumerate(self._globals())}
        return sorted(where[g] for g in global_ranks if g in where)

    def after(self, config: ParallelConfig, survivors: Sequence[int]
              ) -> tuple[Cluster | MultiPoolCluster, StagePools]:
        """The cluster and stage pools of the plan on the surviving replicas ``survivors``
        (old replica indices, in order) with ``config``."""
        if not self.across_pools:
            cluster = shrunk_cluster(self.cluster, config.num_gpus)
            return cluster, StagePools((cluster.name,) * config.pp)
        old_dp = self.config.dp
        names = []
        for name in self.stage_pools.pools:
            shares, start, new = stage_shares(name, old_dp), 0, []
            for pool, replicas in shares:
                kept = sum(1 for r in survivors if start <= r < start + replicas)
                if kept:
                    new.append((pool, kept))
                start += replicas
            names.append(new[0][0] if len(new) == 1 else split_name(tuple(new)))
        pools = StagePools(tuple(names))
        used = gpus_by_pool(pools, config.dp, config.tp * config.cp)
        nodes = {p.name: math.ceil(used.get(p.name, 0) / p.gpus_per_node)
                 for p in self.cluster.pools}
        return cut_pools(self.cluster, nodes), pools

    def __post_init__(self) -> None:
        object.__setattr__(self, "_global_of", self._globals())
