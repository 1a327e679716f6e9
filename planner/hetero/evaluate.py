"""Step time and per-GPU memory of a plan whose pipeline stages run on different pools.

Consumes a model, a cluster (multi-pool or one pool), a ParallelConfig, the pool of every stage
(:class:`~planner.hetero.layout.StagePools`: a pool, or a split over pools), a LayerPlacement, runtime options and optional
per-stage slowdown factors (stragglers); produces a :class:`HeteroEvaluation`.

It is the one-pool composition of :mod:`planner.cost.terms` with one ConfigTerms per stage:
stage i's layers are costed with the terms of its pool (:mod:`planner.hetero.terms`), its
memory is checked against its pool's capacity, and the step is
:func:`planner.cost.terms.step_time` over the per-stage terms. A stage slowed by ``factor``
(a straggler among its GPUs: its TP peers wait for it every collective) has its time per
micro-batch and its optimizer step multiplied by the factor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from planner.config import ParallelConfig, RuntimeOptions
from planner.strategy import LayerPlacement
from planner.cost.model import StageResult, model_flops_per_step
from planner.cost.terms import (ConfigTerms, LayerTerms, StepBreakdown, stage_memory,
                                stage_time, step_time)
from planner.errors import invalid
from planner.hardware import Cluster, MultiPoolCluster
from planner.hetero.layout import StagePools, check_fits, gpus_by_pool, stage_shares
from planner.hetero.terms import PoolTerms, pool_terms
from planner.ir import ModelGraph
from planner.strategy import default_placement


@dataclass(frozen=True)
class HeteroEvaluation:
    model: ModelGraph
    cluster: Cluster | MultiPoolCluster
    config: ParallelConfig
    stage_pools: StagePools
    placement: LayerPlacement
    options: RuntimeOptions
    stages: tuple[StageResult, ...]
    capacity_bytes: tuple[float, ...]  # per stage: its pool's memory per GPU
    slowdown: tuple[float, ...]  # per stage
    breakdown: StepBreakdown
    model_flops: float
    hw_flops: float

    @property
    def step_time_s(self) -> float:
        return self.breakdown.step_time_s

    @property
    def tokens_per_s(self) -> float:
        return self.config.global_batch * self.config.seq_len / self.step_time_s

    @property
    def num_gpus_used(self) -> int:
        return self.config.num_gpus

    @property
    def model_tflops_per_gpu(self) -> float:
        """Over the GPUs the plan uses (idle GPUs of a pool are not counted)."""
        return self.model_flops / self.step_time_s / self.num_gpus_used / 1e12

    @property
    def hw_tflops_per_gpu(self) -> float:
        return self.hw_flops / self.step_time_s / self.num_gpus_used / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs over the summed peak of the GPUs the plan uses (each its pool's GPU)."""
        pools = {p.name: p for p in self.cluster.pools}
        peak = sum(pools[name].gpu.peak_tflops[self.config.dtype] * 1e12 * gpus
                   for name, gpus in self.gpus_per_pool().items())
        return self.model_flops / self.step_time_s / peak

    @property
    def fits(self) -> bool:
        return all(s.memory.total <= cap for s, cap in zip(self.stages, self.capacity_bytes))

    @property
    def peak_memory_bytes(self) -> float:
        return max(s.memory.total for s in self.stages)

    @property
    def memory_headroom_bytes(self) -> float:
        """Smallest capacity - use over the stages (negative: does not fit)."""
        return min(cap - s.memory.total for s, cap in zip(self.stages, self.capacity_bytes))

    def gpus_per_pool(self) -> dict[str, int]:
        c = self.config
        used = gpus_by_pool(self.stage_pools, c.dp, c.tp * c.cp)
        return {p.name: used.get(p.name, 0) for p in self.cluster.pools}


def stage_terms(terms: Sequence[PoolTerms], stage_pools: StagePools) -> list[ConfigTerms]:
    """The ConfigTerms of every stage (its pool's, with the crossing link next to a crossing)."""
    by_name = {t.name: t for t in terms}
    return [by_name[name].config_terms(stage_pools.next_to_crossing(i))
            for i, name in enumerate(stage_pools.pools)]


