"""Cluster and GPU presets, and :func:`load_cluster` for preset names and YAML files.

Consumes: a preset name (case-insensitive) or a path to a cluster YAML file (schema in
docs/clusters.md), optionally a node count that overrides the file's ``num_nodes``.
Produces: :class:`~planner.hardware.Cluster` / :class:`~planner.hardware.Gpu` objects, or a
:class:`~planner.errors.PlannerError` (INVALID_INPUT for bad files and values, UNKNOWN_PRESET
for names that are neither a preset nor a file).

Presets live in ``clusters/presets/``: ``gpus.yaml`` holds every GPU preset, and each other
``*.yaml`` file one cluster preset named like the file. Numbers and their sources are in the
YAML comments (from /work/shared/reference/ecosystem.md sections C1, C2 and C4).
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from clusters.safe_yaml import read_yaml_file
from clusters.schema import (check_keys, cluster_from_mapping, gpu_from_mapping, unknown_preset,
                             with_nodes)
from planner.errors import invalid
from planner.hardware import Cluster, Gpu

PRESET_DIR = Path(__file__).resolve().parent / "presets"
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


def load_cluster(spec: str | os.PathLike, *, nodes: int | None = None) -> Cluster:
    """A cluster from a preset name or a YAML file; ``nodes`` (>= 1) replaces ``num_nodes``.

    Preset names win over files of the same name in the working directory; write ``./name``
    to force the file.
    """
    if isinstance(spec, os.PathLike):
        return _load_file(Path(spec), nodes)
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
    try:
        path = Path(spec).expanduser()
        exists = path.exists()
    except (OSError, ValueError, RuntimeError):  # name too long, NUL byte, unknown ~user
        path, exists = Path(spec), False
    looks_like_path = path.suffix.lower() in YAML_SUFFIXES or "/" in spec or os.sep in spec
    if looks_like_path or exists:
        return _load_file(path, nodes)
    raise unknown_preset("cluster", spec, sorted(presets))


def _load_file(path: Path, nodes: int | None) -> Cluster:
    return cluster_from_mapping(read_yaml_file(path, "cluster file"), str(path),
                                _gpu_preset_data(), nodes)
