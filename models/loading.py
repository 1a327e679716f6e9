"""``load_model``: turn a user's model spec into a ModelGraph.

Consumes: a spec string (a preset name, case-insensitive; or a path to an HF ``config.json``, a
native model file, an ``.onnx`` file or a ``.pt2`` ExportedProgram), an optional training
sequence length and the importer for HF configs: ``"config"`` (arithmetic, the default) or
``"graph"`` (build the model on the meta device and trace it, :mod:`models.graph`).
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

GRAPH_SUFFIXES = (".onnx", ".pt2")
_FILE_SUFFIXES = JSON_SUFFIXES + YAML_SUFFIXES + GRAPH_SUFFIXES
IMPORTERS = ("config", "graph")


def load_model(spec: str | os.PathLike, *, seq_len: int | None = None,
               importer: str = "config") -> ModelGraph:
    """Load a preset or a model file; ``seq_len`` overrides the default training length;
    ``importer="graph"`` imports HF configs through the operator graph (needs the ``graph``
    extra). ``.onnx`` and ``.pt2`` files always go through the graph importers."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise invalid(f"model spec must be a preset name or a file path, got {type(spec).__name__}")
    if not spec.strip():
        raise invalid("model spec is empty; pass a preset name or a file path")
    if importer not in IMPORTERS:
        raise invalid(f"importer must be one of {', '.join(IMPORTERS)}, got {importer!r}")
    graph = _resolve(spec, importer)
    return graph if seq_len is None else with_seq_len(graph, seq_len)


def _resolve(spec: str, importer: str = "config") -> ModelGraph:
    looks_like_path = ("/" in spec or "\\" in spec or os.sep in spec
                       or spec.lower().endswith(_FILE_SUFFIXES))
    if not looks_like_path and catalog.is_preset(spec):
        if importer == "graph":
            return catalog.load_preset_graph(spec)
        return catalog.load_preset(spec)
    try:
        path = Path(spec).expanduser()
    except RuntimeError:  # "~user" for a user that does not exist: take the name literally
        path = Path(spec)
    if looks_like_path or _exists(path):
        return load_file(path, importer=importer)
    raise catalog.unknown_preset(spec)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # name too long, NUL byte, ...
        return False


def load_file(path: Path, *, importer: str = "config") -> ModelGraph:
    """An HF config.json or a native model file, told apart by content; ``.onnx`` and ``.pt2``
    files by suffix."""
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        from .graph.onnx_import import load_onnx

        return load_onnx(path)
    if suffix == ".pt2":
        from .graph.torch_import import load_pt2

        return load_pt2(path)
    data = read_mapping(path)
    if looks_native(data):
        if importer == "graph":
            raise invalid(f"{path}: --importer graph needs a Hugging Face config.json or an "
                          f".onnx / .pt2 file; native model files have no operator graph")
        return build_native(data, where=str(path), default_name=path.stem, source=str(path))
    if any(key in data for key in ("model_type", "text_config", "architectures")):
        if importer == "graph":
            from .graph.torch_import import import_hf_config_graph

            return import_hf_config_graph(data, name=path.stem, source=str(path),
                                          where=str(path))
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


__all__ = ["IMPORTERS", "GRAPH_SUFFIXES", "load_model", "load_file", "with_seq_len"]
