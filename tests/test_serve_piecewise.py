"""Piecewise CUDA graphs of prompt-carrying iterations (ServingConfig.prefill_capture_num_tokens,
TensorRT-LLM torch_compile_config): the attention core eager at the iteration's tokens, every
other part of a block replayed at the smallest captured count at or above them, no MoE host
floor; beyond the largest captured count the iteration is the eager one."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from clusters import load_cluster
from models import load_model
from planner.errors import PlannerError
from planner.serve.evaluate import evaluate_serving
from planner.serve.phases import Calibration, captured_tokens, iteration_time
from planner.serve.plan import config_from_dict
from planner.serve.runtime import CALIBRATED
from planner.serve.workload import ServingConfig, ServingWorkload, WorkerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

# InferenceX benchmarks/dsr1_fp8_b200_trt_mtp.sh at MAX_NUM_TOKENS 1216 (1, 2, ..., 128, then
# every 256 up to MAX_NUM_TOKENS, then MAX_NUM_TOKENS itself)
CAPTURE = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1216)
CALIB = Calibration.from_mapping(CALIBRATED)


@pytest.fixture(scope="module")
def deepseek():
    return load_model("deepseek-v3")


@pytest.fixture(scope="module")
def b200():
    return load_cluster("dgx-b200")


def _it(model, cluster, worker, decode, prompt, capture=(), draft=0, requests=None):
    return iteration_time(model, cluster, worker, "fp8", "fp8", CALIB, decode_seqs=decode,
                          context=1536, prefill_tokens=prompt, prefill_isl=1024,
                          prefill_requests=prompt / 1024 if requests is None else requests,
                          runtime="trtllm",
                          draft_tokens=draft, capture_num_tokens=capture)


def test_captured_token_count_is_the_next_captured_size():
    assert captured_tokens(1000, CAPTURE) == 1024
    assert captured_tokens(1024, CAPTURE) == 1024
    assert captured_tokens(1024.5, CAPTURE) == 1216
    assert captured_tokens(1216, CAPTURE) == 1216
    assert captured_tokens(1217, CAPTURE) is None
    assert captured_tokens(3, ()) is None


def test_captured_iteration_has_no_host_floor_and_pads_the_captured_pieces(deepseek, b200):
    w = WorkerConfig(tp=8, ep=8)
    eager = _it(deepseek, b200, w, 32, 968, requests=1)
    graph = _it(deepseek, b200, w, 32, 968, CAPTURE, requests=1)  # 1,000 tokens: the 1,024 graph
    assert eager.host_s > 0 and graph.host_s == 0.0
    assert graph.total_s < eager.total_s
    # the attention core runs eagerly at the iteration's own tokens
    assert graph.attention_s == eager.attention_s
    # GEMMs and collectives run at 1,024 tokens: those of an eager iteration of 1,024 tokens
    # (one prompt sampling its first token in both; the head runs on sampled positions only)
    padded = _it(deepseek, b200, w, 32, 992, requests=1)
    assert graph.gemm_s == pytest.approx(padded.gemm_s, rel=1e-12)
    assert graph.comm_s == pytest.approx(padded.comm_s, rel=1e-12)
    assert graph.gemm_s > eager.gemm_s


def test_beyond_the_largest_capture_and_decode_only_iterations_are_unchanged(deepseek, b200):
    w = WorkerConfig(tp=8, ep=8)
    assert _it(deepseek, b200, w, 32, 1200, CAPTURE) == _it(deepseek, b200, w, 32, 1200)
    assert _it(deepseek, b200, w, 32, 0, CAPTURE) == _it(deepseek, b200, w, 32, 0)
    assert _it(deepseek, b200, w, 32, 0, CAPTURE, draft=3) == _it(deepseek, b200, w, 32, 0,
                                                                   draft=3)
    # a dense model has no host floor: capture only pads its captured pieces
    llama = load_model("llama-3.1-70b")
    one = WorkerConfig(tp=1)
    assert _it(llama, b200, one, 8, 1000, CAPTURE).host_s == 0.0
    assert (_it(llama, b200, one, 8, 1000, CAPTURE).attention_s
            == _it(llama, b200, one, 8, 1000).attention_s)


def test_iteration_time_does_not_fall_with_prompt_tokens_under_capture(deepseek, b200):
    """What the searches' bounds rely on, across captured sizes and the eager boundary."""
    w = WorkerConfig(tp=8, ep=8)
    times = [_it(deepseek, b200, w, 32, p, CAPTURE).total_s for p in range(0, 1400, 23)]
    assert all(b >= a for a, b in zip(times, times[1:]))


