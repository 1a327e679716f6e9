"""``check`` of a serving plan refuses the options only a training plan's check reads
(--runtime, --calibration, --memory-confidence; exit 2) instead of ignoring them: before,
``check serve.json --memory-confidence 0.9 --runtime megatron`` passed (exit 0) at the
prediction, a CI gate that asked for 90 % confidence and got none.
"""
from __future__ import annotations

import json

import pytest

from conftest import run_cli


@pytest.fixture(scope="module")
def serve_plan(tmp_path_factory):
    from cli.main import main

    path = tmp_path_factory.mktemp("serve") / "serve.json"
    with pytest.raises(SystemExit) as done:
        main(["plan", "--workload", "serve", "-m", "tiny", "-c", "tiny", "--concurrency", "4",
              "--isl", "64", "--osl", "32", "-o", str(path)])
    assert done.value.code == 0
    return path


@pytest.mark.parametrize("extra, named", [
    (["--runtime", "megatron"], "--runtime"),
    (["--memory-confidence", "0.9"], "--memory-confidence"),
    (["--calibration", "profile.yaml"], "--calibration"),
    (["--runtime", "fsdp", "--memory-confidence", "0.9"], "--runtime and --memory-confidence"),
])
def test_training_only_options_are_refused(serve_plan, capsys, extra, named):
    code, out, _ = run_cli(["check", serve_plan, *extra, "--json"], capsys)
    error = json.loads(out)["error"]
    assert code == 2 and error["exit_code"] == 2
    assert error["message"].startswith(f"{named}: ") and "serving plan" in error["message"]


def test_a_plain_check_of_a_serving_plan_still_passes(serve_plan, capsys):
    code, out, _ = run_cli(["check", serve_plan, "--json"], capsys)
    assert code == 0 and json.loads(out)["ok"]
