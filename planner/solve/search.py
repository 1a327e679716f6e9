"""The planner's main loop: enumerate outer configurations, bound them, solve the promising ones.

Consumes a model, a cluster, the training inputs and :class:`SearchOptions`; produces a
:class:`SearchResult` (the best evaluated plan, runners-up, and an honest solver record).

It reads like pseudocode (torchrec's planner shape): propose (``space.enumerate_configs``),
bound (a compute lower bound on step time, a memory lower bound on the fullest stage), keep the
candidates that could still win in a queue by bound (tightened once, lazily, by the LP that keeps
the stages), solve each exactly (``inner.solve_stages``, hinted with Megatron's uniform split),
keep the best k, stop when the next bound cannot beat the k-th best. Every pruned candidate's bound is at least the incumbent, so when the loop ends
without hitting the time limit the result is OPTIMAL within the cost model.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import ortools

from planner import offload_rules
from planner.config import ParallelConfig, RuntimeOptions, check_seq_len
from planner.cost.model import Evaluation, evaluate
from planner.errors import ErrorKind, PlannerError, invalid
from planner.hardware import GIB, Cluster
from planner.ir import ModelGraph
from planner.solve.bounds import contiguous_split_exceeds, slowest_stage_lb_s, stage_lp_bound
from planner.solve.candidates import candidates, config_key
from planner.solve.explain import does_not_fit
from planner.solve.gate import DEFAULT_CONFIDENCE, MemoryGate
from planner.solve.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from planner.solve.inner import solve_stages
from planner.profiles import profile as runtime_profile
from planner.solve.space import Pins, why_no_config
from planner.solve.split_hint import best_split
from planner.strategy import LayerOption, Layout, default_placement


@dataclass(frozen=True)
class SearchOptions:
    time_limit_s: float = 60.0
    workers: int = 1
    seed: int = 0
    top_k: int = 1
    runtime: RuntimeOptions = RuntimeOptions()
    inner_deterministic_time: float = 5.0  # CP-SAT deterministic-time budget per configuration
    # A deterministic budget: solve at most this many configurations (each within its
    # deterministic-time budget), so that a budgeted search gives the same plan on any machine.
    work_limit: int | None = None
    # memory each GPU keeps free of the plan (planner/solve/headroom.py; default 5 % of HBM)
    memory_headroom: MemoryHeadroom = DEFAULT_HEADROOM
    # Plans the search starts from (per-layer layouts: the best uniform plans of an earlier
    # search); empty: with layouts=per-layer the search finds them itself in half its time.
    incumbents: tuple = ()
    # a plan must fit at this quantile of its peak-memory band (planner/solve/gate.py,
    # --memory-confidence); None: at the prediction
    memory_gate: MemoryGate | None = None


@dataclass
class SolverRecord:
    status: str
    objective_s: float
    best_bound_s: float
    gap: float
    solve_time_s: float
    candidates_total: int  # parallel configurations in the space, each counted once
    candidates_pruned_memory: int  # configurations none of whose placements fits (the bound)
    # inner CP-SAT solves (a configuration re-solved after a cut-short solve, or split in two
    # by a memory gate, planner/solve/gate.py, counts each time) and those proven optimal
    candidates_evaluated: int
    inner_optimal: int
    time_limit_s: float
    workers: int
    seed: int
    objective_scale_s: float
    ortools_version: str = ortools.__version__
    # what ended the search: "complete" (every candidate solved or pruned by its bound),
    # "work_limit" (deterministic), "time_limit" (the wall clock: the plan may differ run to run)
    stopped_by: str = "complete"
    work_limit: int | None = None
    memory_headroom: str = DEFAULT_HEADROOM.describe()  # as --memory-headroom spells it
    memory_limit_gib: float = 0.0  # per GPU: the memory the search let a plan use
    # the quantile of the peak-memory band the plan had to fit (--memory-confidence); written
    # only when not the prediction's 0.5, so that plans searched without it keep their bytes
    memory_confidence: float = DEFAULT_CONFIDENCE

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if self.memory_confidence == DEFAULT_CONFIDENCE:
            del out["memory_confidence"]
        return out


@dataclass
class SearchResult:
    best: Evaluation
    alternatives: list[Evaluation]
    record: SolverRecord
    pins: Pins = field(default_factory=Pins)


Progress = Callable[[int, int, float, float], None]


def uniform_placement(model: ModelGraph, cluster: Cluster, config: ParallelConfig,
                      runtime: RuntimeOptions, allowed: tuple[LayerOption, ...] = Pins().block_options(),
                      memory_limit_bytes: float | None = None) -> Evaluation | None:
    """Best Megatron-style uniform plan (even split, one option for every block) that fits
    (within ``memory_limit_bytes`` when given); ties go to the lower peak memory."""
    limit = cluster.memory_bytes_per_gpu if memory_limit_bytes is None else memory_limit_bytes
    best = None
    for option in allowed:
        placement = default_placement(model, config, option)
        if option.act_offload and offload_rules.placement_refusals(model, config.pp, placement):
            continue  # every block's activations offloaded: Megatron-Core refuses it
        try:
            ev = evaluate(model, cluster, config, placement, runtime)
        except ValueError:  # a per-layer layout this mesh or some block cannot take
            continue
        if ev.fits and ev.peak_memory_bytes <= limit and (best is None or rank(ev) < rank(best)):
            best = ev
    return best


def rank(ev: Evaluation) -> tuple[float, float]:
    """The search's order of plans: step time, then peak memory (ties go to the leaner plan)."""
    return (ev.step_time_s, ev.peak_memory_bytes)