def test_attention_dp_counts_tokens_per_rank(deepseek, b200):
    """With data-parallel attention each rank's own tokens pick its graph: 1,200 prompt tokens
    over 8 attention ranks are 150 per rank, the 256 graph (captured, no host floor)."""
    w = WorkerConfig(tp=1, ep=8, attention_dp=8)
    assert _it(deepseek, b200, w, 0, 8 * 150, CAPTURE).host_s == 0.0
    assert _it(deepseek, b200, w, 0, 8 * 150).host_s > 0.0


def test_config_validates_and_round_trips_the_capture_list():
    base = dict(worker=WorkerConfig(tp=8), batch=32)
    for bad in ((0, 4), (4, 2), (2, 2), [1, 2], (1.5,), (True,)):
        with pytest.raises(PlannerError):
            ServingConfig("aggregated", prefill_capture_num_tokens=bad, **base)
    cfg = ServingConfig("aggregated", prefill_capture_num_tokens=CAPTURE, **base)
    assert cfg.as_dict()["prefill_capture_num_tokens"] == list(CAPTURE)
    assert config_from_dict(cfg.as_dict()) == cfg
    plain = ServingConfig("aggregated", **base)
    assert "prefill_capture_num_tokens" not in plain.as_dict()  # plans without it unchanged
    assert config_from_dict(plain.as_dict()) == plain


def test_evaluation_reads_the_capture_in_both_modes(deepseek, b200):
    wl = ServingWorkload(isl=1024, osl=1024, concurrency=32, dtype="fp8", kv_dtype="fp8",
                         draft_tokens=3)
    agg = ServingConfig("aggregated", worker=WorkerConfig(tp=8, ep=8), batch=32,
                        max_num_tokens=1216)
    eager = evaluate_serving(deepseek, b200, wl, agg, "trtllm")
    graph = evaluate_serving(deepseek, b200, wl, replace(agg, prefill_capture_num_tokens=CAPTURE),
                             "trtllm")
    assert graph.ttft_s < eager.ttft_s and graph.tpot_s < eager.tpot_s
    cluster = load_cluster("dgx-b200", nodes=2)
    dwl = replace(wl, mode="disaggregated", draft_tokens=0)
    dis = ServingConfig("disaggregated", prefill=WorkerConfig(tp=8, ep=8),
                        decode=WorkerConfig(tp=8, ep=8), prefill_workers=1, decode_workers=1,
                        batch=32, max_num_tokens=1216)
    d_eager = evaluate_serving(deepseek, cluster, dwl, dis, "trtllm")
    d_graph = evaluate_serving(deepseek, cluster, dwl,
                               replace(dis, prefill_capture_num_tokens=CAPTURE), "trtllm")
    assert d_graph.ttft_s < d_eager.ttft_s
    assert d_graph.tpot_s == d_eager.tpot_s  # the decode pool never prefills


def test_published_piecewise_config_reaches_exactly_the_rows_that_state_it():
    """The deployment facts' torch_compile_config (enable_piecewise_cuda_graph) is read into
    the case's deployment wherever a row's facts state it, and nowhere else."""
    from inference_data import cases, deployments

    stated = {k for k, f in deployments().items()
              if (f.get("torch_compile_config") or {}).get("enable_piecewise_cuda_graph")}
    assert stated  # the single-node TensorRT-LLM MTP rows
    for c in cases():
        if c.id in stated:
            facts = deployments()[c.id]["torch_compile_config"]
            assert c.config.prefill_capture_num_tokens == tuple(facts["capture_num_tokens"])
            assert c.config.prefill_capture_num_tokens[-1] == c.config.max_num_tokens
        else:
            assert c.config.prefill_capture_num_tokens == ()


def test_cli_evaluate_takes_the_capture_list(capsys):
    import json

    from conftest import run_cli

    base = ["evaluate", "--workload", "serve", "--model", "deepseek-v3", "--cluster", "dgx-b200",
            "--tp", 8, "--ep", 8, "--isl", 1024, "--osl", 1024, "--concurrency", 32,
            "--dtype", "fp8", "--kv-dtype", "fp8", "--runtime", "trtllm", "--speculative",
            "mtp:3", "--max-num-tokens", 1216, "--batch", 32, "--json"]
    code, out, _ = run_cli(base, capsys)
    assert code == 0
    eager = json.loads(out)
    code, out, _ = run_cli(base + ["--prefill-capture-num-tokens",
                                   ",".join(map(str, CAPTURE))], capsys)
    assert code == 0
    graph = json.loads(out)
    assert graph["inference"]["deployment"]["prefill_capture_num_tokens"] == list(CAPTURE)
    assert graph["predicted"]["ttft_ms"] < eager["predicted"]["ttft_ms"]
    for bad in ("4,2", "x", "0,8"):
        code, out, err = run_cli(base + ["--prefill-capture-num-tokens", bad], capsys)
        assert code == 2 and "capture_num_tokens" in (out + err).replace("-", "_")
