"""Search the serving deployment with the most output tokens/s per GPU under the latency
targets, or (no targets, no load given) the Pareto frontier of tokens/s per GPU against
tokens/s per user.

Exact over the discrete space (``tests/test_serve_search.py`` compares it with trying every
layout and batch), with bounds that make it fast:

* aggregated, per worker layout: the batch by branch and bound over batch intervals
  (:func:`_best_batch`: TPOT bisection, a throughput bound and a TTFT lower bound per
  interval, both from the iteration time never falling as tokens are added);
* disaggregated (:mod:`planner.serve.disaggregated`): best-first branch and bound over
  (decode layout, prefill layout, decode-batch interval), then pool sizes, on each pool's
  capacity bound (``tests/test_serve_disaggregated.py`` compares it with evaluating every
  combination).

Space: worker layouts ``tp x pp x attention_dp`` GPUs (``tp`` dividing the heads, KV heads
dividing or divided by ``tp``; for MoE models every ``ep`` dividing the experts and
``tp x attention_dp``), replicas or pool sizes up to the cluster, batch up to the KV capacity.
"""
from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field, replace

from planner.errors import ErrorKind, PlannerError
from planner.hardware import Cluster
from planner.ir import ModelGraph
from planner.serve.evaluate import (ServingEvaluation, aggregated_rates,
                                    aggregated_ttft_bound_s, evaluate_serving,
                                    validate_worker)
from planner.serve.bisection import largest_meeting
from planner.serve.runtime import DEFAULT_RUNTIME, runtime
from planner.serve.workload import ServingConfig, ServingWorkload, WorkerConfig

MAX_PP = 8


@dataclass
class ServeSearchResult:
    best: ServingEvaluation | None
    frontier: list[ServingEvaluation] = field(default_factory=list)
    alternatives: list[ServingEvaluation] = field(default_factory=list)
    evaluated: int = 0
    layouts: int = 0
    pruned: int = 0
    solve_time_s: float = 0.0

    def record(self) -> dict:
        return {"method": "exhaustive enumeration with branch and bound",
                "status": "OPTIMAL" if self.best is not None or self.frontier else "INFEASIBLE",
                "evaluated": self.evaluated, "layouts": self.layouts, "pruned": self.pruned,
                "solve_time_s": self.solve_time_s}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def worker_layouts(model: ModelGraph, max_gpus: int, gpus_per_node: int) -> list[WorkerConfig]:
    """Every valid worker layout on at most ``max_gpus`` GPUs, tensor/expert groups inside
    powers of two or divisors of the node (what runtimes launch)."""
    sizes = sorted({d for d in _divisors(max_gpus)} | {1 << i for i in range(12)
                                                          if 1 << i <= max_gpus})
    out = []
    experts = max((layer.mlp.num_experts for layer in model.blocks()
                   if layer.mlp is not None and layer.mlp.is_moe), default=1)
    for tp in sizes:
        for pp in [p for p in range(1, MAX_PP + 1) if tp * p <= max_gpus]:
            adps = [a for a in sizes if tp * a * pp <= max_gpus] if model.is_moe else [1]
            for adp in adps:
                eps = [e for e in _divisors(tp * adp) if experts % e == 0] if model.is_moe else [1]
                for ep in eps:
                    w = WorkerConfig(tp=tp, pp=pp, ep=ep, attention_dp=adp)
                    try:
                        validate_worker(model, w)
                    except PlannerError:
                        continue
                    out.append(w)
    return out


def _key(ev: ServingEvaluation) -> tuple:
    """Larger is better; ties broken deterministically (fewer GPUs, faster tokens, layout)."""
    return (round(ev.output_tokens_per_s_per_gpu, 6), -ev.num_gpus,
            round(ev.output_tokens_per_s_per_user, 6), _layout(ev))


def _layout(ev: ServingEvaluation) -> tuple:
    return _config_layout(ev.config)


def _config_layout(c: ServingConfig) -> tuple:
    if c.mode == "aggregated":
        return (0, -c.worker.tp, -c.worker.pp, -c.worker.ep, -c.worker.attention_dp, -c.replicas)
    return (1, -c.prefill.gpus, -c.decode.gpus, -c.prefill_workers, -c.decode_workers)


