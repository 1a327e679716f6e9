"""Module-level selective recomputation (Megatron --recompute-modules) and CUDA-graph capture of
MoE layers: bytes and work per module against their formulas, through plan, check and the
Megatron export (parsed back by the reference parser)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from clusters import load_cluster
from models import load_model
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost import compute
from planner.cost.compute import Gemm, Shard, gemm_time_s, layer_compute
from planner.cost.memory import layer_activation_bytes
from planner.cost.model import evaluate
from planner.cost.recompute_modules import validate_modules
from planner.export import export_plan
from planner.export.megatron import parse_args_file
from planner.moe import MoeOptions
from planner.plan import dumps, make_plan
from planner.plan_types import Plan
from planner.strategy import Recompute, uniform

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.runtime_reference import Rejected, megatron  # noqa: E402

DS = load_model("deepseek-v3")
QWEN = load_model("qwen3-30b-a3b")
TOKENS = 4096


def moe_block(graph):
    return next(b for b in graph.blocks() if b.mlp is not None and b.mlp.is_moe)


def stored(layer, modules, recompute=Recompute.SELECTIVE, fp8=False):
    return layer_activation_bytes(layer, 1, TOKENS, 1, 1, False, recompute, "flash", False,
                                  1, 1.0, fp8, modules)


def test_default_modules_are_megatrons_core_attn():
    block = moe_block(DS)
    assert stored(block, ("core_attn",)) == layer_activation_bytes(
        block, 1, TOKENS, 1, 1, False, Recompute.SELECTIVE, "flash", False, 1, 1.0, False)
    assert validate_modules(["mla_up_proj", "core_attn"]) == ("core_attn", "mla_up_proj")
    for bad in (["attention"], [], "core_attn"):
        with pytest.raises(ValueError):
            validate_modules(bad)


def test_mla_up_proj_drops_the_up_projected_queries_keys_and_values():
    """Not stored: Q and K (heads x qk_head_dim each) and V (heads x v_head_dim), 16-bit."""
    block = moe_block(DS)
    att = block.attention
    base, _ = stored(block, ("core_attn",))
    up, working = stored(block, ("core_attn", "mla_up_proj"))
    assert base - up == pytest.approx(TOKENS * 2 * att.num_heads * (2 * att.head_dim
                                                                    + att.v_head_dim))
    assert working > 0  # rebuilt while the layer's backward runs
    # the recomputed work: the query and key-value up-projection GEMMs
    shard = Shard(micro_batch=1, seq_len=TOKENS, tp=1, dtype="bf16")
    gpu = load_cluster("hgx-h800").gpu
    plain = layer_compute(block, shard, gpu, RuntimeOptions())
    more = layer_compute(block, shard, gpu,
                         RuntimeOptions(recompute_modules=("core_attn", "mla_up_proj")))
    nope = att.head_dim - att.rope_head_dim
    gemms = (Gemm(TOKENS, att.num_heads * att.head_dim, att.q_lora_rank),
             Gemm(TOKENS, att.num_heads * (nope + att.v_head_dim), att.kv_lora_rank))
    assert more.recompute_s(Recompute.SELECTIVE) - plain.recompute_s(Recompute.SELECTIVE) == \
        pytest.approx(sum(gemm_time_s(g, gpu, "bf16") for g in gemms))
    assert more.recompute_flops(Recompute.SELECTIVE) - \
        plain.recompute_flops(Recompute.SELECTIVE) == pytest.approx(sum(g.flops for g in gemms))
    assert more.recompute_s(Recompute.FULL) == plain.recompute_s(Recompute.FULL)


def test_moe_act_and_layernorm_drop_their_outputs():
    block = moe_block(QWEN)
    mlp = block.mlp
    base, _ = stored(block, ("core_attn",))
    act, _ = stored(block, ("core_attn", "moe_act"))
    assert base - act == pytest.approx(TOKENS * mlp.top_k * 2 * mlp.ffn_hidden)
    norm, _ = stored(block, ("core_attn", "layernorm"))
    assert base - norm == pytest.approx(TOKENS * 2 * 2 * block.hidden)
    fp8_base, _ = stored(block, ("core_attn",), fp8=True)
    fp8_act, _ = stored(block, ("core_attn", "moe_act"), fp8=True)
    assert fp8_base - fp8_act == pytest.approx(TOKENS * mlp.top_k * mlp.ffn_hidden)  # 1 byte
    # without core_attn the attention core's internals stay stored
    only, _ = stored(block, ("moe_act",))
    assert only > act


def test_modules_do_not_touch_other_policies():
    block = moe_block(DS)
    for policy in (Recompute.NONE, Recompute.FULL):
        assert stored(block, ("core_attn",), policy) == \
            stored(block, ("mla_up_proj", "moe_act", "layernorm"), policy)


def plan_with(runtime: RuntimeOptions, config: ParallelConfig, recompute=Recompute.SELECTIVE):
    hw = load_cluster("hgx-h800", nodes=256)
    ev = evaluate(DS, hw, config, uniform(DS, config, recompute), runtime)
    doc = make_plan(ev, model_spec="deepseek-v3", cluster_spec="hgx-h800", nodes=256)
    return ev, Plan.from_dict(json.loads(dumps(doc)))


CONFIG = ParallelConfig(tp=1, pp=16, dp=128, ep=64, etp=1, global_batch=15360, seq_len=4096,
                        zero_stage=1, dtype="fp8")


def test_plan_records_modules_and_megatron_exports_them():
    runtime = RuntimeOptions(recompute_modules=("core_attn", "mla_up_proj"),
                             moe=MoeOptions(dispatcher="deepep", cuda_graph="full_iteration"))
    ev, plan = plan_with(runtime, CONFIG)
    plain, _ = plan_with(RuntimeOptions(moe=MoeOptions(dispatcher="deepep")), CONFIG)
    assert ev.peak_memory_bytes < plain.peak_memory_bytes
    assert plan.runtime.recompute_modules == ("core_attn", "mla_up_proj")
    assert plan.runtime.moe.cuda_graph == "full_iteration"
    assert plan.to_dict()["runtime"]["recompute_modules"] == ["core_attn", "mla_up_proj"]
    again = evaluate(plan.model, plan.cluster, plan.config, plan.placement, plan.runtime)
    assert again.step_time_s == ev.step_time_s and \
        again.peak_memory_bytes == ev.peak_memory_bytes
    args = parse_args_file(export_plan(plan, "megatron").text)
    i = args.index("--recompute-modules")
    assert args[i + 1:i + 3] == ["core_attn", "mla_up_proj"]
    assert args[args.index("--cuda-graph-scope") + 1] == "full_iteration"
    assert args[args.index("--moe-flex-dispatcher-backend") + 1] == "hybridep"
    assert "--moe-paged-stash" in args and "--moe-enable-deepep" not in args
    got = megatron(args, world_size=2048, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
                   device_arch=9)
    assert got["ep"] == 64
    with pytest.raises(Rejected):  # modules without selective granularity
        megatron([a for a in args if a not in ("--recompute-granularity", "selective")],
                 world_size=2048, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, device_arch=9)


def test_default_plans_record_no_modules():
    _, plan = plan_with(RuntimeOptions(), CONFIG)
    doc = plan.to_dict()
    assert "recompute_modules" not in doc["runtime"]
    args = parse_args_file(export_plan(plan, "megatron").text)
    assert "--recompute-modules" not in args and "--cuda-graph-impl" not in args


def test_cli_rejects_unknown_modules(capsys):
    from tests.conftest import run_cli

    base = ["evaluate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--tp", "1",
            "--pp", "1", "--ep", "8", "--global-batch", "64", "--recompute", "selective"]
    code, _, err = run_cli(base + ["--recompute-modules", "core_attn,attention"], capsys)
    assert code == 2 and "attention" in err
    code, out, _ = run_cli(base + ["--recompute-modules", "core_attn,moe_act", "--cuda-graph",
                                   "full_iteration", "--json"], capsys)
    assert code in (0, 1) and json.loads(out)["runtime"]["recompute_modules"] == \
        ["core_attn", "moe_act"]


def test_compute_cache_keys_on_modules():
    compute._layer_compute.cache_clear()
    block = moe_block(QWEN)
    shard = Shard(micro_batch=1, seq_len=TOKENS, tp=1, dtype="bf16")
    gpu = load_cluster("dgx-h100").gpu
    a = layer_compute(block, shard, gpu, RuntimeOptions())
    b = layer_compute(block, shard, gpu, RuntimeOptions(recompute_modules=("moe_act",)))
    assert b.recompute_s(Recompute.SELECTIVE) != a.recompute_s(Recompute.SELECTIVE)


# -- the loss over the vocabulary ---------------------------------------------------------------

def test_cross_entropy_keeps_its_logit_bytes():
    """fp32 keeps the fp32 softmax (4 B per logit, 6 more in backward), bf16 2 and 4, fused
    only the 16-bit buffer its gradient is written into (2, 0)."""
    from planner.cost.memory import LOGIT_BYTES

    head = DS.layers[-1]
    got = {}
    for loss in LOGIT_BYTES:
        got[loss] = layer_activation_bytes(head, 1, TOKENS, 2, 1, True, Recompute.NONE, "flash",
                                           False, cross_entropy=loss)
    vocab_per_token = TOKENS * head.vocab / 2
    assert got["fp32"][0] - got["fused"][0] == pytest.approx(2 * vocab_per_token)
    assert got["fp32"][1] == pytest.approx(6 * vocab_per_token) and got["fused"][1] == 0
    assert got["bf16"][0] == got["fused"][0] and got["bf16"][1] == pytest.approx(
        4 * vocab_per_token)
    block = moe_block(DS)  # blocks do not depend on it
    assert layer_activation_bytes(block, 1, TOKENS, 1, 1, False, Recompute.NONE, "flash", False,
                                  cross_entropy="fused") == stored(block, ("core_attn",),
                                                                   Recompute.NONE)


def test_fused_cross_entropy_through_plan_and_megatron_export():
    runtime = RuntimeOptions(cross_entropy="fused")
    ev, plan = plan_with(runtime, CONFIG)
    plain, _ = plan_with(RuntimeOptions(), CONFIG)
    assert ev.peak_memory_bytes <= plain.peak_memory_bytes
    assert ev.stages[-1].memory.activations < plain.stages[-1].memory.activations  # the head
    assert plan.runtime.cross_entropy == "fused"
    assert plan.to_dict()["runtime"]["cross_entropy"] == "fused"
    args = parse_args_file(export_plan(plan, "megatron").text)
    assert "--cross-entropy-loss-fusion" in args
    assert args[args.index("--cross-entropy-fusion-impl") + 1] == "te"
    megatron(args, world_size=2048, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, device_arch=9)
    doc = plan.to_dict()
    doc["runtime"]["cross_entropy"] = "fp16"
    from planner.errors import PlannerError
    with pytest.raises(PlannerError):
        Plan.from_dict(doc)


def test_recompute_modules_that_change_nothing_are_said(capsys):
    """--recompute-modules without --recompute selective, or naming a module the model has
    nothing of, changed nothing and said nothing: evaluate -m mixtral-8x7b --recompute-modules
    moe_act evaluated no recomputation (the user meant selective), and --recompute-modules
    mla_up_proj on Mixtral (no MLA) the same as no recomputation."""
    import json

    from conftest import run_cli

    base = ["evaluate", "-m", "tiny-moe", "-c", "tiny", "--global-batch", "16", "--tp", "1",
            "--pp", "1", "--json"]
    code, out, _ = run_cli(base + ["--recompute-modules", "moe_act"], capsys)
    assert code == 0
    (note,) = json.loads(out)["warnings"]
    assert "recomputes none" in note and "--recompute selective" in note
    code, out, _ = run_cli(base + ["--recompute", "selective", "--recompute-modules",
                                   "mla_up_proj,moe_act"], capsys)
    assert code == 0
    (note,) = json.loads(out)["warnings"]
    assert "tiny-moe has no multi-head latent attention (mla_up_proj)" in note
    code, out, _ = run_cli(base + ["--recompute", "selective", "--recompute-modules",
                                   "moe_act"], capsys)
    assert code == 0 and "warnings" not in json.loads(out)
    code, _, err = run_cli(["plan", "-m", "tiny", "-c", "tiny", "--global-batch", "16",
                            "--recompute-modules", "moe_act", "--json"], capsys)
    assert code == 0 and "tiny has no routed experts (moe_act)" in " ".join(err.split())
