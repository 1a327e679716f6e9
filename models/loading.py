"""``load_model``: turn a user's model spec into a ModelGraph.

Consumes: a spec string (a preset name, case-insensitive; or a path to an HF ``config.json`` or
a native model file) and an optional training sequence length.
Produces: a :class:`planner.ir.ModelGraph`, or a :class:`PlannerError`: UNKNOWN_PRESET for a name
that is neither a preset nor a file (with a close match), INVALID_INPUT for unreadable or
invalid files, UNSUPPORTED for model families this tool does not know.

Resolution: a spec that looks like a path (has a path separator or a .json/.yaml/.yml suffix)
is always a file; otherwise a preset name wins over a same-named file in the working directory
(write ``./name`` for the file).
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from planner.errors import invalid
from planner.ir import ModelGraph

from . import catalog
from .fields import Fields
from .hf_config import import_hf_config
from .native import build_native, looks_native
from .reading import JSON_SUFFIXES, YAML_SUFFIXES, read_mapping

_FILE_SUFFIXES = JSON_SUFFIXES + YAML_SUFFIXES


def load_model(spec: str | os.PathLike, *, seq_len: int | None = None) -> ModelGraph:
    """Load a preset or a model file; ``seq_len`` overrides the default training length."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise invalid(f"model spec must be a preset name or a file path, got {type(spec).__name__}")
    if not spec.strip():
        raise invalid("model spec is empty; pass a preset name or a file path")
    graph = _resolve(spec)
    return graph if seq_len is None else with_seq_len(graph, seq_len)


def _resolve(spec: str) -> ModelGraph:
    looks_like_path = ("/" in spec or "\\" in spec or os.sep in spec
                       or spec.lower().endswith(_FILE_SUFFIXES))
    if not looks_like_path and catalog.is_preset(spec):
        return catalog.load_preset(spec)
    try:
        path = Path(spec).expanduser()
    except RuntimeError:  # "~user" for a user that does not exist: take the name literally
        path = Path(spec)
    if looks_like_path or _exists(path):
        return load_file(path)
    raise catalog.unknown_preset(spec)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # name too long, NUL byte, ...
        return False


def load_file(path: Path) -> ModelGraph:
    """An HF config.json or a native model file, told apart by content."""
    data = read_mapping(path)
    if looks_native(data):
        return build_native(data, where=str(path), default_name=path.stem, source=str(path))
    if any(key in data for key in ("model_type", "text_config", "architectures")):
        return import_hf_config(data, name=path.stem, source=str(path), where=str(path))
    raise invalid(f"{path}: cannot tell what kind of model file this is: it has neither "
                  f"'shardplan_model' (native format) nor 'model_type' (Hugging Face config.json)",
                  "See docs/models.md for the native format.")


def with_seq_len(graph: ModelGraph, seq_len: int) -> ModelGraph:
    """``graph`` with another default training sequence length (validated)."""
    Fields({}, "model options").check_int("seq_len", seq_len, limit="positions")
    positions = dict(graph.metadata).get("positions")
    if positions == "learned" and graph.max_seq_len is not None and seq_len > graph.max_seq_len:
        raise invalid(f"seq_len {seq_len} exceeds {graph.name}'s {graph.max_seq_len} learned "
                      f"position embeddings", f"Use seq_len <= {graph.max_seq_len}.",
                      seq_len=seq_len, max_seq_len=graph.max_seq_len)
    return replace(graph, default_seq_len=seq_len)


__all__ = ["load_model", "load_file", "with_seq_len"]
