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

A **split** stage (its replicas on two pools or more, :mod:`planner.hetero.layout`) is costed
with each share's terms -- its pool's GPU and TP/CP links, and the data-parallel group over the
inter-pool link (:func:`~planner.pool_topology.cross_pool_link` with one segment per share,
every split stage of that shape reducing at once) -- and takes, term by term, the largest over
the shares (the smallest memory capacity): its replicas wait for each other at the gradient
reduction, so the stage runs at its slower share's pace. Exact when one share is slower in
every term (an A100 share against an H100 share); an upper estimate otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Sequence

from planner.pool_topology import Segment, cross_pool_link
from planner.topology import Link, group_link
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.compute import Shard
from planner.cost.context import CostContext, Links, stage_links
from planner.cost.terms import Affine, ConfigTerms, LayerTerms, config_terms, layer_terms
from planner.hardware import Cluster, MultiPoolCluster, Pool
from planner.ir import ModelGraph
from planner.hetero.layout import split_name
from planner.solve.costs import BlockClass, StageProblem, stage_problem
from planner.strategy import BLOCK_OPTIONS, LayerOption


@dataclass(frozen=True)
class PoolTerms:
    """The terms of one configuration on one pool.

    ``problem``: per block class and option the LayerTerms, and the ConfigTerms of a stage whose
    boundaries stay inside the pool (``problem.terms``); ``cross``: the ConfigTerms of a stage
    next to a pool crossing (None on a one-pool cluster). ``max_stages``: how many stages of
    ``tp x cp x dp`` GPUs the pool can host."""

    pool: Pool  # a split stage: its slowest share's pool
    problem: StageProblem
    cross: ConfigTerms | None
    max_stages: int
    # ((pool, GPUs per stage, GPUs of the pool), ...): one row, or one per share of a split
    gpus: tuple[tuple[str, int, int], ...] = ()
    shares: tuple[tuple[str, int], ...] = ()  # a split stage's (pool, replicas); () one pool
    share_contexts: tuple[CostContext, ...] = ()  # a split stage's per-share contexts

    @property
    def inner(self) -> ConfigTerms:
        return self.problem.terms

    @property
    def name(self) -> str:
        """The stage-pool entry: the pool's name, or the split's spelling."""
        return split_name(self.shares) if self.shares else self.pool.name

    def config_terms(self, next_to_crossing: bool) -> ConfigTerms:
        return self.cross if next_to_crossing and self.cross is not None else self.inner

    def layer(self, layer, option) -> LayerTerms:
        """The terms of ``layer`` with ``option`` on a stage placed here."""
        if not self.share_contexts:
            return layer_terms(self.problem.ctx, layer, option)
        return _largest([layer_terms(ctx, layer, option) for ctx in self.share_contexts])


@dataclass(frozen=True)
class _SplitProblem(StageProblem):
    """A split stage's StageProblem: the per-share terms combined (its ``terms`` are given,
    not recomputed from ``ctx``, which is the slowest share's)."""

    combined_terms: ConfigTerms | None = None

    @property
    def terms(self) -> ConfigTerms:
        return self.combined_terms


def _largest(records: Sequence):
    """Term by term the largest of LayerTerms or ConfigTerms records (memory capacities: the
    smallest): what a stage whose shares wait for each other costs."""
    first = records[0]
    if len(records) == 1:
        return first
    out = {}
    for f in fields(first):
        values = [getattr(r, f.name) for r in records]
        if f.name in ("capacity_bytes", "host_capacity_bytes"):
            out[f.name] = min(values)
        elif isinstance(values[0], bool):
            if len(set(values)) != 1:
                raise ValueError(f"shares disagree on {f.name}")
            out[f.name] = values[0]
        elif isinstance(values[0], Affine):
            out[f.name] = Affine(max(v.slope_s_per_byte for v in values),
                                 max(v.intercept_s for v in values))
        elif isinstance(values[0], tuple):
            out[f.name] = tuple(max(x) for x in zip(*values))
        else:
            out[f.name] = max(values)
    return replace(first, **out)


