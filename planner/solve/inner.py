"""Inner solver: for one outer configuration, place blocks on pipeline stages and choose each
block's :class:`~planner.strategy.LayerOption` (layout and recomputation) with CP-SAT, minimising
the cost model's step time under each stage's memory limit.

Consumes a :class:`~planner.solve.costs.StageProblem`; produces an :class:`InnerResult` (a
:class:`~planner.strategy.LayerPlacement`, objective and bound in seconds, CP-SAT status).

Why not one boolean per (layer, stage, option): that model does not scale (96 layers x 16 stages
x 3 options finds no good solution in a minute). Identical blocks make a stage's decision a few
integers, and every cost term is linear in them:

Every coefficient is a term of :mod:`planner.cost.terms` (a :class:`LayerTerms` field times a
count, or a :class:`ConfigTerms` constant); this module writes no cost formula, only the
combinators (sums, maxima via indicator variables, the ``(.)^+`` of exposures) that
``planner.cost.terms.stage_memory / stage_time / step_time`` apply in floats.

Variables (i = stage, c = block class, r = layer option)
  b[i]        first block of stage i (b[0] = 0, b[p] = L): stages are contiguous, each >= 1 block
  x[i,c]      blocks of class c in stage i = |[b[i], b[i+1]) n [start_c, end_c)|
  n[i,c,r]    of those, blocks with option r;  sum_r n[i,c,r] = x[i,c]
  u[i,c,r]    n[i,c,r] >= 1 (bool);  present[i,c]: x[i,c] >= 1 (bool)
  t[i]        stage time per micro-batch;  T >= t[i]  (the slowest stage)
Constraints, per stage, built by :mod:`planner.solve.stage_model` (shared with the model
across pools, :mod:`planner.hetero.ilp`):
  (M) memory of stage i <= capacity: state bytes + in-flight x stored activations + the largest
      working set + buffers (+ the largest ZeRO-3 gather buffer) + reserve (``stage_memory``),
      all linear in x and n (maxima via ``u`` / ``present``)
  (Z) ZeRO-2/3 exposed per-micro-batch traffic  e[i] >= traffic(n) - compute(n), e[i] >= 0
  (D) data-parallel exposure  d >= (reduce(n) - hidden(n))^+ + (gather(n) - fwd(n))^+ per stage
  (O) optimizer step  o >= sum of optimizer_s terms per stage
and here (R) the per-class layouts and their resharding edges, and (C) the runtime's recompute
rule on the counts n (Megatron's first N blocks of every chunk, torchtitan's one setting for all
blocks: :mod:`planner.solve.recompute_model`), and (A) Megatron's activation-offload rule (pp 1,
no recomputation, the first N blocks: :mod:`planner.solve.offload_model`).
Objective (``step_time``, times v to stay integer): (m v - 1) T + sum_i t[i] + v (d + o); a
zero-bubble schedule (planner.cost.pipeline): m v T + beta + v (d + o) with beta >= 0 and,
for each of its pieces, beta >= x (sum_i t[i] - T) + y sum_i b[i] + z sum_i w[i].

Integer coefficients: seconds are divided by a recorded tick (``objective_scale_s``), bytes are
rounded up, so the solver never accepts a stage that ``evaluate`` would reject.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from ortools.sat.python import cp_model

from planner import cpsat
from planner.cost.terms import pipeline_excess
from planner.solve.costs import StageProblem
from planner.solve.offload_model import add_offload_rule
from planner.solve.recompute_model import add_rule, rule_of
from planner.solve.stage_model import StageModel, blocks_in, decode_placement
from planner.strategy import LayerPlacement

TICKS = 10**9  # the objective of the heaviest placement spans about this many ticks


@dataclass(frozen=True)
class InnerResult:
    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN
    placement: LayerPlacement | None
    objective_s: float  # step time of the solution (solver's integer model), inf if none
    bound_s: float  # proven lower bound on the step time for this configuration
    scale_s: float  # seconds per objective tick
    wall_s: float


Terms = list  # [(cp-sat variable, float coefficient)]


class _Builder:
    """Builds the CP-SAT model of one StageProblem (see the module docstring for the math).

    ``drop`` names terms to leave out (read as zero): only the mutation test uses it, to show
    that every term matters to the ILP's agreement with ``evaluate``."""

    def __init__(self, problem: StageProblem, cutoff_s: float | None,
                 drop: frozenset[str] = frozenset(), slowest_stage_s: float = 0.0):
        self.p = problem
        self.ctx = problem.ctx
        self.c = self.ctx.config
        self.T = problem.terms
        self.drop = drop
        self.model = cp_model.CpModel()
        work = sum(max(x.time_s for x in cls.costs) * cls.count for cls in problem.classes)
        work += problem.fixed_extreme("time_s", max)
        m, v = self.T.num_micro_batches, self.T.virtual_stages
        self.scale_s = max(work * (m * v + 1), 1e-12) / TICKS
        self.cutoff_s = cutoff_s
        self.style = self.c.schedule_spec.placement  # chunk-to-rank map (loop or V)
        self.head = self.T.head_stage % self.T.pp  # the stage of the LM head
        self.slowest_stage_s = slowest_stage_s

    # -- integer scaling -------------------------------------------------------------------
    def ticks(self, seconds: float) -> int:
        return int(round(seconds / self.scale_s))

    def time_lin(self, terms: Terms, factor: float = 1.0):
        """Seconds-valued terms as an integer expression in ticks."""
        return sum(var * int(round(coef * factor / self.scale_s)) for var, coef in terms)

    def ct(self, name: str):
        return self.stages.ct(self.T, name)

    # -- model -----------------------------------------------------------------------------
    def build(self) -> None:
        T, P, M = self.T, self.p, self.model
        pp, L = T.pp, P.num_blocks
        v, m = T.virtual_stages, T.num_micro_batches

        # Stages are contiguous runs of >= 1 block; interleaved chunks or an explicit pipeline
        # layout fix each block's rank (P.block_ranks). With one block class the boundaries
        # reduce to per-stage counts summing to L.
        single = len(P.classes) == 1
        ranks = P.block_ranks
        fixed = ranks is not None
        b = [M.new_constant(0)]
        for i in range(1, pp):
            b.append(M.new_constant(sum(1 for r in ranks if r < i) if v == 1 else i * L // pp)
                     if fixed else M.new_constant(i * L // pp) if single
                     else M.new_int_var(i, L - (pp - i), f"b[{i}]"))
        b.append(M.new_constant(L))
        counts = []
        for i in range(pp):
            if fixed:
                counts.append(sum(1 for r in ranks if r == i))
            elif single:
                counts.append(M.new_int_var(1, L - pp + 1, f"k[{i}]"))
            else:
                M.add(b[i + 1] - b[i] >= 1)
        if single and not fixed:
            M.add(sum(counts) == L)

        # x[i,c]: blocks of class c in stage i; n[i,c,r]: with option r (planner.solve.stage_model)
        sm = self.stages = StageModel(M, self.scale_s, pp, [P], drop=self.drop)
        # unequal chunks inside a rank: every stage time x 1 + the order's excess
        # (planner.cost.terms.stage_time, pipeline_excess)
        sm.stage_factor = 1 + pipeline_excess(replace(T, chunk_weights=self.ct("chunk_weights")))
        self.edge_vars()
        sm.e = self.e
        # peak memory of the plan (bytes): the secondary objective of the tie-break solve
        self.peak = sm.peak = M.new_int_var(0, 2**52, "peak")
        self.x = {}
        for i in range(pp):
            sm.a[i, 0] = 1
            for ci, cls in enumerate(P.classes):
                x = M.new_int_var(0, cls.count, f"x[{i},{ci}]")
                if fixed:  # interleaved: rank i holds chunks i, i + pp, ... (V: i, 2pp-1-i)
                    M.add(x == sum(1 for blk in range(cls.first_block, cls.first_block + cls.count)
                                   if ranks[blk] == i))
                elif single:
                    M.add(x == counts[i])
                else:
                    blocks_in(M, x, b, i, ci, cls, L)
                self.x[i, ci] = x
                sm.add_options(i, ci, x)
        self.n = sm.n
        # the runtime's recompute rule (planner/recompute_rules.py, solve/recompute_model.py)
        add_rule(M, rule_of(P), P.classes, L, pp, ranks, self.x, self.n,
                 None if single and not fixed else b)
        # Megatron-Core's activation-offload rule (planner/offload_rules.py, offload_model.py)
        add_offload_rule(M, P.classes, [self.ctx.model.layers[cls.start].signature
                                        for cls in P.classes], L, pp, self.n)
        if not single and not fixed:
            # redundant cut: the stages hold every block (the min/max of blocks_in relax weakly)
            for ci, cls in enumerate(P.classes):
                M.add(sum(self.x[i, ci] for i in range(pp)) == cls.count)
        reshard = self.layouts(b)

        # (M), (Z), (T), (D), (O) per stage: planner.solve.stage_model
        T_var = M.new_int_var(0, 2**50, "T")
        if 0 < self.slowest_stage_s < math.inf:
            # redundant cut: a proven floor of the slowest stage (planner.solve.bounds), less
            # a margin for the rounding of each coefficient to ticks
            M.add(T_var >= max(0, int(self.slowest_stage_s / self.scale_s) - L - 64))
        d = M.new_int_var(0, 2**50, "d")
        o = M.new_int_var(0, 2**50, "o")
        self.t, slack = [], 0
        for i in range(pp):
            extra = self.time_lin(reshard[i][0]) + self.ticks(reshard[i][1])
            t, slack = sm.add_stage(i, T_var, d, o, slack, extra)
            self.t.append(t)

        # redundant cut: the slowest stage is at least the average (tightens the relaxation)
        M.add(pp * T_var >= sum(self.t))
        self.objective = (m * v - 1) * T_var + sum(self.t) + v * (d + o) + v * self.sync()
        pieces = self.ct("bubble_pieces")
        if pp > 1 and pieces:
            # zero-bubble schedules (planner.cost.pipeline.bubble_pieces): the fill/drain is
            # the largest of x (sum t - T) + y sum b + z sum w, floored at 0, times v; each
            # piece times p (p - 1) has integer coefficients
            scale = pp * (pp - 1)
            rest = sum(self.t) - T_var
            bwd = sum(sm.time(i, ("bwd_s", "recompute_s")) for i in range(pp))
            wgrad = sum(sm.time(i, ("wgrad_s",)) for i in range(pp))
            bubble = M.new_int_var(0, 2**50, "bubble")
            for x, y, z in pieces:
                M.add(scale * bubble >= round(x * scale) * rest + round(y * scale) * bwd
                      + round(z * scale) * wgrad)
            self.objective = m * v * T_var + bubble + v * (d + o) + v * self.sync()
        M.minimize(self.objective)
        if self.cutoff_s is not None:
            M.add(self.objective <= self.ticks((self.cutoff_s - self.constant_s()) * v))

    def layouts(self, b: list) -> list[tuple[Terms, float]]:
        """(R) Per-class layouts and the resharding edges between consecutive layers.

        Each block class takes one layout: y[c,l] one-hot, n[i,c,r] = 0 unless y[c, layout(r)];
        each non-block layer one option, e[j,k] (:meth:`edge_vars`). The boundary into class c
        costs ``reshard(l1, l2)`` on the stage holding c's first block when class c-1 has l1
        and c has l2: an edge variable z >= y[c-1,l1] + y[c,l2] - 1 (and, when that stage is a
        decision, q >= z + w[i,c] - 1 with w[i,c] = "stage i holds c's first block"). The
        boundaries between the embedding(s) and the first class are charged to the first
        stage, those between the last class and the head(s) to the last. Returns per stage
        the (variable, seconds) terms and a constant (Alpa / OpenXLA auto-sharding: one-hot
        strategies per node, linearised pairwise resharding costs per edge)."""
        P, M, pp = self.p, self.model, self.T.pp
        L, v = P.num_blocks, self.T.virtual_stages
        out: list[tuple[Terms, float]] = [([], 0.0) for _ in range(pp)]
        if all(len(P.layouts(ci)) <= 1 for ci in range(len(P.classes))) and \
                all(len(P.edge_choices(j)) <= 1 for j in P.pre + P.post):
            return out

        y = []
        for ci, cls in enumerate(P.classes):
            ys = {lay: M.new_bool_var(f"y[{ci},{lay.value}]") for lay in P.layouts(ci)}
            M.add_exactly_one(list(ys.values()))
            for (i, c, ri), n in self.n.items():
                if c == ci:
                    M.add(n <= cls.count * ys[cls.options[ri].layout])
            y.append(ys)

        def edge(stage: int, after_index: int, before: dict, after: dict, tag: str) -> None:
            """Charge reshard(l1, l2) to ``stage`` when before = l1 and after = l2."""
            for l1, y1 in before.items():
                for l2, y2 in after.items():
                    cost = P.reshard_s(after_index - 1, after_index, l1, l2)
                    if not cost:
                        continue
                    if isinstance(y1, int) and isinstance(y2, int):
                        out[stage] = (out[stage][0], out[stage][1] + cost)
                        continue
                    z = M.new_bool_var(f"z[{tag},{l1.value},{l2.value}]")
                    M.add(z >= y1 + y2 - 1)
                    out[stage][0].append((z, cost))

        chain = list(P.pre)
        for k in range(1, len(chain)):
            edge(0, chain[k], self.edge_layout(chain[k - 1]), self.edge_layout(chain[k]),
                 f"pre{k}")
        if P.pre:
            edge(0, P.classes[0].start, self.edge_layout(P.pre[-1]), y[0], "pre")
        if P.post:
            edge(self.head, P.post[0], y[-1], self.edge_layout(P.post[0]), "post")
        for k in range(1, len(P.post)):
            edge(self.head, P.post[k], self.edge_layout(P.post[k - 1]),
                 self.edge_layout(P.post[k]), f"post{k}")
        for ci in range(1, len(P.classes)):
            cls = P.classes[ci]
            if self.p.block_ranks is not None:
                fixed = self.p.block_ranks[cls.first_block]
                w = None
            elif pp == 1:
                fixed, w = 0, None
            else:
                fixed, s0 = None, cls.first_block
                w = [M.new_bool_var(f"w[{i},{ci}]") for i in range(pp)]
                M.add_exactly_one(w)
                for i in range(pp):
                    M.add(b[i] <= s0 + L * (1 - w[i]))
                    M.add(b[i + 1] >= s0 + 1 - L * (1 - w[i]))
            for l1, y1 in y[ci - 1].items():
                for l2, y2 in y[ci].items():
                    cost = P.reshard_s(cls.start - 1, cls.start, l1, l2)
                    if not cost:
                        continue
                    z = M.new_bool_var(f"z[{ci},{l1.value},{l2.value}]")
                    M.add(z >= y1 + y2 - 1)
                    if w is None:
                        out[fixed][0].append((z, cost))
                        continue
                    for i in range(pp):
                        q = M.new_bool_var(f"q[{i},{ci},{l1.value},{l2.value}]")
                        M.add(q >= z + w[i] - 1)
                        out[i][0].append((q, cost))
        return out

    def edge_vars(self) -> None:
        """e[j,k]: non-block layer j takes its k-th option (one-hot; the int 1 when it has one
        option). A tied embedding and LM head hold one table: the same layout."""
        M, P = self.model, self.p
        self.e = {}
        for index in P.pre + P.post:
            choices = P.edge_choices(index)
            if len(choices) == 1:
                self.e[index, 0] = 1
                continue
            vs = [M.new_bool_var(f"e[{index},{o.name}]") for o, _ in choices]
            M.add_exactly_one(vs)
            for k, var in enumerate(vs):
                self.e[index, k] = var
        if not self.ctx.model.tied_embeddings:
            return
        layers = self.ctx.model.layers
        tied = [j for j in P.pre + P.post
                if layers[j].kind.value == "embedding" or layers[j].tied_params]
        for a, h in zip(tied, tied[1:]):
            la, lb = self.edge_layout(a), self.edge_layout(h)
            for lay in dict.fromkeys([*la, *lb]):  # in option order: the same model in every
                M.add(la.get(lay, 0) == lb.get(lay, 0))  # process (a set's order is the hash's)

    def edge_layout(self, index: int) -> dict:
        """layout -> indicator of non-block layer ``index``."""
        return {o.layout: self.e[index, k] for k, (o, _) in enumerate(self.p.edge_choices(index))}

    def sync(self):
        """Ticks the tied table's gradient sync differs from the mesh layout's (a constant
        of :meth:`constant_s`) under the embedding's chosen layout: sum_k e[j,k] delta_k."""
        base = self.ct("embedding_sync_s")
        expr = 0
        for j, seconds in self.p.sync_choices():
            for k, s in enumerate(seconds):
                var, delta = self.e[j, k], self.ticks(s - base) if base else 0
                if delta and not isinstance(var, int):
                    expr += delta * var
        return expr

    def constant_s(self) -> float:
        """Step-time terms no decision changes (the tied-embedding gradient all-reduce)."""
        return self.ct("embedding_sync_s")

    def to_seconds(self, objective: float) -> float:
        return objective * self.scale_s / self.T.virtual_stages + self.constant_s()

    # -- hints and solution ----------------------------------------------------------------
    def hint(self, placement: LayerPlacement) -> None:
        counts = self._counts(placement)
        for key, var in self.n.items():
            self.model.add_hint(var, counts.get(key, 0))

    def _counts(self, placement: LayerPlacement) -> dict:
        counts: dict = {}
        for ci, cls in enumerate(self.p.classes):
            for k in range(cls.count):
                index = cls.start + k
                option = placement.options[index]
                ri = cls.options.index(option) if option in cls.options else 0
                key = (placement.stage[index], ci, ri)
                counts[key] = counts.get(key, 0) + 1
        return counts

    def placement(self, solver: cp_model.CpSolver) -> LayerPlacement:
        def edge_option(index: int):
            for k, (option, _) in enumerate(self.p.edge_choices(index)):
                var = self.e[index, k]
                if isinstance(var, int) or solver.value(var):
                    return option
            raise AssertionError("one-hot edge option without a value")

        return decode_placement(self.p, self.T.pp, lambda i, c: solver.value(self.x[i, c]),
                                lambda i, c, r: solver.value(self.n[i, c, r]),
                                self.p.block_ranks, edge_option)


_STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE",
           cp_model.INFEASIBLE: "INFEASIBLE", cp_model.MODEL_INVALID: "MODEL_INVALID",
           cp_model.UNKNOWN: "UNKNOWN"}


def solve_stages(problem: StageProblem, *, hint: LayerPlacement | None = None,
                 cutoff_s: float | None = None, workers: int = 1, seed: int = 0,
                 max_time_s: float = 10.0, deterministic_time: float = 5.0,
                 drop_terms: frozenset[str] = frozenset(), tie_break: bool = True,
                 slowest_stage_s: float = 0.0) -> InnerResult:
    """Solve one outer configuration exactly (within the limits). ``drop_terms``: see _Builder.
    ``slowest_stage_s``: a proven lower bound on the slowest stage's seconds per micro-batch
    (:func:`planner.solve.bounds.slowest_stage_lb_s`), added as a redundant cut.

    Lexicographic objective: step time first; then (``tie_break``), among the placements of
    that step time (in objective ticks), the lowest peak memory: a second solve of the same
    model with the objective held at the first solve's value and the peak minimised, hinted
    with the first solution (so it can only keep or improve the peak), within the remaining
    time and the same deterministic budget."""
    start = time.monotonic()
    builder = _Builder(problem, cutoff_s, drop_terms, slowest_stage_s)
    builder.build()
    if hint is not None:
        builder.hint(hint)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.max_time_in_seconds = max(max_time_s, 0.01)
    solver.parameters.max_deterministic_time = deterministic_time
    code = cpsat.solve(solver, builder.model)  # the process signal policy, not CP-SAT's
    status = _STATUS.get(code, "UNKNOWN")
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        objective, bound = solver.objective_value, solver.best_objective_bound
        placement = builder.placement(solver)
        remaining = max_time_s - (time.monotonic() - start)
        if tie_break and remaining > 0.01:
            placement, objective = _leanest(builder, solver, objective, workers, seed,
                                            remaining, deterministic_time) or (placement,
                                                                               objective)
        return InnerResult(status, placement, builder.to_seconds(objective),
                           builder.to_seconds(bound), builder.scale_s,
                           time.monotonic() - start)
    bound = math.inf if code == cp_model.INFEASIBLE else 0.0
    return InnerResult(status, None, math.inf, bound, builder.scale_s, solver.wall_time)


def _leanest(builder: _Builder, first: cp_model.CpSolver, objective: float, workers: int,
             seed: int, max_time_s: float, deterministic_time: float
             ) -> tuple[LayerPlacement, float] | None:
    """The tie-break solve: the first solution's objective held, the peak memory minimised.
    None when it finds nothing (the first solution stands)."""
    M = builder.model
    M.add(builder.objective <= int(round(objective)))
    M.minimize(builder.peak)
    M.clear_hints()
    for index in range(len(M.proto.variables)):
        var = M.get_int_var_from_proto_index(index)
        M.add_hint(var, first.value(var))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.max_time_in_seconds = max(max_time_s, 0.01)
    solver.parameters.max_deterministic_time = deterministic_time
    code = cpsat.solve(solver, M)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return builder.placement(solver), solver.value(builder.objective)
