"""Runtime profiles: the search enumerates only what the target runtime can run, old layout
names still work, the plan records its runtime, evaluate --json carries error bands, and check
gives a three-way memory verdict."""
from __future__ import annotations

import json

import pytest

from clusters import load_cluster
from models import load_model
from planner.errors import PlannerError
from planner.profiles import PROFILES, profile, profile_for_framework, resolve_runtime
from planner.solve.space import Pins, enumerate_configs
from planner.strategy import Recompute


def test_profiles_and_legacy_names():
    assert set(PROFILES) == {"megatron", "torchtitan", "deepspeed", "fsdp"}
    assert resolve_runtime("deepspeed-bf16") == (PROFILES["deepspeed"], "deepspeed-bf16")
    assert resolve_runtime("deepspeed", "fp16")[1] == "deepspeed"
    assert resolve_runtime("megatron")[1] == "megatron"
    assert profile("zero-paper").name == "megatron"  # keeps the default search space
    with pytest.raises(PlannerError, match="unknown runtime"):
        profile("colossalai")
    assert profile_for_framework("Megatron-DeepSpeed").name == "deepspeed"
    assert profile_for_framework("Composer/llm-foundry, PyTorch FSDP FULL_SHARD").name == "fsdp"
    assert profile_for_framework("NeMo AutoModel (PyTorch FSDP2 backend)").name == "torchtitan"
    assert profile_for_framework("Megatron-Core r0.8.0").name == "megatron"


def _configs(runtime: str, pins: Pins = Pins()):
    model = load_model("tiny")
    cluster = load_cluster("tiny")
    return list(enumerate_configs(model, cluster, 16, model.default_seq_len, "bf16", pins,
                                  profile(runtime)))


def test_search_space_follows_the_runtime():
    megatron = _configs("megatron")
    assert {c.zero_stage for c in megatron} == {0, 1}  # what its exporter emits
    assert {c.sp for c in megatron if c.tp > 1} == {True, False}
    titan = _configs("torchtitan")
    assert {c.zero_stage for c in titan} == {3}  # FSDP2 always shards parameters
    assert all(c.sp for c in titan if c.tp > 1)  # SP is implied by TP
    fsdp = _configs("fsdp")
    assert all(c.tp == 1 and c.pp == 1 and c.cp == 1 for c in fsdp)
    assert {c.zero_stage for c in fsdp} == {0, 2, 3}
    deepspeed = _configs("deepspeed")
    assert all(c.virtual_stages == 1 and not c.sp for c in deepspeed)
    assert len(titan) < len(megatron) and len(fsdp) < len(titan)


def test_recompute_policies_follow_the_runtime():
    options = {o.recompute for o in Pins().block_options(None, profile("torchtitan"))}
    assert options == {Recompute.NONE, Recompute.FULL, Recompute.OP}
    assert {o.recompute for o in Pins().block_options(None, profile("deepspeed"))} == \
        {Recompute.NONE, Recompute.FULL}
    with pytest.raises(PlannerError, match="no such policy"):
        Pins(recompute=Recompute.SELECTIVE).block_options(None, profile("fsdp"))


def test_pins_the_runtime_cannot_run_are_refused():
    with pytest.raises(PlannerError, match="cannot run the pinned zero=1"):
        _configs("torchtitan", Pins(zero=1))
    with pytest.raises(PlannerError, match="tp=2"):
        _configs("fsdp", Pins(tp=2))


def _cli(capsys, *args):
    from cli.main import main
    with pytest.raises(SystemExit) as done:
        main(list(args))
    return done.value.code, capsys.readouterr().out


def test_evaluate_json_has_error_bands(capsys):
    code, out = _cli(capsys, "evaluate", "-m", "llama-3.1-8b", "-c", "dgx-h100",
                     "--global-batch", "64", "--tp", "1", "--pp", "1", "--zero", "3",
                     "--runtime", "torchtitan", "--recompute", "op", "--json")
    assert code == 0
    doc = json.loads(out)
    p = doc["predicted"]
    lo, hi = p["step_time_s_interval"]
    assert lo <= p["step_time_s"] <= hi and lo < hi
    lo, hi = p["peak_memory_gib_interval"]
    assert lo <= p["peak_memory_gib"] <= hi
    assert p["interval_coverage"] == 0.8
    assert doc["runtime"]["profile"] == "torchtitan"


def test_plan_records_its_runtime_and_check_gives_a_verdict(capsys, tmp_path):
    plan_file = tmp_path / "plan.json"
    code, _ = _cli(capsys, "plan", "-m", "tiny", "-c", "tiny", "--global-batch", "16",
                   "--runtime", "fsdp", "-o", str(plan_file), "--time-limit", "30")
    assert code == 0
    doc = json.loads(plan_file.read_text())
    assert doc["runtime"]["profile"] == "fsdp"
    assert doc["parallelism"]["tp"] == 1 and doc["parallelism"]["pp"] == 1
    assert "step_time_s_interval" in doc["predicted"]
    code, out = _cli(capsys, "check", str(plan_file), "--json")
    report = json.loads(out)
    assert report["memory_verdict"] in ("fits", "fits only at the optimistic end")
    assert code == (0 if report["ok"] else 1)
    # at a 99 % confidence the gate uses the band's pessimistic end
    code, out = _cli(capsys, "check", str(plan_file), "--memory-confidence", "0.99", "--json")
    strict = json.loads(out)
    assert strict["memory_gate_gib"] >= report["memory_gate_gib"]
