"""Search the serving deployment with the most output tokens/s per GPU under the latency
targets, or (no targets, no load given) the Pareto frontier of tokens/s per GPU against
tokens/s per user.

Exact over the discrete space (``tests/test_serve_search.py`` compares it with trying every
layout and batch), with bounds that make it fast:

* aggregated, per worker layout: the batch by branch and bound over batch intervals
  (:func:`_best_batch`: TPOT bisection, a throughput bound and a TTFT lower bound per
  interval, both from the iteration time never falling as tokens are added);
* disaggregated: dominated layouts are dropped per pool (same GPUs, slower prefill and more KV
  bytes to send; or fewer completed requests/s at a larger batch); a pair of prefill / decode
  layouts can never beat the harmonic combination of their per-GPU rates (computed without
  queueing), so pairs below the best found are skipped (branch and bound); the decode batch is
  the largest meeting TPOT, and the prefill pool the fewest workers meeting TTFT (TTFT falls as
  workers are added: bisection).

Space: worker layouts ``tp x pp x attention_dp`` GPUs (``tp`` dividing the heads, KV heads
dividing or divided by ``tp``; for MoE models every ``ep`` dividing the experts and
``tp x attention_dp``), replicas or pool sizes up to the cluster, batch up to the KV capacity.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from planner.errors import ErrorKind, PlannerError
from planner.hardware import Cluster
from planner.ir import ModelGraph
from planner.serve.evaluate import (ServingEvaluation, aggregated_ttft_bound_s,
                                    evaluate_serving, validate_worker)
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
    c = ev.config
    if c.mode == "aggregated":
        return (0, -c.worker.tp, -c.worker.pp, -c.worker.ep, -c.worker.attention_dp, -c.replicas)
    return (1, -c.prefill.gpus, -c.decode.gpus, -c.prefill_workers, -c.decode_workers)


def _largest(lo: int, hi: int, ok) -> int | None:
    """Largest n in [lo, hi] with ok(n), assuming ok is monotone (true then false)."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


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
        top = _largest(1, cap, lambda b: at(b).tpot_s * 1e3 <= workload.tpot_ms)
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
    for w in layouts:
        base = ServingConfig("aggregated", worker=w, replicas=max(1, n // w.gpus),
                             batch=rt.max_batch, max_num_tokens=budget)
        probe = _eval(model, cluster, replace(workload, concurrency=None, request_rate_per_s=None),
                      base, rt_name, result, calibration)
        if not probe.fits:
            continue
        cap = probe.pools[0].max_batch
        if workload.concurrency is not None or workload.request_rate_per_s is not None:
            for replicas in range(1, n // w.gpus + 1):
                ev = _eval(model, cluster, workload, replace(base, replicas=replicas), rt_name,
                           result, calibration)
                if ev.meets_targets():
                    candidates.append(ev)
            continue
        if pareto:
            b = 1
            while True:
                ev = _eval(model, cluster, replace(workload, concurrency=b * base.replicas),
                           base, rt_name, result, calibration)
                if ev.fits:
                    candidates.append(ev)
                if b >= cap:
                    break
                b = min(cap, b * 2)
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
    _finish(result, candidates, top_k, pareto)


def _finish(result, candidates, top_k, pareto):
    if pareto:
        result.frontier = pareto_frontier(candidates)
        result.best = max(result.frontier, key=_key) if result.frontier else None
        return
    ranked = sorted(candidates, key=_key, reverse=True)
    result.best = ranked[0] if ranked else None
    result.alternatives = ranked[1:1 + top_k]


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
    rt = runtime(rt_name)
    budget = rt.default_max_num_tokens(cluster.gpu)
    isl, osl = workload.isl, workload.osl
    # layouts whose weights leave room for KV at all (either pool needs one)
    from planner.serve.memory import serving_memory
    fitting = [w for w in layouts if serving_memory(
        model, cluster.gpu, w, workload.dtype, workload.kv_cache_dtype, rt, budget,
        1).kv_budget_bytes > 0]
    if not fitting:
        return
    smallest = min(fitting, key=lambda w: (w.gpus, w))
    # decode pools: best batch per layout under TPOT (one worker; TTFT is the prefill's)
    decode_options = []
    for d in fitting:
        p_any = smallest
        if d.gpus + p_any.gpus > n:
            continue
        base = ServingConfig("disaggregated", prefill=p_any, decode=d, prefill_workers=1,
                             decode_workers=1, batch=rt.max_batch,
                             max_num_tokens=budget)

        def tpot_ok(b: int, base=base) -> bool:
            ev = _eval(model, cluster, replace(workload, concurrency=b, ttft_ms=None),
                       replace(base, batch=b), rt_name, result, calibration)
            return ev.fits and ev.meets_targets()

        probe = _eval(model, cluster, replace(workload, concurrency=1, ttft_ms=None,
                                              tpot_ms=None), base, rt_name, result, calibration)
        if not probe.pools[-1].max_batch or not probe.fits:
            continue
        cap = probe.pools[-1].max_batch
        b = _largest(1, cap, tpot_ok)
        if b is None:
            continue
        ev = _eval(model, cluster, replace(workload, concurrency=b, ttft_ms=None),
                   replace(base, batch=b), rt_name, result, calibration)
        rate = b / (ev.tpot_s * osl)  # requests/s one decode worker completes
        decode_options.append((rate * osl / d.gpus, d, b, rate))
    prefill_options = []
    for p in fitting:
        if p.gpus + smallest.gpus > n:
            continue
        base = ServingConfig("disaggregated", prefill=p, decode=smallest, prefill_workers=1,
                             decode_workers=1, batch=1, max_num_tokens=budget)
        ev = _eval(model, cluster, replace(workload, concurrency=1, ttft_ms=None, tpot_ms=None),
                   base, rt_name, result, calibration)
        if not ev.fits:
            continue
        t_pf = ev.pools[0].iteration.total_s * math.ceil(isl / budget)
        if workload.ttft_ms is not None and t_pf * 1e3 > workload.ttft_ms:
            continue  # even an idle prefill worker misses TTFT
        from planner.serve.memory import kv_bytes_per_token
        kv = kv_bytes_per_token(model, p, workload.kv_cache_dtype)
        prefill_options.append((osl / t_pf / p.gpus, p, 1.0 / t_pf, kv))
    # Dominated layouts out (exact for this model): a prefill layout is beaten by one on as many
    # GPUs that prefills faster and sends no more KV bytes per GPU; a decode layout by one on as
    # many GPUs that completes more requests/s with no larger batch (a larger batch means more
    # requests in flight, hence more prefill queueing).
    decode_options = _pareto(decode_options, lambda o: (o[1].gpus,), lambda o: (-o[3], o[2]))
    prefill_options = _pareto(prefill_options, lambda o: (o[1].gpus,), lambda o: (-o[2], o[3]))
    result.pruned += result.layouts * 2 - len(decode_options) - len(prefill_options)
    decode_options.sort(key=lambda o: (-o[0], o[1]))
    prefill_options.sort(key=lambda o: (-o[0], o[1]))
    candidates: list[ServingEvaluation] = []
    best = -1.0
    for d_rate_gpu, d, b, d_rate in decode_options:
        for p_rate_gpu, p, p_rate, _kv in prefill_options:
            # upper bound at the ideal ratio: harmonic combination of the two per-GPU rates
            bound = 1.0 / (1.0 / d_rate_gpu + 1.0 / p_rate_gpu)
            if bound <= best:
                result.pruned += 1
                continue
            for n_d in range(1, (n - p.gpus) // d.gpus + 1):
                # at least the prefill workers the decode pool's request rate needs; more only
                # lower TTFT (and tokens/s per GPU), so the first that meets TTFT is the best
                need = max(1, math.ceil(n_d * d_rate / p_rate))
                top = (n - n_d * d.gpus) // p.gpus
                if top < need:
                    continue
                conc = workload.concurrency if workload.concurrency is not None else b * n_d
                wl = replace(workload, concurrency=conc) \
                    if workload.request_rate_per_s is None else workload
                evals: dict[int, ServingEvaluation] = {}

                def at(n_p: int, p=p, d=d, n_d=n_d, b=b, wl=wl, evals=evals):
                    if n_p not in evals:
                        cfg = ServingConfig("disaggregated", prefill=p, decode=d,
                                            prefill_workers=n_p, decode_workers=n_d, batch=b,
                                            max_num_tokens=budget)
                        evals[n_p] = _eval(model, cluster, wl, cfg, rt_name, result, calibration)
                    return evals[n_p]

                # TTFT falls as prefill workers are added: bisect for the fewest meeting it
                if not at(top).meets_targets():
                    continue
                lo, hi = need, top
                while lo < hi:
                    mid = (lo + hi) // 2
                    if at(mid).meets_targets():
                        hi = mid
                    else:
                        lo = mid + 1
                ev = at(lo)
                candidates.append(ev)
                best = max(best, ev.output_tokens_per_s_per_gpu)
    _finish(result, candidates, top_k, False)
    if result.best is None and not candidates:
        return


def _pareto(options: list, group, score) -> list:
    """Options not dominated within their group: ``score`` tuples, lower is better in every
    component."""
    out = []
    for o in options:
        so = score(o)
        dominated = any(group(q) == group(o) and q is not o and
                        all(a <= b for a, b in zip(score(q), so)) and score(q) != so
                        for q in options)
        if not dominated:
            out.append(o)
    return out


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
