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

The search keeps to the rule (Megatron-Core is the one profile with activation offload, so its
rule is the search's): :func:`searchable` drops the options no plan of a configuration may use
(every activation offload when pp > 1, and offload together with recomputation on one block),
the CP-SAT model (:mod:`planner.solve.offload_model`) constrains the rest from
:func:`pipeline_allows`, :data:`RECOMPUTE_ALLOWED` and :func:`first_n_counts`, the brute-force
oracle enumerates :func:`allows`, and the search's uniform start plans are kept to
:func:`placement_refusals`.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Sequence

from planner.ir import LayerKind

if TYPE_CHECKING:
    from planner.ir import ModelGraph
    from planner.plan_types import Plan
    from planner.strategy import LayerOption, LayerPlacement

RECOMPUTE_ALLOWED = "none"  # the one recompute setting any block may have while some offloads


def pipeline_allows(pp: int) -> bool:
    """Megatron-Core's CPU offloading runs at this pipeline depth (pp = 1 only)."""
    return pp == 1


def first_n_counts(classes: Sequence, n: int) -> Counter:
    """The blocks of each class among the first n, which ``--cpu-offloading-num-layers n``
    offloads (``classes``: each block's class, in block order)."""
    return Counter(classes[:n])


def allows(pp: int, recompute: Sequence[str], offloaded: Sequence[bool],
           classes: Sequence) -> bool:
    """Megatron-Core runs this activation offload (or there is none):
    :func:`megatron_refusals` is empty."""
    return not megatron_refusals(pp, recompute, offloaded, classes)


def pinned_refusals(pp: int | None, recompute: str | None) -> list[str]:
    """Why no plan under these pins (None: searched) may offload activations: a pinned pipeline
    depth :func:`pipeline_allows` refuses, or a pinned recomputation other than
    :data:`RECOMPUTE_ALLOWED` (it applies to every block, and Megatron-Core's CPU offloading
    refuses any recompute granularity)."""
    out = []
    if pp is not None and not pipeline_allows(pp):
        out.append(f"pp={pp} (no CPU offloading with pipeline parallelism)")
    if recompute is not None and recompute != RECOMPUTE_ALLOWED:
        out.append(f"recompute={recompute} (CPU offloading refuses any recompute granularity)")
    return out


def searchable(options: Sequence[LayerOption], pp: int | None) -> tuple[LayerOption, ...]:
    """The per-block options a plan of pipeline depth ``pp`` (None: any) may use under the
    rule: no activation offload unless :func:`pipeline_allows`, and none on a block that is
    itself recomputed. The rest of the rule binds the whole model (the CP-SAT model, brute
    force's :func:`allows`)."""
    return tuple(o for o in options if not o.act_offload or (
        o.recompute.value == RECOMPUTE_ALLOWED and (pp is None or pipeline_allows(pp))))


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
    if not pipeline_allows(pp):
        out.append(f"pp {pp}: no CPU offloading with pipeline parallelism")
    if any(setting != RECOMPUTE_ALLOWED for setting in recompute):
        out.append("recomputation in the plan: CPU offloading refuses any recompute "
                   "granularity")
    if n >= len(offloaded):
        out.append("every decoder layer offloaded: --cpu-offloading-num-layers must be less "
                   "than --num-layers")
    elif Counter(c for c, o in zip(classes, offloaded) if o) != first_n_counts(classes, n):
        out.append(f"the offloaded blocks are not (blocks of the same kinds as) the first {n} "
                   f"decoder layers, which --cpu-offloading-num-layers {n} offloads")
    return out


def offloaded_blocks(plan: Plan) -> int:
    """How many blocks of ``plan`` keep their saved activations in host memory."""
    return sum(option.act_offload for layer, option in zip(plan.model.layers,
                                                           plan.placement.options)
               if layer.kind is LayerKind.BLOCK)


def placement_refusals(model: ModelGraph, pp: int, placement: LayerPlacement) -> list[str]:
    """:func:`megatron_refusals` of a placement of ``model`` over ``pp`` stages (empty: no
    activation offload, or one Megatron-Core runs)."""
    blocks = [(layer, option) for layer, option in zip(model.layers, placement.options)
              if layer.kind is LayerKind.BLOCK]
    return megatron_refusals(pp, [option.recompute.value for option in placement.options],
                             [option.act_offload for _, option in blocks],
                             [layer.signature for layer, _ in blocks])


def plan_refusals(plan: Plan) -> list[str]:
    """:func:`placement_refusals` of a plan (empty: no activation offload, or one
    Megatron-Core runs as ``--cpu-offloading-num-layers offloaded_blocks(plan)``)."""
    return placement_refusals(plan.model, plan.config.pp, plan.placement)


__all__ = ["RECOMPUTE_ALLOWED", "allows", "first_n_counts", "megatron_refusals",
           "offloaded_blocks", "pinned_refusals", "pipeline_allows", "placement_refusals",
           "plan_refusals", "searchable"]
