"""The exporters' view of the runtimes' recompute rules: a :class:`~planner.plan_types.Plan`'s
per-block settings and the smallest flag value that runs them at the plan's cost.

The rules themselves (Megatron's ``--recompute-method block --recompute-num-layers N``: the
first N blocks of every model chunk; torchtitan <= 0.2.2's ``selective_ac_option = "N"``: every
N-th block of a rank) are :mod:`planner.recompute_rules`, the definitions the search, brute
force and ``check --runtime`` use too. Same cost: the cost model sees a rank's blocks by class
and setting only, so settings with the plan's counts on every rank have the plan's memory and
step time (:func:`same_cost`).
"""
from __future__ import annotations

from collections import Counter

from planner import recompute_rules as core
from planner.ir import LayerKind
from planner.plan_types import Plan


def block_settings(plan: Plan) -> list[str]:
    """The plan's recomputation of each block, in block order."""
    return [option.recompute.value
            for layer, option in zip(plan.model.layers, plan.placement.options)
            if layer.kind is LayerKind.BLOCK]


def _runs(plan: Plan) -> list[tuple[int, tuple[int, ...]]]:
    return core.chunk_runs([stage for layer, stage in zip(plan.model.layers, plan.placement.stage)
                            if layer.kind is LayerKind.BLOCK])


def _stage_counts(plan: Plan, settings: list[str]) -> Counter:
    blocks = [(layer, stage) for layer, stage in zip(plan.model.layers, plan.placement.stage)
              if layer.kind is LayerKind.BLOCK]
    return Counter((stage, layer.signature, value)
                   for (layer, stage), value in zip(blocks, settings))


def same_cost(plan: Plan, settings: list[str]) -> bool:
    """``settings`` give every pipeline rank the plan's number of blocks of each class and
    recomputation setting (so the cost model's memory and time are the plan's)."""
    return _stage_counts(plan, list(settings)) == _stage_counts(plan, block_settings(plan))


def megatron_block(plan: Plan, n: int) -> list[str]:
    """Megatron's block method with ``--recompute-num-layers n``."""
    return list(core.first_n(_runs(plan), n))


def every_nth(plan: Plan, n: int) -> list[str]:
    """torchtitan <= 0.2.2's ``selective_ac_option = "n"`` on each pipeline rank."""
    return list(core.every_nth(_runs(plan), n))


def exact_count(plan: Plan, rule, largest: int) -> int | None:
    """The smallest N in 1..largest whose ``rule(plan, N)`` costs what the plan's settings do
    (None if none does). The plan must recompute with ``full`` and ``none`` only."""
    if any(value not in ("none", "full") for value in block_settings(plan)):
        return None
    for n in range(1, largest + 1):
        if same_cost(plan, rule(plan, n)):
            return n
    return None