def _infinite(tier: str) -> Link:
    return Link(float("inf"), 0.0, tier, False, 1, float("inf"))


def _boundary(cluster: Cluster, size: int) -> Link:
    """The in-pool link between two stages of ``size`` GPUs on a one-pool ``cluster``."""
    return group_link(cluster, 2, size) if 2 * size <= cluster.num_gpus else \
        _infinite(cluster.tiers[-1].name)  # the pool holds one stage: no in-pool boundary


@lru_cache(maxsize=256)
def _stage_links(cluster: Cluster, tp: int, cp: int, dp: int, ep: int,
                 ep_stride: int) -> tuple[Link, ...]:
    """(tp, cp, dp, ep, in-pool boundary) links of a split stage's share on a one-pool
    ``cluster``; ``ep_stride``: the expert mesh's (planner.mesh: etp, not tp)."""
    return (group_link(cluster, tp, 1), group_link(cluster, cp, tp),
            group_link(cluster, dp * cp, tp), group_link(cluster, ep, ep_stride),
            _boundary(cluster, tp * cp * dp))


@lru_cache(maxsize=1024)
def _cross_link(cluster: MultiPoolCluster, pool: Pool, transfers: int) -> Link:
    """The slowest boundary link from ``pool`` to any other pool of the cluster."""
    links = [cross_pool_link(cluster, [Segment(pool.name, 1), Segment(other.name, 1)],
                             concurrent=transfers)
             for other in cluster.pools if other.name != pool.name]
    return min(links, key=lambda link: (link.bandwidth_bytes_per_s, -link.latency_s))


def pool_terms(model: ModelGraph, cluster: Cluster | MultiPoolCluster, config: ParallelConfig,
               options: RuntimeOptions = RuntimeOptions(),
               block_options: tuple[LayerOption, ...] = BLOCK_OPTIONS,
               splits: Sequence[tuple[tuple[str, int], ...]] = (),
               headroom=None) -> tuple[PoolTerms, ...]:
    """One :class:`PoolTerms` per pool of ``cluster`` that can host a stage of ``config``,
    then one per split stage shape of ``splits`` (``((pool, replicas), ...)``). ``headroom``
    (a :class:`~planner.solve.headroom.MemoryHeadroom`): each stage's problem may fill only
    its pool's memory less the headroom (the CP-SAT model's limit; evaluate still judges the
    whole capacity)."""
    out = list(_pure_terms(model, cluster, config, options, block_options, headroom))
    for shares in splits:
        out.append(split_terms(model, cluster, config, options, block_options, tuple(shares),
                               headroom))
    return tuple(out)


def _limit(headroom, pool: Pool) -> float | None:
    return None if headroom is None else headroom.limit_bytes(pool.memory_bytes_per_gpu)


def _pure_terms(model, cluster, config, options, block_options, headroom=None):
    c = config
    size = c.tp * c.cp * c.dp
    # the stage as planner.cost.context.make_context sees it: the expert mesh's etp and
    # routing load, and every group's link on the mesh (expert, HSDP replicate groups)
    shard = Shard(c.micro_batch, c.seq_len, c.tp, c.cp, c.ep, c.sp, c.dtype,
                  etp=c.mesh.expert_tp, expert_load=options.moe.load_factor)
    out = []
    for pool in cluster.pools:
        if pool.num_gpus < size or pool.gpus_per_node % min(c.tp, pool.gpus_per_node) or \
                c.dtype not in pool.gpu.peak_tflops:
            continue
        one = pool.as_cluster() if isinstance(cluster, MultiPoolCluster) else cluster
        links = stage_links(one, c.mesh, _boundary(one, size))
        mine = options.for_pool(pool.name)  # the pool's generation's calibrated efficiencies
        ctx = CostContext(model, one, config, mine, shard, links)
        problem = stage_problem(ctx, block_options, _limit(headroom, pool))
        cross = None
        if isinstance(cluster, MultiPoolCluster) and len(cluster.pools) > 1:
            link = _cross_link(cluster, pool, size)
            cross_ctx = CostContext(model, one, config, mine, shard, replace(links, pp=link))
            cross = config_terms(cross_ctx)
        out.append(PoolTerms(pool, problem, cross, pool.num_gpus // size,
                             ((pool.name, size, pool.num_gpus),)))
    return tuple(out)