def embedding_sync_s(terms: Sequence[PoolTerms], stage_pools: StagePools) -> float:
    """The tied-embedding all-reduce of the first and last stage: in-pool or across pools."""
    by_name = {t.name: t for t in terms}
    first, last = stage_pools.pools[0], stage_pools.pools[-1]
    if first == last:
        return by_name[first].inner.embedding_sync_s
    return max(by_name[first].cross.embedding_sync_s, by_name[last].cross.embedding_sync_s)


def hetero_evaluate(model: ModelGraph, cluster: Cluster | MultiPoolCluster,
                    config: ParallelConfig, stage_pools: StagePools,
                    placement: LayerPlacement | None = None,
                    options: RuntimeOptions = RuntimeOptions(),
                    slowdown: Sequence[float] | None = None,
                    terms: Sequence[PoolTerms] | None = None) -> HeteroEvaluation:
    """Predict step time and memory of ``config`` with stage i on pool ``stage_pools.pools[i]``."""
    if stage_pools.pp != config.pp:
        raise invalid(f"{stage_pools.pp} stage pools for pp {config.pp}")
    if config.virtual_stages != 1 and len(set(stage_pools.pools)) > 1:
        raise invalid("plans across pools use the 1F1B schedule (virtual stages 1): interleaved "
                      "chunks must be equal, stages on different GPUs are not")
    size = config.tp * config.cp * config.dp
    check_fits(cluster, stage_pools, config.dp, config.tp * config.cp)
    if placement is None:
        placement = default_placement(model, config)
    factors = tuple(float(f) for f in (slowdown or (1.0,) * config.pp))
    if len(factors) != config.pp or any(not f >= 1.0 for f in factors):
        raise invalid(f"slowdown needs {config.pp} factors >= 1, got {factors}")
    if terms is None:
        terms = pool_terms(model, cluster, config, options, splits=[
            stage_shares(name, config.dp) for name in stage_pools.splits()])
    by_name = {t.name: t for t in terms}
    for name in stage_pools.pools:
        if name not in by_name:
            raise invalid(f"pool {name!r} cannot host a stage of {size} GPUs with tp "
                          f"{config.tp} in {config.dtype}")
    per_stage = stage_terms(terms, stage_pools)
    per_stage = [_with_embedding(t, embedding_sync_s(terms, stage_pools)) for t in per_stage]
    cache: dict = {}

    def cost(i: int, pool: str) -> LayerTerms:
        key = (model.layers[i].signature, placement.options[i], pool)
        if key not in cache:
            cache[key] = by_name[pool].layer(model.layers[i], placement.options[i])
        return cache[key]

    stage_costs = [[cost(i, stage_pools.pools[s]) for i in placement.layers_of_stage(s)]
                   for s in range(config.pp)]
    times = [stage_time(per_stage[s], costs) * factors[s] for s, costs in enumerate(stage_costs)]
    stages = tuple(
        StageResult(index=s, layers=tuple(placement.layers_of_stage(s)),
                    memory=stage_memory(per_stage[s], s, stage_costs[s]), time_s=times[s],
                    compute_s=sum(x.compute_s for x in stage_costs[s]) * factors[s],
                    comm_s=times[s] - sum(x.compute_s for x in stage_costs[s]) * factors[s])
        for s in range(config.pp))
    slowed = [[_slowed(x, factors[s]) for x in costs] for s, costs in enumerate(stage_costs)]
    breakdown = step_time(per_stage, slowed, times)
    m = config.num_micro_batches
    hw = sum(x.hw_flops for costs in stage_costs for x in costs) * m * config.dp * config.tp * config.cp
    return HeteroEvaluation(model, cluster, config, stage_pools, placement, options, stages,
                            tuple(t.capacity_bytes for t in per_stage), factors, breakdown,
                            model_flops_per_step(model, config), hw)


def _with_embedding(t: ConfigTerms, seconds: float) -> ConfigTerms:
    from dataclasses import replace

    return replace(t, embedding_sync_s=seconds)


def _slowed(x: LayerTerms, factor: float) -> LayerTerms:
    """A straggler's optimizer step is slower too (its DP collectives are not: the fabric is)."""
    if factor == 1.0:
        return x
    from dataclasses import replace

    return replace(x, optimizer_s=x.optimizer_s * factor)
