"""Balanced uneven splits: start plans for the inner solver where the even split is poor.

Consumes a :class:`~planner.solve.costs.StageProblem` and the memory limit of a stage; produces
:class:`~planner.strategy.LayerPlacement` candidates, one per combination of one option per
block class (mesh layout, any recomputation): the contiguous split of the blocks over the
``pp`` stages whose slowest stage is fastest among those a greedy fill finds, every stage
within the memory limit. The search (:mod:`planner.solve.search`) evaluates them with
``evaluate`` and hints CP-SAT with the best that fits (and keeps it when the solver's limits
stop it earlier): on models whose blocks differ (a vision encoder's 40 narrow blocks in front
of 80 wide decoder blocks) Megatron's even split puts the same number of blocks on every stage,
so its first stages run out of memory or idle, and CP-SAT without a feasible start can spend
its whole budget finding one.

The fill: for a target stage time ``T``, stage ``i`` (first to last) takes blocks while its
time (``sum time_s`` + the stage's constant terms) stays within ``T``, its memory
(:func:`planner.cost.terms.stage_memory` with its in-flight micro-batches) within the limit,
and enough blocks are left for the later stages; the last stage takes the rest. ``T`` is
bisected between the largest block and the whole model. This is a heuristic (the plan it gives
is evaluated, never trusted): optimality comes from CP-SAT and the bounds.
"""
from __future__ import annotations

from dataclasses import replace
import math
from typing import Iterable, Iterator

from planner.cost.terms import LayerTerms, stage_memory
from planner.solve.costs import StageProblem
from planner.strategy import LayerPlacement, Layout

BISECTIONS = 30


def split_hints(problem: StageProblem, limit_bytes: float) -> Iterator[LayerPlacement]:
    """A balanced contiguous placement over the mesh layout (interleaved or one-stage
    configurations have a fixed assignment: nothing to balance, none is given)."""
    t = problem.terms
    if problem.block_ranks is not None or t.pp == 1:
        return
    placement = _balanced(problem, limit_bytes)
    if placement is not None:
        yield placement


def _merged(records: Iterable[tuple[LayerTerms, int]]) -> LayerTerms | None:
    """One record standing for ``n`` times each record in ``stage_memory``: the additive terms
    summed in order, the two maxima (working set, gather buffer) maximised; the other fields
    are the first record's (None: no record). One ``replace`` for the whole stage."""
    first, merged = None, False
    for b, n in records:
        if n == 0:
            continue
        if first is None:
            first, n = b, n - 1
            params, grads, optimizer = b.params_bytes, b.grads_bytes, b.optimizer_bytes
            stored, working, gather = (b.act_stored_bytes, b.act_working_bytes,
                                       b.gather_buffer_bytes)
            if n == 0:
                continue
        merged = True
        params = params + n * b.params_bytes
        grads = grads + n * b.grads_bytes
        optimizer = optimizer + n * b.optimizer_bytes
        stored = stored + n * b.act_stored_bytes
        working = max(working, b.act_working_bytes)
        gather = max(gather, b.gather_buffer_bytes)
    if not merged:
        return first
    return replace(first, params_bytes=params, grads_bytes=grads, optimizer_bytes=optimizer,
                   act_stored_bytes=stored, act_working_bytes=working,
                   gather_buffer_bytes=gather)


class _Stage:
    """The fastest mix of (mesh-layout) options for given block counts of one stage that fits
    the memory limit, by a greedy over each class's options ordered by time (a block moves to
    a slower, leaner option where that saves the most bytes per second lost)."""

    def __init__(self, problem: StageProblem, limit: float):
        self.p, self.t, self.limit = problem, problem.terms, limit
        self.ladders = []
        for cls in problem.classes:
            mesh = [ri for ri, o in enumerate(cls.options) if o.layout is Layout.MESH] \
                or list(range(len(cls.options)))
            self.ladders.append(sorted(mesh, key=lambda ri: (cls.costs[ri].time_s,
                                                             cls.costs[ri].state_bytes)))

    def best(self, i: int, counts: dict[int, int], fixed: list[LayerTerms]
             ) -> tuple[float, dict] | None:
        """(stage seconds per micro-batch, {(class, option): blocks}) or None (no mix fits)."""
        t, p = self.t, self.p
        alpha = 1.0 + t.allocator_overhead
        rung = {c: [n] + [0] * (len(self.ladders[c]) - 1) for c, n in counts.items()}

        def held() -> LayerTerms | None:
            return _merged([(x, 1) for x in fixed] +
                           [(p.classes[c].costs[self.ladders[c][k]], n)
                            for c, ns in rung.items() for k, n in enumerate(ns)])

        def contrib(c: int, k: int) -> tuple[float, float]:
            x = p.classes[c].costs[self.ladders[c][k]]
            return x.time_s, x.state_bytes + alpha * t.in_flight[i] * x.act_stored_bytes

        while True:
            record = held()
            over = stage_memory(t, i, [record]).total - self.limit if record else 0.0
            if over <= 0:
                break
            move = None  # (seconds per byte saved, class, rung, bytes saved per block)
            for c, ns in rung.items():
                for k in range(len(ns) - 1):
                    if not ns[k]:
                        continue
                    t0, m0 = contrib(c, k)
                    for k2 in range(k + 1, len(ns)):
                        t1, m1 = contrib(c, k2)
                        if m1 < m0:
                            ratio = (t1 - t0) / (m0 - m1)
                            if move is None or ratio < move[0]:
                                move = (ratio, c, k, k2, m0 - m1)
            if move is None:
                return None
            _, c, k, k2, saved = move
            n = min(rung[c][k], max(1, math.ceil(over / saved)))
            rung[c][k] -= n
            rung[c][k2] += n
        time_s = t.boundary_s + t.micro_batch_overhead_s + sum(x.time_s for x in fixed)
        mix = {}
        for c, ns in rung.items():
            for k, n in enumerate(ns):
                if n:
                    ri = self.ladders[c][k]
                    time_s += n * p.classes[c].costs[ri].time_s
                    mix[c, ri] = n
        return time_s, mix


