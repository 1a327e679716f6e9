"""Built-in model presets.

Consumes: ``models/presets/index.yaml`` (name, file, seq_len, description, source per preset)
and the files it points to (native model files under ``models/presets/``, HF configs under
``models/hf_configs/``), all shipped as package data and found relative to this module.
Produces: :class:`PresetInfo` rows (:func:`list_presets`) and preset ModelGraphs
(:func:`load_preset`), named after the preset, with ``source = "preset:NAME"`` and the index's
``seq_len`` as ``default_seq_len``.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from planner.errors import ErrorKind, PlannerError, invalid
from planner.ir import ModelGraph

from .fields import Fields
from .hf_config import import_hf_config
from .native import build_native, looks_native
from .reading import read_mapping

PACKAGE_DIR = Path(__file__).resolve().parent
INDEX = PACKAGE_DIR / "presets" / "index.yaml"
_ENTRY_KEYS = ("name", "file", "seq_len", "description", "source")


@dataclass(frozen=True)
class PresetInfo:
    name: str
    description: str
    params: int
    active_params: int
    num_layers: int  # transformer blocks
    source: str


@dataclass(frozen=True)
class _Entry:
    name: str
    file: Path
    seq_len: int
    description: str
    source: str


@lru_cache(maxsize=1)
def _index() -> dict[str, _Entry]:
    data = read_mapping(INDEX)
    rows = data.get("presets")
    if not isinstance(rows, list):
        raise invalid(f"{INDEX}: 'presets' must be a list")
    entries: dict[str, _Entry] = {}
    for row in rows:
        if not isinstance(row, dict) or set(row) != set(_ENTRY_KEYS):
            raise invalid(f"{INDEX}: each preset needs exactly the keys {', '.join(_ENTRY_KEYS)}")
        f = Fields(row, f"{INDEX} ({row.get('name')})")
        name = f.text("name").lower()
        entries[name] = _Entry(name, PACKAGE_DIR / f.text("file"),
                               f.integer("seq_len", limit="positions"), f.text("description"),
                               f.text("source"))
    return entries


def preset_names() -> list[str]:
    return sorted(_index())


def is_preset(name: str) -> bool:
    return name.strip().lower() in _index()


def unknown_preset(spec: str) -> PlannerError:
    names = preset_names()
    close = difflib.get_close_matches(spec.strip().lower(), names, n=1, cutoff=0.5)
    guess = f" Did you mean {close[0]!r}?" if close else ""
    return PlannerError(ErrorKind.UNKNOWN_PRESET,
                        f"unknown model {spec[:80]!r}: not a preset name and not an existing "
                        f"file.{guess} Presets: {', '.join(names)}",
                        ("Pass a preset name, or a path to a config.json or native model file.",),
                        {"presets": names, **({"did_you_mean": close[0]} if close else {})})


def load_preset(name: str) -> ModelGraph:
    key = name.strip().lower()
    if key not in _index():
        raise unknown_preset(name)
    return _load(key)


@lru_cache(maxsize=None)
def _load(key: str) -> ModelGraph:
    entry = _index()[key]
    data = read_mapping(entry.file)
    where = str(entry.file)
    if looks_native(data):
        graph = build_native(data, where=where, default_name=key)
    else:
        graph = import_hf_config(data, name=key, where=where)
    return replace(graph, name=key, default_seq_len=entry.seq_len, source=f"preset:{key}")


def load_preset_graph(name: str) -> ModelGraph:
    """A preset through the graph importer: HF-config presets are built and traced on the meta
    device; native presets have no operator graph (error)."""
    key = name.strip().lower()
    if key not in _index():
        raise unknown_preset(name)
    entry = _index()[key]
    data = read_mapping(entry.file)
    if looks_native(data):
        raise invalid(f"preset {key!r} is a native model file, which has no operator graph; "
                      f"plan it without --importer graph")
    from .graph.torch_import import import_hf_config_graph

    graph = import_hf_config_graph(data, name=key, where=str(entry.file))
    return replace(graph, name=key, default_seq_len=entry.seq_len, source=f"preset:{key}")


def list_presets() -> list[PresetInfo]:
    """Every preset, sorted by name, with its counts (each preset is loaded once and cached)."""
    rows = []
    for name in preset_names():
        entry, graph = _index()[name], load_preset(name)
        rows.append(PresetInfo(name=name, description=entry.description, params=graph.params,
                               active_params=graph.active_params, num_layers=graph.num_blocks,
                               source=entry.source))
    return rows
