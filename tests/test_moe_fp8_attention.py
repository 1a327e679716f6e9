"""FP8 attention (Transformer Engine's FP8 DotProductAttention, Megatron
--fp8-dot-product-attention): the attention core's term, the options that refuse it, the plan
file, the exports and the Megatron reference parser."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from clusters import load_cluster
from models import load_model
from planner.check_runtime import runtime_options, runtime_problems
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.compute import KERNEL_LAUNCH_S, Shard, attention_core_dtype, layer_compute
from planner.cost.model import evaluate
from planner.export import export_plan
from planner.export.megatron import parse_args_file
from planner.ir import LayerKind
from planner.errors import PlannerError
from planner.plan import dumps, make_plan
from planner.plan_io import validate_plan
from planner.plan_types import Plan
from planner.profiles import profile
from planner.strategy import uniform

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.runtime_reference import megatron  # noqa: E402

# micro-batch 4: device-bound MoE layers; at micro-batch 1 the layer is host-bound on both sides
# of the dropless read-back (planner.cost.moe.host_floor_s), so a faster attention core cannot
# shorten it, nor (the DP sync hiding in the device's wait on the host as behind compute,
# planner.cost.moe.host_wait_split_s) lengthen it
CONFIG = ParallelConfig(tp=1, pp=1, dp=16, ep=8, etp=1, global_batch=256, seq_len=4096,
                        micro_batch=4, zero_stage=1, dtype="fp8")


def plan_with(options: RuntimeOptions, micro_batch: int = 4) -> Plan:
    graph, hw = load_model("qwen3-30b-a3b"), load_cluster("dgx-h100", nodes=2)
    config = replace(CONFIG, micro_batch=micro_batch)
    ev = evaluate(graph, hw, config, uniform(graph, config, "none"), options)
    doc = make_plan(ev, model_spec="qwen3-30b-a3b", cluster_spec="dgx-h100", nodes=2)
    return Plan.from_dict(json.loads(dumps(doc)))


def block_and_gpu():
    graph = load_model("qwen3-30b-a3b")
    block = next(layer for layer in graph.layers if layer.kind is LayerKind.BLOCK)
    return block, load_cluster("dgx-h100").gpu


def test_the_attention_core_runs_on_the_fp8_peak_and_nothing_else_moves():
    block, gpu = block_and_gpu()
    shard = Shard(micro_batch=1, seq_len=4096, tp=1, dtype="fp8")
    plain = layer_compute(block, shard, gpu, RuntimeOptions())
    fast = layer_compute(block, shard, gpu, RuntimeOptions(fp8_attention=True))
    ratio = gpu.peak_flops("fp8") / gpu.peak_flops("bf16")
    assert ratio == pytest.approx(2.0, rel=0.01)
    launches = 2 * KERNEL_LAUNCH_S  # one forward, one backward kernel tail, unscaled
    core16 = plain.attn_core_s - launches
    core8 = fast.attn_core_s - launches
    assert core8 == pytest.approx(core16 / ratio, rel=1e-9)
    # the GEMMs, the element-wise work and the FLOPs are the same
    assert fast.fwd_s - fast.attn_core_fwd_s == pytest.approx(plain.fwd_s - plain.attn_core_fwd_s)
    assert fast.fwd_flops == plain.fwd_flops
    # 16-bit GEMMs keep a 16-bit attention core whatever the option says
    bf16 = Shard(micro_batch=1, seq_len=4096, tp=1, dtype="bf16")
    assert layer_compute(block, bf16, gpu, RuntimeOptions(fp8_attention=True)).attn_core_s == \
        layer_compute(block, bf16, gpu, RuntimeOptions()).attn_core_s
    assert attention_core_dtype("fp4", True) == "bf16"  # only FP8 GEMMs bring FP8 attention


def test_fp8_attention_never_slows_a_host_bound_step():
    """Micro-batch 1: the MoE layers wait on the host (dropless read-back); FP8 attention
    leaves less device compute but the same wait on the host, behind which the DP gradient
    reduction and parameter gather (side streams) hide as well: never slower (it was 36 ms
    slower, 7.238 vs 7.202 s, while only compute hid the DP sync)."""
    plain = plan_with(RuntimeOptions(), micro_batch=1)
    fast = plan_with(RuntimeOptions(fp8_attention=True), micro_batch=1)
    assert fast.document["predicted"]["step_time_s"] <= \
        plain.document["predicted"]["step_time_s"] * (1 + 1e-12)


def test_a_step_with_fp8_attention_is_faster_and_the_plan_records_it():
    plain, fast = plan_with(RuntimeOptions()), plan_with(RuntimeOptions(fp8_attention=True))
    assert fast.document["predicted"]["step_time_s"] < plain.document["predicted"]["step_time_s"]
    assert fast.runtime.fp8_attention and "fp8_attention" not in plain.document["runtime"]
    assert fast.document["runtime"]["fp8_attention"] is True
    validate_plan(json.loads(dumps(dict(fast.document))))  # planner/plan_schema.json has it
    bad = json.loads(dumps(dict(fast.document)))
    bad["runtime"]["fp8_attention"] = "yes"
    with pytest.raises(PlannerError):
        validate_plan(bad)


def test_megatron_exports_it_and_the_reference_parser_reads_it_back():
    plan = plan_with(RuntimeOptions(fp8_attention=True))
    args = parse_args_file(export_plan(plan, "megatron").text)
    assert "--fp8-dot-product-attention" in args
    got = megatron(args, world_size=16, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
                   device_arch=9)
    assert got["fp8_attention"] is True and got["dtype"] == "fp8"
    plain = parse_args_file(export_plan(plan_with(RuntimeOptions()), "megatron").text)
    assert "--fp8-dot-product-attention" not in plain
    assert megatron(plain, world_size=16, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
                    device_arch=9)["fp8_attention"] is False


def test_runtimes_without_it_say_so():
    plan = plan_with(RuntimeOptions(fp8_attention=True))
    warnings = export_plan(plan, "torchtitan").warnings
    assert any(w.startswith("FP8 attention:") for w in warnings)
    assert not any("FP8 attention" in w for w in export_plan(plan, "megatron").warnings)
    problems = [p.message for p in runtime_problems(plan, profile("torchtitan"))]
    assert any("FP8 attention" in m for m in problems)
    assert not any("FP8 attention" in p.message for p in runtime_problems(plan,
                                                                          profile("megatron")))
    # check --runtime re-evaluates with what the runtime runs
    assert runtime_options(plan, "megatron")[1].fp8_attention
    assert not runtime_options(plan, "torchtitan")[1].fp8_attention


def test_cli_refuses_it_without_fp8_gemms_or_on_a_runtime_without_it(capsys):
    from tests.conftest import run_cli

    base = ["evaluate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "2",
            "--tp", "1", "--pp", "1", "--ep", "8", "--global-batch", "64", "--json"]
    code, out, err = run_cli(base + ["--fp8-attention"], capsys)  # dtype bf16
    assert code == 2 and "Traceback" not in err
    assert "--dtype fp8" in json.loads(out)["error"]["message"]
    code, out, _ = run_cli(base + ["--dtype", "fp8", "--fp8-attention", "--runtime",
                                   "torchtitan"], capsys)
    assert code == 2 and "no FP8 attention" in json.loads(out)["error"]["message"]
    code, out, _ = run_cli(base + ["--dtype", "fp8", "--fp8-attention"], capsys)
    assert code in (0, 1) and json.loads(out)["runtime"]["fp8_attention"] is True

