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


# what a stage's ZeRO-2/3 traffic can hide behind at most (terms.stage_time): its compute and
# the device's waits on the host (the MoE host floor, planner.cost.moe.host_wait_split_s)
HIDING_TERMS = ("fwd_s", "bwd_s", "host_wait_fwd_s", "host_wait_bwd_s")


def free_time_lower_bound(p: StageProblem) -> float:
    """Step time no placement can beat: every block at its fastest option, the work spread
    perfectly over the stages (1F1B: ``(m - 1/v) work / pp + work / v``), the optimizer step of
    the average stage, the fixed embedding sync, and the ZeRO-2/3 per-micro-batch traffic no
    stage can hide. The other exposures are >= 0 and left out."""
    t = p.terms
    work = p.class_sum("time_s")
    work += p.fixed_extreme("time_s") + t.pp * t.boundary_s
    if t.per_micro_batch_sync:
        # ZeRO-2/3 traffic each stage exposes beyond its compute: summed over the stages it is
        # at least (all traffic - all compute)^+ (a sum of positive parts >= the positive part
        # of the sum); slopes only, the intercepts are >= 0.
        traffic = p.class_sum("zero_traffic_s")
        traffic += p.fixed_extreme("zero_traffic_s")
        busy = p.class_sum(HIDING_TERMS, max)
        busy += sum(p.fixed_extreme(name, max) for name in HIDING_TERMS)
        work += max(0.0, traffic - busy)
    m, v = t.num_micro_batches, t.virtual_stages
    pipeline = (m - 1.0 / v) * work / t.pp + work / v
    if t.pp > 1 and t.bubble_pieces:
        # zero-bubble schedules: m T + max(0, largest piece x (sum t - T) + y sum b + z sum w)
        # over v grows with T (m v >= x) and with sum t (x >= 0), so T = work / pp; each
        # piece takes the backward and W sums at whichever end its sign makes least
        def total(names: tuple[str, ...], pick) -> float:
            return p.class_sum(names, pick) + sum(p.fixed_extreme(n, pick) for n in names)

        bwd = {pick: total(("bwd_s", "recompute_s"), pick) for pick in (min, max)}
        wgrad = {pick: total(("wgrad_s",), pick) for pick in (min, max)}
        slowest = max(work / t.pp, _fixed_rank_time_lb(p)) if p.block_ranks is not None \
            else work / t.pp
        fill = max(x * (work - slowest) + y * bwd[min if y >= 0 else max]
                   + z * wgrad[min if z >= 0 else max] for x, y, z in t.bubble_pieces)
        pipeline = m * slowest + max(0.0, fill / v)
    optimizer = (p.class_sum("optimizer_s")
                 + p.fixed_extreme("optimizer_s")) / t.pp
    return pipeline + optimizer + p.least_sync_s()


def _classic(p: StageProblem) -> bool:
    """The configuration runs 1F1B or interleaved 1F1B on the looped placement (head on the
    last stage): the finer bounds below assume that pipeline formula and placement; under a
    zero-bubble or V schedule (planner/cost/pipeline.py) they return no information."""
    t = p.terms
    return not t.bubble_pieces and t.head_stage < 0


def _fixed_rank_time_lb(p: StageProblem) -> float:
    """The slowest rank's least time per micro-batch when chunks fix which blocks each rank
    holds (interleaved chunks, an explicit pipeline layout: StageProblem.block_ranks): its blocks at
    their fastest options, its non-block layers (the embedding on rank 0, the head on the head
    stage) at their fastest, and its boundary transfers."""
    t = p.terms
    pp, fixed = t.pp, p.block_ranks
    ranks = [t.boundary_s] * pp
    for cls in p.classes:
        fastest = min(x.time_s for x in cls.costs)
        for blk in range(cls.first_block, cls.first_block + cls.count):
            ranks[fixed[blk]] += fastest
    head = t.head_stage % pp
    for i in p.pre:
        ranks[0] += min(x.time_s for _, x in p.edge_choices(i))
    for i in p.post:
        ranks[head] += min(x.time_s for _, x in p.edge_choices(i))
    return max(ranks)


def free_memory_lower_bound(p: StageProblem) -> float:
    """Bytes the fullest stage needs at least: the stage average with every block at its
    least-memory option, each stage holding >= 1 micro-batch, plus the fixed reserve."""
    t = p.terms
    states = p.class_sum("state_bytes")
    states += p.fixed_extreme("state_bytes")
    stored = p.class_sum("act_stored_bytes")
    stored += p.fixed_extreme("act_stored_bytes")
    return (states + (1 + t.allocator_overhead) * stored) / t.pp + t.reserve_bytes