def _uniform_incumbents(model, cluster, global_batch, seq_len, dtype, pins, options,
                        deadline, work) -> list[tuple[tuple[float, float], tuple, Evaluation]]:
    """The best uniform (mesh-layout) plans within ``deadline`` and ``work`` solves, as
    (rank, key, evaluation) entries."""
    try:
        found = search(model, cluster, global_batch, seq_len, dtype, replace(pins, layouts=None),
                       replace(options, time_limit_s=max(deadline - time.monotonic(), 0.01),
                               work_limit=work))
    except PlannerError:
        return []
    return [(rank(ev), config_key(ev.config), ev) for ev in [found.best, *found.alternatives]]


def gate_limit(ev: Evaluation, limit: float, gate: MemoryGate | None) -> float:
    """The peak ``ev`` may reach: ``limit`` over its memory gate's factor (planner/solve/gate.py;
    the same division the candidates' capacities make)."""
    return limit if gate is None else gate.peak_limit_bytes(ev, limit)


def _hint(model, cluster, cand, pins, prof, runtime, limit) -> Evaluation | None:
    """The inner solve's start: the best uniform plan of this configuration over the mesh
    layout (a uniform non-mesh layout is rarely the best start and costs an evaluation each);
    when blocks differ (or an even split does not fit), a balanced uneven split if better."""
    allowed = cand.block_options(pins.block_options(cand.config, prof))
    hint = uniform_placement(model, cluster, cand.config, runtime,
                             tuple(o for o in allowed if o.layout is Layout.MESH) or allowed,
                             limit)
    if hint is None or len(cand.problem.classes) > 1:
        split = best_split(cand.problem, limit, runtime)
        if split is not None and (hint is None or rank(split) < rank(hint)):
            hint = split
    return hint


def _keep(kept: list, ev: Evaluation | None, replaces: Evaluation | None, top_k: int,
          limit: float, gate: MemoryGate | None = None) -> list:
    """``kept`` (the best ``top_k`` plans, by rank then configuration) with ``ev`` added when it
    fits the memory limit (under ``gate``: the limit over its factor), and ``replaces`` (the
    plan ``ev`` improves on: its configuration's hint) dropped. Under an active gate a
    configuration may be two candidates (gate.py): it keeps one plan, its best."""
    if ev is None or not ev.fits or ev.peak_memory_bytes > gate_limit(ev, limit, gate):
        return kept
    kept = [item for item in kept if item[2] is not replaces] if replaces is not None else kept
    if gate is not None and gate.active:
        key = config_key(ev.config)
        same = [item for item in kept if item[1] == key]
        if same and same[0][0] <= rank(ev):
            return kept
        kept = [item for item in kept if item[1] != key]
    kept.append((rank(ev), config_key(ev.config), ev))
    kept.sort(key=lambda item: (item[0], item[1]))
    return kept[:top_k]


