"""``--compile`` / ``--elementwise``: torch.compile and element-wise fusion reach the cost model
from the command line (planner.calibration.session.compile_choice, planner.calibration.apply),
the plan records them, ``check`` re-evaluates with them and the torchtitan export enables
compile. Before, every command calibrated eager: a torchtitan plan costed eager PyTorch's
element-wise traffic (unfused_elementwise.torchtitan, about twice the fused bytes) and no
async TP, whatever the user ran.
"""
from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import run_cli

EVAL = ["evaluate", "-m", "llama-3.1-8b", "-c", "dgx-h100", "--global-batch", "64", "--tp", "2",
        "--pp", "1", "--zero", "3", "--runtime", "torchtitan", "--json"]
PLAN = ["plan", "-m", "llama-3.1-8b", "-c", "dgx-h100", "--global-batch", "64", "--runtime",
        "torchtitan", "--work-limit", "200", "--json"]


def _evaluate(capsys, *extra):
    code, out, _ = run_cli(EVAL + list(extra), capsys)
    assert code == 0, out
    return json.loads(out)


def test_fused_and_compiled_torchtitan_steps_are_faster_than_eager(capsys):
    eager = _evaluate(capsys)
    fused = _evaluate(capsys, "--elementwise", "fused")
    compiled = _evaluate(capsys, "--compile")
    t = {name: doc["predicted"]["step_time_s"]
         for name, doc in (("eager", eager), ("fused", fused), ("compiled", compiled))}
    # fused element-wise traffic is cheaper; compile adds async TP (tp 2) on top
    assert t["compiled"] < t["fused"] < t["eager"], t
    r = {name: doc["runtime"] for name, doc in (("eager", eager), ("fused", fused),
                                                ("compiled", compiled))}
    assert r["eager"]["elementwise_factor"] > r["fused"]["elementwise_factor"] == \
        r["compiled"]["elementwise_factor"]
    assert r["eager"]["tp_comm_overlap"] == r["fused"]["tp_comm_overlap"] == 0
    assert r["compiled"]["tp_comm_overlap"] > 0  # async TP needs torch.compile
    assert "compiled" not in r["eager"] and "elementwise" not in r["eager"]
    assert r["fused"]["elementwise"] == "fused" and "compiled" not in r["fused"]
    assert r["compiled"]["compiled"] is True and "elementwise" not in r["compiled"]


@pytest.mark.parametrize("args, needle", [
    (["--runtime", "megatron", "--compile"], "compiling changes nothing the cost model counts"),
    (["--runtime", "megatron", "--elementwise", "eager"], "no eager constant"),
    (["--runtime", "torchtitan", "--compile", "--elementwise", "eager"], "Inductor"),
])
def test_choices_a_runtime_cannot_mean_are_bad_input(capsys, args, needle):
    base = [a for a in EVAL if a not in ("--runtime", "torchtitan")]
    code, out, _ = run_cli(base + args, capsys)
    assert code == 2
    assert needle in json.loads(out)["error"]["message"]


@pytest.mark.parametrize("runtime, explicit", [
    ("torchtitan", ["--no-compile", "--elementwise", "eager"]),
    ("megatron", ["--elementwise", "fused"]),
])
def test_the_defaults_chosen_explicitly_are_the_same_bytes(capsys, runtime, explicit):
    base = [a if a != "torchtitan" else runtime for a in PLAN]
    code, default, _ = run_cli(base, capsys)
    assert code == 0
    code, chosen, _ = run_cli(base + explicit, capsys)
    assert code == 0
    assert chosen == default
    assert not {"compiled", "elementwise"} & set(json.loads(default)["runtime"])


@pytest.fixture(scope="module")
def compiled_plan(tmp_path_factory):
    from cli.main import main

    path = tmp_path_factory.mktemp("compile") / "plan.json"
    with pytest.raises(SystemExit) as done:
        main(PLAN[:-1] + ["--pin", "tp=2", "--compile", "-o", str(path)])
    assert done.value.code == 0
    return path


def test_the_plan_records_compile_and_check_reproduces_it(compiled_plan, capsys):
    from planner.check_runtime import runtime_options
    from planner.plan_types import Plan

    plan = Plan.load(compiled_plan)
    doc = json.loads(compiled_plan.read_text())
    assert doc["runtime"]["compiled"] is True and doc["runtime"]["tp_comm_overlap"] > 0
    assert plan.runtime.compiled and plan.runtime.elementwise == ""
    assert plan.to_dict() == doc
    # the plan's options re-evaluate to its prediction; `check --runtime torchtitan`
    # recalibrates the runtime compiled, as planned (it calibrated eager before)
    assert plan.evaluate().step_time_s == pytest.approx(doc["predicted"]["step_time_s"],
                                                        rel=1e-5)
    _, options = runtime_options(plan, "torchtitan")
    assert options == plan.runtime
    for extra in ([], ["--runtime", "torchtitan"]):
        code, out, _ = run_cli(["check", compiled_plan, "--json"] + extra, capsys)
        assert code == 0, out
        assert json.loads(out)["peak_gib"] == pytest.approx(
            doc["predicted"]["peak_memory_gib"], rel=1e-5)


def test_the_torchtitan_export_enables_compile(compiled_plan, tmp_path, capsys):
    from planner.export import export_plan
    from planner.plan_types import Plan

    plan = Plan.load(compiled_plan)
    cli = export_plan(plan, "torchtitan").text
    toml = export_plan(plan, "torchtitan", "0.2.2").text
    assert "  --compile.enable\n" in cli and "--compile.enable_async_tensor_parallel" in cli
    assert "[compile]\nenable = true\n" in toml
    eager = Plan.from_dict(json.loads(compiled_plan.read_text())).with_changes(
        runtime_compiled=False, runtime_tp_comm_overlap=0.0)
    assert "--compile" not in export_plan(eager, "torchtitan").text
    assert "[compile]" not in export_plan(eager, "torchtitan", "0.2.2").text
    if importlib.util.find_spec("torchtitan") is None:
        pytest.skip("torchtitan is not installed (pip install -e '.[runtimes]')")
    from bench.export_runtimes import run_worker

    results = run_worker("torchtitan", [{"text": t, "notes": [], "world": 8, "arch": 9}
                                        for t in (cli, export_plan(eager, "torchtitan").text)])
    assert [r["accepted"] for r in results[:2]] == [True, True], results
    assert [r["derived"]["compile"] for r in results[:2]] == [True, False]


def test_every_eager_profile_has_its_calibrated_constant():
    """RuntimeProfile.elementwise "eager" is costed unfused_elementwise.<name>; a profile
    declared eager without that constant would fail at calibration."""
    from planner.calibration.constants import PARAM_NAMES
    from planner.profiles import PROFILES

    eager = {name for name, p in PROFILES.items() if p.elementwise == "eager"}
    assert eager == {"torchtitan", "fsdp"}
    assert eager == {k.split(".", 1)[1] for k in PARAM_NAMES
                     if k.startswith("unfused_elementwise.")}