def fitting_time_lower_bound(p: StageProblem) -> float:
    """Step time no placement that fits the stage memory limit can beat (``inf``: none fits,
    even fractionally): LP relaxations of the option choice under weighted memory budgets.

    Proof. Stage i's memory is ``states_i + (1+a)(f_i stored_i + working_i + buffers_i)
    + reserve <= limit`` (:func:`planner.cost.terms.stage_memory`, ``a`` the allocator
    overhead, ``f_i`` its in-flight micro-batches; working sets and gather buffers >= 0), so with
    ``room = limit - reserve - (1+a) buffer_bytes`` and any weights ``w_i >= 0``:
    ``sum_i w_i (states_i + (1+a) f_i stored_i) <= room sum_i w_i``. A layer with option r
    adds ``w_i (s_r + (1+a) f_i a_r)`` on whichever stage i it is, so at least
    ``min_i w_i (s_r + (1+a) f_i a_r)`` (a block may be on any stage; the embedding is on the
    first, the head on the last): one knapsack constraint on the layers' options.
    The step time is at least ``A sum_layers time_s + sum_layers optimizer_s / pp + const``
    (as in :func:`time_lower_bound`, ``A = (m - 1/v)/pp + 1/v``; resharding and exposures >= 0),
    linear in each layer's option. Letting each class mix its options in any fractions only
    widens the feasible set, so the minimum of that linear program (a multiple-choice knapsack
    relaxation, solved exactly by :func:`_knapsack_lp`) is a lower bound on every fitting
    placement, for each weight vector; the largest is returned. Weights: all 1 (the stages'
    sum), ``1/f_i``, and ``1/(s + (1+a) f_i a)`` of the heaviest class's fastest and leanest
    option (each stage's capacity counted in blocks of that kind)."""
    if not _classic(p):
        return 0.0
    t = p.terms
    m, v, pp = t.num_micro_batches, t.virtual_stages, t.pp
    a = (m - 1.0 / v) / pp + 1.0 / v
    alpha = 1.0 + t.allocator_overhead
    f = t.in_flight
    room = p.memory_limit_bytes - t.reserve_bytes - alpha * t.buffer_bytes
    groups = [(cls.count, cls.costs, None) for cls in p.classes]
    groups += [(1, tuple(x for _, x in p.edge_choices(j)), 0) for j in p.pre]
    groups += [(1, tuple(x for _, x in p.edge_choices(j)), pp - 1) for j in p.post]
    const = a * pp * (t.boundary_s + t.micro_batch_overhead_s) + p.least_sync_s()
    if t.per_micro_batch_sync:  # as in time_lower_bound: traffic no stage can hide
        traffic = p.class_sum("zero_traffic_s")
        traffic += p.fixed_extreme("zero_traffic_s")
        busy = p.class_sum(HIDING_TERMS, max)
        busy += sum(p.fixed_extreme(name, max) for name in HIDING_TERMS)
        const += a * max(0.0, traffic - busy)
    # weights w_i = 1 / (s* + (1+a) f_i a*) of reference options (s*, a*); all 1 and 1/f_i
    # are the references (1, 0) and (0, 1). A layer's weighted bytes
    # (s + (1+a) f a) / (s* + (1+a) f a*) are a ratio of linear functions of f, monotone, so
    # their minimum over the stages is at the least or the most in-flight stage.
    refs = [(1.0, 0.0), (0.0, 1.0)]
    if p.classes:
        heavy = max(p.classes, key=lambda c: c.count * max(x.state_bytes for x in c.costs))
        for x in (min(heavy.costs, key=lambda x: x.time_s),
                  min(heavy.costs, key=lambda x: x.state_bytes + x.act_stored_bytes)):
            if x.state_bytes > 0:
                refs.append((x.state_bytes, x.act_stored_bytes))
    ends = {min(f), max(f)}
    # per group: its count, the stages' in-flight counts it may see, and per option its
    # linear cost, state bytes and stored activation bytes (read once, for every weight)
    rows = [(n, ends if where is None else (f[where],),
             [(a * x.time_s + x.optimizer_s / pp, x.state_bytes, x.act_stored_bytes)
              for x in costs]) for n, costs, where in groups]
    best = 0.0
    for rs, ra in refs:
        items = []
        for n, at, options in rows:
            scale = [(alpha * fi, rs + alpha * fi * ra) for fi in at]
            items.append((n, [(cost, min((s + af * st) / w for af, w in scale))
                              for cost, s, st in options]))
        best = max(best, _knapsack_lp(items, sum(room / (rs + alpha * fi * ra) for fi in f)))
        if best == float("inf"):
            break
    return best + const


