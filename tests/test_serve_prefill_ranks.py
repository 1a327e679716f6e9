"""A disaggregated prefill worker with data-parallel attention prefills a whole prompt on each of
its attention-DP ranks per pass (planner/serve/evaluate.py ``prefill_prompts``): the pool's
capacity and the burst a new request waits behind count prompts per pass, not per worker. An
aggregated worker's prompts obey the same rule (``prompt_tokens``): a prompt on its own rank."""
from __future__ import annotations

import pytest

from clusters import load_cluster
from models import load_model
from planner.serve.client import BenchmarkClient
from planner.cost.compute import KERNEL_LAUNCH_S
from planner.serve.evaluate import (evaluate_serving, prefill_burst, prefill_pass,
                                    prefill_prompts, prompt_tokens)
from planner.serve.phases import Calibration, iteration_time
from planner.serve.runtime import CALIBRATED
from planner.serve.workload import ServingConfig, ServingWorkload, WorkerConfig

CALIB = Calibration.from_mapping({**CALIBRATED, "prefill_queue_fraction": {"trtllm": 0.14}})
STEADY = BenchmarkClient()  # a long closed loop of fixed lengths, no start-up burst


def test_prompts_per_pass_and_the_burst_by_hand():
    assert prefill_prompts(WorkerConfig(tp=8, ep=8)) == 1
    assert prefill_prompts(WorkerConfig(tp=1, ep=8, attention_dp=8)) == 8
    assert prefill_prompts(WorkerConfig(tp=1, ep=4, attention_dp=4), 2) == 8
    # 36 requests in flight on one worker, 0.14 of the others arriving together: 0.14 x (36 - 8)
    # = 3.92 prompts ahead, spread over 8 ranks = 0.49 passes (one rank: 0.14 x 35 = 4.9)
    assert prefill_burst(CALIB, "trtllm", STEADY, 36, 1, 8) == pytest.approx(0.49)
    assert prefill_burst(CALIB, "trtllm", STEADY, 36, 1, 1) == pytest.approx(4.9)
    # two workers halve the requests each sees: 0.14 x (18 - 8) / 8
    assert prefill_burst(CALIB, "trtllm", STEADY, 36, 2, 8) == pytest.approx(0.175)


def test_a_pass_prefills_a_whole_prompt_on_every_rank():
    ds, h200 = load_model("deepseek-v3"), load_cluster("dgx-h200", nodes=2)
    wl = ServingWorkload(isl=1024, osl=1024, concurrency=16, mode="disaggregated",
                         dtype="fp8", kv_dtype="fp8", client=STEADY)
    adp = WorkerConfig(tp=1, ep=8, attention_dp=8)
    seconds, it = prefill_pass(ds, h200, wl, adp, "trtllm", CALIB, 8192)
    # one iteration of 8 whole prompts (1,024 tokens on each rank), 8 first tokens sampled
    assert it == iteration_time(ds, h200, adp, "fp8", "fp8", CALIB, decode_seqs=0, context=0,
                                prefill_tokens=8 * 1024, prefill_isl=1024,
                                prefill_requests=8, runtime="trtllm")
    assert seconds == it.total_s
    # eager: the host issues each MoE layer in 2 ms (planner.cost.moe) and each rank's
    # prompt takes about as long on its GPU, so 8 prompts on 8 ranks take about one tp8
    # worker's host-bound pass of one prompt (1.05 x here), not 8 of them
    one, it1 = prefill_pass(ds, h200, wl, WorkerConfig(tp=8, ep=8), "trtllm", CALIB, 8192)
    assert it1.host_s > 0 and one < seconds < 1.15 * one
    # a per-rank budget below the prompt chunks every rank's prompt alike
    chunked, it2 = prefill_pass(ds, h200, wl, adp, "trtllm", CALIB, 512)
    assert chunked == 2 * it2.total_s
    assert it2 == iteration_time(ds, h200, adp, "fp8", "fp8", CALIB, decode_seqs=0, context=0,
                                 prefill_tokens=8 * 512, prefill_isl=1024,
                                 prefill_requests=4, runtime="trtllm")
    # the evaluation uses that pass: TTFT >= one pass + the burst of 16 requests on 8 ranks
    cfg = ServingConfig("disaggregated", prefill=adp, decode=WorkerConfig(tp=8, ep=8),
                        prefill_workers=1, decode_workers=1, batch=64, max_num_tokens=8192)
    ev = evaluate_serving(ds, h200, wl, cfg, "trtllm", CALIB)
    assert ev.fits and ev.pools[0].iteration == it
    burst = 0.14 * (16 - 8) / 8
    assert ev.ttft_s >= seconds * (1 + burst) + ev.kv_transfer_s
    # the pool's utilisation (M/D/1) counts 8 prompts a pass: under 1 % extra here
    assert ev.ttft_s <= seconds * (1 + burst) * 1.01 + ev.kv_transfer_s


