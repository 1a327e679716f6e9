"""Plans made for a runtime export to it with no fallback; exports to another runtime say
exactly what changes (planner/export/retarget.py, recompute_rules.py)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench import export_profiles as profiles_bench
from bench.export_profiles import FORMATS
from conftest import build_plan, run_cli
from planner.calibration.session import runtime_setup
from planner.export import export_plan
from planner.export import recompute_rules as rules
from planner.export.retarget import made_for, retarget_warning
from planner.plan_types import Plan
from planner.profiles import PROFILES
from planner.solve.space import enumerate_configs
from clusters import load_cluster
from models import load_model

# plan --runtime X on these: data parallel, TP + SP, a pinned pipeline (interleaved where the
# runtime has it), MoE with expert parallelism: two of bench/export_profiles.py's setups (which
# runs all of them, 28 exports) and two small ones
SETUPS = {name: profiles_bench.SETUPS[name] for name in ("gpt3-1.3b a100x8",
                                                         "gpt3-13b pp4 a100x16")}
SETUPS.update({
    "llama8b-tp2": ["-m", "llama-3.1-8b", "-c", "dgx-a100-80g", "--nodes", "2",
                    "--global-batch", "256", "--pin", "tp=2"],
    "moe-ep": ["-m", "tiny-moe", "-c", "tiny", "--global-batch", "16", "--pin", "ep=2"],
})
_PLANS: dict = {}


def _made_plan(setup: str, runtime: str, tmp_path_factory, capsys) -> Plan:
    key = (setup, runtime)
    if key not in _PLANS:
        path = tmp_path_factory.mktemp("plans") / f"{setup.replace(' ', '_')}-{runtime}.json"
        code, _, err = run_cli(["plan", *SETUPS[setup], "--runtime", runtime, "--work-limit",
                                "60", "-o", path], capsys)
        assert code == 0, err
        _PLANS[key] = Plan.load(path)
    return _PLANS[key]


@pytest.mark.parametrize("runtime", list(FORMATS))
@pytest.mark.parametrize("setup", list(SETUPS))
def test_plans_made_for_a_runtime_export_without_fallback(setup, runtime, tmp_path_factory,
                                                          capsys):
    plan = _made_plan(setup, runtime, tmp_path_factory, capsys)
    assert plan.runtime.profile == runtime and made_for(plan, runtime)
    for fmt, version in FORMATS[runtime]:
        result = export_plan(plan, fmt, version)
        assert result.warnings == (), (fmt, version, result.warnings)
    # and --strict accepts it (the command fails on any warning)
    out = tmp_path_factory.mktemp("out") / "file"
    plan_file = tmp_path_factory.mktemp("in") / "plan.json"
    plan_file.write_text(json.dumps(plan.to_dict()))
    code, _, err = run_cli(["export", plan_file, "--format", FORMATS[runtime][0][0], "--strict",
                            "-o", out], capsys)
    assert code == 0, err


def test_exports_to_another_runtime_say_what_changes(tmp_path_factory, capsys):
    plan = _made_plan("llama8b-tp2", "megatron", tmp_path_factory, capsys)
    for target, fmt, version in (("torchtitan", "torchtitan", "0.3"),
                                 ("deepspeed", "deepspeed", None)):
        assert not made_for(plan, target)
        text = "\n".join(export_plan(plan, fmt, version).warnings)
        line = next(w for w in text.splitlines() if w.startswith("runtime:"))
        assert "made for megatron" in line and f"not {target}" in line
        # each behaviour that differs is named with both values
        layout = PROFILES[target].state_layout_for("bf16")
        assert f"optimizer-state layout megatron -> {layout}" in line
        tp_overlap = runtime_setup(plan.cluster, "megatron", "bf16").options.tp_comm_overlap
        assert f"TP overlap {tp_overlap:.4g} -> 0" in line or "TP overlap" not in line
        # and the re-evaluated plan under the target's profile, against the plan's numbers
        changed = runtime_setup(plan.cluster, target, "bf16").options
        assert f"{plan.document['predicted']['peak_memory_gib']:.1f}" in line
        assert "GiB peak per GPU" in line and "step time" in line
        assert changed.runtime == layout
    # the same plan to its own runtime: nothing to say
    assert retarget_warning(plan, "megatron") is None


def test_retarget_prediction_is_the_target_profiles_evaluation():
    doc = build_plan(model="gpt3-1.3b", cluster="dgx-a100-80g", global_batch=64, tp=2)
    plan = Plan.from_dict(doc)
    target = runtime_setup(plan.cluster, "deepspeed", "bf16").options
    ev = replace(plan, runtime=replace(target, moe=plan.runtime.moe)).evaluate()
    line = retarget_warning(plan, "deepspeed")
    assert f"{ev.peak_memory_bytes / 2**30:.1f} GiB peak per GPU" in line
    assert f"step time {ev.step_time_s:.4g} s" in line


def _mixed(runtime: str, block_recompute: list[str], **config) -> Plan:
    options = runtime_setup(load_cluster("dgx-a100-80g"), runtime, "bf16").options
    return Plan.from_dict(build_plan(model="gpt3-1.3b", cluster="dgx-a100-80g",
                                     global_batch=64, block_recompute=block_recompute,
                                     runtime=options, zero=3 if runtime == "torchtitan" else 1,
                                     **config))


def test_megatron_block_method_is_exact_when_each_rank_has_the_plans_counts():
    # interleaved pp 2 x v 2 (6-block chunks): rank 0 holds chunks 0 and 2, rank 1 chunks 1, 3.
    # The plan recomputes blocks 0, 1 (chunk 0) and 6, 7 (chunk 1): 2 per rank, but Megatron's
    # block method with N=1 recomputes block 0 of every chunk: also 2 per rank, the same cost
    settings = ["full", "full"] + ["none"] * 4 + ["full", "full"] + ["none"] * 16
    plan = _mixed("megatron", settings, pp=2, virtual_stages=2)
    assert rules.exact_count(plan, rules.megatron_block, 6) == 1
    result = export_plan(plan, "megatron")
    assert result.warnings == ()
    assert "--recompute-num-layers" in result.text and any(
        "not the very blocks" in n for n in result.notes)
    # unequal per-rank counts have no exact N: a warning with the counts
    uneven = _mixed("megatron", ["full"] * 3 + ["none"] * 21, pp=2)
    assert rules.exact_count(uneven, rules.megatron_block, 12) is None
    assert any("per-stage counts 3, 0" in w for w in export_plan(uneven, "megatron").warnings)


def test_torchtitan_every_nth_and_op_recompute():
    # every 3rd block of each rank (pp 2, 12 blocks each: 4 per rank): selective_ac_option "3"
    settings = (["none", "none", "full"] * 4) * 2
    plan = _mixed("torchtitan", settings, pp=2)
    result = export_plan(plan, "torchtitan", "0.2.2")
    assert result.warnings == () and 'selective_ac_option = "3"' in result.text
    # 0.3 has no layer-selective AC: the difference is named
    assert any("no layer-selective AC" in w for w in export_plan(plan, "torchtitan").warnings)
    # per-op SAC on every block is torchtitan's selective mode
    op = _mixed("torchtitan", ["op"] * 24)
    assert export_plan(op, "torchtitan").warnings == ()
    assert "activation_checkpoint:selective" in export_plan(op, "torchtitan").text
    text = export_plan(op, "torchtitan", "0.2.2")
    assert text.warnings == () and 'selective_ac_option = "op"' in text.text
    # per-op SAC on some blocks only: SAC on all (never more memory), named as a difference
    some = _mixed("torchtitan", ["op"] * 18 + ["none"] * 6)
    for version, form in (("0.3", "activation_checkpoint:selective"),
                          ("0.2.2", 'selective_ac_option = "op"')):
        result = export_plan(some, "torchtitan", version)
        assert form in result.text
        assert any("op on 18 of 24 blocks" in w and "all 24 blocks" in w
                   for w in result.warnings)


def test_deepspeed_recompute_and_pipeline_are_exact_notes():
    plan = _mixed("deepspeed", ["full"] * 3 + ["none"] * 9 + ["full"] + ["none"] * 11, pp=2)
    result = export_plan(plan, "deepspeed")
    assert result.warnings == ()
    notes = "\n".join(result.notes)
    assert "wrap blocks 0-2, 12 (of 0-23)" in notes and "num_stages=2" in notes


def test_deepspeed_search_keeps_zero_2_and_3_off_pipelines():
    model, cluster = load_model("gpt3-1.3b"), load_cluster("dgx-a100-80g", nodes=2)
    configs = list(enumerate_configs(model, cluster, 64, 2048, "bf16",
                                     runtime=PROFILES["deepspeed"]))
    assert any(c.pp > 1 for c in configs) and any(c.zero_stage >= 2 for c in configs)
    assert not any(c.pp > 1 and c.zero_stage >= 2 for c in configs)


def test_torchtitan_eager_plans_have_no_tp_overlap():
    # async TP, torchtitan's only TP overlap, needs torch.compile: an eager plan hides none
    cluster = load_cluster("dgx-h100")
    eager = runtime_setup(cluster, "torchtitan", "bf16").options
    compiled = runtime_setup(cluster, "torchtitan", "bf16", compiled=True).options
    assert eager.tp_comm_overlap == 0.0 and compiled.tp_comm_overlap > 0
    assert runtime_setup(cluster, "megatron", "bf16").options.tp_comm_overlap > 0
    # a compiled torchtitan plan exports async TP with compile, as a note
    plan = Plan.from_dict(build_plan(model="gpt3-1.3b", cluster="dgx-h100", global_batch=64,
                                     tp=2, zero=3, runtime=compiled))
    result = export_plan(plan, "torchtitan")
    assert "--compile.enable" in result.text and result.warnings == ()
    assert any("torch.compile" in n for n in result.notes)


def test_tp_overlap_needs_sequence_parallelism():
    options = runtime_setup(load_cluster("dgx-a100-80g"), "megatron", "bf16").options
    on = Plan.from_dict(build_plan(model="gpt3-1.3b", cluster="dgx-a100-80g", global_batch=64,
                                   tp=4, runtime=options))
    off = Plan.from_dict(build_plan(model="gpt3-1.3b", cluster="dgx-a100-80g", global_batch=64,
                                    tp=4, sp=False, runtime=options))
    assert "--tp-comm-overlap" in export_plan(on, "megatron").text
    assert "--tp-comm-overlap" not in export_plan(off, "megatron").text  # validate_args refuses
    assert export_plan(off, "megatron").warnings == ()
    # the cost model hides no TP collective without SP: the same as no overlap at all
    none = off.with_changes(runtime_tp_comm_overlap=0.0).evaluate()
    assert off.evaluate().step_time_s == none.step_time_s
    assert on.evaluate().step_time_s < on.with_changes(
        runtime_tp_comm_overlap=0.0).evaluate().step_time_s

