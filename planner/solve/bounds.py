"""Lower bounds of one outer configuration, from its cost terms: what lets the search skip a
configuration before building a CP-SAT model.

Consumes a :class:`~planner.solve.costs.StageProblem`; produces seconds and bytes no placement
of that configuration can beat. Both read the :mod:`planner.cost.terms` records only.
"""
from __future__ import annotations

from planner.cost.pipeline import bubble_credit_s
from planner.solve.costs import StageProblem
from planner.strategy import interleaved_rank


def time_lower_bound(p: StageProblem) -> float:
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
    if t.pp > 1 and (t.bubble_wgrad_credit or t.bubble_bwd_extra):
        # zero-bubble schedules: m T + max(0, (sum t - T)/v + credit) grows with T and with
        # sum t, so T = work / pp, the fastest options' backward and the largest W bound it
        bwd = sum(min(x.bwd_s + x.recompute_s for x in cls.costs) * cls.count
                  for cls in p.classes) + p.fixed_extreme("bwd_s")
        wgrad = sum(max(x.wgrad_s for x in cls.costs) * cls.count for cls in p.classes) + \
            p.fixed_extreme("wgrad_s", max)
        credit = bubble_credit_s(t.pp, v, t.bubble_wgrad_credit, t.bubble_bwd_extra, bwd, wgrad)
        slowest = max(work / t.pp, _fixed_rank_time_lb(p)) if v > 1 else work / t.pp
        pipeline = m * slowest + max(0.0, (work - slowest) / v + credit)
    optimizer = (sum(min(x.optimizer_s for x in cls.costs) * cls.count for cls in p.classes)
                 + p.fixed_extreme("optimizer_s")) / t.pp
    return pipeline + optimizer + t.embedding_sync_s


def _fixed_rank_time_lb(p: StageProblem) -> float:
    """The slowest rank's least time per micro-batch when chunks fix which blocks each rank
    holds (``virtual_stages > 1``: :func:`planner.strategy.interleaved_rank`): its blocks at
    their fastest options, its non-block layers (the embedding on rank 0, the head on the head
    stage) at their fastest, and its boundary transfers."""
    t = p.terms
    pp, v, L = t.pp, t.virtual_stages, p.num_blocks
    placement = p.ctx.config.schedule_spec.placement
    ranks = [t.boundary_s] * pp
    for cls in p.classes:
        fastest = min(x.time_s for x in cls.costs)
        for blk in range(cls.first_block, cls.first_block + cls.count):
            ranks[interleaved_rank(blk, L, pp, v, placement)] += fastest
    head = t.head_stage % pp
    for i in p.pre:
        ranks[0] += min(x.time_s for _, x in p.edge_choices(i))
    for i in p.post:
        ranks[head] += min(x.time_s for _, x in p.edge_choices(i))
    return max(ranks)


def memory_lower_bound(p: StageProblem) -> float:
    """Bytes the fullest stage needs at least: the stage average with every block at its
    least-memory option, each stage holding >= 1 micro-batch, plus the fixed reserve."""
    t = p.terms
    states = sum(min(x.state_bytes for x in cls.costs) * cls.count for cls in p.classes)
    states += p.fixed_extreme("state_bytes")
    stored = sum(min(x.act_stored_bytes for x in cls.costs) * cls.count for cls in p.classes)
    stored += p.fixed_extreme("act_stored_bytes")
    return (states + (1 + t.allocator_overhead) * stored) / t.pp + t.reserve_bytes