def _knapsack_lp(groups: list[tuple[int, list[tuple[float, float]]]], budget: float) -> float:
    """min sum_g n_g sum_r lam_gr cost_gr  s.t. sum_r lam_gr = 1, lam >= 0,
    sum_g n_g sum_r lam_gr mem_gr <= budget (``inf`` when infeasible).

    The LP of a multiple-choice knapsack: start every group at its cheapest option (least
    memory among ties); while over budget, walk each group's lower convex hull towards less
    memory, taking globally the hull segments of least cost per byte saved first (a group's
    segments come in increasing order of that ratio, by convexity), the last one fractionally.
    This greedy is the LP's optimum (Sinha and Zoltners, Operations Research 1979)."""
    total_cost = total_mem = 0.0
    segments = []  # (cost per byte saved, bytes saved, cost added)
    for n, options in groups:
        if not options:
            continue
        pts = sorted(set(options), key=lambda cm: (cm[1], cm[0]))  # by memory
        hull: list[tuple[float, float]] = []  # lower convex hull, memory increasing
        for cost, mem in pts:
            if hull and cost >= hull[-1][0]:
                continue  # more memory, no cheaper: never on the efficient frontier
            while len(hull) >= 2:
                (c1, m1), (c2, m2) = hull[-2], hull[-1]
                # drop the middle point when it lies on or above the chord (c1,m1)-(cost,mem)
                if (c2 - c1) * (mem - m1) >= (cost - c1) * (m2 - m1):
                    hull.pop()
                else:
                    break
            hull.append((cost, mem))
        cheapest = hull[-1]
        total_cost += n * cheapest[0]
        total_mem += n * cheapest[1]
        for (c_lo, m_lo), (c_hi, m_hi) in zip(hull, hull[1:]):
            saved = (m_hi - m_lo) * n
            added = (c_lo - c_hi) * n
            segments.append((added / saved, saved, added))
    over = total_mem - budget
    if over <= 0:
        return total_cost
    for ratio, saved, added in sorted(segments):
        if saved >= over:
            return total_cost + ratio * over
        total_cost += added
        over -= saved
    return float("inf")


