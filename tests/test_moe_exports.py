"""MoE plans exported: Megatron's expert mesh and --moe-* flags, torchtitan's expert degrees,
each parsed back and compared with the plan."""
from __future__ import annotations

import json

import pytest

from clusters import load_cluster
from models import load_model
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.model import evaluate
from planner.export import export_plan
from planner.export.megatron import parse_args_file
from planner.moe import MoeOptions
from planner.plan import dumps, make_plan
from planner.plan_types import Plan
from planner.strategy import uniform

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None


def moe_plan(model: str, cluster: str, nodes: int, config: ParallelConfig,
             runtime: RuntimeOptions = RuntimeOptions(), recompute: str = "full") -> Plan:
    graph, hw = load_model(model), load_cluster(cluster, nodes=nodes)
    ev = evaluate(graph, hw, config, uniform(graph, config, recompute), runtime)
    doc = make_plan(ev, model_spec=model, cluster_spec=cluster, nodes=nodes)
    return Plan.from_dict(json.loads(dumps(doc)))


def flags(text: str) -> dict[str, str | None]:
    args = parse_args_file(text)
    out: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            assert arg not in out, f"{arg} twice"
            out[arg] = value
    return out


DEEPSEEK = ParallelConfig(tp=1, pp=16, dp=128, ep=64, etp=1, global_batch=15360, seq_len=4096,
                          zero_stage=1, dtype="fp8")


def test_megatron_gets_the_published_deepseek_v3_layout():
    plan = moe_plan("deepseek-v3", "hgx-h800", 256, DEEPSEEK,
                    RuntimeOptions(moe=MoeOptions(dispatcher="deepep")))
    f = flags(export_plan(plan, "megatron").text)
    assert f["--pipeline-model-parallel-size"] == "16"
    assert f["--expert-model-parallel-size"] == "64"
    assert f["--expert-tensor-parallel-size"] == "1"
    assert f["--num-experts"] == "256" and f["--moe-router-topk"] == "8"
    assert f["--moe-ffn-hidden-size"] == "2048"
    assert f["--moe-shared-expert-intermediate-size"] == "2048"
    assert f["--moe-layer-freq"] == "[" + ",".join(["0"] * 3 + ["1"] * 58) + "]"
    assert f["--moe-token-dispatcher-type"] == "flex" and "--moe-enable-deepep" in f
    assert "--moe-expert-capacity-factor" not in f  # dropless
    assert "--use-distributed-optimizer" in f  # ZeRO-1
    # node-limited routing (config.json n_group 8 / topk_group 4), which the deepep dispatch
    # cost assumes, is written as Megatron-Core's group-limited routing
    assert f["--moe-router-num-groups"] == "8" and f["--moe-router-group-topk"] == "4"
    mixtral = moe_plan("mixtral-8x7b", "dgx-h100", 1, ParallelConfig(
        tp=1, pp=1, dp=8, ep=8, global_batch=8, seq_len=4096, zero_stage=1))
    assert "--moe-router-num-groups" not in flags(export_plan(mixtral, "megatron").text)


def test_megatron_capacity_and_overlap_flags():
    config = ParallelConfig(tp=2, pp=1, dp=8, ep=8, etp=2, sp=True, global_batch=64,
                            seq_len=4096, zero_stage=1)
    plan = moe_plan("qwen3-30b-a3b", "dgx-h100", 2, config,
                    RuntimeOptions(moe=MoeOptions(capacity_factor=1.25, a2a_overlap=0.9)))
    result = export_plan(plan, "megatron")
    f = flags(result.text)
    assert f["--expert-tensor-parallel-size"] == "2" and f["--expert-model-parallel-size"] == "8"
    assert f["--moe-layer-freq"] == "([1]*48)"
    assert f["--moe-expert-capacity-factor"] == "1.25"
    assert "--moe-pad-expert-input-to-capacity" in f
    assert "--overlap-moe-expert-parallel-comm" in f
    assert f["--moe-token-dispatcher-type"] == "alltoall"
    assert any("expert all-to-all" in n and "--overlap-moe-expert-parallel-comm" in n
               for n in result.notes)  # the flag is exact: a note, not a difference
    # the default overlap (fitted: what runtimes hide without the flag) exports no flag
    plain = moe_plan("qwen3-30b-a3b", "dgx-h100", 2, config, RuntimeOptions())
    assert "--overlap-moe-expert-parallel-comm" not in flags(export_plan(plain, "megatron").text)


