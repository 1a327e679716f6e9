"""The per-stage constraints of the placement CP-SAT models: one source for the one-pool model
(:mod:`planner.solve.inner`) and the model across pools (:mod:`planner.hetero.ilp`).

Consumes a CP-SAT model, the tick (seconds per objective unit), the pipeline depth and one
:class:`~planner.solve.costs.StageProblem` per pool (one on a one-pool cluster), plus the
decision variables the caller made: ``a[i,p]`` stage i runs on pool p (the constant 1 on one
pool), ``x[i,c]`` blocks of class c in stage i, ``adj[i]`` stage i is next to a pool crossing
(constant 0 on one pool) and per-stage slowdown factors. It creates the option counts and adds
per stage (labels as in :mod:`planner.solve.inner`):

  (M) memory <= the capacity of the stage's pool: state bytes + in-flight x stored activations
      + the largest working set + the largest ZeRO-3 gather buffer + buffers + reserve
  (Z) ZeRO-2/3 exposed per-micro-batch traffic, per phase, with NCCL's slowdown kappa
  (T) t[i] = stage time per micro-batch x slowdown; T >= t[i]
  (D) data-parallel exposure d >= (1 - kappa)((reduce - hidden)^+ + (gather - fwd)^+)
      + kappa (reduce + gather), hidden = this and earlier stages' backward
  (O) optimizer step o >= the stage's optimizer time x slowdown

Every coefficient is a :class:`~planner.cost.terms.LayerTerms` field or a
:class:`~planner.cost.terms.ConfigTerms` constant of the stage's pool; the combinators are the
sums, maxima and ``(.)^+`` that ``planner.cost.terms.stage_memory / stage_time / step_time``
apply in floats. A stage's quantity is ``sum_p (pool p's coefficients . q[i,c,r,p]) +
sum_p a[i,p] (pool p's constants)`` with ``q[i,c,r,p] = n[i,c,r]`` if ``a[i,p]`` else 0; a stage
next to a crossing adds, for its pool, the crossing's ConfigTerms minus the in-pool ones.
Seconds become ticks (rounded), bytes are rounded up (never under-estimates memory).

``drop`` names terms read as zero: only the mutation test (tests/test_cost_terms.py) uses it.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from ortools.sat.python import cp_model

from planner.cost.terms import (BWD_HIDING_TERMS, FWD_HIDING_TERMS, NO_COMM, Affine,
                                ConfigTerms, LayerTerms)
from planner.solve.costs import StageProblem
from planner.strategy import NO_OPTION, LayerPlacement

TIME_TERMS = ("fwd_s", "bwd_s", "recompute_s", "comm_s")
STATE_TERMS = ("params_bytes", "grads_bytes", "optimizer_bytes")
BIG = 2**50


def blocks_in(model: cp_model.CpModel, x, b: Sequence, i: int, ci: int, cls, num_blocks: int):
    """x = |[b[i], b[i+1]) n [first, first + count)|: class ``cls``'s blocks in stage i of
    contiguous stages with boundaries ``b``."""
    top = model.new_int_var(0, num_blocks, f"top[{i},{ci}]")
    model.add_min_equality(top, [b[i + 1], cls.first_block + cls.count])
    bot = model.new_int_var(0, num_blocks, f"bot[{i},{ci}]")
    model.add_max_equality(bot, [b[i], cls.first_block])
    model.add_max_equality(x, [top - bot, 0])


def both(model: cp_model.CpModel, x, y, name: str):
    """x AND y for a bool (or constant 0/1) pair, as an expression to charge or bound with."""
    if isinstance(x, int):
        return y if x else 0
    if isinstance(y, int):
        return x if y else 0
    z = model.new_bool_var(name)
    model.add(z >= x + y - 1)
    return z


class StageModel:
    """The stage constraints over ``P`` pools; ``a``, ``adj`` and ``slowdown`` are set by the
    caller before :meth:`add_options` / :meth:`add_stage`."""

    def __init__(self, model: cp_model.CpModel, scale_s: float, pp: int,
                 problems: Sequence[StageProblem],
                 crossing: Sequence[ConfigTerms | None] | None = None,
                 drop: frozenset[str] = frozenset()):
        self.model = model
        self.scale_s = scale_s
        self.pp = pp
        self.problems = list(problems)
        self.P = len(self.problems)
        self.crossing = list(crossing) if crossing is not None else [None] * self.P
        self.drop = drop
        self.classes = self.problems[0].classes
        first = self.problems[0].terms
        for prob in self.problems[1:]:  # runtime behaviour is one setting for all pools
            for name in ("per_micro_batch_sync", "overlap_grad_reduce", "overlap_param_gather",
                         "comm_slowdown"):
                if getattr(prob.terms, name) != getattr(first, name):
                    raise ValueError(f"pools differ in {name}")
        self.a: dict = {}  # (i, p) -> 0/1 or BoolVar
        self.adj: list = [0] * pp  # stage next to a pool crossing: 0/1 or BoolVar
        self.slowdown: list[float] = [1.0] * pp
        self.stage_factor = 1.0  # every stage time's factor (terms.stage_time's chunk excess)
        self.n: dict = {}  # (i, c, r) -> blocks of class c with option r in stage i
        self.q: dict = {}  # (i, c, r, p) -> n[i,c,r] if stage i is on pool p else 0
        self.u: dict = {}  # (i, c, r) -> n[i,c,r] >= 1 (only where a working set exists)
        self.present: dict = {}  # (i, c) -> x[i,c] >= 1
        self.peak = None  # an IntVar >= every stage's memory (bytes) when the caller sets one
        # (non-block layer, option index) -> its one-hot indicator, set by the caller when the
        # embedding / head choose a layout (planner.solve.inner); absent: their one option
        self.e: dict = {}

    # -- reading terms ---------------------------------------------------------------------
    def lt(self, cost: LayerTerms, names: tuple[str, ...]) -> float:
        """The sum of the named LayerTerms fields of ``cost`` (dropped ones read as zero)."""
        return sum(0.0 if name in self.drop else getattr(cost, name) for name in names)

    def ct(self, terms: ConfigTerms, name: str):
        """A ConfigTerms field (zero of its type when dropped)."""
        value = getattr(terms, name)
        if name not in self.drop:
            return value
        if isinstance(value, Affine):
            return NO_COMM
        if isinstance(value, tuple):  # (tuples of pieces drop to none)
            return tuple(0.0 for _ in value if not isinstance(_, tuple))
        return 0.0

    def terms(self, p: int, crossing: bool = False) -> ConfigTerms:
        """Pool p's ConfigTerms: of a stage inside the pool, or of one next to a crossing."""
        cross = self.crossing[p]
        return cross if crossing and cross is not None else self.problems[p].terms

    def costs(self, p: int, ci: int) -> tuple[LayerTerms, ...]:
        return self.problems[p].classes[ci].costs

    def fixed(self, p: int, i: int) -> list[tuple[object, LayerTerms]]:
        """(indicator, terms) of every option of the non-block layers of stage i (embedding on
        the first, head on the last): the int 1 for a layer with one option, else its one-hot
        indicator ``e`` (one pool only)."""
        prob = self.problems[p]
        head = prob.terms.head_stage % self.pp  # -1: the last stage; a V placement: 0
        indices = (prob.pre if i == 0 else ()) + (prob.post if i == head else ())
        out = []
        for index in indices:
            choices = prob.edge_choices(index)
            if len(choices) == 1:
                out.append((1, choices[0][1]))
                continue
            if self.P > 1:
                raise ValueError("embedding and head layouts are a one-pool choice")
            out += [(self.e[index, k], cost) for k, (_, cost) in enumerate(choices)]
        return out

    def ticks(self, seconds: float) -> int:
        return int(round(seconds / self.scale_s))

    # -- linear expressions of a stage -----------------------------------------------------
    def _factor(self, factor, p: int) -> float:
        return factor(p) if callable(factor) else factor

    def _linear(self, i: int, names: tuple[str, ...], factor, unit: Callable[[float], int]):
        """sum over pools, classes and options of unit(term x factor) q[i,c,r,p], plus the
        stage's fixed layers' unit(sum x factor) a[i,p] (the int 0 when it has no term). One
        weighted sum (the same linear expression as adding the terms one by one, built in a
        third of the time: most of a CP-SAT model's build is these sums)."""
        variables, coefficients, offset = [], [], 0
        for p in range(self.P):
            k_p = self._factor(factor, p)
            for ci in range(len(self.classes)):
                for ri, cost in enumerate(self.costs(p, ci)):
                    k = unit(self.lt(cost, names) * k_p)
                    if k and (i, ci, ri, p) in self.q:
                        variables.append(self.q[i, ci, ri, p])
                        coefficients.append(k)
            const = 0.0
            for ind, x in self.fixed(p, i):
                if isinstance(ind, int):
                    const += self.lt(x, names)
                else:  # a chosen option (one pool: a[i,p] = 1)
                    k = unit(self.lt(x, names) * k_p)
                    if k:
                        variables.append(ind)
                        coefficients.append(k)
            if const:
                a = self.a[i, p]
                if isinstance(a, int):  # one pool: the constant 1
                    offset += unit(const * k_p) * a
                else:
                    variables.append(a)
                    coefficients.append(unit(const * k_p))
        if not variables:
            return offset
        expr = cp_model.LinearExpr.weighted_sum(variables, coefficients)
        return expr + offset if offset else expr

    def time(self, i: int, names: tuple[str, ...], factor: float | Callable = 1.0):
        """Ticks of the named time terms of stage i (its pool's coefficients) x factor."""
        return self._linear(i, names, factor, self.ticks)

    def nbytes(self, i: int, names: tuple[str, ...], factor: float | Callable = 1.0):
        """Bytes of the named terms of stage i, each coefficient rounded up."""
        return self._linear(i, names, factor, math.ceil)

    def pool_const(self, i: int, value: Callable[[ConfigTerms], float], factor: float = 1.0):
        """Ticks of sum_p a[i,p] value(pool p's terms), plus next to a crossing the crossing's
        value minus the in-pool one."""
        expr = 0
        for p in range(self.P):
            k = self.ticks(value(self.terms(p)) * factor)
            if k:
                expr += k * self.a[i, p]
            delta = self.ticks((value(self.terms(p, True)) - value(self.terms(p))) * factor)
            if delta:
                expr += delta * both(self.model, self.a[i, p], self.adj[i], f"ex[{i},{p}]")
        return expr

    def gated(self, i: int, ticks: Sequence[int], indicator, name: str):
        """sum_p ticks[p] (a[i,p] AND indicator): a per-pool amount charged when ``indicator``."""
        if all(k == ticks[0] for k in ticks):
            return ticks[0] * indicator if ticks[0] else 0
        return sum(k * both(self.model, self.a[i, p], indicator, f"{name}[{i},{p}]")
                   for p, k in enumerate(ticks) if k)

    def at_least(self, var, i: int, amounts: Sequence[int], indicator, name: str) -> None:
        """var >= amounts[p] when stage i is on pool p and ``indicator`` holds (a maximum)."""
        if all(k == amounts[0] for k in amounts):
            if amounts[0]:
                self.model.add(var >= amounts[0] * indicator)
            return
        for p, k in enumerate(amounts):
            if k:
                self.model.add(var >= k * both(self.model, self.a[i, p], indicator,
                                               f"{name}[{i},{p}]"))

    # -- variables -------------------------------------------------------------------------
    def add_options(self, i: int, ci: int, x) -> None:
        """present[i,c], and per option n[i,c,r] (summing to x), u[i,c,r] and the pool shares
        q[i,c,r,p] of stage i's class-c blocks; ``a`` must be set."""
        M, cls = self.model, self.classes[ci]
        present = M.new_bool_var(f"present[{i},{ci}]")
        M.add(x <= cls.count * present)
        M.add(x >= present)
        self.present[i, ci] = present
        for ri, option in enumerate(cls.options):
            n = M.new_int_var(0, cls.count, f"n[{i},{ci},{option.name}]")
            self.n[i, ci, ri] = n
            if max(self.lt(self.costs(p, ci)[ri], ("act_working_bytes",))
                   for p in range(self.P)) > 0:  # only then is "used" needed
                u = M.new_bool_var(f"u[{i},{ci},{option.name}]")
                M.add(n <= cls.count * u)
                self.u[i, ci, ri] = u
            shares = []
            for p in range(self.P):
                a = self.a[i, p]
                if isinstance(a, int):
                    if a:
                        self.q[i, ci, ri, p] = n
                    continue
                q = M.new_int_var(0, cls.count, f"q[{i},{ci},{option.name},{p}]")
                M.add(q <= cls.count * a)
                self.q[i, ci, ri, p] = q
                shares.append(q)
            if shares:
                M.add(sum(shares) == n)
        M.add(sum(self.n[i, ci, ri] for ri in range(len(cls.options))) == x)

    def has_expert(self, i: int):
        """Stage i holds routed experts (a bool, or a constant)."""
        if any(x.expert_params > 0 for p in range(self.P) for _, x in self.fixed(p, i)):
            return 1
        moe = [ci for ci, cls in enumerate(self.classes) if cls.costs[0].expert_params > 0]
        if not moe:
            return 0
        var = self.model.new_bool_var(f"has_expert[{i}]")
        self.model.add_max_equality(var, [self.present[i, ci] for ci in moe])
        return var

    # -- constraints of one stage ----------------------------------------------------------
    def add_stage(self, i: int, T_var, d, o, slack, extra_time=0):
        """Adds (M), (Z), (T), (D), (O) of stage i; returns (t[i], slack for the next stage:
        the backward ticks of stages 0..i). ``extra_time``: further ticks of the stage's time
        per micro-batch (the one-pool model's resharding edges)."""
        M, P, f = self.model, self.P, self.slowdown[i]
        ct, inner = self.ct, [self.terms(p) for p in range(P)]
        has_expert = self.has_expert(i)

        def intercept(t: ConfigTerms, names: tuple[str, ...]) -> float:
            return sum(ct(t, name).intercept_s for name in names)

        def charged(slope, dense, expert, factor=1.0, expert_share=1.0):
            """A stage's collective ticks: slope terms + each group's latency intercept
            (``expert_share`` of the experts': the forward's half of a ZeRO-3 gather)."""
            out = self.time(i, slope, factor)
            out += self.pool_const(i, lambda t: intercept(t, dense), factor)
            return out + self.gated(i, [self.ticks(intercept(t, expert) * expert_share * factor)
                                        for t in inner], has_expert, f"he_{slope[0]}")

        # (M) memory of stage i against its pool's capacity
        alpha = [1.0 + ct(t, "allocator_overhead") for t in inner]
        in_flight = [ct(t, "in_flight")[i] for t in inner]
        working = M.new_int_var(0, 2**52, f"working[{i}]")  # the largest working set x alpha
        for (si, ci, ri), u in self.u.items():
            if si == i:
                self.at_least(working, i, [math.ceil(alpha[p] * self.lt(
                    self.costs(p, ci)[ri], ("act_working_bytes",))) for p in range(P)], u,
                    f"wk{ci}_{ri}")
        gather = M.new_int_var(0, 2**52, f"gather_buffer[{i}]")  # the largest ZeRO-3 gather
        for ci in range(len(self.classes)):
            self.at_least(gather, i, [max(math.ceil(alpha[p] * self.lt(x, ("gather_buffer_bytes",)))
                                          for x in self.costs(p, ci)) for p in range(P)],
                          self.present[i, ci], f"gb{ci}")
        for p in range(P):
            for ind, cost in self.fixed(p, i):
                for var, name in ((working, "act_working_bytes"), (gather, "gather_buffer_bytes")):
                    k = math.ceil(alpha[p] * self.lt(cost, (name,)))
                    if k:
                        M.add(var >= k * (self.a[i, p] if isinstance(ind, int) else ind))
        mem = (self.nbytes(i, STATE_TERMS)
               + self.nbytes(i, ("act_stored_bytes",), lambda p: in_flight[p] * alpha[p])
               + working + gather)
        fixed_bytes = [math.ceil(alpha[p] * ct(t, "buffer_bytes") + ct(t, "reserve_bytes"))
                       for p, t in enumerate(inner)]
        # the capacity a stage may fill: its pool's GPU memory less the search's headroom
        room = sum((math.floor(self.problems[p].memory_limit_bytes) - fixed_bytes[p])
                   * self.a[i, p] for p in range(P))
        M.add(mem <= room)
        if self.peak is not None:
            M.add(self.peak >= mem + sum(k * self.a[i, p] for p, k in enumerate(fixed_bytes)))
        host = self.nbytes(i, ("host_bytes",))
        if not isinstance(host, int) and P == 1:  # offloaded states: the GPU's host share
            for p, t in enumerate(inner):
                if math.isfinite(t.host_capacity_bytes):
                    M.add(host <= math.floor(t.host_capacity_bytes))

        # (T) stage time per micro-batch (x slowdown), with (Z) the exposed ZeRO-2/3 traffic
        ft = f * self.stage_factor
        stage = self.time(i, TIME_TERMS, ft) + self.pool_const(
            i, lambda t: ct(t, "boundary_s") + ct(t, "micro_batch_overhead_s"), ft) + extra_time
        kappa = ct(inner[0], "comm_slowdown")
        zero_dense = ("zero_reduce_dense", "zero_gather_dense")
        zero_expert = ("zero_reduce_expert", "zero_gather_expert")
        if inner[0].per_micro_batch_sync:
            # per phase (terms.stage_time): forward gathers behind the forward, the rest behind
            # backward + recompute, one layer's edge; x (1 - kappa), plus kappa x the traffic
            keep = (1.0 - kappa) * ft
            total = charged(("zero_traffic_s",), zero_dense, zero_expert, keep)
            fwd = charged(("zero_fwd_traffic_s",), ("zero_gather_fwd_dense",),
                          ("zero_gather_expert",), keep, expert_share=0.5)
            e_f = M.new_int_var(0, BIG, f"e_fwd[{i}]")
            M.add(e_f >= fwd - self.time(i, FWD_HIDING_TERMS, keep))
            e_b = M.new_int_var(0, BIG, f"e_bwd[{i}]")
            M.add(e_b >= total - fwd - self.time(i, BWD_HIDING_TERMS, keep))
            edge = M.new_int_var(0, BIG, f"edge[{i}]")
            for ci in range(len(self.classes)):
                self.at_least(edge, i, [max(self.ticks(keep * self.lt(x, ("zero_edge_s",)))
                                            for x in self.costs(p, ci)) for p in range(P)],
                              self.present[i, ci], f"edge{ci}")
            for p in range(P):
                for ind, cost in self.fixed(p, i):
                    k = self.ticks(keep * self.lt(cost, ("zero_edge_s",)))
                    if k:
                        M.add(edge >= k * (self.a[i, p] if isinstance(ind, int) else ind))
            stage += e_f + e_b + edge
            if kappa:
                stage += charged(("zero_traffic_s",), zero_dense, zero_expert, kappa * ft)
        t = M.new_int_var(0, BIG, f"t[{i}]")
        M.add(t == stage)
        M.add(T_var >= t)

        # (D) data-parallel sync of stage i, hidden behind its backward (and earlier stages'
        # backward still running) and the next forward; a straggler's fabric is not slower
        bwd = self.time(i, BWD_HIDING_TERMS)
        reduce = charged(("dp_reduce_s",), ("dp_reduce_dense",), ("dp_reduce_expert",))
        gather_s = charged(("dp_gather_s",), ("dp_gather_dense",), ("dp_gather_expert",))
        hidden = slack + (bwd if inner[0].overlap_grad_reduce else 0)
        hidden_gather = (self.time(i, FWD_HIDING_TERMS)
                         if inner[0].overlap_param_gather else 0)
        exposed_r = M.new_int_var(0, BIG, f"exposed_reduce[{i}]")
        exposed_g = M.new_int_var(0, BIG, f"exposed_gather[{i}]")
        M.add(exposed_r >= reduce - hidden)
        M.add(exposed_g >= gather_s - hidden_gather)
        if kappa:  # d >= (1 - kappa) e + kappa (reduce + gather), in ticks x 1000
            M.add(1000 * d >= int(round(1000 * (1 - kappa))) * (exposed_r + exposed_g)
                  + int(round(1000 * kappa)) * (reduce + gather_s))
        else:
            M.add(d >= exposed_r + exposed_g)

        # (O) optimizer step over the parameters this GPU updates (x slowdown)
        M.add(o >= self.time(i, ("optimizer_s",), f))
        return t, slack + bwd


