"""Per-layer-class cost tables for one outer configuration: what the inner solver optimises over.

Consumes a :class:`~planner.cost.model.CostContext`; produces a :class:`StageProblem` holding,
for every run of identical blocks and every recomputation option, the numbers the cost model
(``planner/cost/model.py``) would add up for a stage. Everything here is read from the cost
model's own functions (``layer_cost``, ``comm``), never re-derived, so that the solver and
``evaluate`` agree by construction.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.config import Recompute
from planner.cost.model import CostContext, LayerCost, layer_cost
from planner.ir import LayerKind

RECOMPUTE_OPTIONS = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


@dataclass(frozen=True)
class BlockClass:
    """``count`` identical blocks at layer indices ``start .. start+count-1``."""

    start: int  # index in model.layers
    first_block: int  # index among blocks
    count: int
    options: tuple[Recompute, ...]
    costs: tuple[LayerCost, ...]  # one per option


@dataclass(frozen=True)
class StageProblem:
    ctx: CostContext
    classes: tuple[BlockClass, ...]
    num_blocks: int
    pre: tuple[int, ...]  # non-block layer indices before the first block (stage 0)
    post: tuple[int, ...]  # non-block layer indices after the last block (last stage)
    pre_costs: tuple[LayerCost, ...]
    post_costs: tuple[LayerCost, ...]


def stage_problem(ctx: CostContext, allowed: tuple[Recompute, ...] = RECOMPUTE_OPTIONS) -> StageProblem:
    model = ctx.model
    layers = model.layers
    block_idx = [i for i, layer in enumerate(layers) if layer.kind is LayerKind.BLOCK]
    first, last = block_idx[0], block_idx[-1]
    if block_idx != list(range(first, last + 1)):
        raise ValueError("non-block layers between blocks are not supported by the solver")
    classes: list[BlockClass] = []
    for cls in model.layer_classes():
        if cls.layer.kind is not LayerKind.BLOCK:
            continue
        costs = tuple(layer_cost(ctx, cls.layer, r) for r in allowed)
        classes.append(BlockClass(cls.start, cls.start - first, cls.count, allowed, costs))
    pre = tuple(range(0, first))
    post = tuple(range(last + 1, len(layers)))
    return StageProblem(
        ctx, tuple(classes), len(block_idx), pre, post,
        tuple(layer_cost(ctx, layers[i], Recompute.NONE) for i in pre),
        tuple(layer_cost(ctx, layers[i], Recompute.NONE) for i in post))
