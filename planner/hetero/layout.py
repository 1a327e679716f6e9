"""Which pool each pipeline stage runs on, and the global ranks of every stage.

A plan across pools keeps one mesh (``tp x cp x dp`` GPUs per pipeline stage, ``pp`` stages,
:class:`~planner.mesh.Mesh`). Every stage runs on **one** pool, or -- a stage whose
data-parallel group spans pools -- is **split** by replica: its first ``d1`` replicas on one
pool, the next ``d2`` on another (spelled ``"h100:8+a100:24"``, replicas per pool, in replica
order; ``d1 + d2 = dp``). Either way a replica's TP and CP groups stay inside one pool (a TP
group never straddles two GPU types); a split stage's gradient reduction crosses the
inter-pool link and the stage runs at its slower share's pace (its replicas wait for each other
at that reduction).

Ranks: a stage's GPUs on pool ``P`` are the next unused GPUs of ``P`` (pool-major global ranks,
stages in order), ordered inside the stage as in the one-pool mesh (dp, cp, tp; tp innermost),
so a split stage's first ``d1 x tp x cp`` runtime ranks are on its first pool. With every stage
on one pool, the k-th stage placed on ``P`` holds ``P.first_rank + k x S .. + S - 1``
(``S = tp x cp x dp``); on one pool with every stage on it this is exactly the Megatron order
of :class:`~planner.mesh.Mesh`. GPUs of a pool beyond its stages stay idle.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.errors import invalid
from planner.hardware import Pool

SPLIT, SHARE = "+", ":"  # reserved in pool names (clusters/pools.py refuses them)


def split_name(shares: tuple[tuple[str, int], ...]) -> str:
    """The stage-pool spelling of a split stage: ``"h100:8+a100:24"``."""
    return SPLIT.join(f"{pool}{SHARE}{replicas}" for pool, replicas in shares)


def stage_shares(name: str, dp: int) -> tuple[tuple[str, int], ...]:
    """``((pool, replicas), ...)`` of a stage-pool entry: ``((name, dp),)`` for one pool."""
    if SPLIT not in name and SHARE not in name:
        return ((name, dp),)
    shares = []
    for part in name.split(SPLIT):
        pool, _, count = part.rpartition(SHARE)
        if not pool or not count.isdigit() or int(count) < 1:
            raise invalid(f"stage pool {name!r}: a split stage is spelled pool:replicas+"
                          f"pool:replicas (e.g. h100:8+a100:24)")
        shares.append((pool, int(count)))
    if len(shares) < 2 or len({p for p, _ in shares}) != len(shares):
        raise invalid(f"stage pool {name!r}: a split stage names two pools or more, each once")
    if sum(d for _, d in shares) != dp:
        raise invalid(f"stage pool {name!r}: its replicas add up to "
                      f"{sum(d for _, d in shares)}, not dp {dp}")
    return tuple(shares)


@dataclass(frozen=True)
class StagePools:
    """``pools[i]``: the pool stage ``i`` runs on (a pool name, or a split's spelling)."""

    pools: tuple[str, ...]

    @property
    def pp(self) -> int:
        return len(self.pools)

    def crossings(self) -> tuple[bool, ...]:
        """``crossings()[i]``: the boundary between stage i and i + 1 crosses pools (a split
        stage next to a stage placed otherwise sends some replicas' activations across)."""
        return tuple(a != b for a, b in zip(self.pools, self.pools[1:]))

    def next_to_crossing(self, stage: int) -> bool:
        """Stage ``stage`` sends or receives over the inter-pool link."""
        cross = self.crossings()
        return (stage > 0 and cross[stage - 1]) or (stage < len(cross) and cross[stage])

    def stages_on(self, pool: str) -> list[int]:
        """The stages placed exactly on ``pool`` (a pool name or a split's spelling)."""
        return [i for i, p in enumerate(self.pools) if p == pool]

    def splits(self) -> tuple[str, ...]:
        """The split stages' spellings, each once, in stage order."""
        return tuple(dict.fromkeys(p for p in self.pools if SPLIT in p or SHARE in p))


def pools_of(cluster) -> tuple[Pool, ...]:
    """The pools of a MultiPoolCluster, or a Cluster's one pool."""
    return tuple(cluster.pools)


def gpus_by_pool(stage_pools: StagePools, dp: int, replica_gpus: int) -> dict[str, int]:
    """GPUs every pool gives the plan (``replica_gpus = tp x cp``)."""
    out: dict[str, int] = {}
    for name in stage_pools.pools:
        for pool, replicas in stage_shares(name, dp):
            out[pool] = out.get(pool, 0) + replicas * replica_gpus
    return out


def check_fits(cluster, stage_pools: StagePools, dp: int, replica_gpus: int) -> None:
    """INVALID_INPUT unless every stage's pools exist and have the GPUs for its stages."""
    pools = {p.name: p for p in pools_of(cluster)}
    for i, name in enumerate(stage_pools.pools):
        for pool, _ in stage_shares(name, dp):
            if pool not in pools:
                raise invalid(f"stage {i} is placed on pool {pool!r}; cluster {cluster.name!r} "
                              f"has pools {', '.join(pools)}")
    for name, need in gpus_by_pool(stage_pools, dp, replica_gpus).items():
        if need > pools[name].num_gpus:
            raise invalid(f"the stages need {need} GPUs on pool {name!r}, which has "
                          f"{pools[name].num_gpus}")


def stage_segments(cluster, stage_pools: StagePools, dp: int, replica_gpus: int
                   ) -> list[tuple[tuple[str, range], ...]]:
    """Per stage, ``((pool, global ranks), ...)`` in runtime-rank order."""
    pools = {p.name: p for p in pools_of(cluster)}
    used: dict[str, int] = {}
    out = []
    for name in stage_pools.pools:
        segs = []
        for pool, replicas in stage_shares(name, dp):
            first = pools[pool].first_rank + used.get(pool, 0)
            n = replicas * replica_gpus
            segs.append((pool, range(first, first + n)))
            used[pool] = used.get(pool, 0) + n
        out.append(tuple(segs))
    return out


def stage_ranks(cluster, stage_pools: StagePools, dp: int, replica_gpus: int
                ) -> list[tuple[int, ...]]:
    """The global ranks of every pipeline stage, in stage order and runtime-rank order."""
    return [tuple(r for _, ranks in segs for r in ranks)
            for segs in stage_segments(cluster, stage_pools, dp, replica_gpus)]
