"""Grouped expert GEMMs run one GEMM per local expert where the runtime does so
(RuntimeProfile.expert_gemm_per_expert -> RuntimeOptions.expert_gemm_per_expert ->
planner.cost.compute.gemm_time_s): Transformer Engine's GroupedLinear launches a cuBLASLt GEMM
per expert, each beyond the first adding planner.cost.moe.EXPERT_GEMM_S; torchtitan's
torch._grouped_mm runs every expert in one kernel, and a CUDA graph that replays the MoE layer
records the launches once."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clusters import load_cluster
from models import load_model
from planner.calibration.session import runtime_setup
from planner.config import ParallelConfig
from planner.cost import moe
from planner.cost.compute import Gemm, Shard, gemm_time_s, layer_compute, layer_gemms
from planner.cost.model import evaluate
from planner.ir import LayerKind
from planner.moe import MoeOptions
from planner.plan import dumps, make_plan
from planner.plan_io import validate_plan
from planner.plan_types import Plan
from planner.strategy import uniform

GRAPH = load_model("qwen3-30b-a3b")  # 128 experts
HW = load_cluster("dgx-h100", nodes=2)
GPU = HW.gpu
SHARD = Shard(micro_batch=2, seq_len=4096, tp=1, ep=8, etp=1, dtype="fp8")  # 16 local experts


def options(runtime: str):
    return runtime_setup(HW, runtime, "fp8").options


def moe_block():
    return next(x for x in GRAPH.layers if x.kind is LayerKind.BLOCK and x.mlp.is_moe)


def test_profiles_say_which_runtimes_run_one_gemm_per_expert():
    assert options("megatron").expert_gemm_per_expert
    assert options("deepspeed").expert_gemm_per_expert
    assert not options("torchtitan").expert_gemm_per_expert


def test_a_grouped_gemm_adds_the_launch_of_each_expert_beyond_the_first():
    s = moe.EXPERT_GEMM_S
    assert 1e-6 < s < 1e-4  # tens of microseconds: a GEMM launch with its per-expert setup
    grouped = Gemm(256, 1536, 2048, count=16, grouped=True)
    assert gemm_time_s(grouped, GPU, "fp8", 0.8, s) - gemm_time_s(grouped, GPU, "fp8", 0.8) \
        == pytest.approx(15 * s, rel=1e-9)
    one = Gemm(256, 1536, 2048, count=1, grouped=True)
    assert gemm_time_s(one, GPU, "fp8", 0.8, s) == gemm_time_s(one, GPU, "fp8", 0.8)
    batched = Gemm(256, 1536, 2048, count=16)  # batched heads: one kernel, not grouped
    assert gemm_time_s(batched, GPU, "fp8", 0.8, s) == gemm_time_s(batched, GPU, "fp8", 0.8)


def test_a_moe_layer_pays_it_in_each_pass_and_only_its_routed_experts():
    opts = options("megatron")
    block = moe_block()
    local = block.mlp.num_experts // SHARD.ep
    grouped = [g for g in layer_gemms(block, SHARD) if g.grouped]
    assert len(grouped) == 2 and all(g.count == local for g in grouped)  # FC1, FC2
    per = layer_compute(block, SHARD, GPU, opts)
    fused = layer_compute(block, SHARD, GPU, replace(opts, expert_gemm_per_expert=False))
    s = moe.EXPERT_GEMM_S * (local - 1)
    assert per.fwd_s - fused.fwd_s == pytest.approx(2 * s, rel=1e-9)  # FC1, FC2
    assert per.bwd_s - fused.bwd_s == pytest.approx(4 * s, rel=1e-9)  # their dgrad and wgrad
    assert per.fwd_flops == fused.fwd_flops  # the work is the same
    dense = next(x for x in GRAPH.layers if x.kind is LayerKind.HEAD)
    assert layer_compute(dense, SHARD, GPU, opts) == \
        layer_compute(dense, SHARD, GPU, replace(opts, expert_gemm_per_expert=False))


@pytest.mark.parametrize("graph", ["moe", "full_iteration"])
def test_a_cuda_graph_that_replays_the_layer_or_one_kernel_has_none(graph):
    opts = options("megatron")
    block = moe_block()
    captured = replace(opts, moe=MoeOptions(capacity_factor=1.0 if graph == "moe" else 0.0,
                                            cuda_graph=graph))
    assert layer_compute(block, SHARD, GPU, captured) == \
        layer_compute(block, SHARD, GPU, replace(captured, expert_gemm_per_expert=False))
    titan = options("torchtitan")
    assert layer_compute(block, SHARD, GPU, titan) == \
        layer_compute(block, SHARD, GPU, replace(titan, expert_gemm_per_expert=False))


def test_plan_records_it_and_reads_it_back():
    config = ParallelConfig(tp=1, pp=1, dp=16, ep=8, etp=1, global_batch=256, seq_len=4096,
                            zero_stage=1, dtype="fp8")
    opts = options("megatron")
    ev = evaluate(GRAPH, HW, config, uniform(GRAPH, config, "none"), opts)
    fused = evaluate(GRAPH, HW, config, uniform(GRAPH, config, "none"),
                     replace(opts, expert_gemm_per_expert=False))
    # more device time per MoE layer (the step itself can hide a host floor or DP traffic)
    assert ev.stages[0].compute_s > fused.stages[0].compute_s
    doc = json.loads(dumps(make_plan(ev, model_spec="qwen3-30b-a3b", cluster_spec="dgx-h100",
                                     nodes=2)))
    assert doc["runtime"]["expert_gemm_per_expert"] is True
    validate_plan(doc)
    assert Plan.from_dict(doc).runtime.expert_gemm_per_expert
    bad = json.loads(json.dumps(doc))
    bad["runtime"]["expert_gemm_per_expert"] = "yes"
    with pytest.raises(Exception):
        validate_plan(bad)
