"""The aggregated serving search is exact: it returns what trying every layout and every batch
returns, and the two facts its pruning rests on hold batch by batch (iteration time monotone in
its decode sequences and prompt tokens; the TTFT interval bound below every TTFT it bounds)."""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

import pytest

from clusters import load_cluster
from models import load_model
from planner.serve.evaluate import (_step, aggregated_rates, aggregated_ttft_bound_s,
                                    evaluate_serving, mean_iteration, mean_iteration_bounds)
from planner.serve.phases import Calibration
from planner.serve.runtime import CALIBRATED, runtime
from planner.serve.search import search_serving, worker_layouts
from planner.serve.workload import ServingConfig, ServingWorkload, WorkerConfig

CALIB = Calibration.from_mapping(CALIBRATED)


@lru_cache(maxsize=None)
def _every_batch(name, gpus, isl, osl, rt):
    """Every layout the search enumerates at every batch up to what fits, evaluated once per
    instance setup (the targets only select among them)."""
    model, cluster = load_model(name), _cluster(gpus)
    wl = ServingWorkload(isl=isl, osl=osl, dtype="fp8", kv_dtype="fp8")
    n, caps, out = cluster.num_gpus, runtime(rt), []
    for w in worker_layouts(model, n, cluster.gpus_per_node):
        base = ServingConfig("aggregated", worker=w, replicas=n // w.gpus, batch=caps.max_batch,
                             max_num_tokens=caps.default_max_num_tokens(cluster.gpu))
        probe = evaluate_serving(model, cluster, wl, base, rt)
        if probe.fits:
            out += [evaluate_serving(model, cluster, replace(wl, concurrency=b * base.replicas),
                                     base, rt) for b in range(1, probe.pools[0].max_batch + 1)]
    return out


def _brute_best(name, gpus, wl, rt="vllm"):
    """The best per GPU of every layout at every batch meeting ``wl``'s targets."""
    best = None
    for ev in _every_batch(name, gpus, wl.isl, wl.osl, rt):
        ev = replace(ev, workload=replace(ev.workload, ttft_ms=wl.ttft_ms, tpot_ms=wl.tpot_ms))
        if ev.meets_targets() and (best is None or ev.output_tokens_per_s_per_gpu >
                                   best.output_tokens_per_s_per_gpu):
            best = ev
    return best


def _cluster(node):
    """One node of ``(gpus, GiB)`` H100s with less memory than 80 GiB: fewer batches fit (a
    cheaper brute force), the same search."""
    gpus, memory_gib = node
    cluster = replace(load_cluster("dgx-h100"), gpus_per_node=gpus)
    return replace(cluster, gpu=replace(cluster.gpu, memory_gib=memory_gib))


INSTANCES = (
    # model, GPUs (one node of GiB each), isl, osl, TTFT ms, TPOT ms, runtime
    ("llama-3.1-8b", (2, 40.0), 2048, 256, 400.0, 12.0, "vllm"),
    ("llama-3.1-8b", (4, 40.0), 4096, 256, 250.0, 20.0, "trtllm"),
    ("llama-3.1-8b", (2, 40.0), 4096, 512, 150.0, None, "sglang"),
    ("tiny-moe", (2, 3.8), 4096, 128, 30.0, 2.0, "sglang"),
    ("llama-3.1-8b", (2, 40.0), 2048, 256, None, 9.0, "vllm"),
)


@pytest.mark.parametrize("name,gpus,isl,osl,ttft,tpot,rt", INSTANCES)
def test_search_equals_brute_force(name, gpus, isl, osl, ttft, tpot, rt):
    model, cluster = load_model(name), _cluster(gpus)
    wl = ServingWorkload(isl=isl, osl=osl, ttft_ms=ttft, tpot_ms=tpot, dtype="fp8",
                         kv_dtype="fp8")
    result = search_serving(model, cluster, wl, rt)
    found, brute = result.best, _brute_best(name, gpus, wl, rt)
    assert (found is None) == (brute is None)
    if found is not None:
        assert found.meets_targets()
        assert found.output_tokens_per_s_per_gpu == pytest.approx(
            brute.output_tokens_per_s_per_gpu, rel=1e-12)
        assert result.pruned > 0  # the bounds did cut the space