@pytest.mark.skipif(tomllib is None, reason="tomllib needs Python 3.11")
@pytest.mark.parametrize("etp", [1, 2])
def test_torchtitan_gets_the_expert_degrees(etp):
    config = ParallelConfig(tp=2, pp=1, dp=8, ep=8 if etp == 1 else 4, etp=etp, sp=True,
                            global_batch=64, seq_len=4096, zero_stage=3)
    plan = moe_plan("qwen3-30b-a3b", "dgx-h100", 2, config)
    old = export_plan(plan, "torchtitan", target_version="0.2.2")  # TOML job file
    par = tomllib.loads(old.text)["parallelism"]
    assert par["expert_parallel_degree"] == config.ep
    assert par["expert_tensor_parallel_degree"] == etp
    new = export_plan(plan, "torchtitan")  # 0.3: expert mesh efsdp x ep, no ETP
    assert f"--parallelism.expert_parallel_degree {config.ep}" in " ".join(new.text.split())
    assert any("expert tensor parallelism" in w for w in new.warnings) == (etp > 1)


def test_megatron_reference_parser_accepts_the_moe_exports():
    """Megatron-LM's options and validation rules (bench/runtime_reference.py) take them."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.runtime_reference import Rejected, megatron

    plan = moe_plan("deepseek-v3", "hgx-h800", 256, DEEPSEEK,
                    RuntimeOptions(moe=MoeOptions(dispatcher="deepep")))
    args = parse_args_file(export_plan(plan, "megatron").text)
    got = megatron(args, world_size=2048, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
                   device_arch=9)
    assert (got["pp"], got["ep"], got["dp"], got["zero_stage"]) == (16, 64, 128, 1)
    with pytest.raises(Rejected):  # the expert mesh must fold into the world
        megatron(args + ["--expert-tensor-parallel-size", "64"], world_size=2048,
                 env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, device_arch=9)


@pytest.mark.parametrize("etp, written, warned", [
    (4, "MoE(..., ep_size=2, enable_expert_tensor_parallelism=True)", False),
    (1, "MoE(..., ep_size=2)", False),
    (2, "MoE(..., ep_size=2)", True),
])
def test_deepspeed_moe_note_carries_the_expert_tensor_split(etp, written, warned):
    """DeepSpeed-MoE keeps experts whole unless MoE(enable_expert_tensor_parallelism=True)
    slices them over the tp group. The note said MoE(..., ep_size=N) for every plan, so a plan
    with experts split over tp 4 (etp 4) ran with them whole: the expert weights on each GPU
    4x the plan's. etp 2 under tp 4 has no DeepSpeed form: a warning with its memory."""
    config = ParallelConfig(tp=4, pp=1, dp=2, ep=2, etp=etp, global_batch=32, seq_len=4096,
                            sp=True, zero_stage=1)
    result = export_plan(moe_plan("mixtral-8x7b", "dgx-h100", 1, config), "deepspeed")
    moe = [n for n in result.notes if "deepspeed.moe.layer.MoE" in n]
    assert len(moe) == 1 and written in moe[0]
    if etp == 1:
        assert "enable_expert_tensor_parallelism" not in moe[0]
    etp_warnings = [w for w in result.warnings if w.startswith("expert tensor parallelism")]
    assert bool(etp_warnings) == warned
    if warned:
        assert "GiB peak per GPU" in etp_warnings[0]
