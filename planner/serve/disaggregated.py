"""Exact search of disaggregated deployments: prefill layout ``P`` x ``n_p`` workers, decode
layout ``D`` x ``n_d`` workers, decode batch ``b`` (``--max-num-seqs``), prompts batched one
per prefill iteration, on at most ``n`` GPUs; the most output tokens/s per GPU meeting the
latency targets. The same optimum as evaluating every combination
(``tests/test_serve_disaggregated.py``), by best-first branch and bound on bounds that hold
for every evaluation :func:`planner.serve.evaluate.evaluate_serving` makes:

* the request rate is at most each pool's capacity: ``n_p x r_p`` with ``r_p = a / t_prefill``
  (a prefill worker's prompts per second, idle: a pass of ``t_prefill`` prefills a prompt on
  each of its ``a`` attention-DP ranks) and ``n_d x r_d`` with ``r_d = b_eff / (osl x
  tpot(b_eff))`` (a decode worker's completions at its running batch ``b_eff``);
* hence, for any pool sizes, tokens/s per GPU ``<= osl / (|D| / r_d + |P| / r_p)`` (the two
  rates combined at the ideal pool ratio), and for given pool sizes ``<= osl x min(n_d r_d,
  n_p r_p) / GPUs``;
* TPOT (a decode step at ``b_eff``) does not fall as the batch grows (the iteration time never
  falls with more tokens: ``tests/test_serve_search.py``), so over ``b in lo .. hi`` a decode
  worker completes at most ``hi / (osl x tpot(lo))`` requests/s (``tpot(1)`` when a given load
  can hold ``b_eff`` below ``lo``), and the batches meeting the TPOT target are ``1 .. B``;
* TTFT is at least the idle prefill of one prompt, so prefill layouts missing the TTFT target
  idle are out.

Nodes ``(D, P, lo .. hi)`` are taken in order of their bound; a node whose bound is not above
the best deployment found is dropped with everything it covers; a single batch is expanded to
its pool sizes, each evaluated only when its own bound beats the best.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import replace

from planner.serve.evaluate import (ServingEvaluation, decode_iteration, pool_capacities,
                                    prefill_burst, prefill_pass, prefill_prompts)
from planner.serve.phases import Calibration
from planner.serve.runtime import runtime
from planner.serve.bisection import largest_meeting
from planner.serve.workload import ServingConfig, ServingWorkload, WorkerConfig


def disaggregated_space(model, cluster, workload: ServingWorkload, rt_name: str, layouts, n: int,
                        calib: Calibration) -> tuple[list, list, int]:
    """(decode options, prefill options, token budget): decode layouts ``(layout, batch cap)``,
    the cap what the KV cache holds at the runtime's default ``--max-num-seqs`` workspace;
    prefill layouts ``(layout, prompts per second idle, seconds of one pass)`` that hold a
    prompt on each attention group and prefill it within the TTFT target (one pass: a prompt
    on every attention-DP rank, :func:`planner.serve.evaluate.prefill_prompts`)."""
    rt = runtime(rt_name)
    budget = rt.default_max_num_tokens(cluster.gpu)
    smallest = min((w.gpus for w in layouts), default=n + 1)
    decode, prefill = [], []
    for w in layouts:
        if w.gpus + smallest > n:
            continue
        prompts, cap = pool_capacities(model, cluster, workload, w, rt_name, budget,
                                       rt.max_batch)
        if prompts >= 1:
            t_prefill, _ = prefill_pass(model, cluster, workload, w, rt_name, calib, budget)
            if workload.ttft_ms is None or t_prefill * 1e3 <= workload.ttft_ms:
                # else even an idle worker misses TTFT
                prefill.append((w, prefill_prompts(w) / t_prefill, t_prefill))
        if cap >= 1:
            decode.append((w, cap))
    return decode, prefill, budget


# seqs whose decode step bounds every decode step from below (the iteration time never falls
# with more tokens): a given load can run a decode worker below one sequence on average
LOWEST_SEQS = 1e-15
RATE_SLACK = 0.05  # how close the per-layout completion-rate bound is refined
RATE_REFINEMENTS = 6  # interval splits at most per decode layout for that bound


def search_disaggregated(model, cluster, workload: ServingWorkload, rt_name: str, layouts,
                         n: int, calib: Calibration,
                         evaluate) -> tuple[list[ServingEvaluation], int]:
    """(every deployment evaluated that meets the targets, nodes and pool sizes dropped by
    their bound); the best of the first is the optimum (see the module docstring).
    ``evaluate(workload, config)`` evaluates and counts one."""
    decode, prefill, budget = disaggregated_space(model, cluster, workload, rt_name, layouts,
                                                  n, calib)
    space = _Space(model, cluster, workload, rt_name, calib, n)
    # prefill layouts by GPU-seconds per prompt: for one decode node the cheap bound falls
    # along this order, so a decode layout's prefill partners enter the heap one at a time
    order = sorted(range(len(prefill)), key=lambda j: (prefill[j][0].gpus / prefill[j][1], j))
    space.passes = {id(w): t for w, _, t in prefill}  # a prefill layout's seconds per pass

    def partner(d: WorkerConfig, k: int) -> int | None:
        """Position in ``order`` of the first prefill layout from ``k`` that fits beside d."""
        while k < len(order) and prefill[order[k]][0].gpus + d.gpus > n:
            k += 1
        return k if k < len(order) else None

    # nodes (-bound, tight, decode option, position in order, lo, hi, root): first keyed by
    # the cheap bound over any pool sizes, re-keyed by the tight one (TTFT floor per pool
    # size) when taken; both are valid, so a node taken with a bound below the best is done
    heap: list = []
    tops: dict[int, int] = {}
    for i, (d, top) in enumerate(decode):
        if space.misses_tpot(d, top):  # the largest batch meeting TPOT (bisection)
            top = largest_meeting(1, top, lambda b, d=d: not space.misses_tpot(d, b))
            if top is None:
                continue
        tops[i] = top
        k = partner(d, 0)
        if k is not None:
            p, r_p, _ = prefill[order[k]]
            heap.append((-space.cheap_bound(d, p, r_p, 1, top), 0, i, k, 1, top, 1))
    heapq.heapify(heap)
    best = -1.0
    found: list[ServingEvaluation] = []
    pruned = 0
    while heap:
        neg, tight, i, k, lo, hi, root = heapq.heappop(heap)
        if -neg <= best:
            pruned += 1 + len(heap)
            break  # every node left is bounded by this one (and every partner not yet in)
        d, (p, r_p, _) = decode[i][0], prefill[order[k]]
        if root and not tight:  # the next prefill partner of this decode layout enters
            nxt = partner(d, k + 1)
            if nxt is not None:
                q, r_q, _ = prefill[order[nxt]]
                heapq.heappush(heap, (-space.cheap_bound(d, q, r_q, 1, tops[i]), 0, i, nxt,
                                      1, tops[i], 1))
        if space.misses_tpot(d, lo):
            pruned += 1  # TPOT does not fall with the batch: no batch of the node meets it
            continue
        if not tight:
            bound = min(-neg, space.node_bound(d, p, r_p, lo, hi))
            if bound > best:
                heapq.heappush(heap, (-bound, 1, i, k, lo, hi, root))
            else:
                pruned += 1
            continue
        if lo < hi:
            mid = (lo + hi) // 2
            for a, b in ((lo, mid), (mid + 1, hi)):
                bound = space.cheap_bound(d, p, r_p, a, b)
                if bound > best:
                    heapq.heappush(heap, (-bound, 0, i, k, a, b, 0))
                else:
                    pruned += 1
            continue
        for n_p, n_d, bound in space.pool_sizes(d, p, r_p, lo):
            if bound <= best:
                pruned += 1
                break
            cfg = ServingConfig("disaggregated", prefill=p, decode=d, prefill_workers=n_p,
                                decode_workers=n_d, batch=lo, max_num_tokens=budget)
            ev = evaluate(space.load(lo, n_d), cfg)
            if ev.meets_targets():
                found.append(ev)
                best = max(best, ev.output_tokens_per_s_per_gpu)
    return found, pruned


class _Space:
    """The bounds of the module docstring for one search."""

    def __init__(self, model, cluster, workload, rt_name, calib, n):
        self.model, self.cluster, self.workload = model, cluster, workload
        self.rt_name, self.calib, self.n = rt_name, calib, n
        self.osl, self.tps = workload.osl, workload.tokens_per_step
        self.closed = workload.request_rate_per_s is None
        self.no_load = self.closed and workload.concurrency is None
        self._tpot: dict = {}
        self._first: dict = {}
        self._cap: dict = {}
        self.passes: dict = {}  # id(prefill layout) -> seconds of one prefill pass

    def tpot(self, d: WorkerConfig, seqs: float) -> float:
        key = (id(d), seqs)  # the layouts' own objects (hashing the dataclass is slower)
        if key not in self._tpot:
            self._tpot[key] = decode_iteration(self.model, self.cluster, self.workload, d,
                                               self.rt_name, self.calib, seqs).total_s / self.tps
        return self._tpot[key]

    def rate_cap(self, d: WorkerConfig, top: int) -> float:
        """An upper bound, within ``RATE_SLACK`` of the exact value when the refinement
        budget allows, on ``max b / (osl x tpot(b))`` over ``b in 1 .. top`` (no load: the
        completion rate of one decode worker): intervals of doubling width, each bounded by
        ``hi / (osl x tpot(lo))``, the loosest split until it is within the slack of the best
        batch evaluated."""
        key = (id(d), top)
        if key in self._cap:
            return self._cap[key]
        f = lambda b: b / (self.osl * self.tpot(d, b))  # noqa: E731
        spans, lo = [], 1
        while lo <= top:
            hi = min(2 * lo - 1, top)
            spans.append((hi / (self.osl * self.tpot(d, lo)), lo, hi))
            lo = hi + 1
        known = max(f(hi) for _, _, hi in spans)
        for _ in range(RATE_REFINEMENTS):
            spans.sort()
            ub, lo, hi = spans[-1]
            if ub <= known * (1 + RATE_SLACK) or lo == hi:
                break
            spans.pop()
            mid = (lo + hi) // 2
            for a, b in ((lo, mid), (mid + 1, hi)):
                spans.append((b / (self.osl * self.tpot(d, a)), a, b))
                known = max(known, f(b), f(a))
        self._cap[key] = max(ub for ub, _, _ in spans)
        return self._cap[key]

    def misses_tpot(self, d: WorkerConfig, lo: int) -> bool:
        """No batch from ``lo`` up meets the TPOT target (no load given: the batch is the
        running batch, and TPOT does not fall as it grows)."""
        target = self.workload.tpot_ms
        return self.no_load and target is not None and self.tpot(d, lo) * 1e3 > target

    def load(self, b: int, n_d: int) -> ServingWorkload:
        """The workload a deployment of ``n_d`` decode workers of batch ``b`` is evaluated at
        (no load given: as many requests in flight as the decode pool holds)."""
        return replace(self.workload, concurrency=b * n_d) if self.no_load else self.workload

    def decode_rate(self, d: WorkerConfig, lo: int, hi: int, n_d: int) -> float:
        """Requests/s a decode worker of layout ``d`` completes at most, batch cap lo..hi,
        ``n_d`` workers (exact when lo == hi under a closed loop)."""
        if self.no_load:
            if lo == hi:
                return hi / (self.osl * self.tpot(d, lo))
            return min(hi / (self.osl * self.tpot(d, lo)), self.rate_cap(d, hi))
        if self.closed:  # the running batch the given load sets
            seqs_hi = min(self.workload.concurrency / n_d, hi)
            seqs_lo = min(self.workload.concurrency / n_d, lo)
            return seqs_hi / (self.osl * self.tpot(d, seqs_lo))
        return hi / (self.osl * self.tpot(d, LOWEST_SEQS))

    def min_prefill_workers(self, p: WorkerConfig, lo: int, n_d: int, top: int) -> int | None:
        """Fewest prefill workers of layout ``p`` whose burst floor meets TTFT at batch >=
        lo (None: none up to ``top``): TTFT >= t_prefill x (1 + burst), the pass of a prompt
        on each attention-DP rank, and the burst falls as workers are added and rises with the
        requests in flight."""
        w = self.workload
        if w.ttft_ms is None or not self.closed:
            return 1
        requests = lo * n_d if w.concurrency is None else min(w.concurrency, lo * n_d)
        t_pass, prompts = self.passes[id(p)], prefill_prompts(p)

        def ok(n_p: int) -> bool:
            burst = prefill_burst(self.calib, self.rt_name, w.client, requests, n_p, prompts)
            return t_pass * (1.0 + burst) * 1e3 <= w.ttft_ms

        key = (t_pass, prompts, requests, top)
        if key in self._first:
            return self._first[key]
        if top < 1 or not ok(top):
            self._first[key] = None
            return None
        a, b = 1, top
        while a < b:
            mid = (a + b) // 2
            if ok(mid):
                b = mid
            else:
                a = mid + 1
        self._first[key] = a
        return a

    def _sizes(self, d, p, r_p, lo, hi):
        """(n_d, fewest prefill workers, most prefill workers, decode rate) per decode size."""
        for n_d in range(1, (self.n - p.gpus) // d.gpus + 1):
            top = (self.n - n_d * d.gpus) // p.gpus
            first = self.min_prefill_workers(p, lo, n_d, top)
            if first is not None:
                yield n_d, first, top, self.decode_rate(d, lo, hi, n_d)

    def _value(self, n_p, n_d, r_d, r_p, p, d) -> float:
        rate = min(n_d * r_d, n_p * r_p)
        given = self.workload.request_rate_per_s
        if given is not None:
            if rate < given:
                return -1.0  # a pool cannot keep up: the deployment does not fit
            rate = given
        return rate * self.osl / (n_p * p.gpus + n_d * d.gpus)

    def cheap_bound(self, d, p, r_p, lo, hi) -> float:
        """Tokens/s per GPU no deployment of the node exceeds: the pools' rates combined at
        the ideal ratio, ``osl / (|D| / r_d + |P| / r_p)`` (``r_d`` at one decode worker, the
        most a worker completes)."""
        r_d = self.decode_rate(d, lo, hi, 1)
        value = self.osl / (d.gpus / r_d + p.gpus / r_p)
        given = self.workload.request_rate_per_s
        if given is not None:  # the rate is given: at least one worker per pool
            value = min(value, given * self.osl / (p.gpus + d.gpus))
        return value

    def node_bound(self, d, p, r_p, lo, hi) -> float:
        """Most tokens/s per GPU of any deployment of the node (any pool sizes)."""
        best = -1.0
        for n_d, first, top, r_d in self._sizes(d, p, r_p, lo, hi):
            # min(n_d r_d, n_p r_p) / GPUs rises until the pools balance, then falls
            balance = n_d * r_d / r_p
            for n_p in {first, top, min(max(math.floor(balance), first), top),
                        min(max(math.ceil(balance), first), top)}:
                best = max(best, self._value(n_p, n_d, r_d, r_p, p, d))
        return best

    def pool_sizes(self, d, p, r_p, b):
        """(n_p, n_d, bound) of batch ``b``, best bound first."""
        out = []
        for n_d, first, top, r_d in self._sizes(d, p, r_p, b, b):
            for n_p in range(first, top + 1):
                value = self._value(n_p, n_d, r_d, r_p, p, d)
                if value > 0:
                    out.append((-value, n_p, n_d))
        out.sort()
        return [(n_p, n_d, -neg) for neg, n_p, n_d in out]