def decode_placement(problem: StageProblem, pp: int, x: Callable[[int, int], int],
                     n: Callable[[int, int, int], int],
                     ranks: Sequence[int] | None = None,
                     edge_option: Callable[[int], object] | None = None) -> LayerPlacement:
    """The LayerPlacement of a solution: ``x(i, c)`` blocks of class c in stage i (contiguous,
    in stage order; where ``ranks`` fixes each block's rank, on it: interleaved chunks, an
    explicit pipeline layout, StageProblem.block_ranks), ``n(i, c, r)`` of them with
    option r (the heaviest recomputation first, then the activation-offloading blocks, as
Megatron-Core offloads the first N layers: any order in a stage costs the same);
    ``edge_option(j)``: the option of non-block layer j (default: NO_OPTION)."""
    layers = problem.ctx.model.layers
    stage, options = [0] * len(layers), [NO_OPTION] * len(layers)
    for ci, cls in enumerate(problem.classes):
        blocks = list(range(cls.first_block, cls.first_block + cls.count))
        done = 0
        for i in range(pp):
            if ranks is not None:
                mine = [blk for blk in blocks if ranks[blk] == i]
            else:  # contiguous: this stage's share follows the previous stages' shares
                mine = blocks[done:done + x(i, ci)]
                done += len(mine)
            chosen = [cls.options[ri]
                      for ri in sorted(range(len(cls.options)),
                                       key=lambda r: (-cls.options[r].memory_rank,
                                                      not cls.options[r].act_offload))
                      for _ in range(n(i, ci, ri))]
            for blk, option in zip(mine, chosen):
                index = cls.start + (blk - cls.first_block)
                stage[index] = i
                options[index] = option
    for index in problem.post:
        stage[index] = problem.terms.head_stage % pp
    if edge_option is not None:
        for index in problem.pre + problem.post:
            options[index] = edge_option(index)
    return LayerPlacement(tuple(stage), tuple(options))
