"""Graph importers: a model's operator graph in, the planner's layers out (docs/graph.md).

Public API (torch / transformers / onnx are imported only when an importer runs; install them
with ``pip install "shardplan[graph]"``)::

    import_hf_config_graph(config, name=...) -> ModelGraph   # HF config via torch.export (meta)
    import_module(model, example_inputs) -> ModelGraph       # a user's nn.Module
    load_pt2(path) -> ModelGraph                             # a saved ExportedProgram
    load_onnx(path) -> ModelGraph                            # an ONNX file (shape inference)
    *_graph(...) -> OpGraph                                  # the operator graph itself
    group_layers(op_graph) -> ModelGraph                     # the grouping pass

Modules: ``ir`` (the operator graph), ``fx`` (ExportedProgram lowering), ``torch_import``
(HF configs, modules, .pt2), ``onnx_import`` (ONNX), ``group`` (operators -> layers).
"""
from __future__ import annotations

from typing import Any

from .group import group_layers
from .ir import OpGraph, OpKind, Param, TensorMeta

_LAZY = {
    "hf_config_graph": "torch_import", "import_hf_config_graph": "torch_import",
    "module_graph": "torch_import", "import_module": "torch_import",
    "pt2_graph": "torch_import", "load_pt2": "torch_import",
    "onnx_graph": "onnx_import", "load_onnx": "onnx_import",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    from importlib import import_module as _import

    return getattr(_import(f"{__name__}.{module}"), name)


__all__ = ["OpGraph", "OpKind", "Param", "TensorMeta", "group_layers", *_LAZY]
