"""``shardplan check --runtime R`` (planner/check_runtime.py): a plan against a runtime's
capabilities and memory layout. Exit 0 when R runs the plan and it fits, 1 when it uses
something R cannot run, 2 for a runtime that does not exist."""
from __future__ import annotations

import json

import pytest

from clusters import load_cluster
from models import load_model
from planner.calibration.session import runtime_setup
from planner.check import check_plan
from planner.check_runtime import runtime_problems
from planner.plan import dumps, make_plan
from planner.plan_io import validate_plan
from planner.plan_types import Plan
from planner.profiles import PROFILES
from planner.solve.search import SearchOptions, search
from conftest import build_plan, run_cli, write


def _searched(runtime: str) -> dict:
    """A plan searched for ``runtime`` (tiny model, 8 tiny GPUs)."""
    model, hw = load_model("tiny"), load_cluster("tiny")
    setup = runtime_setup(hw, runtime)
    result = search(model, hw, 16, model.default_seq_len,
                    options=SearchOptions(runtime=setup.options, work_limit=20))
    doc = make_plan(result.best, model_spec="tiny", cluster_spec="tiny")
    return validate_plan(json.loads(dumps(doc)))


@pytest.mark.parametrize("runtime", sorted(PROFILES))
def test_a_plan_searched_for_a_runtime_passes_its_check(runtime):
    plan = Plan.from_dict(_searched(runtime))
    report = check_plan(plan, runtime=runtime)
    assert report.ok, [p.message for p in report.problems]
    assert report.runtime == runtime


@pytest.fixture(scope="module")
def megatron_plan():  # tp 2, pp 2, ZeRO-1, SP, per-block mixed recomputation
    return build_plan(tp=2, pp=2, zero=1, block_recompute=["none", "full", "none", "full"])


def test_what_each_runtime_cannot_run_is_named(megatron_plan):
    plan = Plan.from_dict(megatron_plan)
    codes = {name: [p.message for p in runtime_problems(plan, prof)]
             for name, prof in PROFILES.items()}
    assert codes["megatron"] == []
    assert codes["torchtitan"] == ["torchtitan cannot run ZeRO-1: it shards data-parallel "
                                   "state as ZeRO 3 (fully_shard (data_parallel_shard_degree))"]
    assert codes["deepspeed"] == ["deepspeed cannot run sequence parallelism: it has none"]
    fsdp = " | ".join(codes["fsdp"])
    for what in ("ZeRO-1", "tensor parallelism (degree 2)", "pipeline parallelism (degree 2)",
                 "sequence parallelism"):
        assert what in fsdp


def test_zero_under_a_pipeline_is_checked():
    """DeepSpeed's pipeline engine runs ZeRO 0 and 1 only (profile pipeline_zero_stages, which
    narrows the search): a ZeRO-2 pipeline plan passed check --runtime deepspeed before."""
    plan = Plan.from_dict(build_plan(pp=2, zero=2))
    assert [p.message for p in runtime_problems(plan, PROFILES["deepspeed"])] == [
        "deepspeed cannot run ZeRO-2 with pipeline parallelism (pp 2): with a pipeline it runs "
        "ZeRO 0, 1 only"]
    assert runtime_problems(Plan.from_dict(build_plan(pp=2, zero=1)), PROFILES["deepspeed"]) == []
    assert runtime_problems(Plan.from_dict(build_plan(pp=1, zero=2)), PROFILES["deepspeed"]) == []


def test_schedule_recompute_and_uneven_chunks_are_checked():
    interleaved = Plan.from_dict(build_plan(model="gpt3-1.3b", cluster="dgx-a100-80g",
                                            global_batch=64, pp=2, virtual_stages=2, zero=1,
                                            recompute="selective"))
    messages = " | ".join(p.message for p in runtime_problems(interleaved, PROFILES["deepspeed"]))
    assert "interleaved-1f1b pipeline schedule" in messages
    assert "selective recomputation (24 blocks)" in messages
    tt = " | ".join(p.message for p in runtime_problems(interleaved, PROFILES["torchtitan"]))
    assert "selective recomputation" in tt  # torchtitan's selective is op-level, not this
    assert "schedule" not in tt


def test_activation_offload_is_checked():
    """Only Megatron-Core offloads activations, and only as its TransformerConfig allows
    (planner.offload_rules): a pipelined plan's offload is named, a pp-1 one passes."""
    h100 = dict(model="gpt3-1.3b", cluster="dgx-h100", global_batch=64)
    first = Plan.from_dict(build_plan(**h100, block_act_offload=[True] * 6 + [False] * 18))
    assert not [p for p in runtime_problems(first, PROFILES["megatron"])]
    assert "activation offload (6 blocks): it has none" in " | ".join(
        p.message for p in runtime_problems(first, PROFILES["torchtitan"]))
    piped = Plan.from_dict(build_plan(**h100, pp=2, block_act_offload=[True] * 6 + [False] * 18))
    [problem] = runtime_problems(piped, PROFILES["megatron"])
    assert "no CPU offloading with pipeline parallelism" in problem.message


def test_check_uses_the_runtimes_memory_layout(megatron_plan):
    plan = Plan.from_dict(megatron_plan)
    own = check_plan(plan)
    megatron = check_plan(plan, runtime="megatron")
    deepspeed = check_plan(plan, runtime="deepspeed")
    assert own.runtime == megatron.runtime == "megatron"
    grads = [s.needed.grads for s in megatron.stages]
    # DeepSpeed's BF16_Optimizer (bf16 runs): bf16 grads plus an unsharded fp32 accumulation
    # buffer and the bf16 copy its all-reduce casts that buffer to, 8 bytes per parameter;
    # Megatron keeps a 4-byte main_grad
    assert [s.needed.grads for s in deepspeed.stages] == pytest.approx([g * 2.0 for g in grads])
    assert deepspeed.exit_code == 1 and any(p.code == "runtime" for p in deepspeed.problems)


def test_cli_exit_codes(megatron_plan, tmp_path, capsys):
    path = write(megatron_plan, tmp_path / "plan.json")
    code, out, _ = run_cli(["check", path, "--runtime", "megatron", "--json"], capsys)
    assert code == 0 and json.loads(out)["runtime"] == "megatron"
    code, out, err = run_cli(["check", path, "--runtime", "torchtitan"], capsys)
    assert code == 1 and "problem (runtime): torchtitan cannot run ZeRO-1" in err
    code, out, err = run_cli(["check", path, "--runtime", "jax"], capsys)
    assert code == 2 and "--runtime" in err and "Traceback" not in err
