"""Exact JSON round-trip of the model IR and the cluster (what a plan file embeds).

Consumes a :class:`~planner.ir.ModelGraph` or a :class:`~planner.hardware.Cluster` and produces
plain JSON values (dicts, lists, str, int, float, bool, None), and back. The plain form is the
one :func:`planner.plan.content_hash` hashes, and the round trip is exact
(``model_from_dict(model_to_dict(m)) == m``), so it never changes a hash: ints stay ints,
floats stay floats, enums become their values, tuples become lists, mappings become objects.

Decoding is strict (the dict usually comes from a file a person may have edited): unknown keys,
wrong types (``true`` is not a number, ``8.0`` is not an integer), missing required fields and
negative or non-finite numbers are refused with a :class:`PlannerError` (INVALID_INPUT) naming
the JSON path. Fields with a default may be absent (a plan written before the field existed).
"""
from __future__ import annotations

import collections.abc
import math
import typing
from dataclasses import MISSING, fields, is_dataclass
from enum import Enum
from types import MappingProxyType, NoneType, UnionType
from typing import Any, Mapping

from planner.errors import invalid
from planner.hardware import Cluster, Gpu, MultiPoolCluster, NetworkTier, Pool
from planner.ir import Attention, Layer, Mlp, ModelGraph

# Fields that must be at least 1 (the cost model divides by them); every other number >= 0.
_POSITIVE = {
    ModelGraph: {"hidden", "default_seq_len", "max_seq_len"},
    Layer: {"hidden"},
    Attention: {"num_heads", "num_kv_heads", "head_dim", "v_head_dim", "sliding_window",
                "q_lora_rank", "kv_lora_rank"},
    Mlp: {"ffn_hidden", "num_experts", "top_k", "expert_groups", "groups_per_token"},
    Cluster: {"gpus_per_node", "num_nodes", "scalable_unit_nodes", "spine_oversubscription"},
    Pool: {"gpus_per_node", "num_nodes", "scalable_unit_nodes", "spine_oversubscription"},
    Gpu: {"memory_gib", "hbm_bandwidth_gbytes_per_s", "num_sms", "matmul_efficiency"},
    NetworkTier: {"domain_gpus", "bandwidth_gbytes_per_s", "efficiency"},
}


# No field of a model or cluster description is anywhere near this (parameter counts are
# ~1e13); the bound keeps products of fields (GiB x 2**30, params x bytes) finite.
MAX_MAGNITUDE = 10**18


def plain_fields(value: Any) -> list:
    """The fields of dataclass ``value`` its plain form holds: all but those the class lists in
    ``PLAIN_OMIT_DEFAULT`` while they hold their default (decoding restores the default)."""
    omit = getattr(value, "PLAIN_OMIT_DEFAULT", ())
    return [f for f in fields(value)
            if not (f.name in omit and getattr(value, f.name) == f.default)]


def to_plain(value: Any) -> Any:
    """Dataclasses, enums, tuples and mappings as plain JSON values (same as the hash input)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in plain_fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, Mapping) or hasattr(value, "items"):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value


def model_to_dict(model: ModelGraph) -> dict[str, Any]:
    return to_plain(model)


def cluster_to_dict(cluster: Cluster) -> dict[str, Any]:
    return to_plain(cluster)


def model_from_dict(data: Any, where: str = "$") -> ModelGraph:
    """The ModelGraph ``data`` describes (the inverse of :func:`model_to_dict`)."""
    return _decode(ModelGraph, data, where)


def cluster_from_dict(data: Any, where: str = "$") -> Cluster:
    """The Cluster ``data`` describes (the inverse of :func:`cluster_to_dict`)."""
    cluster = _decode(Cluster, data, where)
    if cluster.gpus_per_host and (cluster.gpus_per_host == cluster.gpus_per_node
                                  or cluster.gpus_per_node % cluster.gpus_per_host):
        raise invalid(f"{where}.gpus_per_host: {cluster.gpus_per_host} must divide "
                      f"gpus_per_node {cluster.gpus_per_node} and differ from it (0: the node "
                      f"is one host)")
    return cluster


def pool_cluster_from_dict(data: Any, where: str = "$") -> MultiPoolCluster:
    """The MultiPoolCluster ``data`` describes (a plan across pools, planner/hetero/plan_file.py)."""
    return _decode(MultiPoolCluster, data, where)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def _decode(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise invalid(f"{where}: expected an object ({cls.__name__}), got {_type_name(data)}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise invalid(f"{where}: unknown key {unknown[0]!r} in {cls.__name__}; valid keys: "
                      f"{', '.join(sorted(known))}")
    kwargs = {}
    for name, f in known.items():
        if name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise invalid(f"{where}: missing required key {name!r} of {cls.__name__}")
            continue
        value = _value(hints[name], data[name], f"{where}.{name}")
        if name in _POSITIVE.get(cls, ()) and value is not None and not value > 0:
            raise invalid(f"{where}.{name}: must be greater than 0, got {value!r}")
        kwargs[name] = value
    return cls(**kwargs)


def _value(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, UnionType):
        if value is None and NoneType in args:
            return None
        options = [a for a in args if a is not NoneType]
        if len(options) != 1:  # not used by the IR; refuse rather than guess
            raise invalid(f"{where}: cannot decode a value of type {hint}")
        return _value(options[0], value, where)
    if is_dataclass(hint):
        return _decode(hint, value, where)
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError:
            valid = ", ".join(repr(m.value) for m in hint)
            raise invalid(f"{where}: {value!r} is not one of {valid}") from None
    if origin is tuple:
        if not isinstance(value, list):
            raise invalid(f"{where}: expected an array, got {_type_name(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise invalid(f"{where}: expected an array of {len(args)} items, got {len(value)}")
        return tuple(_value(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin in (collections.abc.Mapping, dict) or hint in (Mapping, dict):
        if not isinstance(value, dict):
            raise invalid(f"{where}: expected an object, got {_type_name(value)}")
        item = args[1] if len(args) == 2 else object
        return MappingProxyType({k: _value(item, v, f"{where}.{k}") for k, v in value.items()})
    if hint is bool:
        if not isinstance(value, bool):
            raise invalid(f"{where}: expected true or false, got {_type_name(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(f"{where}: expected an integer, got {_type_name(value)} {value!r}")
        if not 0 <= value <= MAX_MAGNITUDE:
            raise invalid(f"{where}: must be between 0 and {MAX_MAGNITUDE:.0e}, got {value}")
        return value
    if hint is float:  # ints are kept as ints: the hash of 80 and 80.0 differ
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise invalid(f"{where}: expected a number, got {_type_name(value)} {value!r}")
        if not math.isfinite(value) or not 0 <= value <= MAX_MAGNITUDE:
            raise invalid(f"{where}: must be a finite number between 0 and "
                          f"{MAX_MAGNITUDE:.0e}, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise invalid(f"{where}: expected a string, got {_type_name(value)}")
        return value
    if hint is object:  # free-form (Cluster.extra): any JSON value
        return value
    raise invalid(f"{where}: cannot decode a value of type {hint}")
