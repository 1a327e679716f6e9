"""Cluster descriptions: GPU and cluster presets, the YAML loader and the topology model.

Public API (see docs/clusters.md)::

    from clusters import load_cluster, list_cluster_presets, list_gpu_presets
    load_cluster(spec, *, nodes=None) -> Cluster   # preset name or YAML path
    load_cluster(spec, multi_pool=True) -> Cluster | MultiPoolCluster   # files with pools:
    from planner.topology import build_topology, group_link, Link   # the cost model's topology
    from planner.pool_topology import build_pool_topology, cross_pool_link, Segment
"""
from clusters.loader import (cluster_preset_names, gpu_preset, list_cluster_presets,
                             list_gpu_presets, list_pool_presets, load_cluster,
                             pool_preset_names)

__all__ = ["load_cluster", "list_cluster_presets", "list_gpu_presets", "gpu_preset",
           "cluster_preset_names", "list_pool_presets", "pool_preset_names"]