def stage_lp_bound(p: StageProblem) -> float:
    """Step time no fitting placement can beat, from the LP relaxation of the placement with
    the stages kept (``inf``: the LP is infeasible, so no placement fits).

    Variables ``n[i,c,r] >= 0``: blocks of class c with option r on stage i (fractional; the
    contiguity of stages and the maxima of working sets and gather buffers relaxed away, both
    >= 0), ``e[j,k]``: the non-block layer j (on the first or last stage) takes option k.
    Constraints: every class's blocks are placed (interleaved: the counts each rank holds),
    every stage holds >= 1 block, stage i's memory ``states + (1+a) f_i stored <= room``
    (:func:`fitting_time_lower_bound`), ``t_i = sum time_s + boundary + micro-batch overhead``,
    ``T >= t_i``, ``o >= sum_i optimizer_s``. Objective: the pipeline ``((m v - 1) T +
    sum_i t_i) / v`` (:func:`planner.cost.pipeline.pipeline_time_s` with ``T = max t_i``) + o +
    the embedding sync (exposures, resharding >= 0). Every integer placement that fits is a
    point of this LP with an objective at most its step time. Solved with GLOP."""
    from ortools.linear_solver import pywraplp

    if not _classic(p):
        return 0.0

    t = p.terms
    m, v, pp = t.num_micro_batches, t.virtual_stages, t.pp
    alpha = 1.0 + t.allocator_overhead
    room = p.memory_limit_bytes - t.reserve_bytes - alpha * t.buffer_bytes
    lp = pywraplp.Solver.CreateSolver("GLOP")
    inf = lp.infinity()
    big_t = lp.NumVar(0, inf, "T")
    o = lp.NumVar(0, inf, "o")
    stage_time = []
    fixed_at = {0: list(p.pre), pp - 1: list(p.post)} if pp > 1 else {0: list(p.pre + p.post)}
    # Classes with the same option terms are one class here (the LP keeps no contiguity):
    # Gemma-2's 42 alternating sliding-window / global blocks are two.
    merged: dict[tuple, int] = {}
    kinds: list[tuple] = []  # (option terms, blocks, blocks each rank holds when interleaved)
    for cls in p.classes:
        k = merged.setdefault(cls.costs, len(kinds))
        if k == len(kinds):
            kinds.append((cls.costs, 0, [0] * pp))
        costs, count, ranks = kinds[k]
        if p.block_ranks is not None:
            for blk in range(cls.first_block, cls.first_block + cls.count):
                ranks[p.block_ranks[blk]] += 1
        kinds[k] = (costs, count + cls.count, ranks)
    counts = [ranks for _, _, ranks in kinds] if p.block_ranks is not None else None
    per_class = [[] for _ in kinds]

    def row_of(lo: float, hi: float, coefficients) -> None:
        # a linear constraint lo <= sum coef x <= hi, built by coefficient (the natural API's
        # expression trees cost most of this bound's time on DeepSeek-V3's 61 x 12 options)
        row = lp.Constraint(lo, hi)
        for var, coef in coefficients:
            row.SetCoefficient(var, coef)

    objective = lp.Objective()
    for i in range(pp):
        f = t.in_flight[i]
        time_expr, mem_expr, opt_expr, blocks = [], [], [], []
        for ci, (costs, count, _) in enumerate(kinds):
            row = []
            for ri, x in enumerate(costs):
                n = lp.NumVar(0, count, f"n{i}_{ci}_{ri}")
                row.append(n)
                time_expr.append((n, x.time_s))
                mem_expr.append((n, x.state_bytes + alpha * f * x.act_stored_bytes))
                opt_expr.append((n, x.optimizer_s))
            blocks += row
            per_class[ci].append(row)
            if counts is not None:
                row_of(counts[ci][i], counts[ci][i], ((n, 1.0) for n in row))
        row_of(1.0, inf, ((n, 1.0) for n in blocks))
        for j in fixed_at.get(i, ()):
            choices = p.edge_choices(j)
            ks = [lp.NumVar(0, 1, f"e{j}_{k}") for k in range(len(choices))]
            row_of(1.0, 1.0, ((k, 1.0) for k in ks))
            for k, (_, x) in zip(ks, choices):
                time_expr.append((k, x.time_s))
                mem_expr.append((k, x.state_bytes + alpha * f * x.act_stored_bytes))
                opt_expr.append((k, x.optimizer_s))
        ti = lp.NumVar(0, inf, f"t{i}")
        # t_i = sum time_s + boundary + micro-batch overhead
        const = t.boundary_s + t.micro_batch_overhead_s
        row_of(const, const, [(ti, 1.0)] + [(var, -c) for var, c in time_expr])
        row_of(0.0, inf, ((big_t, 1.0), (ti, -1.0)))  # T >= t_i
        row_of(0.0, inf, [(o, 1.0)] + [(var, -c) for var, c in opt_expr])  # o >= optimizer
        row_of(-inf, room, mem_expr)
        stage_time.append(ti)
    if counts is None:
        for ci, (_, count, _) in enumerate(kinds):
            row_of(count, count, ((n, 1.0) for row in per_class[ci] for n in row))
    # ((m v - 1) T + sum_i t_i) / v + o
    objective.SetCoefficient(big_t, (m * v - 1) * (1.0 / v))
    for ti in stage_time:
        objective.SetCoefficient(ti, 1.0 / v)
    objective.SetCoefficient(o, 1.0)
    objective.SetMinimization()
    status = lp.Solve()
    if status == pywraplp.Solver.INFEASIBLE:
        return float("inf")
    if status != pywraplp.Solver.OPTIMAL:
        return 0.0
    # GLOP's optimum is a primal value: a dual bound would be exact, the primal is within its
    # tolerances; shave a relative 1e-6 so floating-point noise never prunes a winner
    return lp.Objective().Value() * (1 - 1e-6) + p.least_sync_s()


def contiguous_split_exceeds(p: StageProblem, cutoff_s: float) -> bool:
    """True when no fitting placement of this (non-interleaved) configuration can have a step
    time <= ``cutoff_s``: the slowest stage it needs is slower than the cutoff allows.

    The step is at least ``(m - 1) max_i t_i + W + O + sync`` (1F1B; ``W`` the whole model's
    least time + the stages' constants, ``O`` the least optimizer time / pp), so it exceeds the
    cutoff when no split has ``max_i t_i <= T* = (cutoff - W - O - sync) / (m - 1)``, which
    :func:`_split_reaches` decides."""
    t = p.terms
    m, pp = t.num_micro_batches, t.pp
    if p.block_ranks is not None or m <= 1 or not p.classes or not _classic(p):
        return False
    const = t.boundary_s + t.micro_batch_overhead_s
    work = p.class_sum("time_s")
    work += p.fixed_extreme("time_s") + pp * const
    opt = (p.class_sum("optimizer_s")
           + p.fixed_extreme("optimizer_s")) / pp
    target = (cutoff_s - work - opt - p.least_sync_s()) / (m - 1)
    return target < 0 or not _split_reaches(p, target)


