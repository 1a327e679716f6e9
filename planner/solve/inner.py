"""Inner solver: for one outer configuration, place blocks on pipeline stages and choose each
block's recomputation with CP-SAT, minimising the cost model's step time under each stage's
memory limit.

Consumes a :class:`~planner.solve.costs.StageProblem`; produces an :class:`InnerResult` (a
:class:`~planner.config.LayerPlacement`, objective and bound in seconds, CP-SAT status).

Why not one boolean per (layer, stage, option): that model does not scale (96 layers x 16 stages
x 3 options finds no good solution in a minute). Identical blocks make a stage's decision a few
integers, and every cost term is linear in them:

Variables (i = stage, c = block class, r = recompute option)
  b[i]        first block of stage i (b[0] = 0, b[p] = L): stages are contiguous, each >= 1 block
  x[i,c]      blocks of class c in stage i = |[b[i], b[i+1]) n [start_c, end_c)|
  n[i,c,r]    of those, blocks with option r;  sum_r n[i,c,r] = x[i,c]
  u[i,c,r]    n[i,c,r] >= 1 (bool);  present[i,c]: x[i,c] >= 1 (bool)
  t[i]        stage time per micro-batch;  T >= t[i]  (the slowest stage)
Constraints (labels match comments in the code)
  (M) memory of stage i <= capacity: ZeRO-sharded states of its parameters + in-flight x stored
      activations + the largest working set + buffers + reserve (planner/cost/model.py
      ``stage_memory``), all linear in x and n (maxima via ``u`` / ``present``)
  (Z) ZeRO-2/3 exposed per-micro-batch traffic  e[i] >= traffic(x) - compute(x, n), e[i] >= 0
  (D) data-parallel exposure  d >= (reduce(x) - hidden(n))^+ + (gather(x) - fwd(n))^+ per stage
  (O) optimizer step  o >= owned(x) * bytes / HBM bandwidth per stage
Objective (``step_time``, times v to stay integer): (m v - 1) T + sum_i t[i] + v (d + o).

Integer coefficients: seconds are divided by a recorded tick (``objective_scale_s``), bytes are
rounded up, so the solver never accepts a stage that ``evaluate`` would reject.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from planner import cpsat
from planner.config import LayerPlacement, Recompute, interleaved_rank
from planner.cost import comm
from planner.cost.compute import HBM_EFFICIENCY
from planner.cost.memory import in_flight_micro_batches
from planner.cost.model import (ACT_BYTES, ALLOCATOR_OVERHEAD, OPTIMIZER_BYTES_PER_PARAM,
                                LayerCost, embedding_sync_s)
from planner.hardware import GIB
from planner.solve.costs import StageProblem

TICKS = 10**9  # the objective of the heaviest placement spans about this many ticks


@dataclass(frozen=True)
class InnerResult:
    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN
    placement: LayerPlacement | None
    objective_s: float  # step time of the solution (solver's integer model), inf if none
    bound_s: float  # proven lower bound on the step time for this configuration
    scale_s: float  # seconds per objective tick
    wall_s: float


def _affine(fn, *args) -> tuple[float, float]:
    """(slope per byte, intercept) of a collective-time function of size, for sizes > 0."""
    a, b = fn(1e9, *args), fn(2e9, *args)
    slope = (b - a) / 1e9
    return slope, a - slope * 1e9


Terms = list  # [(cp-sat variable, float coefficient)]


class _Builder:
    """Builds the CP-SAT model of one StageProblem (see the module docstring for the math)."""

    def __init__(self, problem: StageProblem, cutoff_s: float | None):
        self.p = problem
        self.ctx = problem.ctx
        self.c = self.ctx.config
        self.model = cp_model.CpModel()
        work = sum(max(x.time_s for x in cls.costs) * cls.count for cls in problem.classes)
        work += sum(x.time_s for x in problem.pre_costs + problem.post_costs)
        m, v = self.c.num_micro_batches, self.c.virtual_stages
        self.scale_s = max(work * (m * v + 1), 1e-12) / TICKS
        self.cutoff_s = cutoff_s

    # -- integer scaling -------------------------------------------------------------------
    def ticks(self, seconds: float) -> int:
        return int(round(seconds / self.scale_s))

    def time_lin(self, terms: Terms, factor: float = 1.0):
        """Seconds-valued terms as an integer expression in ticks."""
        return sum(var * int(round(coef * factor / self.scale_s)) for var, coef in terms)

    @staticmethod
    def bytes_lin(terms: Terms, factor: float = 1.0):
        """Byte-valued terms rounded up (never under-estimates memory)."""
        return sum(var * math.ceil(coef * factor) for var, coef in terms)

    def stage_terms(self, i: int, attr) -> tuple[Terms, float]:
        """sum over classes and options of n[i,c,r] * attr(cost), plus the fixed layers' sum."""
        terms = [(self.n[i, ci, ri], attr(cost))
                 for ci, cls in enumerate(self.p.classes) for ri, cost in enumerate(cls.costs)]
        return terms, sum(attr(x) for x in self.fixed(i))

    def fixed(self, i: int) -> tuple[LayerCost, ...]:
        out: tuple[LayerCost, ...] = ()
        if i == 0:
            out += self.p.pre_costs
        if i == self.c.pp - 1:
            out += self.p.post_costs
        return out

    # -- model -----------------------------------------------------------------------------
    def build(self) -> None:
        c, ctx, P, M = self.c, self.ctx, self.p, self.model
        pp, L = c.pp, P.num_blocks
        v, m = c.virtual_stages, c.num_micro_batches

        # Stages are contiguous runs of >= 1 block; interleaving keeps them equal. With one
        # block class the boundaries reduce to per-stage counts summing to L.
        single = len(P.classes) == 1
        b = [M.new_constant(0)]
        for i in range(1, pp):
            b.append(M.new_constant(i * L // pp) if v > 1 or single
                     else M.new_int_var(i, L - (pp - i), f"b[{i}]"))
        b.append(M.new_constant(L))
        counts = []
        for i in range(pp):
            if v > 1:
                counts.append(L // pp)
            elif single:
                counts.append(M.new_int_var(1, L - pp + 1, f"k[{i}]"))
            else:
                M.add(b[i + 1] - b[i] >= 1)
        if single and v == 1:
            M.add(sum(counts) == L)

        # x[i,c]: blocks of class c in stage i; n[i,c,r]: with option r; u, present: >= 1
        self.x, self.n, self.u, self.present = {}, {}, {}, {}
        for i in range(pp):
            for ci, cls in enumerate(P.classes):
                x = M.new_int_var(0, cls.count, f"x[{i},{ci}]")
                if v > 1:  # interleaved: rank i holds chunks i, i + pp, ... (fixed)
                    M.add(x == sum(1 for blk in range(cls.first_block, cls.first_block + cls.count)
                                   if interleaved_rank(blk, L, pp, v) == i))
                elif single:
                    M.add(x == counts[i])
                else:  # x = max(0, min(b[i+1], end) - max(b[i], start))
                    top = M.new_int_var(0, L, f"top[{i},{ci}]")
                    M.add_min_equality(top, [b[i + 1], cls.first_block + cls.count])
                    bot = M.new_int_var(0, L, f"bot[{i},{ci}]")
                    M.add_max_equality(bot, [b[i], cls.first_block])
                    M.add_max_equality(x, [top - bot, 0])
                present = M.new_bool_var(f"present[{i},{ci}]")
                M.add(x <= cls.count * present)
                M.add(x >= present)
                self.x[i, ci], self.present[i, ci] = x, present
                for ri, r in enumerate(cls.options):
                    n = M.new_int_var(0, cls.count, f"n[{i},{ci},{r.value}]")
                    self.n[i, ci, ri] = n
                    if cls.costs[ri].act_working_bytes > 0:  # only then is "used" needed
                        u = M.new_bool_var(f"u[{i},{ci},{r.value}]")
                        M.add(n <= cls.count * u)
                        self.u[i, ci, ri] = u
                M.add(sum(self.n[i, ci, ri] for ri in range(len(cls.options))) == x)

        state = ctx.options.state_bytes
        zero = c.zero_stage
        n_dense = ctx.shard_degree
        n_expert = max(n_dense // c.ep, 1)
        alpha = 1.0 + ALLOCATOR_OVERHEAD
        capacity = math.floor(ctx.cluster.memory_bytes_per_gpu)
        hidden_bytes = ctx.shard.tokens * ctx.model.hidden * ACT_BYTES
        buffers = (2 * hidden_bytes if pp > 1 else 0.0) + (hidden_bytes if c.sp else 0.0)
        if zero >= 1 and n_dense > 1:
            buffers += state.bucket_bytes

        def bytes_per_param(shards: int) -> float:  # planner/cost/memory.py zero_state_bytes
            return (state.weights / (shards if zero >= 3 else 1)
                    + state.grads / (shards if zero >= state.grads_sharded_from_stage else 1)
                    + state.optimizer / (shards if zero >= 1 else 1))

        dense_bpp, expert_bpp = bytes_per_param(n_dense), bytes_per_param(n_expert)
        boundary = hidden_bytes / (c.tp if c.sp else 1)
        p2p_s = 2 * v * comm.p2p_s(boundary, ctx.links.pp) if pp > 1 else 0.0
        links = ctx.links.dp
        red_fn = comm.all_reduce_s if zero == 0 else comm.reduce_scatter_s
        rs = _affine(red_fn, n_dense, links) if n_dense > 1 else (0.0, 0.0)
        ag = _affine(comm.all_gather_s, n_dense, links) if n_dense > 1 and zero >= 1 else (0.0, 0.0)
        ers = _affine(red_fn, n_expert, links) if n_expert > 1 else (0.0, 0.0)
        eag = _affine(comm.all_gather_s, n_expert, links) if n_expert > 1 and zero >= 1 else (0.0, 0.0)
        per_mb_sync = zero >= 2 and n_dense > 1  # ZeRO-2/3 reduce every micro-batch
        rs_mb = _affine(comm.reduce_scatter_s, n_dense, links) if per_mb_sync else (0.0, 0.0)
        ers_mb = (_affine(comm.reduce_scatter_s, n_expert, links)
                  if per_mb_sync and n_expert > 1 else (0.0, 0.0))
        hbm = ctx.cluster.gpu.hbm_bandwidth_gbytes_per_s * 1e9 * HBM_EFFICIENCY
        moe = [ci for ci, cls in enumerate(P.classes) if cls.costs[0].expert_params > 0]

        T = M.new_int_var(0, 2**50, "T")
        d = M.new_int_var(0, 2**50, "d")
        o = M.new_int_var(0, 2**50, "o")
        slack: Terms = []
        slack_c = 0.0
        self.t = []
        for i in range(pp):
            dense, dense_c = self.stage_terms(i, lambda x: x.dense_params)
            expert, expert_c = self.stage_terms(i, lambda x: x.expert_params)
            has_expert = 1 if expert_c else 0
            if moe and not expert_c:
                has_expert = M.new_bool_var(f"has_expert[{i}]")
                M.add_max_equality(has_expert, [self.present[i, ci] for ci in moe])

            # (M) memory of stage i
            inflight = in_flight_micro_batches(i, pp, m, v)
            stored, stored_c = self.stage_terms(i, lambda x: x.act_stored_bytes)
            working = M.new_int_var(0, 2**52, f"working[{i}]")  # largest working set x alpha
            for ci, cls in enumerate(P.classes):
                for ri, cost in enumerate(cls.costs):
                    if cost.act_working_bytes > 0:
                        M.add(working >= math.ceil(alpha * cost.act_working_bytes) * self.u[i, ci, ri])
            for cost in self.fixed(i):
                M.add(working >= math.ceil(alpha * cost.act_working_bytes))
            mem = (self.bytes_lin(dense, dense_bpp) + self.bytes_lin(expert, expert_bpp)
                   + self.bytes_lin(stored, inflight * alpha) + working)
            if zero >= 3:  # gathered weights of the current and next layer
                largest = M.new_int_var(0, 2**52, f"largest[{i}]")
                factor = 2 * state.weights * alpha
                for ci, cls in enumerate(P.classes):
                    M.add(largest >= math.ceil(factor * cls.costs[0].dense_params) * self.present[i, ci])
                for cost in self.fixed(i):
                    M.add(largest >= math.ceil(factor * cost.dense_params))
                mem += largest
            const = (dense_c * dense_bpp + expert_c * expert_bpp + inflight * alpha * stored_c
                     + alpha * buffers + ctx.cluster.gpu.reserve_gib * GIB)
            M.add(mem <= capacity - math.ceil(const))

            # stage time per micro-batch, with (Z) the exposed ZeRO-2/3 traffic
            time_terms, time_c = self.stage_terms(i, lambda x: x.time_s)
            stage = self.time_lin(time_terms) + self.ticks(time_c + p2p_s)
            if per_mb_sync:
                # reduce-scatter of gradients (all-gathers of weights too for ZeRO-3), dense
                # over dp x cp and routed experts over dp x cp / ep
                slope = rs_mb[0] * state.grad_reduce_bytes
                inter = rs_mb[1]
                e_slope = ers_mb[0] * state.grad_reduce_bytes
                e_inter = ers_mb[1]
                if zero >= 3:
                    slope += 2 * ag[0] * state.weights
                    inter += 2 * ag[1]
                    e_slope += 2 * eag[0] * state.weights
                    e_inter += 2 * eag[1]
                traffic = self.time_lin(dense, slope) + self.ticks(dense_c * slope + inter)
                if moe or expert_c:
                    traffic += (self.time_lin(expert, e_slope) + self.ticks(expert_c * e_slope)
                                + self.ticks(e_inter) * has_expert)
                comp, comp_c = self.stage_terms(i, lambda x: x.fwd_s + x.bwd_s)
                e = M.new_int_var(0, 2**50, f"e[{i}]")
                M.add(e >= traffic - self.time_lin(comp) - self.ticks(comp_c))
                stage += e
            t = M.new_int_var(0, 2**50, f"t[{i}]")
            M.add(t == stage)
            M.add(T >= t)
            self.t.append(t)

            # (D) data-parallel sync of stage i, hidden behind backward (and earlier stages'
            # backward still running) and the next forward
            bwd, bwd_c = self.stage_terms(i, lambda x: x.bwd_s + x.recompute_s)
            fwd, fwd_c = self.stage_terms(i, lambda x: x.fwd_s)
            reduce = gather = 0
            if zero < 3:
                if not per_mb_sync:
                    k = rs[0] * state.grad_reduce_bytes
                    reduce = self.time_lin(dense, k) + self.ticks(dense_c * k + rs[1])
                k = ag[0] * state.weights
                gather = self.time_lin(dense, k) + self.ticks(dense_c * k + ag[1])
                if moe or expert_c:
                    if not (zero == 2 and n_dense > 1):
                        k = ers[0] * state.grad_reduce_bytes
                        reduce += (self.time_lin(expert, k) + self.ticks(expert_c * k)
                                   + self.ticks(ers[1]) * has_expert)
                    k = eag[0] * state.weights
                    gather += (self.time_lin(expert, k) + self.ticks(expert_c * k)
                               + self.ticks(eag[1]) * has_expert)
            hidden = self.time_lin(slack) + self.ticks(slack_c)
            if ctx.options.overlap_grad_reduce:
                hidden += self.time_lin(bwd) + self.ticks(bwd_c)
            hidden_gather = (self.time_lin(fwd) + self.ticks(fwd_c)
                             if ctx.options.overlap_param_gather else 0)
            exposed_r = M.new_int_var(0, 2**50, f"exposed_reduce[{i}]")
            exposed_g = M.new_int_var(0, 2**50, f"exposed_gather[{i}]")
            M.add(exposed_r >= reduce - hidden)
            M.add(exposed_g >= gather - hidden_gather)
            M.add(d >= exposed_r + exposed_g)
            slack += bwd
            slack_c += bwd_c

            # (O) optimizer step over the parameters this GPU updates
            kd = (1.0 / n_dense if zero >= 1 else 1.0) * OPTIMIZER_BYTES_PER_PARAM / hbm
            ke = (1.0 / n_expert if zero >= 1 else 1.0) * OPTIMIZER_BYTES_PER_PARAM / hbm
            M.add(o >= self.time_lin(dense, kd) + self.time_lin(expert, ke)
                  + self.ticks(dense_c * kd + expert_c * ke))

        # redundant cut: the slowest stage is at least the average (tightens the relaxation)
        M.add(pp * T >= sum(self.t))
        self.objective = (m * v - 1) * T + sum(self.t) + v * (d + o)
        M.minimize(self.objective)
        if self.cutoff_s is not None:
            M.add(self.objective <= self.ticks((self.cutoff_s - self.constant_s()) * v))

    def constant_s(self) -> float:
        """Step-time terms no decision changes (the tied-embedding gradient all-reduce)."""
        return embedding_sync_s(self.ctx)

    def to_seconds(self, objective: float) -> float:
        return objective * self.scale_s / self.c.virtual_stages + self.constant_s()

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
                ri = cls.options.index(placement.recompute[index]) \
                    if placement.recompute[index] in cls.options else 0
                key = (placement.stage[index], ci, ri)
                counts[key] = counts.get(key, 0) + 1
        return counts

    def placement(self, solver: cp_model.CpSolver) -> LayerPlacement:
        model = self.ctx.model
        stage = [0] * len(model.layers)
        recompute = [Recompute.NONE] * len(model.layers)
        c, L = self.c, self.p.num_blocks
        for ci, cls in enumerate(self.p.classes):
            blocks = range(cls.first_block, cls.first_block + cls.count)
            for i in range(c.pp):
                if c.virtual_stages > 1:
                    mine = [blk for blk in blocks
                            if interleaved_rank(blk, L, c.pp, c.virtual_stages) == i]
                else:  # contiguous: this stage's share follows the previous stages' shares
                    done = sum(solver.value(self.x[j, ci]) for j in range(i))
                    mine = list(blocks)[done:done + solver.value(self.x[i, ci])]
                # within a stage, the heaviest recomputation goes first (any order costs the same)
                options = [cls.options[ri]
                           for ri in sorted(range(len(cls.options)), key=lambda r: -_ORDER[cls.options[r]])
                           for _ in range(solver.value(self.n[i, ci, ri]))]
                for blk, option in zip(mine, options):
                    index = cls.start + (blk - cls.first_block)
                    stage[index] = i
                    recompute[index] = option
        for index in self.p.post:
            stage[index] = self.c.pp - 1
        return LayerPlacement(tuple(stage), tuple(recompute))


_ORDER = {Recompute.FULL: 2, Recompute.SELECTIVE: 1, Recompute.NONE: 0}
_STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE",
           cp_model.INFEASIBLE: "INFEASIBLE", cp_model.MODEL_INVALID: "MODEL_INVALID",
           cp_model.UNKNOWN: "UNKNOWN"}


def solve_stages(problem: StageProblem, *, hint: LayerPlacement | None = None,
                 cutoff_s: float | None = None, workers: int = 1, seed: int = 0,
                 max_time_s: float = 10.0, deterministic_time: float = 5.0) -> InnerResult:
    """Solve one outer configuration exactly (within the limits)."""
    builder = _Builder(problem, cutoff_s)
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
        return InnerResult(status, builder.placement(solver),
                           builder.to_seconds(solver.objective_value),
                           builder.to_seconds(solver.best_objective_bound),
                           builder.scale_s, solver.wall_time)
    bound = math.inf if code == cp_model.INFEASIBLE else 0.0
    return InnerResult(status, None, math.inf, bound, builder.scale_s, solver.wall_time)