def search(model: ModelGraph, cluster: Cluster, global_batch: int, seq_len: int,
           dtype: str = "bf16", pins: Pins = Pins(), options: SearchOptions = SearchOptions(),
           progress: Progress | None = None) -> SearchResult:
    start = time.monotonic()
    deadline = start + options.time_limit_s
    if dtype not in cluster.gpu.peak_tflops:
        raise invalid(f"GPU {cluster.gpu.name} has no {dtype} peak throughput",
                      f"use --dtype with one of: {', '.join(d for d in ('bf16', 'fp16', 'fp8') if d in cluster.gpu.peak_tflops)}")
    if pins.offload not in (None, "none") and cluster.cpu_memory is None:
        raise invalid(f"pin offload={pins.offload}: cluster {cluster.name!r} describes no host memory",
                      "add a host: section to the cluster file (docs/clusters.md), or use a "
                      "preset that has one (dgx-h100, dgx-gb200-nvl72)")
    check_seq_len(model, seq_len)
    if options.runtime.profile:  # run options the runtime cannot run (planner/profiles.py)
        runtime_profile(options.runtime.profile).refuse_options(options.runtime, model.is_moe)
    limit = options.memory_headroom.limit_bytes(cluster.memory_bytes_per_gpu)
    gate = options.memory_gate
    cands = candidates(model, cluster, global_batch, seq_len, dtype, pins, options.runtime,
                       deadline, limit, gate)
    # configurations, each once: under a memory gate one may be two candidates (gate.py)
    total = len({config_key(c.config) for c in cands})
    if not cands:
        reasons = why_no_config(model, cluster, global_batch, seq_len, dtype, pins,
                                runtime_profile(options.runtime.profile))
        raise PlannerError(
            ErrorKind.INFEASIBLE,
            f"no parallel configuration of {cluster.num_gpus} GPUs is valid for {model.name} "
            f"with global batch {global_batch}" + (f": {'; '.join(reasons)}" if reasons else ""),
            ("remove or change those pins (see --pin)",) if pins.as_dict() else
            ("check that the global batch is divisible by some data-parallel degree",),
            {"pins": pins.as_dict()})
    # the memory bound prunes here; the finer bound over fitting placements
    # (Candidate.fit_lb_s) is read when a candidate comes up
    fitting = [c for c in cands if c.memory_lb_bytes <= c.capacity_bytes]
    pruned_memory = total - len({config_key(c.config) for c in fitting})
    prof = runtime_profile(options.runtime.profile)

    kept: list[tuple[tuple[float, float], tuple, Evaluation]] = []  # (rank, key, evaluation)
    if options.incumbents:
        kept = sorted(((rank(ev), config_key(ev.config), ev) for ev in options.incumbents
                       if ev.fits and ev.peak_memory_bytes <= gate_limit(ev, limit, gate)),
                      key=lambda item: (item[0], item[1]))[:options.top_k]
    # The per-layer space contains the uniform one, so a complete per-layer search is never
    # worse than the best uniform plan. Should it stop on its limits, it has had half of
    # them, and the uniform search runs in the other half: the plan is the better of the two.
    fallback = pins.layouts == "per-layer" and not options.incumbents
    loop_deadline, work_limit = deadline, options.work_limit
    if fallback:
        loop_deadline = start + options.time_limit_s / 2
        work_limit = None if work_limit is None else max(1, work_limit // 2)
    evaluated = optimal = 0
    open_bound = math.inf  # smallest bound among candidates not proven
    timed_out = False
    out_of_work = False
    scale = 0.0
    # Best first over lower bounds that tighten lazily: a candidate comes up by its time
    # bound; then by the knapsack bound over fitting placements (Candidate.fit_lb_s), then by
    # the LP with the stages kept (bounds.stage_lp_bound), each computed the first time the
    # candidate comes up at the level before, and if another candidate's bound is now lower
    # it goes back in the queue. The candidates that really can be fast are solved first, so
    # the incumbent is good early and the finer bounds prune the rest; the costly ones are
    # computed only for the few candidates that come up.
    queue = [(c.time_lb_s, config_key(c.config), 0, i) for i, c in enumerate(fitting)]
    heapq.heapify(queue)
    # Hinted candidates, waiting to be solved by their final bound. Before any candidate is
    # solved, every candidate whose bound is within the cutoff is bounded and hinted (its
    # uniform plan, the solve's start, evaluated): the best of these plans is an incumbent
    # before the first CP-SAT solve, so no solve runs without a cutoff or under a loose one.
    # The candidates that must be solved are the same (each whose bound is within the best
    # plan's step time); only their order and the cutoffs they are solved under change.
    ready: list[tuple[float, tuple, int, int]] = []
    popped = 0
    # A candidate CP-SAT does not prove within its budget goes back in the queue at level 3
    # by the bound it did prove, with its best plan so far as the hint: by the time it comes
    # up again the incumbent is better, so it is pruned by that bound or solved once more
    # under the tighter cutoff (which often proves it at once). It is not retried again.
    hints: dict[int, Evaluation | None] = {}
    while queue or ready:
        cutoff = kept[-1][0][0] if len(kept) >= options.top_k else math.inf
        # (while fewer than k plans are known, at most k candidates wait hinted: should
        # their start plans not fit, they are solved without a cutoff, as before the sweep)
        sweep = bool(queue) and queue[0][0] <= cutoff * (1 + 1e-9) and \
            (math.isfinite(cutoff) or len(ready) < options.top_k)
        bound, key, level, index = queue[0] if sweep else ready[0] if ready else queue[0]
        if bound > cutoff * (1 + 1e-9):
            break  # every remaining candidate's bound is above the k-th best (a tie may win
            # on memory, so a bound equal to it is still solved)
        remaining = loop_deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            open_bound = min(open_bound, *(q[0][0] for q in (queue, ready) if q))
            break
        cand = fitting[index]
        if sweep:
            heapq.heappop(queue)
            if level < 2:
                finer = cand.fit_lb_s if level == 0 else stage_lp_bound(cand.problem)
                bound = max(bound, finer)
                if math.isinf(bound):
                    continue  # no placement of it fits, even fractionally
                if level == 0 or (queue and bound > queue[0][0]):
                    heapq.heappush(queue, (bound, key, level + 1, index))
                    continue
                if bound > cutoff * (1 + 1e-9):
                    continue  # proven by the LP: no fitting placement reaches the k-th best
            if math.isfinite(cutoff) and \
                    contiguous_split_exceeds(cand.problem, cutoff * (1 + 1e-9)):
                continue  # proven by the integrality of contiguous stages
            hint = hints[index] = _hint(model, cluster, cand, pins, prof, options.runtime,
                                        cand.capacity_bytes)
            kept = _keep(kept, hint, None, options.top_k, limit, gate)
            heapq.heappush(ready, (bound, key, 2, index))
            continue
        if work_limit is not None and evaluated >= work_limit:
            out_of_work = True
            open_bound = min(open_bound, *(q[0][0] for q in (queue, ready) if q))
            break
        heapq.heappop(ready)
        popped += 1
        if math.isfinite(cutoff) and contiguous_split_exceeds(cand.problem, cutoff * (1 + 1e-9)):
            continue  # proven by the integrality of contiguous stages
        hint = hints.pop(index)  # the uniform plan, or a retry's first best plan
        # blocks that differ: CP-SAT's relaxation does not see the integrality of stages
        slowest = slowest_stage_lb_s(cand.problem) if len(cand.problem.classes) > 1 else 0.0
        result = solve_stages(
            cand.problem, hint=hint.placement if hint else None, slowest_stage_s=slowest,
            cutoff_s=None if math.isinf(cutoff) else cutoff * (1 + 1e-6),
            workers=options.workers, seed=options.seed, max_time_s=remaining,
            deterministic_time=options.inner_deterministic_time)
        evaluated += 1
        if time.monotonic() >= loop_deadline:  # the wall clock may have cut this solve short
            timed_out = True
        scale = max(scale, result.scale_s)
        placement = result.placement
        ev = None
        if placement is not None:
            ev = evaluate(model, cluster, cand.config, placement, options.runtime)
        if hint is not None and (ev is None or rank(hint) < rank(ev)):
            ev = hint  # never worse than the uniform plan, whatever the solver's limits
        if result.status == "OPTIMAL" or result.status == "INFEASIBLE":
            optimal += 1
        elif level < 3:
            hints[index] = ev
            heapq.heappush(ready, (max(result.bound_s, bound), key, 3, index))
        else:
            open_bound = min(open_bound, max(result.bound_s, bound))
        kept = _keep(kept, ev, hint, options.top_k, limit, gate)
        if progress is not None:
            progress(popped, len(fitting), kept[0][0][0] if kept else math.inf,
                     min(bound, open_bound))
    if fallback and (timed_out or out_of_work):
        work = None if options.work_limit is None else max(1, options.work_limit - work_limit)
        kept = sorted(kept + _uniform_incumbents(model, cluster, global_batch, seq_len, dtype,
                                                 pins, options, deadline, work),
                      key=lambda item: (item[0], item[1]))[:options.top_k]
    if not kept:
        raise does_not_fit(model, cluster, cands, global_batch, seq_len, timed_out, deadline, pins,
                           options.memory_headroom,
                           gate.confidence if gate is not None and gate.active else None, gate)
    best = kept[0][2]
    bound = min(open_bound, best.step_time_s)
    if timed_out or out_of_work or bound < best.step_time_s:
        status = "FEASIBLE"
    else:
        status = "OPTIMAL"
    gap = max(0.0, (best.step_time_s - bound) / best.step_time_s)
    record = SolverRecord(
        status=status, objective_s=best.step_time_s, best_bound_s=bound, gap=gap,
        solve_time_s=time.monotonic() - start, candidates_total=total,
        candidates_pruned_memory=pruned_memory, candidates_evaluated=evaluated,
        inner_optimal=optimal, time_limit_s=options.time_limit_s, workers=options.workers,
        seed=options.seed, objective_scale_s=scale,
        stopped_by="time_limit" if timed_out else "work_limit" if out_of_work else "complete",
        work_limit=options.work_limit, memory_headroom=options.memory_headroom.describe(),
        memory_limit_gib=limit / GIB,
        memory_confidence=gate.confidence if gate is not None and gate.active
        else DEFAULT_CONFIDENCE)
    return SearchResult(best, [item[2] for item in kept[1:]], record, pins)
