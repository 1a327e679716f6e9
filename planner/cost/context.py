"""Cost context: one configuration's inputs gathered once (model, cluster, config, runtime
options), with the per-GPU :class:`~planner.cost.compute.Shard` and the link each mesh group
spans.

Consumes a ModelGraph, a Cluster, a ParallelConfig and RuntimeOptions; produces a
:class:`CostContext` that :mod:`planner.cost.terms` turns into cost terms
(``config_terms(ctx)``, ``layer_terms(ctx, layer, option)``). Which ranks form a
group (and so which link it spans) is read from :class:`planner.mesh.Mesh`: its strides are the
one statement of the rank layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner.topology import Link, group_link
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.compute import Shard
from planner.cost.moe import ep_domains
from planner.hardware import Cluster
from planner.ir import ModelGraph
from planner.mesh import Mesh


@dataclass(frozen=True)
class Links:
    tp: Link
    cp: Link
    dp: Link  # the dp x cp ranks sharing ZeRO states and reducing gradients
    ep: Link
    pp: Link
    # The expert mesh (planner.mesh.Mesh): expert tensor and expert data parallel groups, and
    # for the hierarchical dispatcher the EP members inside one NVLink domain and one member
    # per domain (the same rail), with the number of domains the EP group spans.
    etp: Link | None = None
    edp: Link | None = None
    ep_intra: Link | None = None
    ep_inter: Link | None = None
    ep_domains: int = 1
    # HSDP: the replicate group (one rank of each shard group holding the same shard)
    replicate: Link | None = None


@dataclass(frozen=True, eq=False)  # identity hash: contexts key the per-layer cost cache
class CostContext:
    model: ModelGraph
    cluster: Cluster
    config: ParallelConfig
    options: RuntimeOptions
    shard: Shard
    links: Links

    @property
    def mesh(self) -> Mesh:
        return self.config.mesh

    @property
    def shard_degree(self) -> int:
        """Ranks sharing ZeRO states of dense parameters (Megatron shards over dp x cp)."""
        return self.mesh.shard_degree


def make_context(model: ModelGraph, cluster: Cluster, config: ParallelConfig,
                 options: RuntimeOptions = RuntimeOptions()) -> CostContext:
    c = config
    shard = Shard(c.micro_batch, c.seq_len, c.tp, c.cp, c.ep, c.sp, c.dtype,
                  etp=c.mesh.expert_tp, expert_load=options.moe.load_factor)
    return CostContext(model, cluster, config, options, shard, mesh_links(cluster, c.mesh))


@lru_cache(maxsize=4096)
def mesh_links(cluster: Cluster, mesh: Mesh) -> Links:
    """The link of every group of the mesh: a group of ``size`` ranks ``stride`` apart."""
    return stage_links(cluster, mesh,
                       group_link(cluster, 2 if mesh.pp > 1 else 1, mesh.stride("pp")))


def stage_links(cluster: Cluster, mesh: Mesh, pp: Link) -> Links:
    """The links of the groups inside one pipeline stage's ``tp x cp x dp`` ranks (dense and
    expert mesh), with ``pp`` as the stage boundary's link: :func:`mesh_links`, and the
    re-planner's stages on a pool that may hold one stage only (planner/hetero/terms.py)."""
    ep_stride = mesh.stride("ep")
    domains = ep_domains(mesh.ep, ep_stride, cluster.tiers[0].domain_gpus)
    per_domain = max(mesh.ep // domains, 1)
    return Links(
        tp=group_link(cluster, mesh.tp, mesh.stride("tp")),
        cp=group_link(cluster, mesh.cp, mesh.stride("cp")),
        dp=group_link(cluster, mesh.shard_degree, mesh.stride("shard")),
        ep=group_link(cluster, mesh.ep, ep_stride),
        pp=pp,
        etp=group_link(cluster, mesh.expert_tp, mesh.stride("etp")),
        edp=group_link(cluster, mesh.expert_dp, mesh.stride("edp")),
        ep_intra=group_link(cluster, per_domain, ep_stride),
        ep_inter=group_link(cluster, domains, ep_stride * per_domain),
        ep_domains=domains,
        replicate=group_link(cluster, mesh.replicas, mesh.stride("replicate")),
    )
