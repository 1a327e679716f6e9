"""The per-block recomputation a runtime's own rule gives, and whether it is the plan's.

Consumes a :class:`~planner.plan_types.Plan`; produces the per-block settings (in block order)
of two runtime rules, and :func:`same_cost`: whether a rule's settings cost what the plan's do.

* Megatron's ``--recompute-method block --recompute-num-layers N``: the first N blocks of every
  pipeline model chunk are fully recomputed (all chunks, interleaved or not);
* torchtitan <= 0.2.2's layer-selective AC, ``selective_ac_option = "N"``: each process counts
  the blocks it wraps, in order over its model parts, and checkpoints every N-th
  (``_apply_ac_to_transformer_block``: ``_count % ac_freq == 0``).

Same cost: the cost model (planner.cost.terms, the solver's counts n[stage, class, option])
sees a stage's blocks by class and option only, so two settings with the same number of
blocks of each class and option on every pipeline rank have the same memory and step time,
whichever blocks carry them.
"""
from __future__ import annotations

from collections import Counter

from planner.export.base import chunks
from planner.ir import LayerKind
from planner.plan_types import Plan


def block_settings(plan: Plan) -> list[str]:
    """The plan's recomputation of each block, in block order."""
    return [option.recompute.value
            for layer, option in zip(plan.model.layers, plan.placement.options)
            if layer.kind is LayerKind.BLOCK]


def _stage_counts(plan: Plan, settings: list[str]) -> Counter:
    blocks = [(layer, stage) for layer, stage in zip(plan.model.layers, plan.placement.stage)
              if layer.kind is LayerKind.BLOCK]
    return Counter((stage, layer.signature, value)
                   for (layer, stage), value in zip(blocks, settings))


def same_cost(plan: Plan, settings: list[str]) -> bool:
    """``settings`` give every pipeline rank the plan's number of blocks of each class and
    recomputation setting (so the cost model's memory and time are the plan's)."""
    return _stage_counts(plan, settings) == _stage_counts(plan, block_settings(plan))


def megatron_block(plan: Plan, n: int) -> list[str]:
    """Megatron's block method with ``--recompute-num-layers n``."""
    out = ["none"] * plan.model.num_blocks
    for chunk in chunks(plan.to_dict()):
        for block in chunk.block_indices[:n]:
            out[block] = "full"
    return out


def every_nth(plan: Plan, n: int) -> list[str]:
    """torchtitan <= 0.2.2's ``selective_ac_option = "n"`` on each pipeline rank."""
    out = ["none"] * plan.model.num_blocks
    position: Counter = Counter()
    for chunk in chunks(plan.to_dict()):  # in block order: a rank's parts in its order
        for block in chunk.block_indices:
            position[chunk.rank] += 1
            if position[chunk.rank] % n == 0:
                out[block] = "full"
    return out


def exact_count(plan: Plan, rule, largest: int) -> int | None:
    """The smallest N in 1..largest whose ``rule(plan, N)`` costs what the plan's settings do
    (None if none does). The plan must recompute with ``full`` and ``none`` only."""
    if any(value not in ("none", "full") for value in block_settings(plan)):
        return None
    for n in range(1, largest + 1):
        if same_cost(plan, rule(plan, n)):
            return n
    return None
