"""Lower bounds of one configuration across pools, from its cost terms (what lets the search
skip a configuration before building its CP-SAT model).

Consumes the :class:`~planner.hetero.terms.PoolTerms` of a configuration; produces seconds and
bytes no placement of it can beat. Both read :mod:`planner.cost.terms` records only.

* :func:`quick_bounds` (every candidate, cheap): with ``W_p`` the least work of the whole model
  per micro-batch on pool p, a stage on p covers at most ``T / W_p`` of the model, so the
  slowest stage ``T >= 1 / R``, R the sum of the pp largest ``1 / W_p`` over the stage slots
  (the same with the ZeRO-2/3 traffic a stage cannot hide); the stage times sum to at least
  ``min_p W_p``; plus the least boundary time per stage, the optimizer step of the average stage
  and the least embedding sync. Memory: the stage average of states and one micro-batch of
  activations plus the least reserve.
* :func:`memory_time_bound` (candidates about to be solved): the slowest stage is at least the
  least T at which the stages can hold all L blocks, where stage i on pool p can hold, in time
  T and in its memory, at most the optimum of the linear program max sum_r k_r s.t.
  sum_r time_r k_r <= T - boundary and sum_r (states_r + in-flight_i x stored_r) k_r <= room_p
  (a fractional mix of options, every block at the least time and bytes over the classes; its
  optimum is a vertex: one option, or two), rounded down to whole blocks. With two pools the
  best assignment of stages to pools within the slots is exact (the k stages that gain most
  from pool 0); with more pools each stage takes its best pool (slots relaxed). A split stage
  (replicas on two pools) holds no more than either pool's stage would: with two pools it
  counts as the smaller of the two (exact over assignments: pool 0 takes the stages that gain
  most from it, the split stages the next), at most one per split shape.
"""
from __future__ import annotations

import math
from typing import Sequence

from planner.hetero.terms import PoolTerms


def _work(t: PoolTerms, per_layer) -> float:
    prob = t.problem
    return (sum(min(per_layer(x) for x in cls.costs) * cls.count for cls in prob.classes)
            + sum(per_layer(x) for x in prob.pre_costs + prob.post_costs))


def _fixed_step_terms(terms: Sequence[PoolTerms], pp: int) -> float:
    optimizer = min(_work(t, lambda x: x.optimizer_s) for t in terms)
    embedding = min(min(t.inner.embedding_sync_s, (t.cross or t.inner).embedding_sync_s)
                    for t in terms)
    return optimizer / pp + (embedding if pp > 1 else 0.0)


def _boundary(terms: Sequence[PoolTerms]) -> float:
    return min(min(t.inner.boundary_s, (t.cross or t.inner).boundary_s) for t in terms)


def quick_bounds(terms: Sequence[PoolTerms], pp: int) -> tuple[float, float, float]:
    """(time lower bound, memory lower bound, largest capacity) of one configuration."""
    per_mb = terms[0].inner.per_micro_batch_sync
    works = []
    for t in terms:
        kinds = [_work(t, lambda x: x.time_s)]
        if per_mb:  # a stage is at least its TP/CP/EP communication plus its ZeRO traffic
            kinds.append(_work(t, lambda x: x.comm_s + x.zero_traffic_s))
        works.append(kinds)
    m = terms[0].inner.num_micro_batches
    b = _boundary(terms)
    lb = 0.0
    for k in range(len(works[0])):
        rates = sorted((1.0 / w[k] for t, w in zip(terms, works) for _ in range(t.max_stages)),
                       reverse=True)[:pp]
        if len(rates) < pp:
            return math.inf, math.inf, 0.0
        lb = max(lb, (m - 1) * (1.0 / sum(rates) + b) + min(w[k] for w in works) + pp * b)
    lb += _fixed_step_terms(terms, pp)
    prob, t0 = terms[0].problem, terms[0].inner
    fixed = prob.pre_costs + prob.post_costs
    states = sum(min(x.state_bytes for x in cls.costs) * cls.count for cls in prob.classes)
    states += sum(x.state_bytes for x in fixed)
    stored = sum(min(x.act_stored_bytes for x in cls.costs) * cls.count for cls in prob.classes)
    stored += sum(x.act_stored_bytes for x in fixed)
    mem = (states + (1 + t0.allocator_overhead) * stored) / pp + min(t.inner.reserve_bytes
                                                                     for t in terms)
    return lb, mem, max(t.inner.capacity_bytes for t in terms)


