"""Which per-block activation offload (LayerOption.act_offload) a runtime can run: written once
here and used by ``check --runtime``, the exporters and the search.

Megatron-Core is the one runtime profile with activation offload
(``RuntimeProfile.activation_offload``). Its layer-level CPU offload (``--cpu-offloading
--cpu-offloading-num-layers N``: Transformer Engine's offload context over the first N decoder
layers, ``TransformerBlock``) is refused by ``TransformerConfig.__post_init__``
(megatron/core/transformer/transformer_config.py) with pipeline parallelism ("Currently there is
no support for Pipeline parallelism with CPU offloading"), with any activation recomputation
(its ``recompute_granularity`` is global: "CPU offloading does not work when activation
recomputation is enabled") and unless ``0 <= N < num_layers``. Its fine-grained activation
offloading offloads the inputs of named modules in every layer (``--offload-modules``), not the
whole block's saved tensors the cost model moves (planner/cost/offload.py), so it is not this.

Same cost (as in :mod:`planner.recompute_rules`): the cost model sees a stage's blocks by class
and option only, so offloading any N blocks whose classes are those of the first N is the same
plan as Megatron's first N.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Sequence

from planner.ir import LayerKind

if TYPE_CHECKING:
    from planner.plan_types import Plan


def megatron_refusals(pp: int, recompute: Sequence[str], offloaded: Sequence[bool],
                      classes: Sequence[int]) -> list[str]:
    """Why Megatron-Core cannot run this activation offload (empty: it can, as
    ``--cpu-offloading-num-layers sum(offloaded)``). One entry per block, in block order:
    ``recompute`` its setting (planner.strategy.Recompute value), ``offloaded`` its act_offload,
    ``classes`` its layer class (the cost model's unit)."""
    n = sum(offloaded)
    if not n:
        return []
    out = []
    if pp > 1:
        out.append(f"pp {pp}: no CPU offloading with pipeline parallelism")
    if any(setting != "none" for setting in recompute):
        out.append("recomputation in the plan: CPU offloading refuses any recompute "
                   "granularity")
    if n >= len(offloaded):
        out.append("every decoder layer offloaded: --cpu-offloading-num-layers must be less "
                   "than --num-layers")
    elif Counter(c for c, o in zip(classes, offloaded) if o) != Counter(classes[:n]):
        out.append(f"the offloaded blocks are not (blocks of the same kinds as) the first {n} "
                   f"decoder layers, which --cpu-offloading-num-layers {n} offloads")
    return out


def offloaded_blocks(plan: Plan) -> int:
    """How many blocks of ``plan`` keep their saved activations in host memory."""
    return sum(option.act_offload for layer, option in zip(plan.model.layers,
                                                           plan.placement.options)
               if layer.kind is LayerKind.BLOCK)


def plan_refusals(plan: Plan) -> list[str]:
    """:func:`megatron_refusals` of a plan's placement (empty: no activation offload, or one
    Megatron-Core runs as ``--cpu-offloading-num-layers offloaded_blocks(plan)``)."""
    blocks = [(layer, option) for layer, option in zip(plan.model.layers, plan.placement.options)
              if layer.kind is LayerKind.BLOCK]
    return megatron_refusals(plan.config.pp,
                             [option.recompute.value for option in plan.placement.options],
                             [option.act_offload for _, option in blocks],
                             [layer.signature for layer, _ in blocks])


__all__ = ["megatron_refusals", "offloaded_blocks", "plan_refusals"]
