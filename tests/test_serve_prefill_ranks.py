"""A disaggregated prefill worker with data-parallel attention prefills a whole prompt on each of
its attention-DP ranks per pass (planner/serve/evaluate.py ``prefill_prompts``): the pool's
capacity and the burst a new request waits behind count prompts per pass, not per worker."""
from __future__ import annotations

import pytest

from clusters import load_cluster
from models import load_model
from planner.serve.client import BenchmarkClient
from planner.serve.evaluate import (evaluate_serving, prefill_burst, prefill_pass,
                                    prefill_prompts)
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
