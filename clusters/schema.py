"""Validate cluster and GPU mappings (parsed YAML) and build :mod:`planner.hardware` objects.

Consumes: plain mappings as parsed from a cluster file or a preset (see docs/clusters.md for the
schema), plus the GPU presets a cluster may refer to by name.
Produces: :class:`~planner.hardware.Gpu` and :class:`~planner.hardware.Cluster` objects, or a
:class:`~planner.errors.PlannerError` (INVALID_INPUT, or UNKNOWN_PRESET for a GPU name that is
not a preset) whose message names the file and the field path, e.g.
``tiers[1].bandwidth_gbytes_per_s``.

Units are in the key names: GiB (2**30 bytes) of memory, GB/s (1e9 bytes/s) per direction of
bandwidth, microseconds of latency, dense TFLOP/s of throughput.
"""
from __future__ import annotations

import difflib
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from planner.errors import ErrorKind, PlannerError, invalid
# one finite-number check for every input (the serving client's too): planner.safe_input
from planner.safe_input import control_character, number  # noqa: F401  (re-exported)
from planner.safe_input import field_error as _fail, show as _show, type_name as _type_name
from planner.hardware import Cluster, Gpu, HostMemory, NetworkTier

SCHEMA_VERSION = 1

# Upper bounds that no real machine reaches; they catch unit mistakes (bytes for GiB) and
# numbers that would make the planner allocate or loop absurdly.
MAX_NODES = 1_000_000
# Bounds that keep every accepted cluster fast to evaluate (the topology model routes each
# group's flows; docs/reliability.md, "Scale"): the largest NVLink domain sold as one system is
# 144 GPUs (NVL144), the largest clusters built hold ~200k GPUs. 256 GPUs per node took 17 s and
# 1,024 x 1,000,000 nodes minutes per evaluation.
MAX_GPUS_PER_NODE = 144
MAX_GPUS = 2**20
MAX_MEMORY_GIB = 1_000_000
MAX_BANDWIDTH_GBYTES_PER_S = 1_000_000
MAX_TFLOPS = 1_000_000
MAX_SMS = 1_000_000
MAX_LATENCY_US = 1_000_000
MAX_OVERSUBSCRIPTION = 1_000
MAX_TEXT = 2_000
# Lower bounds on rates and sizes: far below any real part (1 MB/s, 1 GFLOP/s, 1 MiB, 0.1%
# efficiency), and far enough above the float limits (1e-300, 5e-324 pass a "> 0" check) that
# every time and byte count derived from them stays finite.
MIN_RATE = 1e-3  # GB/s, TFLOP/s, GiB, efficiency

GPU_REQUIRED = ("name", "memory_gib", "hbm_bandwidth_gbytes_per_s", "peak_tflops", "num_sms")
GPU_OPTIONAL = ("vendor", "matmul_efficiency", "attention_efficiency", "reserve_gib",
                "description", "source")
# bf16/fp16/fp8: dense tensor-core throughput; tf32: dense tensor-core TF32 (matrix); fp32:
# dense non-tensor-core (CUDA-core / vector) FP32. At least one of bf16, fp16 is required.
PEAK_TFLOPS_KEYS = ("bf16", "fp16", "fp8", "fp4", "tf32", "fp32")

CLUSTER_REQUIRED = ("shardplan_cluster", "name", "gpu", "gpus_per_node", "num_nodes", "tiers")
CLUSTER_OPTIONAL = ("gpu_overrides", "nics_per_node", "gpus_per_host", "scalable_unit_nodes",
                    "spine_oversubscription", "spine_latency_us", "intra_node_topology",
                    "host", "description", "source")
HOST_REQUIRED = ("memory_gib_per_gpu", "link_gbytes_per_s", "memory_bandwidth_gbytes_per_s_per_gpu",
                 "cpu_cores_per_gpu", "core_gflops")
HOST_OPTIONAL = ("link_efficiency", "memory_efficiency", "link", "source")
TIER_REQUIRED = ("name", "bandwidth_gbytes_per_s", "latency_us")
TIER_OPTIONAL = ("efficiency",)
INTRA_NODE_TOPOLOGIES = ("switch", "full_mesh")