def _capacity(options: list[tuple[float, float]], time_s: float, room: float) -> float:
    """max sum k_r s.t. sum time_r k_r <= time_s, sum mem_r k_r <= room, k >= 0 (a vertex)."""
    if time_s <= 0 or room <= 0:
        return 0.0
    best = 0.0
    for tau, mu in options:
        best = max(best, min(time_s / tau if tau > 0 else math.inf,
                             room / mu if mu > 0 else math.inf))
    for i, (t1, m1) in enumerate(options):
        for t2, m2 in options[i + 1:]:
            det = t1 * m2 - t2 * m1
            if det == 0:
                continue
            k1 = (time_s * m2 - room * t2) / det
            k2 = (room * t1 - time_s * m1) / det
            if k1 >= 0 and k2 >= 0:
                best = max(best, k1 + k2)
    return best


def memory_time_bound(terms: Sequence[PoolTerms], pp: int, slowest: float | None = None
                      ) -> float:
    """Step-time lower bound with each stage's memory (see the module docstring); inf when no
    arrangement can hold the blocks at all. ``slowest``: :func:`slowest_stage_bound`, when the
    caller has it already."""
    if slowest is None:
        slowest = slowest_stage_bound(terms, pp)
    if math.isinf(slowest):
        return math.inf
    m = terms[0].inner.num_micro_batches
    works = min(_work(t, lambda x: x.time_s) for t in terms)
    return (m - 1) * slowest + works + pp * _boundary(terms) + _fixed_step_terms(terms, pp)


def slowest_stage_bound(terms: Sequence[PoolTerms], pp: int) -> float:
    """Seconds per micro-batch the slowest stage takes at least (the T of the module
    docstring); inf when the stages cannot hold the blocks at all, 0 when not computed."""
    prob = terms[0].problem
    L = prob.num_blocks
    b = _boundary(terms)
    if any(len(cls.costs) == 0 for cls in prob.classes):
        return 0.0

    def stage_options(t: PoolTerms, stage: int) -> tuple[list[tuple[float, float]], float]:
        inner = t.inner
        alpha = 1 + inner.allocator_overhead
        # every block costs at least the least over the classes of each option's time and bytes
        opts = []
        for r in range(len(t.problem.classes[0].costs)):
            opts.append((min(cls.costs[r].time_s for cls in t.problem.classes),
                         min(cls.costs[r].state_bytes + inner.in_flight[stage] * alpha
                             * cls.costs[r].act_stored_bytes for cls in t.problem.classes)))
        room = inner.capacity_bytes - inner.reserve_bytes - alpha * inner.buffer_bytes
        return opts, room

    if len(set(len(cls.costs) for cls in prob.classes)) != 1:
        return 0.0
    # A split stage holds at most what either of its shares' pools would (its terms are the
    # largest over the shares, its capacity the smallest): with two pools it counts as the
    # smaller of the two pools' stages, at most ``extra`` of them.
    pure = [t for t in terms if not t.shares]
    names = {t.pool.name for t in pure}
    extra = min(pp, sum(t.max_stages for t in terms if t.shares))
    relaxed = any(p not in names for t in terms if t.shares for p, _ in t.shares)
    if relaxed:  # a share's pool hosts no whole stage: every entry, slots relaxed
        pure, extra = list(terms), 0
    terms = pure
    P = len(terms)
    table = [[stage_options(t, i) for i in range(pp)] for t in terms]
    slots = [pp if relaxed else t.max_stages for t in terms]

    def held(T: float) -> float:
        # a stage holds a whole number of blocks: at most the floor of its LP optimum
        caps = [[math.floor(_capacity(opts, T - b, room) * (1 + 1e-9) + 1e-9)
                 for opts, room in table[p]] for p in range(P)]
        if P == 1:
            return sum(caps[0]) if pp <= slots[0] + extra else -1.0
        if P == 2:
            # exact over assignments: the k0 stages that gain most from pool 0 there, the next
            # km (the split stages, worth the smaller of the two) split, the rest on pool 1
            gains = sorted((caps[0][i] - caps[1][i] for i in range(pp)), reverse=True)
            on0 = [0.0]
            split = [0.0]
            for g in gains:
                on0.append(on0[-1] + g)
                split.append(split[-1] + min(g, 0))
            base = sum(caps[1])
            best = -1.0
            for k0 in range(min(slots[0], pp) + 1):
                for km in range(min(extra, pp - k0) + 1):
                    if pp - k0 - km <= slots[1]:
                        best = max(best, base + on0[k0] + split[k0 + km] - split[k0])
            return best
        return sum(max(caps[p][i] for p in range(P)) for i in range(pp))  # slots relaxed

    hi = 1.0
    while held(hi) < L:
        hi *= 2
        if hi > 1e9:
            return math.inf
    lo = 0.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if held(mid) >= L:
            hi = mid
        else:
            lo = mid
    return lo  # held(lo) < L: no stage time below lo holds the blocks




