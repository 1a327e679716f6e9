"""The physical decode floor (planner/serve/floor.py): its byte count against the memory
model's, the cost model never below it, and the runtimes' default token budgets."""
from __future__ import annotations

import pytest

from clusters import load_cluster
from models import load_model
from planner.ir import LayerKind
from planner.serve.floor import decode_floor_s, decode_step_bytes, experts_hit_fraction
from planner.serve.memory import kv_bytes_per_token, weight_bytes_per_gpu
from planner.serve.phases import Calibration, iteration_time
from planner.serve.runtime import CALIBRATED, runtime
from planner.serve.workload import WorkerConfig


@pytest.fixture(scope="module")
def llama70():
    return load_model("llama-3.1-70b")


def test_floor_bytes_are_the_weights_a_step_reads_plus_the_kv(llama70):
    w = WorkerConfig(tp=2)
    embedding = sum(layer.params for layer in llama70.layers
                    if layer.kind is LayerKind.EMBEDDING) / w.tp * 2
    # one sequence at no context reads every weight on the GPU but the embedding table
    weights = decode_step_bytes(llama70, w, "fp8", "fp8", 1, 0)
    assert weights == pytest.approx(weight_bytes_per_gpu(llama70, w, "fp8") - embedding,
                                    rel=1e-9)
    # each sequence adds its context's KV bytes
    kv = decode_step_bytes(llama70, w, "fp8", "fp8", 32, 1536) - weights
    assert kv == pytest.approx(32 * 1536 * kv_bytes_per_token(llama70, w, "fp8"), rel=1e-9)
    # pipeline stages read their own layers' KV once a step; weights still all of them
    pp = WorkerConfig(tp=2, pp=2)
    assert decode_step_bytes(llama70, pp, "fp8", "fp8", 32, 1536) == pytest.approx(
        weights + kv / 2, rel=1e-9)


def test_experts_hit_fraction():
    assert experts_hit_fraction(8, 256, 0) == 0.0
    assert experts_hit_fraction(8, 256, 1) == pytest.approx(8 / 256)
    values = [experts_hit_fraction(8, 256, t) for t in (1, 4, 32, 256, 4096)]
    assert values == sorted(values) and values[-1] == pytest.approx(1.0)


@pytest.mark.parametrize("model_name, cluster, worker, dtype", [
    ("llama-3.1-70b", "dgx-h100", WorkerConfig(tp=1), "fp8"),
    ("llama-3.1-70b", "dgx-h100", WorkerConfig(tp=4, pp=2), "fp8"),
    ("deepseek-v3", "dgx-b200", WorkerConfig(tp=8, ep=8), "fp4"),
    ("deepseek-v3", "dgx-b200", WorkerConfig(tp=1, ep=8, attention_dp=8), "fp8"),
])
def test_cost_model_decode_step_never_below_the_floor(model_name, cluster, worker, dtype):
    model, hw = load_model(model_name), load_cluster(cluster)
    calib = Calibration.from_mapping(CALIBRATED)
    for seqs in (1, 8, 32, 256):
        floor = decode_floor_s(model, hw.gpu, worker, dtype, "fp8", seqs, 1536)
        step = iteration_time(model, hw, worker, dtype, "fp8", calib, decode_seqs=seqs,
                              context=1536).total_s
        assert floor > 0 and step >= floor, (seqs, step, floor)


def test_runtime_default_token_budgets():
    h100, b200 = load_cluster("dgx-h100").gpu, load_cluster("dgx-b200").gpu
    assert runtime("vllm").default_max_num_tokens(h100) == 8192
    assert runtime("sglang").default_max_num_tokens(h100) == 8192
    assert runtime("sglang").default_max_num_tokens(b200) == 16384
    assert runtime("trtllm").default_max_num_tokens(b200) == 8192
    from dataclasses import replace
    small = replace(h100, name="NVIDIA L40S", memory_gib=45.0)
    assert runtime("vllm").default_max_num_tokens(small) == 2048
    assert runtime("sglang").default_max_num_tokens(replace(small, memory_gib=24.0)) == 2048
    assert runtime("vllm").default_max_num_tokens(replace(h100, name="NVIDIA A100-SXM4-80GB")) \
        == 2048