def check_keys(data: Any, where: str, path: str, required: tuple[str, ...],
               optional: tuple[str, ...]) -> dict[str, Any]:
    """``data`` must be a mapping with string keys, all of them known, none required missing."""
    label = path or "top level"
    if not isinstance(data, dict):
        raise _fail(where, label, f"expected a mapping (key: value pairs), got "
                                  f"{_type_name(data)} {_show(data)}")
    valid = required + optional
    for key in data:
        if not isinstance(key, str):
            raise _fail(where, label, f"keys must be strings, got {_show(key)}")
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hints = [f"Did you mean {close[0]!r}?"] if close else []
            raise _fail(where, _join(path, key),
                        f"unknown key {key!r}; valid keys: {', '.join(sorted(valid))}", *hints)
    missing = [key for key in required if key not in data]
    if missing:
        raise _fail(where, _join(path, missing[0]),
                    f"missing required key {missing[0]!r} (required: {', '.join(required)})")
    return data


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def text(value: Any, where: str, path: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise _fail(where, path, f"expected a string, got {_type_name(value)} {_show(value)}")
    if not allow_empty and not value.strip():
        raise _fail(where, path, "must not be empty")
    if len(value) > MAX_TEXT:
        raise _fail(where, path, f"is {len(value)} characters long (limit {MAX_TEXT})")
    bad = control_character(value, allow_newlines=not path.endswith("name"))
    if bad is not None:
        raise _fail(where, path, f"contains the control character {bad}; names and text "
                                 f"fields are written into plans and exported configurations")
    return value


# -- GPU -------------------------------------------------------------------------------------

def gpu_from_mapping(data: Any, where: str, path_of: Callable[[str], str]) -> Gpu:
    """Build a Gpu; ``path_of(key)`` gives the field path to report for ``key``."""
    if not isinstance(data, dict):
        raise _fail(where, path_of("name").rsplit(".", 1)[0],
                    f"expected a mapping of GPU fields, got {_type_name(data)}")
    for key in data:
        if not isinstance(key, str) or key not in GPU_REQUIRED + GPU_OPTIONAL:
            close = difflib.get_close_matches(str(key), GPU_REQUIRED + GPU_OPTIONAL, n=1)
            raise _fail(where, path_of(str(key)),
                        f"unknown GPU key {_show(key)}; valid keys: "
                        f"{', '.join(sorted(GPU_REQUIRED + GPU_OPTIONAL))}",
                        *([f"Did you mean {close[0]!r}?"] if close else []))
    for key in GPU_REQUIRED:
        if key not in data:
            raise _fail(where, path_of(key), f"missing required GPU key {key!r} "
                                             f"(required: {', '.join(GPU_REQUIRED)})")
    peak = data["peak_tflops"]
    peak_path = path_of("peak_tflops")
    check_keys(peak, where, peak_path, (), PEAK_TFLOPS_KEYS)
    if not any(k in peak for k in ("bf16", "fp16")):
        raise _fail(where, peak_path, "needs at least one of 'bf16', 'fp16' (dense TFLOP/s)")
    tflops = {k: number(v, where, f"{peak_path}.{k}", minimum=MIN_RATE, maximum=MAX_TFLOPS,
                        allow_min=True)
              for k, v in peak.items()}
    kwargs: dict[str, Any] = dict(
        name=text(data["name"], where, path_of("name")),
        memory_gib=number(data["memory_gib"], where, path_of("memory_gib"),
                          minimum=MIN_RATE, maximum=MAX_MEMORY_GIB, allow_min=True),
        hbm_bandwidth_gbytes_per_s=number(
            data["hbm_bandwidth_gbytes_per_s"], where, path_of("hbm_bandwidth_gbytes_per_s"),
            minimum=MIN_RATE, maximum=MAX_BANDWIDTH_GBYTES_PER_S, allow_min=True),
        peak_tflops=MappingProxyType(dict(sorted(tflops.items()))),
        num_sms=int(number(data["num_sms"], where, path_of("num_sms"), minimum=0,
                           maximum=MAX_SMS, integer=True)),
    )
    if "vendor" in data:
        kwargs["vendor"] = text(data["vendor"], where, path_of("vendor"))
    if "attention_efficiency" in data:
        kwargs["attention_efficiency"] = number(data["attention_efficiency"], where,
                                                path_of("attention_efficiency"), minimum=MIN_RATE,
                                                maximum=1, allow_min=True)
    if "reserve_gib" in data:
        kwargs["reserve_gib"] = number(data["reserve_gib"], where, path_of("reserve_gib"),
                                       minimum=0, maximum=1e3)
    if "matmul_efficiency" in data:
        kwargs["matmul_efficiency"] = number(data["matmul_efficiency"], where,
                                             path_of("matmul_efficiency"), minimum=MIN_RATE,
                                                maximum=1, allow_min=True)
    for key in ("description", "source"):
        if key in data:
            text(data[key], where, path_of(key), allow_empty=True)
    return Gpu(**kwargs)


def resolve_gpu(data: dict[str, Any], where: str, gpu_presets: Mapping[str, dict[str, Any]],
                prefix: str = "") -> Gpu:
    """The cluster's (or pool's, under ``prefix``) ``gpu`` -- a preset name or a mapping --
    with ``gpu_overrides`` applied."""
    spec = data["gpu"]
    overrides = data.get("gpu_overrides")
    at = lambda key: _join(prefix, key)  # noqa: E731
    if isinstance(spec, dict):
        if overrides is not None:
            raise _fail(where, at("gpu_overrides"), "only applies when 'gpu' names a preset; "
                                                    "put the values in the 'gpu' mapping instead")
        return gpu_from_mapping(spec, where, lambda key: at(f"gpu.{key}"))
    if not isinstance(spec, str):
        raise _fail(where, at("gpu"), f"expected a GPU preset name or a mapping of GPU fields, "
                                      f"got {_type_name(spec)} {_show(spec)}")
    preset_name = spec.strip().lower()
    if preset_name not in gpu_presets:
        raise unknown_preset("GPU", spec, sorted(gpu_presets), where=where, field=at("gpu"))
    merged = dict(gpu_presets[preset_name])
    if overrides is None:
        return gpu_from_mapping(merged, where, lambda key: at(f"gpu({preset_name}).{key}"))
    check_keys(overrides, where, at("gpu_overrides"), (), GPU_REQUIRED + GPU_OPTIONAL)
    for key, value in overrides.items():
        if key == "peak_tflops" and isinstance(value, dict):
            merged[key] = {**merged[key], **value}  # override single dtypes
        else:
            merged[key] = value
    return gpu_from_mapping(
        merged, where,
        lambda key: at(f"gpu_overrides.{key}" if key in overrides else f"gpu({preset_name}).{key}"))


def unknown_preset(what: str, name: Any, valid: list[str], **details: Any) -> PlannerError:
    close = difflib.get_close_matches(str(name).lower(), valid, n=1)
    hints = [f"Did you mean {close[0]!r}?"] if close else []
    where = details.get("where")
    prefix = f"{where}: " if where else ""
    return PlannerError(ErrorKind.UNKNOWN_PRESET,
                        f"{prefix}unknown {what} preset {_show(name)}; valid: {', '.join(valid)}",
                        tuple(hints + ["A path to a YAML file is accepted too (see "
                                       "docs/clusters.md)." if what == "cluster" else
                                       "Or give the GPU as a mapping of fields."]),
                        {"preset": str(name), "valid": valid, **details})


# -- Cluster ---------------------------------------------------------------------------------

def cluster_from_mapping(data: Any, where: str, gpu_presets: Mapping[str, dict[str, Any]],
                         nodes: int | None = None) -> Cluster:
    """Build a Cluster from a parsed one-pool cluster document; ``nodes`` overrides
    ``num_nodes``. (Documents with ``pools:`` are read by :mod:`clusters.pools`.)"""
    check_keys(data, where, "", CLUSTER_REQUIRED, CLUSTER_OPTIONAL)
    check_version(data, where)
    name = text(data["name"], where, "name")
    cluster = fabric_from_mapping(data, where, gpu_presets, name)
    cluster = replace(cluster, gpus_per_host=_gpus_per_host(data, where, cluster.gpus_per_node))
    num_nodes = cluster.num_nodes
    return with_nodes(cluster, num_nodes if nodes is None else nodes, where,
                      "nodes" if nodes is not None else "num_nodes")


def _gpus_per_host(data: dict[str, Any], where: str, gpus_per_node: int) -> int:
    """``gpus_per_host``: the GPUs one host (one OS, one launcher) holds, a divisor of the
    node's; stored as 0 when it is the whole node (the default: the content hash leaves it out)."""
    if "gpus_per_host" not in data:
        return 0
    per_host = int(number(data["gpus_per_host"], where, "gpus_per_host", minimum=0,
                          maximum=MAX_GPUS_PER_NODE, integer=True))
    if gpus_per_node % per_host:
        divisors = [d for d in range(1, gpus_per_node + 1) if gpus_per_node % d == 0]
        raise _fail(where, "gpus_per_host",
                    f"{per_host} GPUs per host do not divide the {gpus_per_node} GPUs of a node: "
                    f"a node (NVLink domain) must be a whole number of hosts",
                    f"Use one of {', '.join(map(str, divisors))} (e.g. 4 for a GB200 NVL72 "
                    f"compute tray), or leave it out when a node is one host.")
    return 0 if per_host == gpus_per_node else per_host


def check_version(data: dict[str, Any], where: str) -> None:
    version = data["shardplan_cluster"]
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise _fail(where, "shardplan_cluster", f"unsupported schema version {_show(version)}; "
                                                f"this shardplan reads version {SCHEMA_VERSION}")


def fabric_from_mapping(data: dict[str, Any], where: str, gpu_presets: Mapping[str, dict[str, Any]],
                        name: str, prefix: str = "") -> Cluster:
    """The GPU, node shape, tiers and fabric fields of a cluster document, or of one pool
    (field paths under ``prefix``, e.g. ``pools[1]``); keys already checked by the caller.
    ``domain_gpus`` of the tiers is filled in by :func:`with_nodes`."""
    at = lambda key: _join(prefix, key)  # noqa: E731
    gpu = resolve_gpu(data, where, gpu_presets, prefix)
    gpus_per_node = int(number(data["gpus_per_node"], where, at("gpus_per_node"), minimum=0,
                               maximum=MAX_GPUS_PER_NODE, integer=True))
    num_nodes = int(number(data["num_nodes"], where, at("num_nodes"), minimum=0,
                           maximum=MAX_NODES, integer=True))
    nics = int(number(data.get("nics_per_node", 0), where, at("nics_per_node"), minimum=0,
                      maximum=MAX_GPUS_PER_NODE, allow_min=True, integer=True))
    if nics > gpus_per_node:
        raise _fail(where, at("nics_per_node"),
                    f"{nics} NICs for {gpus_per_node} GPUs per node: at most one NIC per GPU is "
                    f"modelled", "Give one NIC with the combined bandwidth per GPU instead.")
    su_nodes = int(number(data.get("scalable_unit_nodes", 32), where, at("scalable_unit_nodes"),
                          minimum=0, maximum=MAX_NODES, integer=True))
    oversub = number(data.get("spine_oversubscription", 1.0), where,
                     at("spine_oversubscription"), minimum=1, maximum=MAX_OVERSUBSCRIPTION,
                     allow_min=True)
    spine_latency = number(data.get("spine_latency_us", 0.5), where, at("spine_latency_us"),
                           minimum=0, maximum=MAX_LATENCY_US, allow_min=True)
    topology = data.get("intra_node_topology", "switch")
    if topology not in INTRA_NODE_TOPOLOGIES:
        raise _fail(where, at("intra_node_topology"),
                    f"must be one of {', '.join(INTRA_NODE_TOPOLOGIES)}, got {_show(topology)}")
    if topology == "full_mesh" and gpus_per_node < 2:
        raise _fail(where, at("intra_node_topology"), "full_mesh needs at least 2 GPUs per node")
    tiers = _tiers(data["tiers"], where, prefix)
    host = _host(data["host"], where, at("host")) if "host" in data else None
    description = text(data.get("description", ""), where, at("description"), allow_empty=True)
    source = text(data.get("source", ""), where, at("source"), allow_empty=True)
    return Cluster(name=name, gpu=gpu, gpus_per_node=gpus_per_node, num_nodes=num_nodes,
                   tiers=tiers, nics_per_node=nics, source=source, description=description,
                   scalable_unit_nodes=su_nodes, spine_oversubscription=oversub,
                   spine_latency_us=spine_latency, intra_node_topology=topology, cpu_memory=host)


def _host(value: Any, where: str, path: str) -> HostMemory:
    """The ``host:`` section: per-GPU host memory, link and cores (ZeRO-Offload options)."""
    check_keys(value, where, path, HOST_REQUIRED, HOST_OPTIONAL)
    at = lambda key: _join(path, key)  # noqa: E731

    def rate(key: str, maximum: float = MAX_BANDWIDTH_GBYTES_PER_S) -> float:
        return number(value[key], where, at(key), minimum=MIN_RATE, maximum=maximum,
                      allow_min=True)

    def share(key: str) -> float:
        return number(value.get(key, 0.8), where, at(key), minimum=0.0, maximum=1.0)

    text(value.get("source", ""), where, at("source"), allow_empty=True)
    return HostMemory(memory_gib=rate("memory_gib_per_gpu", MAX_MEMORY_GIB),
                      link_gbytes_per_s=rate("link_gbytes_per_s"),
                      memory_bandwidth_gbytes_per_s=rate("memory_bandwidth_gbytes_per_s_per_gpu"),
                      cpu_cores=rate("cpu_cores_per_gpu", MAX_GPUS_PER_NODE * 1024),
                      core_gflops=rate("core_gflops", MAX_TFLOPS),
                      link_efficiency=share("link_efficiency"),
                      memory_efficiency=share("memory_efficiency"),
                      link=text(value.get("link", ""), where, at("link"), allow_empty=True))


def _tiers(value: Any, where: str, prefix: str = "") -> tuple[NetworkTier, ...]:
    at = lambda key: _join(prefix, key)  # noqa: E731
    if not isinstance(value, list):
        raise _fail(where, at("tiers"), f"expected a list of 1 or 2 tiers (intra-node, then "
                                        f"inter-node), got {_type_name(value)} {_show(value)}")
    if not 1 <= len(value) <= 2:
        raise _fail(where, at("tiers"), f"expected 1 or 2 tiers (intra-node, then inter-node), "
                                        f"got {len(value)}",
                    "Describe the spine with scalable_unit_nodes / spine_oversubscription.")
    tiers = []
    for index, item in enumerate(value):
        path = at(f"tiers[{index}]")
        check_keys(item, where, path, TIER_REQUIRED, TIER_OPTIONAL)
        tiers.append(NetworkTier(
            name=text(item["name"], where, f"{path}.name"),
            domain_gpus=1,  # set by with_nodes
            bandwidth_gbytes_per_s=number(item["bandwidth_gbytes_per_s"], where,
                                          f"{path}.bandwidth_gbytes_per_s", minimum=MIN_RATE,
                                          maximum=MAX_BANDWIDTH_GBYTES_PER_S, allow_min=True),
            latency_us=number(item["latency_us"], where, f"{path}.latency_us", minimum=0,
                              maximum=MAX_LATENCY_US, allow_min=True),
            efficiency=number(item.get("efficiency", 1.0), where, f"{path}.efficiency",
                              minimum=MIN_RATE, maximum=1, allow_min=True)))
    if len(tiers) == 2 and tiers[0].name == tiers[1].name:
        raise _fail(where, at("tiers[1].name"), f"duplicates tiers[0].name {tiers[0].name!r}")
    return tuple(tiers)


def with_nodes(cluster: Cluster, nodes: Any, where: str, path: str = "nodes") -> Cluster:
    """``cluster`` scaled to ``nodes`` nodes, with the tiers' ``domain_gpus`` filled in."""
    nodes = int(number(nodes, where, path, minimum=0, maximum=MAX_NODES, integer=True))
    if nodes * cluster.gpus_per_node > MAX_GPUS:
        raise _fail(where, path, f"{nodes:,} nodes x {cluster.gpus_per_node} GPUs = "
                                 f"{nodes * cluster.gpus_per_node:,} GPUs is more than the "
                                 f"{MAX_GPUS:,} this planner accepts (the largest clusters "
                                 f"built hold about 200,000)")
    if nodes > 1 and len(cluster.tiers) < 2:
        raise _fail(where, path, f"{nodes} nodes, but cluster {cluster.name!r} describes no "
                                 f"inter-node tier", "Add a second entry to 'tiers'.")
    domains = [cluster.gpus_per_node, cluster.gpus_per_node * nodes]
    tiers = tuple(replace(t, domain_gpus=domains[i]) for i, t in enumerate(cluster.tiers))
    return replace(cluster, num_nodes=nodes, tiers=tiers)
