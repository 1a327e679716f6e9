"""Lower bounds of one outer configuration, from its cost terms: what lets the search skip a
configuration before building a CP-SAT model.

Consumes a :class:`~planner.solve.costs.StageProblem`; produces seconds and bytes no placement
of that configuration can beat. Both read the :mod:`planner.cost.terms` records only.
"""
from __future__ import annotations

from planner.solve.costs import StageProblem


def time_lower_bound(p: StageProblem) -> float:
    """Step time no placement can beat: every block at its fastest option, the work spread
    perfectly over the stages (1F1B: ``(m - 1/v) work / pp + work / v``), the optimizer step of
    the average stage, the fixed embedding sync, and the ZeRO-2/3 per-micro-batch traffic no
    stage can hide. The other exposures are >= 0 and left out."""
    t = p.terms
    fixed = p.pre_costs + p.post_costs
    work = sum(min(x.time_s for x in cls.costs) * cls.count for cls in p.classes)
    work += sum(x.time_s for x in fixed) + t.pp * t.boundary_s
    if t.per_micro_batch_sync:
        # ZeRO-2/3 traffic each stage exposes beyond its compute: summed over the stages it is
        # at least (all traffic - all compute)^+ (a sum of positive parts >= the positive part
        # of the sum); slopes only, the intercepts are >= 0.
        traffic = sum(min(x.zero_traffic_s for x in cls.costs) * cls.count for cls in p.classes)
        traffic += sum(x.zero_traffic_s for x in fixed)
        busy = sum(max(x.fwd_s + x.bwd_s for x in cls.costs) * cls.count for cls in p.classes)
        busy += sum(x.fwd_s + x.bwd_s for x in fixed)
        work += max(0.0, traffic - busy)
    m, v = t.num_micro_batches, t.virtual_stages
    pipeline = (m - 1.0 / v) * work / t.pp + work / v
    optimizer = (sum(min(x.optimizer_s for x in cls.costs) * cls.count for cls in p.classes)
                 + sum(x.optimizer_s for x in fixed)) / t.pp
    return pipeline + optimizer + t.embedding_sync_s


def memory_lower_bound(p: StageProblem) -> float:
    """Bytes the fullest stage needs at least: the stage average with every block at its
    least-memory option, each stage holding >= 1 micro-batch, plus the fixed reserve."""
    t = p.terms
    fixed = p.pre_costs + p.post_costs
    states = sum(min(x.state_bytes for x in cls.costs) * cls.count for cls in p.classes)
    states += sum(x.state_bytes for x in fixed)
    stored = sum(min(x.act_stored_bytes for x in cls.costs) * cls.count for cls in p.classes)
    stored += sum(x.act_stored_bytes for x in fixed)
    return (states + (1 + t.allocator_overhead) * stored) / t.pp + t.reserve_bytes
