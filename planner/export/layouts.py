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


def layer_tensor_degrees(plan: Plan) -> list[int | None]:
    """Each layer's tensor degree under its layout (:func:`planner.cost.terms.layout_view`);
    None where the layout does not divide the plan's mesh."""
    from planner.cost.context import make_context
    from planner.cost.terms import layout_view
    from planner.strategy import Layout

    if all(option.layout is Layout.MESH for option in plan.placement.options):
        return [plan.config.tp] * len(plan.placement.options)
    if plan.across_pools:  # stages on pools of other GPUs: the layout's own arithmetic
        return [option.layout.tensor_degree(plan.config.tp, plan.config.dp)
                for option in plan.placement.options]
    ctx = make_context(plan.model, plan.cluster, plan.config, plan.runtime)
    out: list[int | None] = []
    for option in plan.placement.options:
        view = layout_view(ctx, option.layout)
        out.append(None if view is None else view.tp)
    return out


def _runs(names: list[str]) -> str:
    """``block.0``, ``block.1``, ``block.2``, ``block.5`` -> 'block.0-2, block.5'."""
    out: list[str] = []
    start = prev = None
    prefix = ""
    for name in names + [None]:  # type: ignore[list-item]
        number = None
        if name is not None and name.startswith("block.") and name[6:].isdigit():
            number = int(name[6:])
        if number is not None and prev is not None and number == prev + 1:
            prev = number
            continue
        if start is not None:
            out.append(f"{prefix}{start}" if start == prev else f"{prefix}{start}-{prev}")
            start = prev = None
        if name is None:
            break
        if number is None:
            out.append(name)
        else:
            prefix, start, prev = "block.", number, number
    return ", ".join(out)


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
    degrees = layer_tensor_degrees(plan)
    tp = plan.config.tp
    off: dict[tuple[str, int | None], list[str]] = {}
    for layer, degree in zip(layers, degrees):
        layout = layer.get("layout", "mesh")
        if layout != "mesh" and degree != tp:
            off.setdefault((layout, degree), []).append(layer["name"])
    if not off:
        return None
    what = "; ".join(f"{layout} (tensor degree {degree}): {_runs(names)}"
                     for (layout, degree), names in sorted(off.items(), key=str))
    text = (f"layouts: the plan runs layers on their own tensor x data factoring of the "
            f"stage's {tp} x {plan.config.dp} ranks ({what}); {fmt} takes one "
            f"tensor-parallel degree for the whole model, so this file runs these layers on "
            f"the mesh's tp {tp} (the per-layer plan's step time and memory do not apply)")
    if fmt == "torchtitan":
        blocks = [i for i, layer in enumerate(layers) if layer["kind"] == "block"]
        number = {i: n for n, i in enumerate(blocks)}
        groups: list[list] = []  # [kind, degree, first block, last block]
        for i, (layer, degree) in enumerate(zip(layers, degrees)):
            if layer.get("layout", "mesh") == "mesh" or degree == tp:
                continue
            n = number.get(i, -1)
            last = groups[-1] if groups else None
            if last and last[0] == layer["kind"] == "block" and last[1] == degree \
                    and last[3] == n - 1:
                last[3] = n
            else:
                groups.append([layer["kind"], degree, n, n])
        rows = []
        for kind, degree, first, last in groups:
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


__all__ = ["layer_tensor_degrees", "layouts_warning"]
