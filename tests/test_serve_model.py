"""Serving cost model: memory formulas, roofline regimes, search vs brute force, CLI contract."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import pytest
from conftest import run_cli

from clusters import load_cluster
from models import load_model
from planner.errors import PlannerError
from planner.hardware import GIB
from planner.serve.evaluate import evaluate_serving
from planner.serve.memory import kv_bytes_per_token, weight_bytes_per_gpu
from planner.serve.search import search_serving, worker_layouts
from planner.serve.workload import ServingConfig, ServingWorkload, WorkerConfig


@pytest.fixture(scope="module")
def llama70():
    return load_model("llama-3.1-70b")


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100")


def test_kv_cache_per_token_gqa_and_mla(llama70):
    # Llama-3.1-70B: 80 layers x 8 KV heads x (128 K + 128 V) x 2 bytes = 327,680 B per token
    assert kv_bytes_per_token(llama70, WorkerConfig(tp=1), "bf16") == 80 * 8 * 256 * 2
    # TP shards KV heads; fp8 halves the bytes; beyond 8 ranks KV heads are replicated
    assert kv_bytes_per_token(llama70, WorkerConfig(tp=8), "fp8") == 80 * 1 * 256 * 1
    assert kv_bytes_per_token(llama70, WorkerConfig(tp=16), "fp8") == 80 * 1 * 256 * 1
    # DeepSeek-V3 MLA: latent 512 + rope key 64 per layer, the same on every TP rank
    ds = load_model("deepseek-v3")
    blocks = sum(1 for _ in ds.blocks())
    assert kv_bytes_per_token(ds, WorkerConfig(tp=8), "bf16") == blocks * (512 + 64) * 2
    # pipeline stages keep the KV of their own layers
    assert kv_bytes_per_token(llama70, WorkerConfig(tp=1, pp=4), "bf16") == 20 * 8 * 256 * 2


def test_sliding_window_layers_keep_window_tokens():
    from planner.ir import Attention
    model = load_model("tiny")
    windowed = replace(model, layers=tuple(
        replace(layer, attention=replace(layer.attention, sliding_window=32))
        if layer.attention is not None else layer for layer in model.layers))
    full = kv_bytes_per_token(model, WorkerConfig(), "bf16", context=128)
    assert kv_bytes_per_token(windowed, WorkerConfig(), "bf16", context=128) == full * 32 / 128
    assert isinstance(windowed.layers[1].attention, Attention)


def test_weights_at_serving_precision(llama70):
    bf16 = weight_bytes_per_gpu(llama70, WorkerConfig(tp=1), "bf16")
    fp8 = weight_bytes_per_gpu(llama70, WorkerConfig(tp=1), "fp8")
    fp4 = weight_bytes_per_gpu(llama70, WorkerConfig(tp=1), "fp4")
    assert bf16 == pytest.approx(2 * llama70.params, rel=1e-9)
    # fp8 halves the block GEMM weights; embeddings and head stay bf16 (2 x 128256 x 8192)
    embed_head = 2 * 2 * 128256 * 8192
    assert fp8 == pytest.approx((bf16 - embed_head) / 2 + embed_head, rel=2e-3)
    assert fp4 < fp8 < bf16
    assert weight_bytes_per_gpu(llama70, WorkerConfig(tp=8), "bf16") == pytest.approx(bf16 / 8,
                                                                                     rel=1e-3)


def _agg(model, cluster, w, conc, dtype="fp8", **kw):
    wl = ServingWorkload(isl=1024, osl=1024, concurrency=conc, dtype=dtype, kv_dtype="fp8", **kw)
    return evaluate_serving(model, cluster, wl, ServingConfig("aggregated", worker=w), "vllm")


def test_decode_is_bandwidth_bound_at_batch_one_and_throughput_grows(llama70, h100):
    one = _agg(llama70, h100, WorkerConfig(tp=8), 1)
    gemm = one.pools[0].iteration.gemm_s
    weights = weight_bytes_per_gpu(llama70, WorkerConfig(tp=8), "fp8")
    # reading the weights once per step at the decode HBM efficiency is the floor
    from planner.serve.runtime import CALIBRATED
    floor = weights / (h100.gpu.hbm_bandwidth_gbytes_per_s * 1e9 *
                       CALIBRATED["decode_hbm_efficiency"])
    assert floor <= gemm < 3 * floor
    prev = None
    for c in (1, 4, 16, 64, 256):
        ev = _agg(llama70, h100, WorkerConfig(tp=8), c)
        if prev is not None:
            assert ev.tpot_s >= prev.tpot_s and ev.ttft_s >= prev.ttft_s
            assert ev.output_tokens_per_s_per_gpu > prev.output_tokens_per_s_per_gpu
        prev = ev


def test_capacity_limits_batch(llama70, h100):
    ev = _agg(llama70, h100, WorkerConfig(tp=1), 8, dtype="bf16")
    assert not ev.fits  # 141 GB of bf16 weights on one 80 GB GPU
    ev = _agg(llama70, h100, WorkerConfig(tp=2), 8)
    mem = ev.pools[0].memory
    per_seq = math.ceil((1024 + 512) / 16) * 16 * mem.kv_bytes_per_token
    assert ev.pools[0].max_batch == min(ev.config.batch, int(mem.kv_budget_bytes // per_seq),
                                        int(8192 / 2))
    assert ev.kv_cache_gib == pytest.approx(mem.kv_budget_bytes / GIB)


def test_validation_errors(llama70, h100):
    with pytest.raises(PlannerError):
        ServingWorkload(isl=10, osl=10, concurrency=4, request_rate_per_s=1.0)
    with pytest.raises(PlannerError):
        _agg(llama70, h100, WorkerConfig(tp=3), 4)  # 64 heads
    with pytest.raises(PlannerError):
        _agg(llama70, h100, WorkerConfig(tp=2, ep=2), 4)  # dense model
    with pytest.raises(PlannerError):  # more GPUs than the cluster
        _agg(llama70, h100, WorkerConfig(tp=16), 4)


def test_disaggregated_kv_transfer_and_pools(h100):
    model = load_model("llama-3.1-8b")
    cluster = load_cluster("dgx-h100", nodes=2)
    wl = ServingWorkload(isl=2048, osl=256, concurrency=64, mode="disaggregated", dtype="fp8",
                         kv_dtype="fp8")
    cfg = ServingConfig("disaggregated", prefill=WorkerConfig(tp=2), decode=WorkerConfig(tp=4),
                        prefill_workers=2, decode_workers=3)
    ev = evaluate_serving(model, cluster, wl, cfg, "sglang")
    assert ev.fits and ev.num_gpus == 16
    assert [p.role for p in ev.pools] == ["prefill", "decode"]
    # TPOT is a pure decode step of concurrency / decode workers sequences
    assert ev.pools[1].batch == math.ceil(64 / 3)
    assert ev.tpot_s == pytest.approx(ev.pools[1].iteration.total_s)
    # the KV of one 2048-token prompt leaves each prefill GPU over the network (pools span nodes)
    per_gpu = kv_bytes_per_token(model, WorkerConfig(tp=2), "fp8") * 2048
    assert ev.kv_transfer_s >= per_gpu / (50e9)
    assert ev.ttft_s > ev.pools[0].iteration.total_s


def test_llama70b_8xh100_target_search_is_fast(llama70, h100):
    # The search is single-threaded Python: its CPU time, unlike wall time, does not grow when
    # other jobs share the machine. Wall-clock numbers live in bench/, not in a unit test.
    import time
    start = time.process_time()
    wl = ServingWorkload(isl=1024, osl=1024, ttft_ms=500, tpot_ms=30, dtype="fp8",
                         kv_dtype="fp8")
    best = search_serving(llama70, h100, wl, "vllm").best
    assert time.process_time() - start < 5.0
    assert best is not None and best.meets_targets()
    assert best.ttft_s <= 0.5 and best.tpot_s <= 0.030


@dataclass
class _Run:
    returncode: int
    stdout: str
    stderr: str


def _invoke(args, capsys) -> _Run:
    """``shardplan ARGS`` in this process, through the real entry point (exit codes included;
    tests/conftest.py run_cli): the test is about the command, not the process."""
    return _Run(*run_cli(args, capsys))


def test_cli_evaluate_json_contract(capsys):
    out = _invoke(["evaluate", "--workload", "serve", "--model", "llama-3.1-8b", "--cluster",
                   "dgx-h100", "--tp", "2", "--replicas", "2", "--isl", "1024", "--osl", "256",
                   "--concurrency", "32", "--dtype", "fp8", "--json"], capsys)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    predicted = doc["predicted"]
    for key in ("output_tokens_per_s_per_gpu", "output_tokens_per_s_per_user", "ttft_ms",
                "tpot_ms", "max_concurrency", "kv_cache_gib", "fits"):
        assert key in predicted
    assert predicted["fits"] is True and doc["inference"]["deployment"]["num_gpus"] == 4
    bad = _invoke(["evaluate", "--workload", "serve", "--model", "llama-3.1-8b", "--cluster",
                   "dgx-h100", "--tp", "2", "--isl", "10", "--osl", "10", "--concurrency", "3",
                   "--request-rate", "2", "--json"], capsys)
    assert bad.returncode == 2 and "error" in json.loads(bad.stdout)
    disagg = _invoke(["evaluate", "--workload", "serve", "--model", "llama-3.1-8b", "--cluster",
                      "dgx-h100", "--prefill-workers", "1", "--prefill-tp", "2",
                      "--decode-workers", "1", "--decode-tp", "4", "--isl", "1024", "--osl",
                      "256", "--concurrency", "16", "--json"], capsys)
    assert disagg.returncode == 0, disagg.stderr
    assert json.loads(disagg.stdout)["inference"]["deployment"]["mode"] == "disaggregated"


def test_cli_plan_file_check_and_determinism(tmp_path, capsys):
    from clusters.loader import PRESET_DIR
    two = tmp_path / "h100x2.yaml"  # one node of 2 H100: a smaller search, the same property
    two.write_text((PRESET_DIR / "dgx-h100.yaml").read_text().replace(
        "gpus_per_node: 8", "gpus_per_node: 2").replace("nics_per_node: 8", "nics_per_node: 2"))
    args = ["plan", "--workload", "serve", "--model", "llama-3.1-8b", "--cluster", str(two),
            "--isl", "1024", "--osl", "256", "--ttft-ms", "300", "--tpot-ms", "20", "--dtype",
            "fp8", "--json"]
    first = _invoke(args, capsys)
    assert first.returncode == 0, first.stderr
    # byte-identical from a fresh process with another hash seed (no warm caches, other set
    # orders)
    import os
    import subprocess
    import sys
    second = subprocess.run([sys.executable, "-c", "from cli.main import main; main()", *args],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert first.stdout == second.stdout
    path = tmp_path / "serve.json"
    path.write_text(first.stdout)
    from planner.plan_io import load_plan
    doc = load_plan(path)
    assert doc["workload"] == "serve" and doc["predicted"]["ttft_ms"] <= 300
    ok = _invoke(["check", str(path)], capsys)
    assert ok.returncode == 0, ok.stderr
    # a batch the KV cache cannot hold must fail the check
    doc["inference"]["deployment"]["batch"] = 10**6
    doc["inference"]["workload"]["concurrency"] = 10**6
    path.write_text(json.dumps(doc))
    bad = _invoke(["check", str(path), "--json"], capsys)
    assert bad.returncode == 1
    assert not json.loads(bad.stdout)["ok"]


def test_worker_mesh_and_workload_union():
    from typing import get_args

    from planner.workload import Workload
    w = WorkerConfig(tp=2, pp=2, ep=8, attention_dp=4)
    mesh = w.mesh
    assert mesh.num_gpus == w.gpus == 16
    assert (mesh.dp, mesh.tp, mesh.ep, mesh.expert_tp) == (4, 2, 8, 1)
    assert mesh.stride("pp") == 8 and mesh.stride("ep") == 1
    assert ServingWorkload in get_args(Workload)
    assert ServingWorkload(isl=8, osl=8).kind == "serving"


def test_eager_prefill_iterations_wait_on_the_host_for_moe_layers(llama70, monkeypatch):
    """Iterations that carry prompt tokens run without CUDA graphs: each MoE layer takes at least
    serving's host floor (planner.serve.phases.SERVING_HOST_PER_LAYER_PASS_S, one forward
    pass), not the training floor re-fitted on training runs (planner.cost.moe); decode-only
    iterations (CUDA graphs) and dense layers never wait on the host."""
    from planner.cost import moe
    from planner.serve import phases
    from planner.serve.phases import Calibration, iteration_time
    from planner.serve.runtime import CALIBRATED
    calib = Calibration.from_mapping(CALIBRATED)
    h200 = load_cluster("dgx-h200")
    ds, w = load_model("deepseek-v3"), WorkerConfig(tp=8, ep=8)
    moe_layers = sum(1 for layer in ds.blocks() if layer.mlp is not None and layer.mlp.is_moe)

    def it(model, worker, decode, prompt):
        return iteration_time(model, h200, worker, "fp8", "fp8", calib, decode_seqs=decode,
                              context=1536, prefill_tokens=prompt, prefill_isl=1024,
                              prefill_requests=prompt / 1024, runtime="trtllm")

    assert it(ds, w, 32, 0).host_s == 0.0
    small = it(ds, w, 1, 16)  # a few prompt tokens: every MoE layer is host-bound
    assert small.host_s > 0
    assert small.total_s - small.overhead_s >= \
        moe_layers * phases.SERVING_HOST_PER_LAYER_PASS_S * (1 - 1e-9)
    # the training constant does not move serving (session 11 re-fitted it on training runs)
    monkeypatch.setattr(moe, "HOST_PER_LAYER_PASS_S", 10 * moe.HOST_PER_LAYER_PASS_S)
    phases._iteration_time.cache_clear()
    assert it(ds, w, 1, 16).host_s == pytest.approx(small.host_s, rel=1e-12)
    phases._iteration_time.cache_clear()
    assert it(ds, w, 1, 16).total_s > it(ds, w, 32, 0).total_s
    # a dense model never waits on the host, prefill or not
    assert it(llama70, WorkerConfig(tp=1), 1, 16).host_s == 0.0


def test_steady_iteration_schedules_whole_prompts(llama70, h100):
    """With fewer than one new prompt per iteration (b / steps < 1) a share f of the iterations
    carries one whole prompt and the rest decode only: the mean is their blend, not one
    iteration of b + b x isl / steps rows."""
    from planner.serve.evaluate import _step, mean_iteration
    from planner.serve.phases import Calibration
    from planner.serve.runtime import CALIBRATED
    calib = Calibration.from_mapping(CALIBRATED)
    wl = ServingWorkload(isl=1000, osl=1000, dtype="fp8", kv_dtype="fp8")
    w = WorkerConfig(tp=1)

    def step(b, p, rank=None):
        return _step(llama70, h100, wl, w, calib, "trtllm", b, p, rank=rank)

    b = 200  # 0.2 prompts per iteration
    mean = mean_iteration(step, b, 1000, 1000, 8192 - b)
    f = b * 1000 / 1000 / 1000
    assert mean.total_s == pytest.approx(f * step(b, 1000).total_s +
                                         (1 - f) * step(b, 0).total_s, rel=1e-12)
    # a prompt longer than the chunk is prefilled in chunk-sized pieces
    long = mean_iteration(step, b, 20000, 1000, 8192 - b)
    f = b * 20000 / 1000 / (8192 - b)
    assert long.total_s == pytest.approx(f * step(b, 8192 - b).total_s +
                                         (1 - f) * step(b, 0).total_s, rel=1e-12)
    # a prompt or more per iteration: every iteration carries b x isl / steps prompt tokens
    assert mean_iteration(step, b, 1000, 100, 8192 - b).total_s == step(b, 2000).total_s


def test_attention_dp_batch_caps_are_per_rank():
    """With data-parallel attention each rank admits its own requests under its own caps (the
    rule the exports write, WorkerConfig.rank_batch): the worker holds ranks x min(ceil(batch /
    ranks), a rank's KV capacity, the sequences a rank's token budget keeps fed). A cap of 29
    over 4 ranks holds 32 (8 a rank; before, 29, which no per-rank cap reproduces); a budget of
    15 tokens keeps floor(15 / (1 + isl/osl)) = 7 sequences fed on a rank, 28 in all (before,
    int(4 x 7.5) = 30: one rank with 8)."""
    ds, h200 = load_model("deepseek-v3"), load_cluster("dgx-h200")
    w = WorkerConfig(tp=2, ep=8, attention_dp=4)
    wl = ServingWorkload(isl=1024, osl=1024, concurrency=40, dtype="fp8", kv_dtype="fp8")

    def pool(batch, tokens):
        ev = evaluate_serving(ds, h200, wl, ServingConfig("aggregated", worker=w, batch=batch,
                                                          max_num_tokens=tokens), "sglang")
        return ev.pools[0]

    capped = pool(29, 2048)
    assert capped.max_batch == 32 and capped.batch == 32  # 40 requests, 32 run at once
    assert pool(256, 15).max_batch == 28
    assert [w.rank_batch(b) for b in (1, 4, 5, 29, 32)] == [1, 1, 2, 8, 8]
    assert WorkerConfig(tp=8).rank_batch(29) == 29
