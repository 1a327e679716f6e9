"""CP-SAT model of one configuration across pools: stage-to-pool, blocks per stage, and each
block's option, minimising the step time under each stage's pool's memory capacity.

Consumes the :class:`~planner.hetero.terms.PoolTerms` of one configuration (one StageProblem per
pool, built from :mod:`planner.cost.terms`), optional per-stage slowdown factors, an optional
fixed stage-to-pool assignment and an optional churn budget against an old placement; produces a
:class:`HeteroResult`. Like :mod:`planner.solve.inner` it writes no cost formula: every
coefficient is a LayerTerms field or a ConfigTerms constant of the stage's pool, combined with
the same sums, maxima and ``(.)^+`` as :mod:`planner.hetero.evaluate` (which is the one-pool
``stage_memory / stage_time / step_time`` with per-stage terms).

Variables (i stage, p pool, c block class, r option); the one-pool model's plus the pool axis
  a[i,p]      stage i runs on pool p (bool), sum_p a[i,p] = 1; sum_i a[i,p] <= stages pool p hosts
  x[i,c], n[i,c,r], u[i,c,r], present[i,c]   as in planner/solve/inner.py
  q[i,c,r,p]  n[i,c,r] if a[i,p] else 0 (q <= count a[i,p], sum_p q = n): the pool's share
  cross[i]    the boundary i | i+1 crosses pools; adj[i] = stage i is next to a crossing;
              sum_i cross[i] <= pools - 1 (each pool's stages are contiguous)
Every per-stage quantity is sum_p (pool p's coefficients . q[., p]) + sum_p a[i,p] . (pool p's
constants); a stage next to a crossing adds, for its pool, the difference between the crossing
and the in-pool boundary terms (ex[i] >= delta_p (a[i,p] + adj[i] - 1)). Memory uses the
capacity of the stage's pool. Stragglers: stage i's time per micro-batch and optimizer step are
multiplied by its slowdown factor. Churn (replan): with the old stage boundaries B, the blocks
that change stage, L - sum_i |[b_i, b_i+1) n [B_i, B_i+1)|, are at most the budget.
Objective (1F1B, v = 1): (m - 1) T + sum_i t[i] + d + o + embedding sync.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ortools.sat.python import cp_model

from planner.cost.terms import LayerTerms
from planner.hetero.layout import StagePools
from planner.hetero.terms import PoolTerms
from planner.strategy import NO_OPTION, LayerPlacement

TICKS = 10**9
TIME_TERMS = ("fwd_s", "bwd_s", "recompute_s", "comm_s")
STATE_TERMS = ("params_bytes", "grads_bytes", "optimizer_bytes")
_STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE",
           cp_model.INFEASIBLE: "INFEASIBLE", cp_model.MODEL_INVALID: "MODEL_INVALID",
           cp_model.UNKNOWN: "UNKNOWN"}


@dataclass(frozen=True)
class HeteroResult:
    status: str
    placement: LayerPlacement | None
    stage_pools: StagePools | None
    objective_s: float
    bound_s: float
    scale_s: float
    wall_s: float


def _get(cost: LayerTerms, names: tuple[str, ...]) -> float:
    return sum(getattr(cost, n) for n in names)


class _Builder:
    def __init__(self, terms: Sequence[PoolTerms], pp: int, *, slowdown: Sequence[float] | None,
                 fixed_pools: StagePools | None, old_counts: Sequence[int] | None,
                 max_moved: int | None, cutoff_s: float | None, min_slowest_s: float = 0.0):
        self.terms = list(terms)
        self.P = len(self.terms)
        self.pp = pp
        first = self.terms[0].problem
        if first.terms.virtual_stages != 1:
            raise ValueError("the model across pools is for 1F1B plans (virtual stages 1)")
        self.classes = first.classes
        self.L = first.num_blocks
        self.m = first.terms.num_micro_batches
        self.f = [float(x) for x in (slowdown or [1.0] * pp)]
        self.fixed_pools = fixed_pools
        self.old_counts = old_counts
        self.max_moved = max_moved
        self.cutoff_s = cutoff_s
        self.min_slowest_s = min_slowest_s
        self.model = cp_model.CpModel()
        work = max(sum(max(x.time_s for x in cls.costs) * cls.count for cls in t.problem.classes)
                   + sum(x.time_s for x in t.problem.pre_costs + t.problem.post_costs)
                   + pp * max(t.inner.boundary_s, (t.cross or t.inner).boundary_s)
                   for t in self.terms)
        self.scale_s = max(work * max(self.f) * (self.m + 1), 1e-12) / TICKS

    # -- scaling ---------------------------------------------------------------------------
    def ticks(self, seconds: float) -> int:
        return int(round(seconds / self.scale_s))

    def costs(self, p: int, ci: int) -> tuple[LayerTerms, ...]:
        return self.terms[p].problem.classes[ci].costs

    def fixed(self, p: int, i: int) -> tuple[LayerTerms, ...]:
        prob = self.terms[p].problem
        out: tuple[LayerTerms, ...] = ()
        if i == 0:
            out += prob.pre_costs
        if i == self.pp - 1:
            out += prob.post_costs
        return out

    def time(self, i: int, names: tuple[str, ...], factor: float = 1.0):
        """Ticks of the named time terms of stage i (its pool's coefficients), x factor."""
        expr = 0
        for p in range(self.P):
            for ci, cls in enumerate(self.classes):
                for ri in range(len(cls.options)):
                    k = int(round(_get(self.costs(p, ci)[ri], names) * factor / self.scale_s))
                    if k:
                        expr += k * self.q[i, ci, ri, p]
            const = sum(_get(x, names) for x in self.fixed(p, i))
            if const:
                expr += self.ticks(const * factor) * self.a[i, p]
        return expr

    def nbytes(self, i: int, names: tuple[str, ...], factor: float = 1.0):
        expr = 0
        for p in range(self.P):
            for ci, cls in enumerate(self.classes):
                for ri in range(len(cls.options)):
                    k = math.ceil(_get(self.costs(p, ci)[ri], names) * factor)
                    if k:
                        expr += k * self.q[i, ci, ri, p]
            const = sum(_get(x, names) for x in self.fixed(p, i))
            if const:
                expr += math.ceil(const * factor) * self.a[i, p]
        return expr

    def per_pool(self, i: int, value) -> object:
        """sum_p a[i,p] * value(p) in ticks (value in seconds)."""
        return sum(self.ticks(value(p)) * self.a[i, p] for p in range(self.P) if value(p))

    def both(self, x, y, name: str):
        z = self.model.new_bool_var(name)
        self.model.add(z >= x + y - 1)
        return z

    # -- model -----------------------------------------------------------------------------
    def build(self) -> None:
        M, pp, L, P = self.model, self.pp, self.L, self.P
        names = [t.pool.name for t in self.terms]
        # stage-to-pool
        self.a = {}
        for i in range(pp):
            for p in range(P):
                if self.fixed_pools is not None:
                    self.a[i, p] = M.new_constant(int(self.fixed_pools.pools[i] == names[p]))
                else:
                    self.a[i, p] = M.new_bool_var(f"a[{i},{names[p]}]")
            M.add_exactly_one(self.a[i, p] for p in range(P))
        for p in range(P):
            M.add(sum(self.a[i, p] for i in range(pp)) <= self.terms[p].max_stages)
        cross = []
        for i in range(pp - 1):
            c = M.new_bool_var(f"cross[{i}]")
            for p in range(P):
                M.add(c >= self.a[i, p] - self.a[i + 1, p])
            cross.append(c)
        if cross:
            M.add(sum(cross) <= P - 1)
        adj = []
        for i in range(pp):
            near = [cross[j] for j in (i - 1, i) if 0 <= j < pp - 1]
            if not near:
                adj.append(0)
                continue
            v = M.new_bool_var(f"adj[{i}]")
            for c in near:
                M.add(v >= c)
            adj.append(v)

        # blocks per stage (contiguous, >= 1 each)
        single = len(self.classes) == 1
        b = [M.new_constant(0)] + [M.new_int_var(i, L - (pp - i), f"b[{i}]")
                                   for i in range(1, pp)] + [M.new_constant(L)]
        for i in range(pp):
            M.add(b[i + 1] - b[i] >= 1)
        self.x, self.n, self.u, self.present, self.q = {}, {}, {}, {}, {}
        for i in range(pp):
            for ci, cls in enumerate(self.classes):
                x = M.new_int_var(0, cls.count, f"x[{i},{ci}]")
                if single:
                    M.add(x == b[i + 1] - b[i])
                else:
                    top = M.new_int_var(0, L, f"top[{i},{ci}]")
                    M.add_min_equality(top, [b[i + 1], cls.first_block + cls.count])
                    bot = M.new_int_var(0, L, f"bot[{i},{ci}]")
                    M.add_max_equality(bot, [b[i], cls.first_block])
                    M.add_max_equality(x, [top - bot, 0])
                present = M.new_bool_var(f"present[{i},{ci}]")
                M.add(x <= cls.count * present)
                M.add(x >= present)
                self.x[i, ci], self.present[i, ci] = x, present
                for ri, option in enumerate(cls.options):
                    n = M.new_int_var(0, cls.count, f"n[{i},{ci},{option.name}]")
                    self.n[i, ci, ri] = n
                    if max(self.costs(p, ci)[ri].act_working_bytes for p in range(P)) > 0:
                        u = M.new_bool_var(f"u[{i},{ci},{option.name}]")
                        M.add(n <= cls.count * u)
                        self.u[i, ci, ri] = u
                    for p in range(P):
                        q = M.new_int_var(0, cls.count, f"q[{i},{ci},{option.name},{names[p]}]")
                        M.add(q <= cls.count * self.a[i, p])
                        self.q[i, ci, ri, p] = q
                    M.add(sum(self.q[i, ci, ri, p] for p in range(P)) == n)
                M.add(sum(self.n[i, ci, ri] for ri in range(len(cls.options))) == x)
        self.b = b

        # churn budget: blocks that change stage against the old boundaries
        if self.old_counts is not None and self.max_moved is not None:
            old_b = [sum(self.old_counts[:i]) for i in range(pp + 1)]
            kept = []
            for i in range(pp):
                lo = M.new_int_var(0, L, f"lo[{i}]")
                M.add_max_equality(lo, [b[i], old_b[i]])
                hi = M.new_int_var(0, L, f"hi[{i}]")
                M.add_min_equality(hi, [b[i + 1], old_b[i + 1]])
                keep = M.new_int_var(0, L, f"keep[{i}]")
                M.add_max_equality(keep, [hi - lo, 0])
                kept.append(keep)
            M.add(L - sum(kept) <= self.max_moved)

        moe = [ci for ci, cls in enumerate(self.classes) if cls.costs[0].expert_params > 0]
        T_var = M.new_int_var(0, 2**50, "T")
        d = M.new_int_var(0, 2**50, "d")
        o = M.new_int_var(0, 2**50, "o")
        self.t = []
        slack = 0
        for i in range(pp):
            f = self.f[i]
            has_expert = 0
            fixed_expert = [any(x.expert_params > 0 for x in self.fixed(p, i)) for p in range(P)]
            if moe:
                has_expert = M.new_bool_var(f"has_expert[{i}]")
                M.add_max_equality(has_expert, [self.present[i, ci] for ci in moe])
            elif any(fixed_expert):
                has_expert = 1
            # per-pool ConfigTerms of this stage: in-pool, plus the crossing's extra next to one
            inner = [t.inner for t in self.terms]
            crossing = [t.cross or t.inner for t in self.terms]
            alpha = [1.0 + t.allocator_overhead for t in inner]

            def pool_const(value, extra=None, scale=1.0):
                """Ticks of sum_p a[i,p] value(inner_p) (+ adj x (value(cross_p) - value(inner_p)))."""
                expr = self.per_pool(i, lambda p: value(inner[p]) * scale)
                if extra is not None and not isinstance(adj[i], int):
                    for p in range(P):
                        delta = value(crossing[p]) - value(inner[p])
                        if self.ticks(delta * scale) > 0:
                            ex = self.both(self.a[i, p], adj[i], f"ex[{i},{p}]")
                            expr += self.ticks(delta * scale) * ex
                return expr

            def charged(slope: tuple[str, ...], dense, expert, factor=1.0):
                out = self.time(i, slope, factor)
                out += pool_const(lambda t: dense(t).intercept_s, True, factor)
                for p in range(P):
                    k = self.ticks(expert(inner[p]).intercept_s * factor)
                    if k and not isinstance(has_expert, int):
                        out += k * self.both(self.a[i, p], has_expert, f"he[{i},{p}]")
                    elif k and has_expert:
                        out += k * self.a[i, p]
                return out

            # (M) memory against the capacity of the stage's pool
            for p in range(P):
                if any(abs(self.costs(p, ci)[ri].act_stored_bytes
                           - self.costs(0, ci)[ri].act_stored_bytes) > 0
                       for ci, cls in enumerate(self.classes) for ri in range(len(cls.options))):
                    raise ValueError("stored activations differ between pools")
            in_flight = inner[0].in_flight[i]
            working = M.new_int_var(0, 2**52, f"working[{i}]")
            for (si, ci, ri), u in self.u.items():
                if si == i:
                    k = max(math.ceil(alpha[p] * self.costs(p, ci)[ri].act_working_bytes)
                            for p in range(P))
                    M.add(working >= k * u)
            for p in range(P):
                for cost in self.fixed(p, i):
                    M.add(working >= math.ceil(alpha[p] * cost.act_working_bytes) * self.a[i, p])
            gather = M.new_int_var(0, 2**52, f"gather[{i}]")
            for ci, cls in enumerate(self.classes):
                k = max(math.ceil(alpha[p] * x.gather_buffer_bytes)
                        for p in range(P) for x in self.costs(p, ci))
                if k:
                    M.add(gather >= k * self.present[i, ci])
            for p in range(P):
                for cost in self.fixed(p, i):
                    k = math.ceil(alpha[p] * cost.gather_buffer_bytes)
                    if k:
                        M.add(gather >= k * self.a[i, p])
            mem = (self.nbytes(i, STATE_TERMS) + self.nbytes(i, ("act_stored_bytes",),
                                                               in_flight * alpha[0])
                   + working + gather)
            room = sum((math.floor(inner[p].capacity_bytes)
                        - math.ceil(alpha[p] * inner[p].buffer_bytes + inner[p].reserve_bytes))
                       * self.a[i, p] for p in range(P))
            M.add(mem <= room)

            # stage time per micro-batch (x slowdown), with the exposed ZeRO-2/3 traffic
            stage = self.time(i, TIME_TERMS, f) + pool_const(
                lambda t: t.boundary_s + t.micro_batch_overhead_s, True, f)
            if inner[0].per_micro_batch_sync:
                # per-phase exposure as planner.cost.terms.stage_time (forward gathers behind
                # the forward, backward traffic behind backward + recompute, one layer's edge),
                # scaled by (1 - kappa), plus kappa x the traffic (NCCL slowing compute)
                kappa = inner[0].comm_slowdown
                keep = (1.0 - kappa) * f
                total = charged(("zero_traffic_s",),
                                lambda t: t.zero_reduce_dense + t.zero_gather_dense,
                                lambda t: t.zero_reduce_expert + t.zero_gather_expert, keep)
                fwd = charged(("zero_fwd_traffic_s",),
                              lambda t: t.zero_gather_dense.scaled(0.5),
                              lambda t: t.zero_gather_expert.scaled(0.5), keep)
                e_f = M.new_int_var(0, 2**50, f"e_fwd[{i}]")
                M.add(e_f >= fwd - self.time(i, ("fwd_s",), keep))
                e_b = M.new_int_var(0, 2**50, f"e_bwd[{i}]")
                M.add(e_b >= total - fwd - self.time(i, ("bwd_s", "recompute_s"), keep))
                edge = M.new_int_var(0, 2**50, f"edge[{i}]")
                for ci, cls in enumerate(self.classes):
                    for p in range(P):
                        k = max(self.ticks(keep * x.zero_edge_s) for x in self.costs(p, ci))
                        if k:
                            M.add(edge >= k * self.both(self.a[i, p], self.present[i, ci],
                                                        f"edge[{i},{p},{ci}]"))
                for p in range(P):
                    for cost in self.fixed(p, i):
                        k = self.ticks(keep * cost.zero_edge_s)
                        if k:
                            M.add(edge >= k * self.a[i, p])
                stage += e_f + e_b + edge
                if kappa:
                    stage += charged(("zero_traffic_s",),
                                     lambda t: t.zero_reduce_dense + t.zero_gather_dense,
                                     lambda t: t.zero_reduce_expert + t.zero_gather_expert,
                                     kappa * f)
            t = M.new_int_var(0, 2**50, f"t[{i}]")
            M.add(t == stage)
            M.add(T_var >= t)
            self.t.append(t)

            # (D) data-parallel sync, hidden behind backward (unslowed: see evaluate.py)
            bwd = self.time(i, ("bwd_s", "recompute_s"))
            reduce = charged(("dp_reduce_s",), lambda t: t.dp_reduce_dense,
                             lambda t: t.dp_reduce_expert)
            gather_s = charged(("dp_gather_s",), lambda t: t.dp_gather_dense,
                               lambda t: t.dp_gather_expert)
            hidden = slack + (bwd if inner[0].overlap_grad_reduce else 0)
            hidden_g = self.time(i, ("fwd_s",)) if inner[0].overlap_param_gather else 0
            er = M.new_int_var(0, 2**50, f"exposed_reduce[{i}]")
            eg = M.new_int_var(0, 2**50, f"exposed_gather[{i}]")
            M.add(er >= reduce - hidden)
            M.add(eg >= gather_s - hidden_g)
            M.add(d >= er + eg)
            slack = slack + bwd
            # (O) optimizer step (x slowdown)
            M.add(o >= self.time(i, ("optimizer_s",), f))

        # tied embeddings: first and last stage, in one pool or across pools
        emb = 0
        if pp > 1 and any(t.inner.embedding_sync_s for t in self.terms):
            emb = M.new_int_var(0, 2**50, "embedding_sync")
            for p in range(P):
                for r in range(P):
                    value = self.terms[p].inner.embedding_sync_s if p == r else max(
                        (self.terms[p].cross or self.terms[p].inner).embedding_sync_s,
                        (self.terms[r].cross or self.terms[r].inner).embedding_sync_s)
                    if self.ticks(value):
                        M.add(emb >= self.ticks(value) * self.both(self.a[0, p],
                                                                   self.a[pp - 1, r],
                                                                   f"emb[{p},{r}]"))
        M.add(pp * T_var >= sum(self.t))
        if self.min_slowest_s > 0:  # a proven bound on the slowest stage (planner/hetero/bounds.py)
            M.add(T_var >= math.floor(self.min_slowest_s / self.scale_s * (1 - 1e-6)))
        self.objective = (self.m - 1) * T_var + sum(self.t) + d + o + emb
        M.minimize(self.objective)
        if self.cutoff_s is not None:
            M.add(self.objective <= self.ticks(self.cutoff_s))

    def to_seconds(self, objective: float) -> float:
        return objective * self.scale_s

    # -- hints and solution ----------------------------------------------------------------
    def hint(self, stage_pools: StagePools, placement: LayerPlacement) -> None:
        names = [t.pool.name for t in self.terms]
        for i in range(self.pp):
            for p in range(self.P):
                if self.fixed_pools is None:
                    self.model.add_hint(self.a[i, p], int(stage_pools.pools[i] == names[p]))
        for ci, cls in enumerate(self.classes):
            for i in range(self.pp):
                for ri, option in enumerate(cls.options):
                    count = sum(1 for k in range(cls.count)
                                if placement.stage[cls.start + k] == i
                                and placement.options[cls.start + k] == option)
                    self.model.add_hint(self.n[i, ci, ri], count)

    def solution(self, solver: cp_model.CpSolver) -> tuple[StagePools, LayerPlacement]:
        names = [t.pool.name for t in self.terms]
        pools = tuple(next(names[p] for p in range(self.P) if solver.value(self.a[i, p]))
                      for i in range(self.pp))
        model = self.terms[0].problem.ctx.model
        stage = [0] * len(model.layers)
        options = [NO_OPTION] * len(model.layers)
        for ci, cls in enumerate(self.classes):
            blocks = list(range(cls.first_block, cls.first_block + cls.count))
            done = 0
            for i in range(self.pp):
                k = solver.value(self.x[i, ci])
                mine = blocks[done:done + k]
                done += k
                chosen = [cls.options[ri]
                          for ri in sorted(range(len(cls.options)),
                                           key=lambda r: -cls.options[r].memory_rank)
                          for _ in range(solver.value(self.n[i, ci, ri]))]
                for blk, option in zip(mine, chosen):
                    index = cls.start + (blk - cls.first_block)
                    stage[index] = i
                    options[index] = option
        for index in self.terms[0].problem.post:
            stage[index] = self.pp - 1
        return StagePools(pools), LayerPlacement(tuple(stage), tuple(options))


def solve_pools(terms: Sequence[PoolTerms], pp: int, *, slowdown: Sequence[float] | None = None,
                fixed_pools: StagePools | None = None, old_counts: Sequence[int] | None = None,
                max_moved: int | None = None, hint: tuple[StagePools, LayerPlacement] | None = None,
                cutoff_s: float | None = None, workers: int = 1, seed: int = 0,
                max_time_s: float = 10.0, deterministic_time: float = 5.0,
                min_slowest_s: float = 0.0) -> HeteroResult:
    """Solve one configuration across pools exactly (within the limits). ``min_slowest_s``: a
    proven lower bound on the slowest stage's time (a cut; slowdown factors must be 1)."""
    builder = _Builder(terms, pp, slowdown=slowdown, fixed_pools=fixed_pools,
                       old_counts=old_counts, max_moved=max_moved, cutoff_s=cutoff_s,
                       min_slowest_s=min_slowest_s)
    builder.build()
    if hint is not None:
        builder.hint(*hint)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.max_time_in_seconds = max(max_time_s, 0.01)
    solver.parameters.max_deterministic_time = deterministic_time
    code = solver.solve(builder.model)
    status = _STATUS.get(code, "UNKNOWN")
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        pools, placement = builder.solution(solver)
        return HeteroResult(status, placement, pools, builder.to_seconds(solver.objective_value),
                            builder.to_seconds(solver.best_objective_bound), builder.scale_s,
                            solver.wall_time)
    bound = math.inf if code == cp_model.INFEASIBLE else 0.0
    return HeteroResult(status, None, None, math.inf, bound, builder.scale_s, solver.wall_time)
