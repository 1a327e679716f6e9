"""shardplan's Python entry points (the CLI is ``shardplan``; the library lives in ``planner``,
``models`` and ``clusters``).

``import_module(model, example_inputs)`` traces a user's ``torch.nn.Module`` with
``torch.export`` (use the meta device for large models: only shapes are read) and returns the
planner's :class:`planner.ir.ModelGraph`, ready for ``planner.solve.search.search``. Needs the
``graph`` extra (``pip install "shardplan[graph]"``). See docs/graph.md.
"""
from __future__ import annotations

from typing import Any

from planner.ir import ModelGraph


def import_module(model: Any, example_inputs: Any, *, name: str | None = None,
                  seq_len: int | None = None, tokens: int | None = None) -> ModelGraph:
    """The ModelGraph of ``model`` traced on ``example_inputs`` (a tensor, a tuple of positional
    inputs, or a dict of keyword inputs). ``seq_len``: the default training sequence length
    (default: the second dim of the first integer input); ``tokens``: tokens of the example
    (default: the first integer input's size, else the batch size)."""
    from models.graph.torch_import import import_module as _import

    return _import(model, example_inputs, name=name, seq_len=seq_len, tokens=tokens)


__all__ = ["import_module"]
