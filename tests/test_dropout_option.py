"""--dropout/--no-dropout: costed by evaluate and plan, recorded in the plan, read by check,
exported to Megatron at its default rate (the plan records no rate)."""
from __future__ import annotations

import json

import pytest

from conftest import run_cli
from planner.export import export_plan
from planner.export.megatron import parse_args_file
from planner.plan_types import Plan

GPT = ["-m", "gpt3-1.3b", "-c", "dgx-a100-80g", "--global-batch", "64"]
EVALUATE = ["evaluate", *GPT, "--tp", "2", "--pp", "2", "--micro-batch", "2", "--json"]


def _predicted(capsys, *extra: str) -> dict:
    code, out, _ = run_cli([*EVALUATE, *extra], capsys)
    assert code == 0
    return json.loads(out)["predicted"]


def test_evaluate_costs_dropout_only_when_asked(capsys):
    default = _predicted(capsys, "--attention", "eager")
    assert _predicted(capsys, "--attention", "eager", "--no-dropout") == default  # default off
    eager = _predicted(capsys, "--attention", "eager", "--dropout")
    flash_off = _predicted(capsys)
    flash = _predicted(capsys, "--dropout")
    # masks in memory, traffic in time, in both kernels
    assert eager["step_time_s"] > default["step_time_s"]
    assert eager["peak_memory_gib"] > default["peak_memory_gib"]
    assert flash["step_time_s"] > flash_off["step_time_s"]
    # the eager core's dropout on the s x s scores costs more than the hidden dropouts alone
    assert (eager["step_time_s"] - default["step_time_s"]
            > 2 * (flash["step_time_s"] - flash_off["step_time_s"]))


@pytest.fixture(scope="module")
def plan_files(tmp_path_factory):
    from cli.main import main

    folder = tmp_path_factory.mktemp("dropout")
    paths = {}
    for flag in ("--dropout", "--no-dropout"):
        path = folder / f"plan{flag}.json"
        with pytest.raises(SystemExit) as done:
            main(["plan", *GPT, "--attention", "eager", flag, "--time-limit", "60", "-o",
                  str(path)])
        assert done.value.code == 0
        paths[flag] = path
    return paths


def test_plan_records_it_check_reads_it_megatron_keeps_its_default(plan_files, capsys):
    on = json.loads(plan_files["--dropout"].read_text())
    off = json.loads(plan_files["--no-dropout"].read_text())
    assert on["runtime"]["dropout"] is True and off["runtime"]["dropout"] is False
    for doc, path in ((on, plan_files["--dropout"]), (off, plan_files["--no-dropout"])):
        code, out, _ = run_cli(["check", path, "--json"], capsys)
        report = json.loads(out)
        assert code == 0 and report["ok"] and not report["stale"]
        for stage, recorded in zip(report["stages"], doc["stages"]):  # same terms as planned
            assert stage["needed_gib"]["total"] == pytest.approx(
                recorded["memory_gib"]["total"], rel=1e-5)
    result = export_plan(Plan.from_dict(on), "megatron")
    args = parse_args_file(result.text)
    assert "--attention-dropout" not in args and "--hidden-dropout" not in args
    assert any("default 0.1" in n for n in result.notes)
    args = parse_args_file(export_plan(Plan.from_dict(off), "megatron").text)
    assert args[args.index("--attention-dropout") + 1] in ("0.0", "0")
    assert args[args.index("--hidden-dropout") + 1] in ("0.0", "0")
