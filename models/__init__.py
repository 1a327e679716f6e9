"""Model importers and presets: everything that turns a model description into a ModelGraph.

Public API (what the CLI and the planner use)::

    load_model(spec, *, seq_len=None) -> ModelGraph   # preset name, HF config.json, native file
    list_presets() -> list[PresetInfo]                # sorted by name

Modules: ``reading`` (safe JSON/YAML), ``fields`` (validated values), ``params`` (exact
parameter arithmetic, layer construction), ``hf_config`` (HF importer), ``native`` (native
format), ``catalog`` (presets), ``loading`` (spec resolution). See docs/models.md.
"""
from .catalog import PresetInfo, list_presets
from .loading import load_model

__all__ = ["PresetInfo", "list_presets", "load_model"]
