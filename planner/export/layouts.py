"""Per-layer layouts (:class:`planner.strategy.Layout`) in exports: each layer's tensor degree
as the cost model reads it, and the exact statement of what a runtime file cannot express.

Megatron-LM (``--tensor-model-parallel-size``), DeepSpeed (its ``mpu``'s one model-parallel
group) and torchtitan (``--parallelism.tensor_parallel_degree``, applied by its model's
``parallelize_fn`` to every block over the one ``tp`` dim of its world mesh) each take one
tensor-parallel degree for the whole model. A layer the plan runs on another degree is
therefore run on the mesh's by the exported file; the warning names every such layer, its
layout and its degree, and for torchtitan the per-module parallelize plan (module FQN ->
ParallelStyle over how many ranks) a custom ``parallelize_fn`` would have to apply.
"""
from __future__ import annotations

from planner.plan_types import Plan


def _spans(items: list[tuple[object, int | None]]) -> list[tuple[object, int | None, int | None]]:
    """Run-length grouping: consecutive numbers under one key become one (key, first, last)
    span; an item without a number is a span of its own."""
    out: list[tuple[object, int | None, int | None]] = []
    for key, number in items:
        last = out[-1] if out else None
        if (number is not None and last is not None and last[0] == key
                and last[2] is not None and last[2] == number - 1):
            out[-1] = (key, last[1], number)
        else:
            out.append((key, number, number))
    return out


def number_ranges(numbers: list[int]) -> str:
    """'0-2, 5, 7-9' for [0, 1, 2, 5, 7, 8, 9]."""
    return ", ".join(f"{first}" if first == last else f"{first}-{last}"
                     for _, first, last in _spans([(None, n) for n in numbers]))


def block_runs(names: list[str]) -> str:
    """``block.0``, ``block.1``, ``block.2``, ``block.5`` -> 'block.0-2, block.5'."""
    items = [("block.", int(name[6:])) if name.startswith("block.") and name[6:].isdigit()
             else (name, None) for name in names]
    return ", ".join(str(key) if first is None else
                     f"{key}{first}" if first == last else f"{key}{first}-{last}"
                     for key, first, last in _spans(items))


# torchtitan's llama3 module names (torchtitan/models/llama3/model/model.py) and the styles its
# apply_tp gives them, per IR layer kind
_TITAN_MODULES = {
    "embedding": ("tok_embeddings: RowwiseParallel",),
    "block": ("attention.wq/wk/wv: ColwiseParallel", "attention.wo: RowwiseParallel",
              "feed_forward.w1/w3: ColwiseParallel", "feed_forward.w2: RowwiseParallel"),
    "head": ("output: ColwiseParallel",),
}


def layouts_warning(plan: Plan, fmt: str) -> str | None:
    """The warning for a plan with per-layer layouts exported to ``fmt`` (None: every layer
    on the mesh layout)."""
    layers = plan.layers
    if all(layer.get("layout", "mesh") == "mesh" for layer in layers):
        return None
    degrees = plan.layer_tensor_degrees()
    tp = plan.config.tp
    off: dict[tuple[str, int | None], list[str]] = {}
    for layer, degree in zip(layers, degrees):
        layout = layer.get("layout", "mesh")
        if layout != "mesh" and degree != tp:
            off.setdefault((layout, degree), []).append(layer["name"])
    if not off:
        return None
    what = "; ".join(f"{layout} (tensor degree {degree}): {block_runs(names)}"
                     for (layout, degree), names in sorted(off.items(), key=str))
    text = (f"layouts: the plan runs layers on their own tensor x data factoring of the "
            f"stage's {tp} x {plan.config.dp} ranks ({what}); {fmt} takes one "
            f"tensor-parallel degree for the whole model, so this file runs these layers on "
            f"the mesh's tp {tp} (the per-layer plan's step time and memory do not apply)")
    if fmt == "torchtitan":
        blocks = [i for i, layer in enumerate(layers) if layer["kind"] == "block"]
        number = {i: n for n, i in enumerate(blocks)}
        groups = _spans([((layer["kind"], degree), number.get(i))
                         for i, (layer, degree) in enumerate(zip(layers, degrees))
                         if layer.get("layout", "mesh") != "mesh" and degree != tp])
        rows = []
        for (kind, degree), first, last in groups:
            scope = ""
            if kind == "block":
                scope = f"layers.{first}." if first == last else f"layers.[{first}-{last}]."
            styles = _TITAN_MODULES.get(kind, (kind,))
            if degree and degree > 1:
                rows.append(", ".join(scope + s for s in styles) + f" over {degree} ranks")
            else:
                rows.append(", ".join(scope + s.split(":")[0] for s in styles)
                            + ": no tensor parallelism (data-parallel over the stage)")
        text += ("; torchtitan's parallelize_fn applies its plan over the world mesh's one "
                 "tp dim, so running them needs a custom TrainSpec parallelize_fn with a "
                 "mesh per degree and this per-module plan: " + "; ".join(rows))
    return text


__all__ = ["block_runs", "layouts_warning", "number_ranges"]