def test_an_aggregated_prompt_lives_on_one_rank_by_hand():
    """An aggregated worker with data-parallel attention obeys the prefill pass's rule: each
    rank carries its own requests' whole prompts (chunked at its own budget), the ranks step
    together, and the iteration takes the busiest rank's time (evaluate.py ``prompt_tokens``),
    not a prompt split over the ranks."""
    # (the worker's, the busiest rank's) prompt tokens of a prompt-carrying iteration
    assert prompt_tokens(64, 4096, 8184, 8) == (4096, 4096)  # one prompt, on one rank
    assert prompt_tokens(64, 4096, 8184, 1) == (4096, 4096)  # as without attention DP
    assert prompt_tokens(8192, 4096, 8184, 8) == (8192, 4096)  # two prompts on two ranks
    assert prompt_tokens(65536, 4096, 8184, 8) == (65536, 8192)  # two on every rank
    assert prompt_tokens(64, 16384, 8184, 8) == (8184, 8184)  # a chunk of the rank's budget
    ds, h200 = load_model("deepseek-v3"), load_cluster("dgx-h200")
    wl = ServingWorkload(isl=4096, osl=1024, concurrency=64, dtype="fp8", kv_dtype="fp8",
                         client=STEADY)
    w = WorkerConfig(tp=1, ep=8, attention_dp=8)
    cfg = ServingConfig("aggregated", worker=w, batch=64, max_num_tokens=8192)
    ev = evaluate_serving(ds, h200, wl, cfg, "trtllm", CALIB)
    assert ev.fits and ev.pools[0].batch == 64

    def step(prefill, rank=None):
        return iteration_time(ds, h200, w, "fp8", "fp8", CALIB, decode_seqs=64,
                              context=4096 + 512, prefill_tokens=prefill, prefill_isl=4096,
                              prefill_requests=prefill / 4096, runtime="trtllm",
                              prefill_rank_tokens=rank)

    # 64 sequences of 1,024 steps: 64 x 4096 / 1024 = 256 prompt tokens an iteration on
    # average; one rank takes a whole prompt (under its budget of 8192 - 64 / 8 = 8184
    # tokens) in 1 of 16 iterations, the others decode only
    whole, split, pure = step(4096, 4096), step(4096), step(0)
    mean = ev.pools[0].iteration
    assert mean.total_s == pytest.approx(whole.total_s / 16 + pure.total_s * 15 / 16,
                                         rel=1e-12)
    # that rank's prompt attention is 8 x the split prompt's (61 layers' launches apart), and
    # its iteration > 3 x the split one's (402 ms against 120 ms, which the host floor holds)
    launches = 61 * KERNEL_LAUNCH_S
    assert whole.attention_s - pure.attention_s - launches == pytest.approx(
        8 * (split.attention_s - pure.attention_s - launches), rel=1e-9)
    assert whole.total_s > 3 * split.total_s
    # TTFT: its own prompt (one iteration on its rank) + the running iteration it joins after
    # + passes of a prompt on each of the 8 ranks: 0.14 x (64 - 8) / 8 = 0.98 of them
    # arriving with it, and the M/D/1 wait at 64 / (1024 x mean) x pass / 8 utilisation
    one_pass = step(8 * 4096, 4096).total_s - pure.total_s
    rho = 64 / (1024 * mean.total_s) * one_pass / 8
    expected = (whole.total_s + mean.total_s + rho / (2 * (1 - rho)) * one_pass
                + 0.98 * one_pass)
    assert ev.ttft_s == pytest.approx(expected, rel=1e-9)
    # a pass with a prompt on every rank is the prefill worker's pass (its rule, one formula)
    seconds, it = prefill_pass(ds, h200, wl, w, "trtllm", CALIB, 8192)
    assert it.total_s == pytest.approx(iteration_time(
        ds, h200, w, "fp8", "fp8", CALIB, decode_seqs=0, context=0, prefill_tokens=8 * 4096,
        prefill_isl=4096, prefill_requests=8, runtime="trtllm",
        prefill_rank_tokens=4096).total_s, rel=1e-12)
