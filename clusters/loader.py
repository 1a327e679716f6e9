"""Cluster and GPU presets, and :func:`load_cluster` for preset names and YAML files.

Consumes: a preset name (case-insensitive) or a path to a cluster YAML file (schema in
docs/clusters.md), optionally a node count that overrides the file's ``num_nodes``.
Produces: :class:`~planner.hardware.Cluster` / :class:`~planner.hardware.Gpu` objects, or a
:class:`~planner.errors.PlannerError` (INVALID_INPUT for bad files and values, UNKNOWN_PRESET
for names that are neither a preset nor a file).

Presets live in ``clusters/presets/``: ``gpus.yaml`` holds every GPU preset, and each other
``*.yaml`` file one cluster preset named like the file; ``clusters/presets/pools/`` holds the
multi-pool presets. A document with ``pools:`` is read by :mod:`clusters.pools`; it gives a
:class:`~planner.hardware.MultiPoolCluster` only to callers that ask for one
(``multi_pool=True``), since one-pool code needs a single GPU type. Numbers and their sources are in the
YAML comments (from vendor datasheets).
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from clusters.pools import multi_pool_from_mapping
from clusters.safe_yaml import read_yaml_file
from clusters.schema import (check_keys, cluster_from_mapping, gpu_from_mapping, unknown_preset,
                             with_nodes)
from planner.errors import invalid
from planner.hardware import Cluster, Gpu, MultiPoolCluster

PRESET_DIR = Path(__file__).resolve().parent / "presets"
# Multi-pool cluster presets (documents with ``pools:``), one per file, named like the file.
POOL_PRESET_DIR = PRESET_DIR / "pools"
GPU_PRESET_FILE = "gpus.yaml"
YAML_SUFFIXES = (".yaml", ".yml")


@lru_cache(maxsize=1)
def _gpu_preset_data() -> dict[str, dict[str, Any]]:
    """GPU preset name -> its raw, validated field mapping (what ``gpu_overrides`` patches)."""
    path = PRESET_DIR / GPU_PRESET_FILE
    where = str(path)
    doc = check_keys(read_yaml_file(path, "GPU preset file"), where, "",
                     ("shardplan_gpus", "gpus"), ())
    if not isinstance(doc["gpus"], list):
        raise invalid(f"{where}: gpus: expected a list of GPU mappings")
    presets: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(doc["gpus"]):
        gpu = gpu_from_mapping(entry, where, lambda key, i=index: f"gpus[{i}].{key}")
        name = gpu.name.lower()
        if name in presets:
            raise invalid(f"{where}: gpus[{index}].name: duplicate GPU preset {name!r}")
        presets[name] = dict(entry)
    return presets


def list_gpu_presets() -> list[Gpu]:
    """Every GPU preset, sorted by name."""
    return [gpu_preset(name) for name in sorted(_gpu_preset_data())]


@lru_cache(maxsize=None)
def gpu_preset(name: str) -> Gpu:
    """The GPU preset ``name`` (case-insensitive); UNKNOWN_PRESET when there is none."""
    data = _gpu_preset_data()
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in data:
        raise unknown_preset("GPU", name, sorted(data))
    where = str(PRESET_DIR / GPU_PRESET_FILE)
    return gpu_from_mapping(data[key], where, lambda field: f"gpus[{key}].{field}")


@lru_cache(maxsize=1)
def _cluster_preset_paths() -> dict[str, Path]:
    return {path.stem.lower(): path for path in sorted(PRESET_DIR.glob("*.yaml"))
            if path.name != GPU_PRESET_FILE}


@lru_cache(maxsize=None)
def _cluster_preset(name: str) -> Cluster:
    path = _cluster_preset_paths()[name]
    return cluster_from_mapping(read_yaml_file(path, "cluster preset"), str(path),
                                _gpu_preset_data())


def cluster_preset_names() -> list[str]:
    return sorted(_cluster_preset_paths())


def list_cluster_presets() -> list[Cluster]:
    """Every cluster preset at its default node count, sorted by name."""
    return [_cluster_preset(name) for name in cluster_preset_names()]


@lru_cache(maxsize=1)
def _pool_preset_paths() -> dict[str, Path]:
    return {path.stem.lower(): path for path in sorted(POOL_PRESET_DIR.glob("*.yaml"))}


def pool_preset_names() -> list[str]:
    """Names of the multi-pool cluster presets."""
    return sorted(_pool_preset_paths())


def list_pool_presets() -> list[MultiPoolCluster | Cluster]:
    """Every multi-pool cluster preset, sorted by name."""
    return [load_cluster(name, multi_pool=True) for name in pool_preset_names()]


def load_cluster(spec: str | os.PathLike, *, nodes: int | None = None,
                 multi_pool: bool = False) -> Cluster | MultiPoolCluster:
    """A cluster from a preset name or a YAML file; ``nodes`` (>= 1) replaces ``num_nodes``.

    Preset names win over files of the same name in the working directory; write ``./name``
    to force the file. A file or preset with several pools gives a MultiPoolCluster when
    ``multi_pool`` is true and INVALID_INPUT otherwise (a one-pool planner cannot use it);
    ``nodes`` cannot scale it (each pool has its own ``num_nodes``).
    """
    if isinstance(spec, os.PathLike):
        return _load_file(Path(spec), nodes, multi_pool)
    if not isinstance(spec, str):
        raise invalid(f"cluster must be a preset name or a path, got {type(spec).__name__}")
    if not spec.strip():
        raise invalid("cluster name is empty",
                      f"Pass a preset ({', '.join(cluster_preset_names())}) or a YAML file.")
    key = spec.strip().lower()
    presets = _cluster_preset_paths()
    if key in presets:
        cluster = _cluster_preset(key)
        return cluster if nodes is None else with_nodes(cluster, nodes, f"preset {key}")
    if key in _pool_preset_paths():
        return _load_file(_pool_preset_paths()[key], nodes, multi_pool, f"preset {key}")
    try:
        path = Path(spec).expanduser()
        exists = path.exists()
    except (OSError, ValueError, RuntimeError):  # name too long, NUL byte, unknown ~user
        path, exists = Path(spec), False
    looks_like_path = path.suffix.lower() in YAML_SUFFIXES or "/" in spec or os.sep in spec
    if looks_like_path or exists:
        return _load_file(path, nodes, multi_pool)
    raise unknown_preset("cluster", spec, sorted(presets) + pool_preset_names())


def _load_file(path: Path, nodes: int | None, multi_pool: bool = False,
               label: str | None = None) -> Cluster | MultiPoolCluster:
    doc = read_yaml_file(path, "cluster file")
    where = str(path)
    if not (isinstance(doc, dict) and "pools" in doc):
        return cluster_from_mapping(doc, where, _gpu_preset_data(), nodes)
    cluster = multi_pool_from_mapping(doc, where, _gpu_preset_data(), _cluster_preset,
                                      cluster_preset_names())
    if isinstance(cluster, Cluster):  # one pool: an ordinary cluster
        return cluster if nodes is None else with_nodes(cluster, nodes, where)
    shown = label or where
    pools = ", ".join(f"{p.name} ({p.num_nodes} x {p.gpus_per_node} {p.gpu.name})"
                      for p in cluster.pools)
    if nodes is not None:
        raise invalid(f"{shown}: --nodes cannot scale a cluster of {len(cluster.pools)} pools "
                      f"({pools})", "Set num_nodes of each pool in the cluster file.",
                      file=where, field="nodes")
    if not multi_pool:
        raise invalid(f"{shown}: describes {len(cluster.pools)} pools ({pools}); this command "
                      f"plans one homogeneous pool",
                      "`shardplan plan` and `shardplan plan-pools` plan across pools (with "
                      "--pin tp=.. --pin pp=.. they cost one configuration; "
                      "docs/heterogeneous.md), or keep one entry of 'pools'.",
                      file=where, field="pools")
    return cluster
