"""GEMMs a runtime leaves in 16 bits under FP8 (RuntimeProfile.fp8_bf16_gemms,
planner.cost.compute.gemm_dtype): Megatron-Core's output layer and router sit outside
Transformer Engine's FP8 autocast, torchtitan's float8 / MX converters filter "output" and
"router.gate"; the other GEMMs of the layer stay FP8."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clusters import load_cluster
from models import load_model
from planner.calibration.session import runtime_setup
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.compute import Shard, gemm_time_s, layer_compute, layer_gemms
from planner.cost.model import evaluate
from planner.ir import LayerKind
from planner.plan import dumps, make_plan
from planner.plan_io import validate_plan
from planner.plan_types import Plan
from planner.strategy import uniform

GRAPH = load_model("qwen3-30b-a3b")
HW = load_cluster("dgx-h100", nodes=2)
GPU = HW.gpu
SHARD = Shard(micro_batch=2, seq_len=4096, tp=1, ep=8, etp=1, dtype="fp8")


def layer(kind: LayerKind):
    return next(x for x in GRAPH.layers if x.kind is kind)


def options(runtime: str) -> RuntimeOptions:
    return runtime_setup(HW, runtime, "fp8").options


def calibrated(opts: RuntimeOptions):
    """The GPU with the calibrated GEMM efficiency layer_compute runs it at."""
    return replace(GPU, matmul_efficiency=opts.matmul_efficiency or GPU.matmul_efficiency,
                   attention_efficiency=opts.attention_efficiency or GPU.attention_efficiency)


@pytest.mark.parametrize("runtime", ["megatron", "torchtitan"])
def test_head_and_router_are_costed_in_bf16_under_fp8(runtime):
    opts = options(runtime)
    assert set(opts.fp8_bf16_gemms) == {"head", "router"}
    head = layer(LayerKind.HEAD)
    fp8 = layer_compute(head, SHARD, GPU, opts)
    bf16 = layer_compute(head, replace(SHARD, dtype="bf16"), GPU, opts)
    # the head is one GEMM plus element-wise work that does not depend on the GEMM precision
    assert fp8.gemm_fwd_s == pytest.approx(bf16.gemm_fwd_s, rel=1e-12)
    assert fp8.bwd_s == pytest.approx(bf16.bwd_s, rel=1e-12)
    (gemm,) = layer_gemms(head, SHARD)
    assert gemm.role == "head"
    assert fp8.gemm_fwd_s == pytest.approx(gemm_time_s(gemm, calibrated(opts), "bf16"),
                                           rel=1e-12)
    # without the exclusion the FP8 head is much faster: the term moves the prediction
    all_fp8 = layer_compute(head, SHARD, GPU, replace(opts, fp8_bf16_gemms=()))
    assert all_fp8.gemm_fwd_s < 0.7 * fp8.gemm_fwd_s


@pytest.mark.parametrize("runtime", ["megatron", "torchtitan"])
def test_router_alone_moves_to_bf16_in_a_moe_block(runtime):
    opts = options(runtime)
    block = layer(LayerKind.BLOCK)
    gemms = layer_gemms(block, SHARD)
    (router,) = [g for g in gemms if g.role == "router"]
    assert (router.n, router.k) == (block.mlp.num_experts, block.hidden)
    kept = layer_compute(block, SHARD, GPU, opts)
    plain = layer_compute(block, SHARD, GPU, replace(opts, fp8_bf16_gemms=()))
    factor = opts.fp8_gemm_factor
    gpu = calibrated(opts)
    delta = gemm_time_s(router, gpu, "bf16") - gemm_time_s(router, gpu, "fp8", factor)
    assert delta > 0
    assert kept.gemm_fwd_s - plain.gemm_fwd_s == pytest.approx(delta, rel=1e-9)
    assert kept.fwd_flops == plain.fwd_flops  # the work is the same, only its rate moves


def test_runtimes_without_the_exclusion_and_bf16_runs_do_not_move():
    opts = options("deepspeed")
    assert opts.fp8_bf16_gemms == ()
    head = layer(LayerKind.HEAD)
    fp8 = layer_compute(head, SHARD, GPU, opts)
    bf16 = layer_compute(head, replace(SHARD, dtype="bf16"), GPU, opts)
    assert fp8.gemm_fwd_s < 0.7 * bf16.gemm_fwd_s
    mega = options("megatron")
    block = layer(LayerKind.BLOCK)
    bshard = replace(SHARD, dtype="bf16")
    assert layer_compute(block, bshard, GPU, mega) == \
        layer_compute(block, bshard, GPU, replace(mega, fp8_bf16_gemms=()))


def test_plan_records_the_16_bit_gemms_and_check_reads_them_back():
    config = ParallelConfig(tp=1, pp=1, dp=16, ep=8, etp=1, global_batch=256, seq_len=4096,
                            zero_stage=1, dtype="fp8")
    opts = options("megatron")
    ev = evaluate(GRAPH, HW, config, uniform(GRAPH, config, "none"), opts)
    plain = evaluate(GRAPH, HW, config, uniform(GRAPH, config, "none"),
                     replace(opts, fp8_bf16_gemms=()))
    assert ev.step_time_s > plain.step_time_s
    doc = json.loads(dumps(make_plan(ev, model_spec="qwen3-30b-a3b", cluster_spec="dgx-h100",
                                     nodes=2)))
    assert doc["runtime"]["fp8_bf16_gemms"] == ["head", "router"]
    validate_plan(doc)
    plan = Plan.from_dict(doc)
    assert plan.runtime.fp8_bf16_gemms == ("head", "router")
    bad = json.loads(json.dumps(doc))
    bad["runtime"]["fp8_bf16_gemms"] = ["embedding"]
    with pytest.raises(Exception):
        validate_plan(bad)
