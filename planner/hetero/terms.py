"""The cost terms of one configuration on every pool of a cluster.

Consumes a model, a :class:`~planner.hardware.MultiPoolCluster` (or a one-pool
:class:`~planner.hardware.Cluster`), a :class:`~planner.config.ParallelConfig` and runtime
options; produces one :class:`PoolTerms` per pool: the one-pool cost terms of
:mod:`planner.cost.terms` (a :class:`~planner.solve.costs.StageProblem`) computed with that
pool's GPU (compute, HBM, memory capacity, runtime reserve) and that pool's links, plus the
configuration terms of a stage whose pipeline boundary crosses to another pool. No formula is
written here: only which link each group of a stage spans.

Links of a stage on pool P (ranks as in :mod:`planner.hetero.layout`):
* TP, CP, DP (the ZeRO shard group) and EP groups lie inside the stage, so inside P, with P's
  layout of every stage at once: ``group_link(P, size, stride)`` exactly as in one pool;
* the pipeline boundary to a neighbour stage on P: ``group_link(P, 2, tp x cp x dp)``; to a
  stage on another pool Q: :func:`planner.pool_topology.cross_pool_link` with the stage's
  ``tp x cp x dp`` transfers at once (the slowest such Q when there are more than two pools).
  A stage next to a crossing pays the crossing link for both of its boundary transfers (an upper
  estimate for a stage with one in-pool and one cross-pool neighbour);
* the tied-embedding all-reduce between the first and the last stage: over the cross-pool link
  when they are on different pools.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner.pool_topology import Segment, cross_pool_link
from planner.topology import Link, group_link
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.compute import Shard
from planner.cost.context import CostContext, Links
from planner.cost.terms import ConfigTerms, config_terms
from planner.hardware import Cluster, MultiPoolCluster, Pool
from planner.ir import ModelGraph
from planner.solve.costs import StageProblem, stage_problem
from planner.strategy import BLOCK_OPTIONS, LayerOption


@dataclass(frozen=True)
class PoolTerms:
    """The terms of one configuration on one pool.

    ``problem``: per block class and option the LayerTerms, and the ConfigTerms of a stage whose
    boundaries stay inside the pool (``problem.terms``); ``cross``: the ConfigTerms of a stage
    next to a pool crossing (None on a one-pool cluster). ``max_stages``: how many stages of
    ``tp x cp x dp`` GPUs the pool can host."""

    pool: Pool
    problem: StageProblem
    cross: ConfigTerms | None
    max_stages: int

    @property
    def inner(self) -> ConfigTerms:
        return self.problem.terms

    def config_terms(self, next_to_crossing: bool) -> ConfigTerms:
        return self.cross if next_to_crossing and self.cross is not None else self.inner


def _infinite(tier: str) -> Link:
    return Link(float("inf"), 0.0, tier, False, 1, float("inf"))


@lru_cache(maxsize=256)
def _stage_links(cluster: Cluster, tp: int, cp: int, dp: int, ep: int) -> tuple[Link, ...]:
    """(tp, cp, dp, ep, in-pool boundary) links of a stage on a one-pool ``cluster``."""
    size = tp * cp * dp
    boundary = group_link(cluster, 2, size) if 2 * size <= cluster.num_gpus else \
        _infinite(cluster.tiers[-1].name)  # the pool holds one stage: no in-pool boundary
    return (group_link(cluster, tp, 1), group_link(cluster, cp, tp),
            group_link(cluster, dp * cp, tp), group_link(cluster, ep, tp), boundary)


@lru_cache(maxsize=1024)
def _cross_link(cluster: MultiPoolCluster, pool: Pool, transfers: int) -> Link:
    """The slowest boundary link from ``pool`` to any other pool of the cluster."""
    links = [cross_pool_link(cluster, [Segment(pool.name, 1), Segment(other.name, 1)],
                             concurrent=transfers)
             for other in cluster.pools if other.name != pool.name]
    return min(links, key=lambda link: (link.bandwidth_bytes_per_s, -link.latency_s))


def pool_terms(model: ModelGraph, cluster: Cluster | MultiPoolCluster, config: ParallelConfig,
               options: RuntimeOptions = RuntimeOptions(),
               block_options: tuple[LayerOption, ...] = BLOCK_OPTIONS) -> tuple[PoolTerms, ...]:
    """One :class:`PoolTerms` per pool of ``cluster`` that can host a stage of ``config``."""
    c = config
    size = c.tp * c.cp * c.dp
    shard = Shard(c.micro_batch, c.seq_len, c.tp, c.cp, c.ep, c.sp, c.dtype)
    out = []
    for pool in cluster.pools:
        if pool.num_gpus < size or pool.gpus_per_node % min(c.tp, pool.gpus_per_node) or \
                c.dtype not in pool.gpu.peak_tflops:
            continue
        one = pool.as_cluster() if isinstance(cluster, MultiPoolCluster) else cluster
        tp, cp, dp, ep, boundary = _stage_links(one, c.tp, c.cp, c.dp, c.ep)
        mine = options.for_pool(pool.name)  # the pool's generation's calibrated efficiencies
        ctx = CostContext(model, one, config, mine, shard, Links(tp, cp, dp, ep, boundary))
        problem = stage_problem(ctx, block_options)
        cross = None
        if isinstance(cluster, MultiPoolCluster) and len(cluster.pools) > 1:
            link = _cross_link(cluster, pool, size)
            cross_ctx = CostContext(model, one, config, mine, shard,
                                    Links(tp, cp, dp, ep, link))
            cross = config_terms(cross_ctx)
        out.append(PoolTerms(pool, problem, cross, pool.num_gpus // size))
    return tuple(out)


def stage_contexts(model: ModelGraph, cluster: MultiPoolCluster, config: ParallelConfig,
                   stage_pools: tuple[str, ...], options: RuntimeOptions = RuntimeOptions()
                   ) -> list[CostContext]:
    """The cost context of every stage of a plan across pools (its pool's GPU and links)."""
    by_name = {t.pool.name: t for t in pool_terms(model, cluster, config, options)}
    return [by_name[name].problem.ctx for name in stage_pools]