def split_terms(model: ModelGraph, cluster: MultiPoolCluster, config: ParallelConfig,
                options: RuntimeOptions, block_options: tuple[LayerOption, ...],
                shares: tuple[tuple[str, int], ...], headroom=None) -> PoolTerms:
    """The terms of a split stage (see the module docstring)."""
    c = config
    s, size = c.tp * c.cp, c.tp * c.cp * c.dp
    pools = {p.name: p for p in cluster.pools}
    shard = Shard(c.micro_batch, c.seq_len, c.tp, c.cp, c.ep, c.sp, c.dtype,
                  etp=c.mesh.expert_tp, expert_load=options.moe.load_factor)
    # one split stage of a shape per plan (planner/hetero/search.py: it fills the GPUs the
    # whole stages leave over); its tp data-parallel groups reduce at once
    stages = min(1, *(pools[p].num_gpus // (d * s) for p, d in shares))
    dp_link = cross_pool_link(cluster, [Segment(p, d * c.cp, c.tp) for p, d in shares],
                              concurrent=c.tp)
    problems, crosses, contexts = [], [], []
    for p, d in shares:
        pool = pools[p]
        one = pool.as_cluster()
        tp, cp, _, ep, boundary = _stage_links(one, c.tp, c.cp, d, c.ep, c.mesh.stride("ep"))
        mine = options.for_pool(p)
        ctx = CostContext(model, one, config, mine, shard, Links(tp, cp, dp_link, ep, boundary))
        contexts.append(ctx)
        problems.append(stage_problem(ctx, block_options))
        crosses.append(config_terms(CostContext(model, one, config, mine, shard,
                                                Links(tp, cp, dp_link, ep,
                                                      _cross_link(cluster, pool, size)))))
    slowest = max(range(len(shares)), key=lambda k: sum(
        x.time_s * cls.count for cls in problems[k].classes for x in cls.costs))
    first = problems[0]
    classes = []
    for ci, cls in enumerate(first.classes):
        if any(prob.classes[ci].options != cls.options for prob in problems):
            raise ValueError("the shares of a split stage offer different options")
        classes.append(BlockClass(cls.start, cls.first_block, cls.count, cls.options,
                                  tuple(_largest([prob.classes[ci].costs[r] for prob in problems])
                                        for r in range(len(cls.options)))))
    problem = _SplitProblem(
        problems[slowest].ctx, tuple(classes), first.num_blocks, first.pre, first.post,
        tuple(_largest(xs) for xs in zip(*(p.pre_costs for p in problems))),
        tuple(_largest(xs) for xs in zip(*(p.post_costs for p in problems))),
        None if headroom is None else min(_limit(headroom, pools[p]) for p, _ in shares),
        first.edge_options,
        tuple(tuple(_largest(xs) for xs in zip(*rows))
              for rows in zip(*(p.edge_costs for p in problems))),
        combined_terms=_largest([p.terms for p in problems]))
    return PoolTerms(pools[shares[slowest][0]], problem, _largest(crosses), stages,
                     tuple((p, d * s, pools[p].num_gpus) for p, d in shares), shares,
                     tuple(contexts))


def stage_contexts(model: ModelGraph, cluster: MultiPoolCluster, config: ParallelConfig,
                   stage_pools: tuple[str, ...], options: RuntimeOptions = RuntimeOptions()
                   ) -> list[CostContext]:
    """The cost context of every stage of a plan across pools (its pool's GPU and links)."""
    from planner.hetero.layout import StagePools, stage_shares

    splits = [stage_shares(n, config.dp) for n in StagePools(tuple(stage_pools)).splits()]
    by_name = {t.name: t for t in pool_terms(model, cluster, config, options, splits=splits)}
    return [by_name[name].problem.ctx for name in stage_pools]