def _layouts():
    for name, cluster, w, rt, draft in (
            ("llama-3.1-8b", "dgx-h100", WorkerConfig(tp=1), "vllm", 0),
            ("llama-3.1-70b", "dgx-h100", WorkerConfig(tp=2, pp=3), "trtllm", 0),
            ("mixtral-8x7b", "dgx-h100", WorkerConfig(tp=2, ep=2), "sglang", 0),
            ("deepseek-v3", "dgx-h200", WorkerConfig(tp=1, ep=8, attention_dp=8), "sglang", 1)):
        yield load_model(name), load_cluster(cluster), w, rt, draft


def test_iteration_time_never_falls_with_more_tokens():
    for model, cluster, w, rt, draft in _layouts():
        wl = ServingWorkload(isl=1024, osl=256, dtype="fp8", kv_dtype="fp8", draft_tokens=draft)
        for prefill in (0.0, 37.0, 1024.0):
            times = [_step(model, cluster, wl, w, CALIB, rt, b, prefill).total_s
                     for b in range(1, 520)]
            assert all(b >= a for a, b in zip(times, times[1:])), (model.name, w, prefill)
        for b in (1, 63, 200):
            times = [_step(model, cluster, wl, w, CALIB, rt, b, p).total_s
                     for p in range(0, 9000, 97)]
            assert all(y >= x for x, y in zip(times, times[1:])), (model.name, w, b)
            # a prompt on one attention-DP rank: neither with that rank's tokens nor with the
            # other ranks' (the worker's total, at least the rank's)
            a = w.attention_dp
            for rank in (37.0, 1024.0):
                times = [_step(model, cluster, wl, w, CALIB, rt, b, rank + p,
                               rank=rank).total_s
                         for p in range(0, int(rank * (a - 1)) + 1, 97)]
                # (to rounding: where the host floor binds, the sum is the floor)
                assert all(y >= x * (1 - 1e-12) for x, y in zip(times, times[1:])), (
                    model.name, w, b)
            times = [_step(model, cluster, wl, w, CALIB, rt, b, 2048.0, rank=r).total_s
                     for r in range(2048 // a, 2049, 31)]
            assert all(y >= x * (1 - 1e-12) for x, y in zip(times, times[1:])), (model.name,
                                                                                  w, b)


def test_mean_iteration_never_falls_with_the_batch_and_its_bounds_hold():
    """The search's pruning reads the mean steady-state iteration as non-decreasing in the
    batch, whole prompts (isl 1024 <= chunk) and chunked ones (isl 16384 > chunk alike)."""
    for model, cluster, w, rt, draft in _layouts():
        for isl, osl in ((1024, 256), (16384, 256)):
            wl = ServingWorkload(isl=isl, osl=osl, dtype="fp8", kv_dtype="fp8",
                                 draft_tokens=draft)
            steps = osl / wl.tokens_per_step

            def step(b, p, rank=None, wl=wl):
                return _step(model, cluster, wl, w, CALIB, rt, b, p, rank=rank)

            a = w.attention_dp

            def chunk(b):
                return 8192 - math.ceil(b / a * (1 + draft))

            batches = range(1, 400, 3)
            means = [mean_iteration(step, b, isl, steps, chunk(b), a).total_s for b in batches]
            assert all(y >= x for x, y in zip(means, means[1:])), (model.name, w, isl)
            for lo, hi in ((1, 10), (40, 52), (100, 160)):
                low, up = mean_iteration_bounds(step, lo, hi, isl, steps, chunk(lo), chunk(hi),
                                                a)
                inside = [mean_iteration(step, b, isl, steps, chunk(b), a).total_s
                          for b in range(lo, hi + 1)]
                assert low.total_s <= min(inside) * (1 + 1e-12)
                assert up.total_s >= max(inside) * (1 - 1e-12)


def test_ttft_bound_is_below_every_ttft_it_bounds():
    for model, cluster, w, rt, draft in _layouts():
        wl = ServingWorkload(isl=1024, osl=256, dtype="fp8", kv_dtype="fp8", draft_tokens=draft)
        caps = runtime(rt)
        cfg = ServingConfig("aggregated", worker=w, batch=caps.max_batch,
                            max_num_tokens=caps.default_max_num_tokens(cluster.gpu))
        cap = evaluate_serving(model, cluster, wl, cfg, rt).pools[0].max_batch
        ttft = {b: evaluate_serving(model, cluster, replace(wl, concurrency=b), cfg, rt).ttft_s
                for b in range(1, min(cap, 300) + 1)}
        top = max(ttft)
        for lo, hi in ((1, top), (1, 2), (top // 2, top), (100, 140), (255, 260), (top, top)):
            lo, hi = min(lo, top), min(hi, top)
            bound = aggregated_ttft_bound_s(model, cluster, wl, cfg, lo, hi, rt)
            assert bound <= min(ttft[b] for b in range(lo, hi + 1)) * (1 + 1e-12)
            assert bound > 0
        # the bound is tight on one batch: the TTFT without its queueing term's rate slack
        assert aggregated_ttft_bound_s(model, cluster, wl, cfg, 7, 7, rt) == pytest.approx(
            ttft[7], rel=1e-9)


def test_pareto_frontier_equals_every_batch():
    """Without targets or load the frontier is that of every layout at every batch (not only
    powers of two)."""
    from planner.serve.search import pareto_frontier
    model = load_model("llama-3.1-8b")
    cluster = replace(load_cluster("dgx-h100"), gpus_per_node=2)
    wl = ServingWorkload(isl=16384, osl=256, dtype="fp8", kv_dtype="fp8")
    result = search_serving(model, cluster, wl, "vllm")
    every = []
    caps = runtime("vllm")
    for w in worker_layouts(model, cluster.num_gpus, cluster.gpus_per_node):
        base = ServingConfig("aggregated", worker=w, replicas=cluster.num_gpus // w.gpus,
                             batch=caps.max_batch,
                             max_num_tokens=caps.default_max_num_tokens(cluster.gpu))
        probe = evaluate_serving(model, cluster, wl, base, "vllm")
        if probe.fits:
            every += [evaluate_serving(model, cluster, replace(
                wl, concurrency=b * base.replicas), base, "vllm")
                for b in range(1, probe.pools[0].max_batch + 1)]
    values = [(round(p.output_tokens_per_s_per_user, 9), round(p.output_tokens_per_s_per_gpu, 9))
              for p in pareto_frontier(every)]
    assert [(round(p.output_tokens_per_s_per_user, 9), round(p.output_tokens_per_s_per_gpu, 9))
            for p in result.frontier] == values
    users = [p.output_tokens_per_s_per_user for p in result.frontier]
    gpus = [p.output_tokens_per_s_per_gpu for p in result.frontier]
    assert len(users) >= 3 and users == sorted(users, reverse=True) and gpus == sorted(gpus)
    batches = {p.pools[0].batch for p in result.frontier}
    assert any(b & (b - 1) for b in batches)  # batches other than powers of two
    # fewer batches tried (on aggregated_rates, plus one probe per layout) than every batch;
    # only the frontier's points are evaluated in full
    assert result.evaluated - len(result.frontier) < len(every)
    # the search prunes on aggregated_rates: the whole evaluation's values, bit for bit
    for ev in every[::17]:
        assert aggregated_rates(model, cluster, wl, ev.config, ev.pools[0].batch, "vllm") == (
            ev.output_tokens_per_s_per_user, ev.output_tokens_per_s_per_gpu)


def test_staircase_answers_as_a_scan_of_every_point():
    """Staircase.dominated (bisection over the Pareto staircase) = any point found weakly
    dominating, on random points with ties."""
    import random

    from planner.serve.search import Staircase
    rng = random.Random(7)
    for _ in range(20):
        stairs, found = Staircase(), []
        for _ in range(60):
            user, gpu = rng.randint(0, 30) / 3, rng.randint(0, 30) / 3
            scan = any(u >= user and g >= gpu for u, g in found)
            assert stairs.dominated(user, gpu) == scan
            stairs.add(user, gpu)
            found.append((user, gpu))
        assert stairs.users == sorted(set(stairs.users))
        assert all(a > b for a, b in zip(stairs.gpus, stairs.gpus[1:]))
