"""Which pool each pipeline stage runs on, and the global ranks of every stage.

A plan across pools keeps one mesh (``tp x cp x dp`` GPUs per pipeline stage, ``pp`` stages,
:class:`~planner.mesh.Mesh`) and puts every stage on **one** pool: a stage never straddles two
GPU types, so its TP, CP and DP groups stay inside that pool's fabric. The k-th stage placed on
pool ``P`` (in stage order) holds the ranks ``P.first_rank + k * S .. + S - 1`` with
``S = tp x cp x dp``, ordered inside the stage as in the one-pool mesh (dp, cp, tp; tp
innermost). On one pool with every stage on it this is exactly the Megatron order of
:class:`~planner.mesh.Mesh`. GPUs of a pool beyond its stages stay idle.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.errors import invalid
from planner.hardware import Pool


@dataclass(frozen=True)
class StagePools:
    """``pools[i]``: the name of the pool stage ``i`` runs on."""

    pools: tuple[str, ...]

    @property
    def pp(self) -> int:
        return len(self.pools)

    def crossings(self) -> tuple[bool, ...]:
        """``crossings()[i]``: the boundary between stage i and i + 1 crosses pools."""
        return tuple(a != b for a, b in zip(self.pools, self.pools[1:]))

    def next_to_crossing(self, stage: int) -> bool:
        """Stage ``stage`` sends or receives over the inter-pool link."""
        cross = self.crossings()
        return (stage > 0 and cross[stage - 1]) or (stage < len(cross) and cross[stage])

    def stages_on(self, pool: str) -> list[int]:
        return [i for i, p in enumerate(self.pools) if p == pool]


def pools_of(cluster) -> tuple[Pool, ...]:
    """The pools of a MultiPoolCluster, or a Cluster's one pool."""
    return tuple(cluster.pools)


def check_fits(cluster, stage_pools: StagePools, gpus_per_stage: int) -> None:
    """INVALID_INPUT unless every stage's pool exists and has the GPUs for its stages."""
    pools = {p.name: p for p in pools_of(cluster)}
    for i, name in enumerate(stage_pools.pools):
        if name not in pools:
            raise invalid(f"stage {i} is placed on pool {name!r}; cluster {cluster.name!r} has "
                          f"pools {', '.join(pools)}")
    for name, pool in pools.items():
        need = len(stage_pools.stages_on(name)) * gpus_per_stage
        if need > pool.num_gpus:
            raise invalid(f"{len(stage_pools.stages_on(name))} stages of {gpus_per_stage} GPUs "
                          f"need {need} GPUs on pool {name!r}, which has {pool.num_gpus}")


def stage_first_rank(cluster, stage_pools: StagePools, gpus_per_stage: int, stage: int) -> int:
    """The first global rank of pipeline stage ``stage``."""
    pools = {p.name: p for p in pools_of(cluster)}
    name = stage_pools.pools[stage]
    k = stage_pools.pools[:stage].count(name)
    return pools[name].first_rank + k * gpus_per_stage


def stage_ranks(cluster, stage_pools: StagePools, gpus_per_stage: int) -> list[range]:
    """The global ranks of every pipeline stage, in stage order."""
    return [range(first, first + gpus_per_stage) for first in
            (stage_first_rank(cluster, stage_pools, gpus_per_stage, i)
             for i in range(stage_pools.pp))]
