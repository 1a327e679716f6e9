"""Summary of a model for ``shardplan inspect``: parameter counts, layer classes and shapes.

Consumes a ModelGraph; produces a plain dict (sorted, stable).
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from planner.ir import ModelGraph


def model_summary(model: ModelGraph) -> dict[str, Any]:
    classes = []
    for cls in model.layer_classes():
        layer = cls.layer
        entry: dict[str, Any] = {
            "first": model.layers[cls.start].name,
            "last": model.layers[cls.start + cls.count - 1].name,
            "count": cls.count,
            "kind": layer.kind.value,
            "params_each": layer.params,
            "active_params_each": layer.active_params,
        }
        if layer.attention is not None:
            entry["attention"] = asdict(layer.attention)
        if layer.mlp is not None:
            entry["mlp"] = asdict(layer.mlp)
        classes.append(entry)
    return {
        "name": model.name,
        "family": model.family,
        "source": model.source,
        "params": model.params,
        "active_params": model.active_params,
        "num_layers": model.num_blocks,
        "hidden": model.hidden,
        "vocab": model.vocab,
        "default_seq_len": model.default_seq_len,
        "max_seq_len": model.max_seq_len,
        "tied_embeddings": model.tied_embeddings,
        "moe": model.is_moe,
        "layer_classes": classes,
    }
