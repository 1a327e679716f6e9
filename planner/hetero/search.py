"""The search across pools: enumerate configurations, bound them, solve the promising ones with
the stage-to-pool CP-SAT model, and prove the best one optimal within the cost model.

Consumes a model, a cluster (multi-pool, or one pool), the training inputs, pins and
:class:`~planner.solve.search.SearchOptions`; produces a :class:`HeteroSearchResult`.

Search space (documented like :mod:`planner.solve.space`): tp a divisor of every pool's GPUs per
node that divides the heads (TP stays inside a node of any pool); cp as in one pool; dp a
divisor of the global batch whose stage (tp x cp x dp GPUs) fits the cluster; pp the number of
stages some set of pools can host (sum over the set of floor(GPUs / stage size), at most the
blocks): all pools, each pool alone, every subset -- so the plans that use only the faster pool
are in the space -- and, beyond every pool's whole stages, the pp that **split stages** make
possible (a stage whose data-parallel replicas sit on two pools, :mod:`planner.hetero.layout`:
:func:`split_shapes` fill the GPUs whole stages leave over, one split stage of a shape per
plan; offered only for such pp, since with enough whole-stage slots a split stage is never
better); micro-batch divisors up to 16, ZeRO 0-3, SP on/off; 1F1B (no interleaving: chunks would
be equal, stages on different GPUs are not). Dense models only (experts across pools: not yet).

Bounds: with ``W_p`` the least work of the whole model per micro-batch on pool p (every block at
its fastest option), a stage on p covers at most ``T / W_p`` of the model, so the slowest stage
``T >= 1 / R`` with R the sum of the pp largest ``1 / W_p`` over the stage slots; the sum of
stage times is at least ``min_p W_p``; both plus the least boundary time per stage. Memory: the
stage average of states and one micro-batch of activations plus the least reserve must fit the
largest pool memory. A candidate whose bound is not below the incumbent is skipped, so a search
that ends within its time limit is OPTIMAL within the cost model. Two passes: each candidate
first gets a short CP-SAT budget (so that one hard proof does not delay the incumbent that
prunes the rest); the unproven ones are solved again, with the full budget, against the best
plan (the certificate needs that none of them beats it; runners-up are the best plans the
first pass found for their configurations, not proven optima of them). Each CP-SAT model also gets the memory bound's least slowest-stage time as a cut
(``T >= slowest_stage_bound``): valid for every placement, and it closes the proofs that the
model's own relaxation leaves open.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from itertools import combinations

import ortools

from planner.config import ParallelConfig, check_seq_len
from planner.errors import ErrorKind, PlannerError, invalid
from planner.hardware import Cluster, MultiPoolCluster
from planner.hetero.bounds import (cheap_bounds, memory_time_bound, quick_bounds,
                                   slowest_stage_bound)
from planner.hetero.evaluate import HeteroEvaluation, hetero_evaluate
from planner.hetero.ilp import solve_pools
from planner.hetero.terms import pool_terms
from planner.ir import ModelGraph
from planner.solve.search import SearchOptions
from planner.solve.space import MAX_MICRO_BATCH, Pins, _divisors, default_choices
from planner.strategy import BLOCK_OPTIONS, LayerOption, Recompute


# CP-SAT deterministic time per configuration in the first pass (see hetero_search)
FIRST_PASS_DETERMINISTIC_TIME = 0.1


@dataclass
class HeteroSearchResult:
    best: HeteroEvaluation
    alternatives: list[HeteroEvaluation]
    record: dict = field(default_factory=dict)


def _stand_in(cluster: Cluster | MultiPoolCluster, config: ParallelConfig) -> Cluster:
    """A one-pool cluster of exactly ``config.num_gpus`` GPUs of the first pool's type: what
    ParallelConfig.validate checks degrees against (pool capacities are checked here)."""
    pool = cluster.pools[0]
    return replace(pool.as_cluster(), gpus_per_node=1, num_nodes=config.num_gpus)


def stage_counts(cluster, size: int, blocks: int) -> list[int]:
    """Every pp some non-empty set of pools can host with stages of ``size`` GPUs."""
    slots = [p.num_gpus // size for p in cluster.pools]
    out = set()
    for k in range(1, len(slots) + 1):
        for subset in combinations(slots, k):
            total = sum(subset)
            if 1 <= total <= blocks:
                out.add(total)
    return sorted(out)


def pure_slots(cluster, size: int) -> int:
    """Stages of ``size`` GPUs the pools can host, each stage on one pool."""
    return sum(p.num_gpus // size for p in cluster.pools)


def split_shapes(cluster, tp: int, cp: int, dp: int) -> list[tuple[tuple[str, int], ...]]:
    """The split stage shapes offered for a stage of ``tp x cp x dp`` GPUs: for every two pools
    A before B, the replicas that fill the GPUs A's whole stages leave over (all of A when no
    stage fits it), the rest on B; and the same with A and B swapped in role."""
    s, size = tp * cp, tp * cp * dp
    out = []
    for a, b in combinations(cluster.pools, 2):
        firsts = set()
        for pool, on_a in ((a, True), (b, False)):
            left = pool.num_gpus % size if size <= pool.num_gpus else pool.num_gpus
            if left % s or not left:
                continue
            d = min(left // s, dp)
            firsts.add(d if on_a else dp - d)
        for d in sorted(firsts):
            if 0 < d < dp and d * s <= a.num_gpus and (dp - d) * s <= b.num_gpus:
                out.append(((a.name, d), (b.name, dp - d)))
    return out


def split_stage_counts(cluster, tp: int, cp: int, dp: int, blocks: int) -> list[int]:
    """The pp beyond every pure stage slot that split stages make possible: one split stage of
    a shape (it fills the GPUs the whole stages leave over) plus the whole stages its pools'
    remaining GPUs hold (and the other pools')."""
    s, size = tp * cp, tp * cp * dp
    most = pure_slots(cluster, size)
    pools = {p.name: p for p in cluster.pools}
    out = set()
    for shares in split_shapes(cluster, tp, cp, dp):
        others = sum(p.num_gpus // size for p in cluster.pools if p.name not in dict(shares))
        pp = 1 + others + sum((pools[p].num_gpus - d * s) // size for p, d in shares)
        if most < pp <= blocks:
            out.add(pp)
    return sorted(out)


def config_splits(cluster, config: ParallelConfig) -> list[tuple[tuple[str, int], ...]]:
    """The split stage shapes a configuration may use: only where whole stages cannot make its
    pp (otherwise a split stage is never better: it runs at its slower share's pace, reduces
    over the slower inter-pool link and has the smaller memory)."""
    c = config
    if len(cluster.pools) < 2 or c.pp <= pure_slots(cluster, c.tp * c.cp * c.dp):
        return []
    return split_shapes(cluster, c.tp, c.cp, c.dp)


def enumerate_hetero_configs(model: ModelGraph, cluster, global_batch: int, seq_len: int,
                             dtype: str, pins: Pins = Pins(), runtime=None):
    """The configurations across pools; ``runtime`` (a RuntimeProfile) keeps only what that
    runtime can run, by the rules of planner.solve.space.enumerate_configs."""
    blocks = model.num_blocks
    heads = min((b.attention.num_heads for b in model.blocks() if b.attention), default=1)
    gpn = math.gcd(*[p.gpus_per_node for p in cluster.pools])
    largest = max(p.num_gpus for p in cluster.pools)
    total = sum(p.num_gpus for p in cluster.pools)
    tps, cps, zeros = default_choices([t for t in _divisors(gpn) if heads % t == 0], seq_len,
                                      pins, runtime)
    for tp in ([pins.tp] if pins.tp else tps):
        for cp in ([pins.cp] if pins.cp else cps):
            for dp in ([pins.dp] if pins.dp else _divisors(global_batch)):
                size = tp * cp * dp
                if size > total or global_batch % dp:
                    continue
                counts = stage_counts(cluster, size, blocks) if size <= largest else []
                counts = sorted(set(counts) | set(split_stage_counts(cluster, tp, cp, dp,
                                                                     blocks)))
                if runtime is not None and not runtime.pp:
                    counts = [c for c in counts if c == 1]
                for pp in ([pins.pp] if pins.pp else counts):
                    for mbs in ([pins.micro_batch] if pins.micro_batch else
                                [b for b in _divisors(global_batch // dp) if b <= MAX_MICRO_BATCH]):
                        if global_batch % (dp * mbs):
                            continue
                        sps = [True, False] if tp > 1 else [False]
                        if runtime is not None and tp > 1 and runtime.sp != "optional":
                            sps = [runtime.sp == "with-tp"]
                        for zero in ([pins.zero] if pins.zero is not None else zeros):
                            if runtime is not None and not runtime.allows_zero_with(zero, pp):
                                continue
                            for sp in ([pins.sp] if pins.sp is not None else sps):
                                config = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, sp=sp,
                                                        zero_stage=zero, micro_batch=mbs,
                                                        global_batch=global_batch,
                                                        seq_len=seq_len, dtype=dtype)
                                try:
                                    config.validate(model, _stand_in(cluster, config))
                                except PlannerError:
                                    continue
                                yield config


def _options(pins: Pins, runtime=None) -> tuple[LayerOption, ...]:
    """The block options of the search across pools: the mesh layout, with the recomputation
    policies ``runtime`` runs (Pins.block_options' rule, which also refuses a pinned policy
    the runtime lacks)."""
    allowed = {o.recompute for o in pins.block_options(None, runtime)}
    if pins.recompute is not None:
        return (LayerOption(Recompute(pins.recompute)),)
    return tuple(o for o in BLOCK_OPTIONS if o.recompute in allowed)


def hetero_search(model: ModelGraph, cluster: Cluster | MultiPoolCluster, global_batch: int,
                  seq_len: int, dtype: str = "bf16", pins: Pins = Pins(),
                  options: SearchOptions = SearchOptions()) -> HeteroSearchResult:
    start = time.monotonic()
    deadline = start + options.time_limit_s
    if model.is_moe:
        raise invalid(f"{model.name} is a mixture-of-experts model; planning experts across pools "
                      f"is not supported yet", "plan it on one pool of the cluster")
    if not any(dtype in p.gpu.peak_tflops for p in cluster.pools):
        raise invalid(f"no pool of {cluster.name!r} has {dtype} units")
    check_seq_len(model, seq_len)
    from planner.profiles import profile

    runtime = profile(options.runtime.profile) if options.runtime.profile else None
    if runtime is not None:  # run options the runtime cannot run (planner/profiles.py)
        runtime.refuse_options(options.runtime, model.is_moe)
    if pins.pipeline_layout:
        raise invalid(f"pin pipeline_layout={pins.pipeline_layout}: a plan across GPU pools "
                      f"splits the stages by pool", "drop the pin, or plan one pool's cluster")
    block_options = _options(pins, runtime)
    # propose, bound cheaply from the leaf formulas, and sort; cost terms only when popped
    queue = []
    total = pruned_memory = with_split = 0
    for config in enumerate_hetero_configs(model, cluster, global_batch, seq_len, dtype, pins,
                                           runtime):
        if time.monotonic() > deadline:
            raise PlannerError(ErrorKind.SOLVER_LIMIT, "the time limit ran out while enumerating "
                               "configurations across pools", ("raise --time-limit",))
        total += 1
        splits = config_splits(cluster, config)
        with_split += bool(splits)
        lb, mem, cap = cheap_bounds(model, cluster, config, options.runtime, splits)
        if mem > cap:
            pruned_memory += 1
        elif math.isfinite(lb):
            queue.append((lb, _key(config), config))
    queue.sort(key=lambda item: (item[0], item[1]))
    kept: list[tuple[float, tuple, HeteroEvaluation]] = []
    evaluated = optimal = pruned_bound = 0
    open_bound = math.inf
    timed_out = False
    deferred: list[tuple[float, tuple, ParallelConfig, tuple]] = []

    def cutoff_now() -> float:
        return kept[-1][0] if len(kept) >= options.top_k else math.inf

    def solve(config, terms, lb: float, budget: float, slowest: float, cutoff: float) -> str:
        """Solve one configuration below ``cutoff``; keep its plan; the CP-SAT status."""
        nonlocal evaluated
        result = solve_pools(terms, config.pp,
                             cutoff_s=None if math.isinf(cutoff) else cutoff * (1 + 1e-6),
                             workers=options.workers, seed=options.seed,
                             max_time_s=max(deadline - time.monotonic(), 0.01),
                             deterministic_time=budget, min_slowest_s=slowest)
        evaluated += 1
        if result.placement is not None:
            ev = hetero_evaluate(model, cluster, config, result.stage_pools, result.placement,
                                 options.runtime, terms=terms)
            if ev.fits and within_headroom(ev, options.memory_headroom):
                kept.append((ev.step_time_s, _key(config), ev))
                kept.sort(key=lambda item: (item[0], item[1]))
                del kept[options.top_k:]
        if result.status not in ("OPTIMAL", "INFEASIBLE"):
            deferred.append((max(result.bound_s, lb), _key(config), config, terms, slowest))
        return result.status

    # First pass, in bound order: a short CP-SAT budget per configuration, so that one hard
    # proof does not hold up the incumbent; unproven configurations come back in pass two.
    first_budget = min(FIRST_PASS_DETERMINISTIC_TIME, options.inner_deterministic_time)
    for cheap_lb, _, config in queue:
        cutoff = cutoff_now()
        if cheap_lb >= cutoff:
            break  # every remaining candidate's bound is at least the k-th best
        if deadline - time.monotonic() <= 0:
            timed_out = True
            open_bound = min(open_bound, cheap_lb)
            break
        terms = pool_terms(model, cluster, config, options.runtime, block_options,
                           splits=config_splits(cluster, config),
                           headroom=options.memory_headroom)
        if not terms:
            continue
        lb, mem, cap = quick_bounds(terms, config.pp)
        if mem > cap:
            pruned_memory += 1
            continue
        slowest = slowest_stage_bound(terms, config.pp) if lb < cutoff else math.inf
        if lb >= cutoff or max(lb, memory_time_bound(terms, config.pp, slowest)) >= cutoff:
            pruned_bound += 1
            continue
        if solve(config, terms, lb, first_budget, slowest, cutoff) in ("OPTIMAL", "INFEASIBLE"):
            optimal += 1
    # Second pass: the unproven ones with the full budget, against the best plan (not the k-th):
    # what the certificate needs is that none of them beats the best; a runner-up keeps the
    # best plan its configuration gave in the first pass (proving its own optimum costs
    # seconds per configuration and certifies nothing about the chosen plan).
    second, deferred = sorted(deferred, key=lambda item: (item[0], item[1])), []
    for bound_s, _, config, terms, slowest in second:
        best_now = kept[0][0] if kept else math.inf
        if bound_s >= best_now:
            pruned_bound += 1
            continue
        if deadline - time.monotonic() <= 0:
            timed_out = True
            open_bound = min(open_bound, bound_s)
            continue
        if solve(config, terms, bound_s, options.inner_deterministic_time, slowest,
                 best_now) in ("OPTIMAL", "INFEASIBLE"):
            optimal += 1
    for bound_s, *_ in deferred:  # still unproven after the full budget
        open_bound = min(open_bound, bound_s)
    if total == 0:  # nothing to weigh: say what narrowed the space, not "does not fit"
        lacks = [f"no {name}" for name, flag in (("pipeline parallelism", runtime.pp),
                                                 ("tensor parallelism", runtime.tp))
                 if runtime is not None and not flag]
        raise PlannerError(ErrorKind.INFEASIBLE,
                           f"no configuration across the pools of {cluster.name!r} is valid for "
                           f"{model.name} with global batch {global_batch}"
                           + (f" under runtime {runtime.name} ({', '.join(lacks)})" if lacks
                              else ""),
                           ("plan on one pool of the cluster, or choose another --runtime"
                            if lacks else "remove pins, or change the global batch",))
    if not kept:
        raise PlannerError(ErrorKind.INFEASIBLE if not timed_out else ErrorKind.SOLVER_LIMIT,
                           f"no plan of {model.name} fits the pools of {cluster.name!r} "
                           f"({total} configurations, {total - pruned_memory} past the memory "
                           f"bound)",
                           ("raise --time-limit" if timed_out else
                            "add GPUs or lower the global batch",))
    best = kept[0][2]
    bound = min(open_bound, best.step_time_s)
    status = "FEASIBLE" if timed_out or bound < best.step_time_s else "OPTIMAL"
    record = {"status": status, "objective_s": best.step_time_s, "best_bound_s": bound,
              "gap": max(0.0, (best.step_time_s - bound) / best.step_time_s),
              "solve_time_s": time.monotonic() - start, "candidates_total": total,
              "candidates_with_split_stages": with_split,
              "candidates_pruned_memory": pruned_memory,
              "candidates_pruned_bound": pruned_bound, "candidates_evaluated": evaluated,
              "inner_optimal": optimal,
              "memory_headroom": options.memory_headroom.describe(),
              "time_limit_s": options.time_limit_s, "workers": options.workers,
              "seed": options.seed, "ortools_version": ortools.__version__}
    return HeteroSearchResult(best, [item[2] for item in kept[1:]], record)


def within_headroom(ev: HeteroEvaluation, headroom) -> bool:
    """Every stage within its pool's memory less the headroom (planner/solve/headroom.py)."""
    return all(s.memory.total <= headroom.limit_bytes(cap)
               for s, cap in zip(ev.stages, ev.capacity_bytes))


def _key(c: ParallelConfig) -> tuple:
    return (c.tp, c.pp, c.dp, c.cp, c.micro_batch, c.zero_stage, not c.sp)