def _balanced(problem: StageProblem, limit: float) -> LayerPlacement | None:
    t, pp = problem.terms, problem.terms.pp
    stage = _Stage(problem, limit)
    cls_of = [c for c, cls in enumerate(problem.classes) for _ in range(cls.count)]
    L = len(cls_of)
    pre = [problem.edge_choices(j)[0][1] for j in problem.pre]
    post = [problem.edge_choices(j)[0][1] for j in problem.post]
    seen: dict[tuple, tuple[float, dict] | None] = {}  # a stage's best mix is the target's

    def best_at(i: int, counts: dict[int, int], fixed: list) -> tuple[float, dict] | None:
        key = (i, tuple(sorted(counts.items())))
        if key not in seen:
            seen[key] = stage.best(i, counts, fixed)
        return seen[key]

    def fill(target: float) -> list[dict] | None:
        """Per stage the option mix of its blocks, or None when the target or the memory limit
        cannot be met."""
        mixes, start = [], 0
        for i in range(pp):
            fixed = (pre if i == 0 else []) + (post if i == pp - 1 else [])
            counts: dict[int, int] = {}
            got = None
            end = start
            last = L if i == pp - 1 else L - (pp - 1 - i)
            while end < last:
                counts[cls_of[end]] = counts.get(cls_of[end], 0) + 1
                trial = best_at(i, counts, fixed)
                if i < pp - 1 and got is not None and (trial is None or trial[0] > target):
                    counts[cls_of[end]] -= 1
                    break
                got, end = trial, end + 1
            if got is None or got[0] > target:
                return None
            mixes.append(got[1])
            start = end
        return mixes

    whole = stage.best(0, {c: cls.count for c, cls in enumerate(problem.classes)}, [])
    lo = max(cls.costs[0].time_s for cls in problem.classes)
    hi = (whole[0] if whole else sum(max(x.time_s for x in cls.costs) * cls.count
                                     for cls in problem.classes)) + \
        sum(x.time_s for x in pre + post) + t.boundary_s + t.micro_batch_overhead_s
    hi = max(hi, sum(max(x.time_s for x in cls.costs) * cls.count for cls in problem.classes)
             + sum(x.time_s for x in pre + post) + t.boundary_s + t.micro_batch_overhead_s)
    best = fill(hi)
    if best is None:
        return None
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        mixes = fill(mid)
        if mixes is None:
            lo = mid
        else:
            best, hi = mixes, mid
    layers = problem.ctx.model.layers
    stages, opts = [0] * len(layers), [None] * len(layers)
    cursor = {c: cls.start for c, cls in enumerate(problem.classes)}
    for i, mix in enumerate(best):
        for (c, ri), n in sorted(mix.items()):
            for _ in range(n):
                stages[cursor[c]], opts[cursor[c]] = i, problem.classes[c].options[ri]
                cursor[c] += 1
    for j in problem.pre + problem.post:
        stages[j] = 0 if j in problem.pre else pp - 1
        opts[j] = problem.edge_choices(j)[0][0]
    return LayerPlacement(tuple(stages), tuple(opts))


def best_split(problem: StageProblem, limit_bytes: float, runtime):
    """The fastest (then leanest) :func:`split_hints` placement that fits, evaluated
    (:class:`~planner.cost.model.Evaluation`), or None."""
    from planner.cost.model import evaluate

    from planner.recompute_rules import placement_expressible
    from planner.solve.recompute_model import rule_of

    ctx = problem.ctx
    best = None
    rule = rule_of(problem)
    for placement in split_hints(problem, limit_bytes):
        if not placement_expressible(rule, ctx.model, placement):
            continue  # a mix of recomputation the runtime's rule cannot run
        ev = evaluate(ctx.model, ctx.cluster, ctx.config, placement, runtime)
        if ev.fits and ev.peak_memory_bytes <= limit_bytes and (
                best is None or (ev.step_time_s, ev.peak_memory_bytes)
                < (best.step_time_s, best.peak_memory_bytes)):
            best = ev
    return best
