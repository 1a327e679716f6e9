"""Lower bounds of one outer configuration, from its cost terms: what lets the search skip a
configuration before building a CP-SAT model.

Consumes a :class:`~planner.solve.costs.StageProblem`; produces seconds and bytes no placement
of that configuration can beat. Both read the :mod:`planner.cost.terms` records only.

The runtime's recompute rule (:mod:`planner.recompute_rules`) narrows both: every setting it
expresses uses one of its :func:`~planner.recompute_rules.groups` of settings (torchtitan: one
setting for all blocks), so a bound is the least over the groups of the bound with each block's
options cut to the group; the time bound skips a group whose memory bound is over capacity.
"""
from __future__ import annotations

from dataclasses import replace

from planner.recompute_rules import groups
from planner.solve.costs import StageProblem
from planner.solve.recompute_model import rule_of


def rule_problems(p: StageProblem) -> list[StageProblem]:
    """``p`` with the block options cut to each group of the rule (``[p]``: one group)."""
    values = {o.recompute.value for cls in p.classes for o in cls.options}
    parts = groups(rule_of(p), values)
    if len(parts) <= 1:
        return [p]
    out = []
    for keep in parts:
        classes = []
        for cls in p.classes:
            mine = [k for k, o in enumerate(cls.options) if o.recompute.value in keep]
            if not mine:
                break
            classes.append(replace(cls, options=tuple(cls.options[k] for k in mine),
                                   costs=tuple(cls.costs[k] for k in mine)))
        else:
            out.append(replace(p, classes=tuple(classes)))
    return out or [p]


def time_lower_bound(p: StageProblem, capacity_bytes: float | None = None) -> float:
    """:func:`free_time_lower_bound` under the runtime's recompute rule: the least over its
    groups whose memory bound fits ``capacity_bytes`` (all groups when none does or None)."""
    parts = rule_problems(p)
    fitting = [q for q in parts if capacity_bytes is None
               or free_memory_lower_bound(q) <= capacity_bytes] or parts
    return min(free_time_lower_bound(q) for q in fitting)


def memory_lower_bound(p: StageProblem) -> float:
    """:func:`free_memory_lower_bound` under the runtime's recompute rule."""
    return min(free_memory_lower_bound(q) for q in rule_problems(p))


def free_time_lower_bound(p: StageProblem) -> float:
    """Step time no placement can beat: every block at its fastest option, the work spread
    perfectly over the stages (1F1B: ``(m - 1/v) work / pp + work / v``), the optimizer step of
    the average stage, the fixed embedding sync, and the ZeRO-2/3 per-micro-batch traffic no
    stage can hide. The other exposures are >= 0 and left out."""
    t = p.terms
    work = sum(min(x.time_s for x in cls.costs) * cls.count for cls in p.classes)
    work += p.fixed_extreme("time_s") + t.pp * t.boundary_s
    if t.per_micro_batch_sync:
        # ZeRO-2/3 traffic each stage exposes beyond its compute: summed over the stages it is
        # at least (all traffic - all compute)^+ (a sum of positive parts >= the positive part
        # of the sum); slopes only, the intercepts are >= 0.
        traffic = sum(min(x.zero_traffic_s for x in cls.costs) * cls.count for cls in p.classes)
        traffic += p.fixed_extreme("zero_traffic_s")
        busy = sum(max(x.fwd_s + x.bwd_s for x in cls.costs) * cls.count for cls in p.classes)
        busy += p.fixed_extreme("fwd_s", max) + p.fixed_extreme("bwd_s", max)
        work += max(0.0, traffic - busy)
    m, v = t.num_micro_batches, t.virtual_stages
    pipeline = (m - 1.0 / v) * work / t.pp + work / v
    optimizer = (sum(min(x.optimizer_s for x in cls.costs) * cls.count for cls in p.classes)
                 + p.fixed_extreme("optimizer_s")) / t.pp
    return pipeline + optimizer + t.embedding_sync_s


def free_memory_lower_bound(p: StageProblem) -> float:
    """Bytes the fullest stage needs at least: the stage average with every block at its
    least-memory option, each stage holding >= 1 micro-batch, plus the fixed reserve."""
    t = p.terms
    states = sum(min(x.state_bytes for x in cls.costs) * cls.count for cls in p.classes)
    states += p.fixed_extreme("state_bytes")
    stored = sum(min(x.act_stored_bytes for x in cls.costs) * cls.count for cls in p.classes)
    stored += p.fixed_extreme("act_stored_bytes")
    return (states + (1 + t.allocator_overhead) * stored) / t.pp + t.reserve_bytes