def slowest_stage_lb_s(p: StageProblem) -> float:
    """Seconds per micro-batch the slowest stage of any fitting placement takes at least
    (``inf``: none fits): interleaved or one stage, the largest ``g_i`` of the stages' fixed
    blocks; contiguous stages, the smallest target :func:`_split_reaches` meets, bisected
    (the infeasible end is returned: a lower bound)."""
    t = p.terms
    if not p.classes or not _classic(p):
        return 0.0
    if p.block_ranks is not None or t.pp == 1:
        per_stage = _stage_groups(p)
        return max(_stage_time_lb(p, i, groups) for i, groups in enumerate(per_stage))
    lo = 0.0
    hi = (p.class_sum("time_s", max)
          + p.fixed_extreme("time_s", max) + t.boundary_s + t.micro_batch_overhead_s)
    seen: dict = {}  # g_i of a stage's blocks does not depend on the target: shared
    if not _split_reaches(p, hi, seen):
        return float("inf")
    for _ in range(40):
        mid = (lo + hi) / 2
        if _split_reaches(p, mid, seen):
            hi = mid
        else:
            lo = mid
    return lo


def _stage_groups(p: StageProblem) -> list[list[tuple[int, tuple]]]:
    """(count, option terms) of the blocks each stage holds when the assignment is fixed
    (interleaved chunks, or one stage), with the embedding on the first and the head on the
    last stage."""
    t = p.terms
    pp, fixed = t.pp, p.block_ranks
    per_stage: list[list] = [[] for _ in range(pp)]
    for cls in p.classes:
        counts = [0] * pp
        for blk in range(cls.first_block, cls.first_block + cls.count):
            counts[fixed[blk] if fixed is not None else 0] += 1
        for i, n in enumerate(counts):
            if n:
                per_stage[i].append((n, cls.costs))
    for i, indices in ((0, p.pre), (pp - 1, p.post)):
        per_stage[i] += [(1, tuple(x for _, x in p.edge_choices(j))) for j in indices]
    return per_stage


def _stage_time_lb(p: StageProblem, i: int, groups) -> float:
    """g_i: stage i's least seconds per micro-batch holding ``groups`` ((count, option terms)):
    the fractional knapsack minimum of their time under the stage's memory
    (``states + (1+a) f_i stored <= room``, as in :func:`fitting_time_lower_bound`), + the
    stage's constant terms. It grows with the blocks held."""
    t = p.terms
    alpha = 1.0 + t.allocator_overhead
    room = p.memory_limit_bytes - t.reserve_bytes - alpha * t.buffer_bytes
    f = t.in_flight[i]
    return t.boundary_s + t.micro_batch_overhead_s + _knapsack_lp(
        [(n, [(x.time_s, x.state_bytes + alpha * f * x.act_stored_bytes) for x in costs])
         for n, costs in groups], room)


def _split_reaches(p: StageProblem, target_s: float, seen: dict | None = None) -> bool:
    """Some contiguous split (>= 1 block per stage) has every stage's g_i <= ``target_s``.

    Greedy fill: each stage takes the longest run of the remaining blocks with
    ``g_i <= target`` (leaving one block for each later stage; found by bisection, g_i being
    monotone). It succeeds whenever some split does: by induction each of its stage ends is at
    or after that split's, since a subset of a feasible stage's blocks is feasible."""
    t = p.terms
    pp, L = t.pp, p.num_blocks
    fixed = {0: list(p.pre), pp - 1: list(p.post)} if pp > 1 else {0: list(p.pre + p.post)}

    seen = {} if seen is None else seen  # (stage, first block, end) -> g_i

    def g(i: int, edge: list, start: int, end: int) -> float:
        if (i, start, end) in seen:
            return seen[i, start, end]
        groups = list(edge)
        for cls in p.classes:
            n = min(end, cls.first_block + cls.count) - max(start, cls.first_block)
            if n > 0:
                groups.append((n, cls.costs))
        seen[i, start, end] = value = _stage_time_lb(p, i, groups)
        return value

    start = 0
    for i in range(pp):
        edge = [(1, tuple(x for _, x in p.edge_choices(j))) for j in fixed.get(i, ())]
        if i == pp - 1:
            return g(i, edge, start, L) <= target_s
        last = L - (pp - 1 - i)
        if g(i, edge, start, start + 1) > target_s:
            return False
        lo, hi = start + 1, last  # g(lo) <= target; find the largest such end
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if g(i, edge, start, mid) <= target_s:
                lo = mid
            else:
                hi = mid - 1
        start = lo
    return True