def _best_batch(at, cap: int, workload: ServingWorkload, ttft_bound,
                result: ServeSearchResult) -> int | None:
    """The batch in ``1 .. cap`` with the most output tokens/s per GPU meeting the targets
    (``at(b)`` evaluates one), the same as trying every batch, given one property of the cost
    model that ``tests/test_serve_search.py`` checks batch by batch: an iteration's time does
    not decrease with its decode sequences or its prompt tokens (every leaf term is a
    non-decreasing staircase in the token count: roofline maxima over padded tiles and waves,
    KV reads, alpha-beta collectives). From it:

    * TPOT does not decrease with the batch, so the batches meeting the TPOT target are
      ``1 .. B`` (bisection);
    * over ``lo .. hi`` throughput per GPU ``b x tokens_per_step / (it(b) x gpus)`` is at most
      ``hi / lo`` x its value at ``lo``, and TTFT at least
      :func:`~planner.serve.evaluate.aggregated_ttft_bound_s` (TTFT itself may fall as the
      batch grows: its queueing terms follow the request rate, which wave quantisation makes
      non-monotone): branch and bound over batch intervals drops those that cannot beat the
      best feasible batch found or cannot meet the TTFT target.
    """
    top = cap
    if workload.tpot_ms is not None:
        top = largest_meeting(1, cap, lambda b: at(b).tpot_s * 1e3 <= workload.tpot_ms)
        if top is None:
            return None
    best, best_value = None, -1.0
    stack = [(1, top)]
    while stack:
        lo, hi = stack.pop()
        low = at(lo)
        if hi / lo * low.output_tokens_per_s_per_gpu <= best_value or (
                workload.ttft_ms is not None and lo < hi and
                ttft_bound(lo, hi) * 1e3 > workload.ttft_ms):
            result.pruned += hi - lo + 1
            continue
        if lo == hi:
            if low.meets_targets() and low.output_tokens_per_s_per_gpu > best_value:
                best, best_value = lo, low.output_tokens_per_s_per_gpu
            continue
        mid = (lo + hi) // 2
        stack += [(lo, mid), (mid + 1, hi)]  # the upper half first
    return best


def search_serving(model: ModelGraph, cluster: Cluster, workload: ServingWorkload,
                   runtime_name: str = DEFAULT_RUNTIME, *, top_k: int = 3,
                   max_gpus: int | None = None, calibration=None) -> ServeSearchResult:
    start = time.perf_counter()
    runtime(runtime_name)
    n = min(max_gpus or cluster.num_gpus, cluster.num_gpus)
    layouts = worker_layouts(model, n, cluster.gpus_per_node)
    result = ServeSearchResult(None, layouts=len(layouts))
    if workload.mode == "aggregated":
        _aggregated(model, cluster, workload, runtime_name, layouts, n, result, top_k,
                    calibration)
    else:
        _disaggregated(model, cluster, workload, runtime_name, layouts, n, result, top_k,
                       calibration)
    result.solve_time_s = time.perf_counter() - start
    return result


def _eval(model, cluster, workload, config, rt, result, calibration) -> ServingEvaluation:
    result.evaluated += 1
    return evaluate_serving(model, cluster, workload, config, rt, calibration)


