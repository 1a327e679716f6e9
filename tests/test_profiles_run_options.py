"""Run options a runtime cannot run (planner/profiles.py ``dropout`` / ``moe_capacity``):
torchtitan's models have no dropout and its MoE routes dropless, so ``plan --runtime
torchtitan`` refuses ``--dropout`` and ``--moe-capacity-factor`` (exit 2, naming the runtime and
the option), ``evaluate`` predicts and warns, ``check --runtime torchtitan`` fails (exit 1), and
a plan made for torchtitan exports to it without warnings."""
from __future__ import annotations

import json

import pytest

from conftest import run_cli
from planner.profiles import PROFILES

MOE = ["-m", "tiny-moe", "-c", "dgx-h100", "--global-batch", "16"]
DENSE = ["-m", "gpt3-1.3b", "-c", "dgx-a100-80g", "--global-batch", "64"]


def test_profiles_declare_dropout_and_capacity():
    assert not PROFILES["torchtitan"].dropout and not PROFILES["torchtitan"].moe_capacity
    for name in ("megatron", "deepspeed"):
        assert PROFILES[name].dropout and PROFILES[name].moe_capacity


@pytest.mark.parametrize("args, option", [
    ([*DENSE, "--dropout"], "--dropout"),
    ([*MOE, "--moe-capacity-factor", "1.25"], "--moe-capacity-factor 1.25"),
])
def test_plan_refuses_what_torchtitan_cannot_run(capsys, tmp_path, args, option):
    out = tmp_path / "plan.json"
    code, _, err = run_cli(["plan", *args, "--runtime", "torchtitan", "--time-limit", "20",
                            "-o", out], capsys)
    assert code == 2, err
    assert "runtime torchtitan cannot run" in err and option in err
    assert "Traceback" not in err and not out.exists()


def test_plan_pools_refuses_it_too(capsys):
    code, _, err = run_cli(["plan", "-m", "gpt3-1.3b", "-c", "h100-a100",
                            "--global-batch", "64", "--runtime", "torchtitan", "--dropout",
                            "--time-limit", "20"], capsys)
    assert code == 2 and "runtime torchtitan cannot run --dropout" in err, err


def test_capacity_on_a_dense_model_is_not_refused():
    # the capacity factor only matters to MoE layers: nothing for torchtitan to refuse
    assert PROFILES["torchtitan"].option_problems(False, 1.25, is_moe=False) == []


def test_evaluate_warns_and_check_fails(capsys, tmp_path):
    code, out, _ = run_cli(["evaluate", *MOE, "--tp", "1", "--pp", "1", "--ep", "2",
                            "--runtime", "torchtitan", "--zero", "3",
                            "--moe-capacity-factor", "1.25", "--dropout", "--json"], capsys)
    assert code == 0
    problems = json.loads(out)["runtime_problems"]
    assert any("--dropout" in p for p in problems), problems
    assert any("--moe-capacity-factor 1.25" in p for p in problems), problems
    # a megatron plan with them: check --runtime torchtitan names both (exit 1)
    path = tmp_path / "megatron.json"
    code, _, err = run_cli(["plan", *MOE, "--moe-capacity-factor", "1.25", "--dropout",
                            "--time-limit", "30", "--work-limit", "20", "-o", path], capsys)
    assert code == 0, err
    code, out, _ = run_cli(["check", path, "--runtime", "torchtitan", "--json"], capsys)
    assert code == 1
    text = json.dumps(json.loads(out))
    assert "torchtitan cannot run --dropout" in text
    assert "torchtitan cannot run --moe-capacity-factor 1.25" in text


def test_torchtitan_plan_exports_without_warnings(capsys, tmp_path):
    path = tmp_path / "titan.json"
    code, _, err = run_cli(["plan", *MOE, "--runtime", "torchtitan", "--time-limit", "30",
                            "--work-limit", "20", "-o", path], capsys)
    assert code == 0, err
    code, _, err = run_cli(["export", path, "--format", "torchtitan", "--strict"], capsys)
    assert code == 0 and "warning" not in err.lower(), err
