"""The benchmark client's TTFT terms (planner/serve/client.py) and the clients recorded in the
calibration data (bench/data/inference_runs.yaml ``workload.client``)."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from clusters import load_cluster
from models import load_model
from planner.errors import PlannerError
from planner.serve.client import ARRIVALS, BenchmarkClient, prompts_ahead
from planner.serve.evaluate import aggregated_ttft_bound_s, evaluate_serving
from planner.serve.workload import ServingConfig, ServingWorkload, WorkerConfig

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

BURST = BenchmarkClient("closed-loop", 0, rounds=20, startup_burst=True)


def test_prompts_ahead_by_client():
    steady = BenchmarkClient()
    assert prompts_ahead(steady, 32, 31, 0.1) == pytest.approx(3.1)
    # the measured start-up burst: (c - 1) / 2 prompts ahead in one round of 20
    assert prompts_ahead(BURST, 32, 31, 0.1) == pytest.approx(3.1 + 31 / 2 / 20)
    # random gaps or random lengths do not synchronise
    assert prompts_ahead(BenchmarkClient("poisson"), 32, 31, 0.1) == 0.0
    assert prompts_ahead(BenchmarkClient(length_stddev_tokens=50), 32, 31, 0.1) == 0.0
    # a start-up burst is measured whether or not the loop then synchronises
    assert prompts_ahead(replace(BURST, arrival="poisson"), 32, 31, 0.1) == pytest.approx(
        31 / 2 / 20)
    # lengths uniform in [0.8, 1] x nominal (benchmark_serving --random-range-ratio 0.8)
    assert BenchmarkClient(length_range_ratio=0.8).mean_tokens(1024) == 922
    # never falls as the requests in flight grow (the search's TTFT bound rests on it)
    values = [prompts_ahead(BURST, c, c - 1, 0.1) for c in range(1, 50)]
    assert values == sorted(values) and values[0] == 0.0


@pytest.mark.parametrize("kwargs, field", [
    (dict(arrival="burst"), "arrival"), (dict(length_stddev_tokens=-1), "length_stddev_tokens"),
    (dict(length_stddev_tokens=float("inf")), "length_stddev_tokens"), (dict(rounds=0), "rounds"),
    (dict(rounds=float("nan")), "rounds"), (dict(length_range_ratio=0), "length_range_ratio"),
    (dict(length_range_ratio=1.5), "length_range_ratio"), (dict(rounds=True), "rounds")])
def test_bad_client_is_a_clear_error(kwargs, field):
    # the numbers through the one finite/bounds check of every input (planner.safe_input)
    with pytest.raises(PlannerError, match=field):
        BenchmarkClient(**kwargs)


def _setup():
    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100", nodes=1)
    cfg = ServingConfig("aggregated", worker=WorkerConfig(tp=1), replicas=1, batch=256,
                        max_num_tokens=8192)
    return model, cluster, cfg


def test_client_moves_ttft_only_and_the_bound_holds():
    model, cluster, cfg = _setup()
    wl = ServingWorkload(isl=1024, osl=256, concurrency=32, dtype="fp8", kv_dtype="fp8")
    ttft = {c.arrival + str(c.startup_burst): evaluate_serving(
        model, cluster, replace(wl, client=c), cfg, "vllm") for c in
        (BenchmarkClient(), BURST, BenchmarkClient("poisson"))}
    steady, burst, poisson = (ttft[k] for k in ("closed-loopFalse", "closed-loopTrue",
                                                "poissonFalse"))
    assert poisson.ttft_s < steady.ttft_s < burst.ttft_s
    assert poisson.tpot_s == steady.tpot_s == burst.tpot_s  # TPOT is the decode batch's
    for lo, hi in ((1, 32), (8, 16), (32, 32)):
        bound = aggregated_ttft_bound_s(model, cluster, replace(wl, client=BURST), cfg, lo, hi,
                                        "vllm")
        ttfts = [evaluate_serving(model, cluster, replace(wl, concurrency=b, client=BURST), cfg,
                                  "vllm").ttft_s for b in range(lo, hi + 1)]
        assert bound <= min(ttfts) * (1 + 1e-12)


def test_a_closed_loop_request_waits_out_the_running_iteration():
    """The runtimes admit new requests at the start of an iteration; a closed loop sends one
    as another's last token returns, as the next iteration starts, so it waits that whole
    iteration; random arrivals wait half of one on average. Without synchronisation (random
    lengths) and without a start-up burst nothing else differs: by hand, the two TTFTs differ
    by half the mean iteration."""
    model, cluster, cfg = _setup()
    closed = BenchmarkClient(length_stddev_tokens=100)
    poisson = BenchmarkClient("poisson", length_stddev_tokens=100)
    assert (closed.join_iterations, poisson.join_iterations,
            BenchmarkClient("offline").join_iterations) == (1.0, 0.5, 0.0)
    wl = ServingWorkload(isl=1024, osl=256, concurrency=32, dtype="fp8", kv_dtype="fp8")
    a = evaluate_serving(model, cluster, replace(wl, client=closed), cfg, "vllm")
    b = evaluate_serving(model, cluster, replace(wl, client=poisson), cfg, "vllm")
    iteration = a.pools[0].iteration.total_s
    assert b.pools[0].iteration.total_s == iteration and a.tpot_s == b.tpot_s
    assert a.ttft_s - b.ttft_s == pytest.approx(0.5 * iteration, rel=1e-9)


def test_every_calibration_entry_names_its_client_with_a_source():
    from inference_data import client, clients, entries

    for spec in clients().values():
        assert spec["arrival"] in ARRIVALS and spec["source"] and spec["tool"]
    for entry in entries():
        spec = clients()[entry["workload"]["client"]]
        if entry["results"].get("ttft_ms_mean") is not None:
            # a measured TTFT comes from a closed loop whose rounds say how much of the
            # start-up burst it holds
            assert spec["arrival"] == "closed-loop" and spec["rounds"] >= 1
        assert client(entry["workload"]).synchronised  # fixed lengths, no random gaps
