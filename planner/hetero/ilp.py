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
              sum_i cross[i] <= pools - 1 (each pool's stages are contiguous; with more than
              two entries also at most one first stage per entry)
A "pool" p may also be a split stage shape (its replicas on several pools,
:mod:`planner.hetero.terms`): its stages take each share's GPUs from that pool, and each pool's
GPUs bound the sum over the stages and shapes that use it.
The per-stage constraints (memory against the capacity of the stage's pool, stage time, ZeRO and
DP exposure, optimizer step) are :mod:`planner.solve.stage_model`'s, the same code as the
one-pool model's: every per-stage quantity is sum_p (pool p's coefficients . q[., p]) + sum_p
a[i,p] . (pool p's constants); a stage next to a crossing adds, for its pool, the difference
between the crossing and the in-pool boundary terms (ex[i] >= delta_p (a[i,p] + adj[i] - 1)). Stragglers: stage i's time per micro-batch and optimizer step are
multiplied by its slowdown factor. Churn (replan): with the old stage boundaries B, the blocks
that change stage, L - sum_i |[b_i, b_i+1) n [B_i, B_i+1)|, are at most the budget.
Objective (1F1B, v = 1): (m - 1) T + sum_i t[i] + d + o + embedding sync.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ortools.sat.python import cp_model

from planner import cpsat
from planner.hetero.layout import StagePools
from planner.hetero.terms import PoolTerms
from planner.solve.recompute_model import add_rule, rule_of
from planner.solve.stage_model import StageModel, blocks_in, both, decode_placement
from planner.strategy import LayerPlacement

TICKS = 10**9
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


def _value(solver: cp_model.CpSolver, var) -> int:
    return var if isinstance(var, int) else solver.value(var)


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

    def ticks(self, seconds: float) -> int:
        return int(round(seconds / self.scale_s))

    # -- model -----------------------------------------------------------------------------
    def build(self) -> None:
        M, pp, L, P = self.model, self.pp, self.L, self.P
        names = [t.name for t in self.terms]
        # stage-to-pool (constants when fixed: then the pool shares are the counts themselves)
        self.a = {}
        fixed = self.fixed_pools
        for i in range(pp):
            for p in range(P):
                self.a[i, p] = (int(fixed.pools[i] == names[p]) if fixed is not None
                                else M.new_bool_var(f"a[{i},{names[p]}]"))
            if fixed is None:
                M.add_exactly_one(self.a[i, p] for p in range(P))
        for p in range(P):
            M.add(sum(self.a[i, p] for i in range(pp)) <= self.terms[p].max_stages)
        # the GPUs of every pool (a split stage takes its shares' GPUs from several)
        room: dict[str, tuple[int, list]] = {}
        for p, t in enumerate(self.terms):
            for pool, per_stage, total in t.gpus:
                room.setdefault(pool, (total, []))[1].append((p, per_stage))
        if any(t.shares for t in self.terms):
            for total, users in room.values():
                M.add(sum(self.a[i, p] * g for p, g in users for i in range(pp)) <= total)
        # each pool's (and split shape's) stages contiguous: at most one first stage each
        if fixed is None and P > 2:
            for p in range(P):
                starts = [self.a[0, p]]
                for i in range(1, pp):
                    s = M.new_bool_var(f"start[{i},{names[p]}]")
                    M.add(s >= self.a[i, p] - self.a[i - 1, p])
                    starts.append(s)
                M.add(sum(starts) <= 1)
        cross: list = []
        for i in range(pp - 1):
            if fixed is not None:
                cross.append(int(fixed.pools[i] != fixed.pools[i + 1]))
                continue
            c = M.new_bool_var(f"cross[{i}]")
            for p in range(P):
                M.add(c >= self.a[i, p] - self.a[i + 1, p])
            cross.append(c)
        if cross and fixed is None:
            M.add(sum(cross) <= P - 1)
        adj: list = []
        for i in range(pp):
            near = [cross[j] for j in (i - 1, i) if 0 <= j < pp - 1]
            if not near or fixed is not None:
                adj.append(int(any(near)))
                continue
            v = M.new_bool_var(f"adj[{i}]")
            for c in near:
                M.add(v >= c)
            adj.append(v)

        # blocks per stage (contiguous, >= 1 each); per stage the option counts and their pool
        # shares (planner.solve.stage_model, shared with the one-pool model)
        sm = StageModel(M, self.scale_s, pp, [t.problem for t in self.terms],
                        [t.cross for t in self.terms])
        sm.a, sm.adj, sm.slowdown = self.a, adj, self.f
        single = len(self.classes) == 1
        b = [M.new_constant(0)] + [M.new_int_var(i, L - (pp - i), f"b[{i}]")
                                   for i in range(1, pp)] + [M.new_constant(L)]
        self.x = {}
        for i in range(pp):
            M.add(b[i + 1] - b[i] >= 1)
            for ci, cls in enumerate(self.classes):
                x = M.new_int_var(0, cls.count, f"x[{i},{ci}]")
                if single:
                    M.add(x == b[i + 1] - b[i])
                else:
                    blocks_in(M, x, b, i, ci, cls, L)
                self.x[i, ci] = x
                sm.add_options(i, ci, x)
        self.n = sm.n
        self.b = b
        # the runtime's recompute rule, as in the one-pool model (planner/solve/recompute_model.py)
        add_rule(M, rule_of(self.terms[0].problem), self.classes, L, pp, None, self.x, self.n, b)

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

        # (M), (Z), (T), (D), (O) per stage, with stage i's pool's terms and slowdown
        T_var = M.new_int_var(0, 2**50, "T")
        d = M.new_int_var(0, 2**50, "d")
        o = M.new_int_var(0, 2**50, "o")
        self.t, slack = [], 0
        for i in range(pp):
            t, slack = sm.add_stage(i, T_var, d, o, slack)
            self.t.append(t)

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
                        M.add(emb >= self.ticks(value) * both(M, self.a[0, p], self.a[pp - 1, r],
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
        names = [t.name for t in self.terms]
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
        names = [t.name for t in self.terms]
        pools = tuple(next(names[p] for p in range(self.P) if _value(solver, self.a[i, p]))
                      for i in range(self.pp))
        placement = decode_placement(self.terms[0].problem, self.pp,
                                     lambda i, c: solver.value(self.x[i, c]),
                                     lambda i, c, r: solver.value(self.n[i, c, r]))
        return StagePools(pools), placement


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
    code = cpsat.solve(solver, builder.model)  # the process signal policy, not CP-SAT's
    status = _STATUS.get(code, "UNKNOWN")
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        pools, placement = builder.solution(solver)
        return HeteroResult(status, placement, pools, builder.to_seconds(solver.objective_value),
                            builder.to_seconds(solver.best_objective_bound), builder.scale_s,
                            solver.wall_time)
    bound = math.inf if code == cp_model.INFEASIBLE else 0.0
    return HeteroResult(status, None, None, math.inf, bound, builder.scale_s, solver.wall_time)