def _aggregated(model, cluster, workload, rt_name, layouts, n, result, top_k, calibration):
    rt = runtime(rt_name)
    budget = rt.default_max_num_tokens(cluster.gpu)
    pareto = not workload.has_targets and workload.concurrency is None and \
        workload.request_rate_per_s is None
    candidates: list[ServingEvaluation] = []
    fitting: list[tuple[ServingConfig, int]] = []  # (layout, its largest batch)
    for w in layouts:
        base = ServingConfig("aggregated", worker=w, replicas=max(1, n // w.gpus),
                             batch=rt.max_batch, max_num_tokens=budget)
        probe = _eval(model, cluster, replace(workload, concurrency=None, request_rate_per_s=None),
                      base, rt_name, result, calibration)
        if not probe.fits:
            continue
        cap = probe.pools[0].max_batch
        if pareto:
            fitting.append((base, cap))
            continue
        if workload.concurrency is not None or workload.request_rate_per_s is not None:
            for replicas in range(1, n // w.gpus + 1):
                ev = _eval(model, cluster, workload, replace(base, replicas=replicas), rt_name,
                           result, calibration)
                if ev.meets_targets():
                    candidates.append(ev)
            continue

        evals: dict[int, ServingEvaluation] = {}

        def at(b: int, base=base, evals=evals) -> ServingEvaluation:
            if b not in evals:
                evals[b] = _eval(model, cluster, replace(
                    workload, concurrency=b * base.replicas), base, rt_name, result, calibration)
            return evals[b]

        def ttft_bound(lo: int, hi: int, base=base) -> float:
            return aggregated_ttft_bound_s(model, cluster, workload, base, lo, hi, rt_name,
                                           calibration)

        b = _best_batch(at, cap, workload, ttft_bound, result)
        if b is not None:
            cfg = replace(base, batch=b)
            candidates.append(_eval(model, cluster, replace(workload, concurrency=b * base.replicas),
                                    cfg, rt_name, result, calibration))
    if pareto:
        candidates = _pareto(model, cluster, workload, rt_name, fitting, result, calibration)
    _finish(result, candidates, top_k, pareto)


def _pareto(model, cluster, workload, rt_name, fitting, result,
            calibration) -> list[ServingEvaluation]:
    """The Pareto frontier over every layout of ``fitting`` and every batch up to its largest:
    each layout's batches by :func:`_frontier_batches` on (tokens/s per user, per GPU) alone,
    against one staircase of every point found, seeded with each layout's largest batch (its
    most tokens/s per GPU: real points, so pruning on them is exact); then the whole
    evaluation of the frontier's points only, chosen as :func:`pareto_frontier` does."""
    staircase = Staircase()
    kept: list[tuple] = []  # (tokens/s per user, per GPU, layout key, config, batch)

    def rates(base: ServingConfig, b: int) -> tuple[float, float]:
        result.evaluated += 1
        return aggregated_rates(model, cluster, workload, base, b, rt_name, calibration)

    seeds = []
    for base, cap in fitting:
        user, gpu = rates(base, cap)
        staircase.add(user, gpu)
        kept.append((user, gpu, _config_layout(base), base, cap))
        seeds.append((-gpu, _config_layout(base), base, cap))
    # the layouts with the most tokens/s per GPU first: their points prune the others' most
    for _, _, base, cap in sorted(seeds, key=lambda s: s[:2]):
        kept += [(user, gpu, _config_layout(base), base, b) for b, user, gpu in
                 _frontier_batches(lambda b, base=base: rates(base, b), cap, staircase, result)]
    frontier, best_gpu = [], -1.0
    for user, gpu, _, base, b in sorted(kept, key=lambda k: (-k[0], -k[1], k[2])):
        if gpu > best_gpu:
            frontier.append(_eval(model, cluster, replace(workload, concurrency=b * base.replicas),
                                  base, rt_name, result, calibration))
            best_gpu = gpu
    return frontier


def _finish(result, candidates, top_k, pareto):
    if pareto:
        result.frontier = pareto_frontier(candidates)
        result.best = max(result.frontier, key=_key) if result.frontier else None
        return
    ranked = sorted(candidates, key=_key, reverse=True)
    result.best = ranked[0] if ranked else None
    result.alternatives = ranked[1:1 + top_k]


class Staircase:
    """The points found so far, kept as their Pareto staircase in (tokens/s per user, tokens/s
    per GPU): users ascending, per-GPU strictly descending. A point is weakly dominated by some
    point found iff it is by a step of the staircase (weak dominance is transitive), which
    :meth:`dominated` answers by bisection instead of a scan of every point."""

    def __init__(self) -> None:
        self.users: list[float] = []
        self.gpus: list[float] = []

    def dominated(self, user: float, gpu: float) -> bool:
        i = bisect_left(self.users, user)  # the first step at least as fast per user
        return i < len(self.users) and self.gpus[i] >= gpu

    def add(self, user: float, gpu: float) -> None:
        if self.dominated(user, gpu):
            return
        i = bisect_left(self.users, user)
        j = i  # steps slower per user and no better per GPU are dominated by the new one
        while i > 0 and self.gpus[i - 1] <= gpu:
            i -= 1
        if j < len(self.users) and self.users[j] == user:
            j += 1  # same speed per user, less per GPU (else it dominated the new point)
        self.users[i:j] = [user]
        self.gpus[i:j] = [gpu]


def _frontier_batches(rates, cap: int, known: Staircase,
                      result: ServeSearchResult) -> list[tuple[int, float, float]]:
    """``(batch, tokens/s per user, tokens/s per GPU)`` of every batch ``1 .. cap`` of one
    layout (which fits: fitting is the memory's, the same at every batch) that may be on the
    Pareto frontier, the others left out only when a point already found (``known``: every
    layout's so far; this one's are added) weakly dominates them: over ``lo .. hi`` tokens/s
    per user is at most its value at ``lo`` (TPOT does not fall with the batch) and tokens/s
    per GPU at most ``hi / lo`` x its value at ``lo`` (the iteration time does not fall), so
    an interval whose corner is dominated holds no frontier point
    (``tests/test_serve_search.py`` compares the frontier with every batch's). ``rates(b)``:
    (tokens/s per user, per GPU) at batch ``b``
    (:func:`~planner.serve.evaluate.aggregated_rates`, the values of the whole evaluation)."""
    points: list[tuple[int, float, float]] = []
    seen: dict[int, tuple[float, float]] = {}

    def point(b: int) -> tuple[float, float]:
        if b not in seen:
            seen[b] = rates(b)
        return seen[b]

    stack = [(1, cap)]
    while stack:
        lo, hi = stack.pop()
        user, gpu = point(lo)
        if known.dominated(user, hi / lo * gpu):
            result.pruned += hi - lo + 1
            continue
        if lo == hi:
            points.append((lo, user, gpu))
            known.add(user, gpu)
            continue
        mid = (lo + hi) // 2
        stack += [(mid + 1, hi), (lo, mid)]  # the lower half (faster tokens) first
    return points


def pareto_frontier(points: list[ServingEvaluation]) -> list[ServingEvaluation]:
    """Points not dominated in (tokens/s per user, tokens/s per GPU), by tokens/s per user."""
    ordered = sorted(points, key=lambda e: (-e.output_tokens_per_s_per_user,
                                            -e.output_tokens_per_s_per_gpu, _layout(e)))
    frontier, best_gpu = [], -1.0
    for ev in ordered:
        if ev.output_tokens_per_s_per_gpu > best_gpu:
            frontier.append(ev)
            best_gpu = ev.output_tokens_per_s_per_gpu
    return frontier


def _disaggregated(model, cluster, workload, rt_name, layouts, n, result, top_k, calibration):
    from planner.serve.disaggregated import search_disaggregated
    from planner.serve.phases import Calibration
    from planner.serve.runtime import CALIBRATED

    calib = calibration or Calibration.from_mapping(CALIBRATED)
    found, result.pruned = search_disaggregated(
        model, cluster, workload, rt_name, layouts, n, calib,
        lambda wl, cfg: _eval(model, cluster, wl, cfg, rt_name, result, calibration))
    _finish(result, found, top_k, False)


def no_plan_error(workload: ServingWorkload) -> PlannerError:
    targets = []
    if workload.ttft_ms is not None:
        targets.append(f"TTFT <= {workload.ttft_ms:g} ms")
    if workload.tpot_ms is not None:
        targets.append(f"TPOT <= {workload.tpot_ms:g} ms")
    what = " and ".join(targets) or "the memory"
    return PlannerError(ErrorKind.INFEASIBLE, f"no serving deployment meets {what}",
                        ("relax the latency targets, use more nodes (--nodes), a lower precision "
                         "(--dtype fp8) or an fp8 KV cache (--kv-dtype fp8)",))