def cheap_bounds(model, cluster, config, options, splits=()) -> tuple[float, float, float]:
    """(time, memory, largest capacity) bounds from the leaf formulas only, before any cost
    term is built: the compute of every block without recomputation (communication and
    recomputation only add) balanced over the fastest stage slots as in :func:`quick_bounds`
    (``splits``: the split stage shapes offered, each slot at its slowest share's compute),
    and the stage average of the model states plus one micro-batch of fully recomputed
    activations (the least any option stores) plus the least runtime reserve."""
    from planner.cost.compute import Shard, layer_compute
    from planner.cost.memory import (layer_activation_bytes, layer_params_on_gpu,
                                     zero_state_bytes)
    from planner.hardware import GIB
    from planner.strategy import Recompute

    c = config
    size = c.tp * c.cp * c.dp
    shard = Shard(c.micro_batch, c.seq_len, c.tp, c.cp, c.ep, c.sp, c.dtype,
                  etp=c.mesh.expert_tp, expert_load=options.moe.load_factor)
    classes = model.layer_classes()
    rates, works, by_pool = [], [], {}
    for pool in cluster.pools:
        if c.dtype not in pool.gpu.peak_tflops:
            continue
        work = 0.0
        for cls in classes:
            lc = layer_compute(cls.layer, shard, pool.gpu, options)
            work += (lc.fwd_s + lc.bwd_s) * cls.count
        by_pool[pool.name] = work
        slots = pool.num_gpus // size
        if slots:
            works.append(work)
            rates += [1.0 / work] * slots
    pools = {p.name: p for p in cluster.pools}
    for shares in splits:  # a split stage computes at its slowest share's pace, or slower
        if any(p not in by_pool for p, _ in shares):
            continue
        work = max(by_pool[p] for p, _ in shares)
        works.append(work)
        rates += [1.0 / work] * min(pools[p].num_gpus // (d * c.tp * c.cp) for p, d in shares)
    rates = sorted(rates, reverse=True)[:c.pp]
    if len(rates) < c.pp:
        return math.inf, math.inf, 0.0
    m = c.num_micro_batches
    time_lb = (m - 1) / sum(rates) + min(works)
    state = options.state_bytes(c.zero_stage)
    dense = sum(layer_params_on_gpu(cls.layer, c.tp, c.ep)[0] * cls.count for cls in classes)
    expert = sum(layer_params_on_gpu(cls.layer, c.tp, c.ep)[1] * cls.count for cls in classes)
    states = zero_state_bytes(dense, c.dp * c.cp, c.zero_stage, state).total + \
        zero_state_bytes(expert, max(c.dp * c.cp // c.ep, 1), c.zero_stage, state).total
    stored = sum(min(layer_activation_bytes(cls.layer, c.micro_batch, c.seq_len, c.tp, c.cp,
                                            c.sp, r, options.attention_kernel,
                                            options.dropout)[0]
                     for r in Recompute) * cls.count for cls in classes)
    memory_lb = (states + (1 + options.allocator_overhead) * stored) / c.pp + \
        min(p.gpu.reserve_gib for p in cluster.pools) * GIB
    return time_lb, memory_lb, max(p.memory_bytes_per_gpu for p in cluster.pools)
