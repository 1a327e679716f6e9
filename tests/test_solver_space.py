"""When no configuration is valid, the error names the cause (planner.solve.space.why_no_config)
instead of a generic "remove pins that contradict each other"."""
from __future__ import annotations

import json

import pytest

from conftest import run_cli

PLAN = ["plan", "-m", "llama-3.1-8b", "-c", "dgx-h100", "--global-batch", "8", "--json"]


@pytest.mark.parametrize("extra, cause", [
    (["--pin", "tp=3"], "pin tp=3 leaves no valid configuration: 3 does not divide the 8 GPUs"),
    (["--pin", "tp=16"], "pin tp=16 leaves no valid configuration: 16 exceeds the 8 GPUs"),
    (["--pin", "dp=8", "--global-batch", "7"],
     "pin dp=8 leaves no valid configuration: the global batch 7 does not split over 8 ranks"),
    (["--pin", "micro_batch=3"], "pin micro_batch=3 leaves no valid configuration: no "
                                 "data-parallel degree d of the 8 GPUs has d x 3 dividing"),
    (["--pin", "tp=8", "--pin", "pp=2"],
     "the pins tp=8, pp=2 leave no valid configuration together, though each alone does"),
])
def test_impossible_pins_are_named(extra, cause, capsys):
    code, out, err = run_cli([*PLAN, *extra], capsys)
    assert code == 1 and "Traceback" not in err
    error = json.loads(out)["error"]
    assert error["kind"] == "infeasible"
    assert cause in error["message"]
    assert error["hints"] == ["remove or change those pins (see --pin)"]


def test_every_impossible_pin_is_named(capsys):
    code, out, _ = run_cli([*PLAN, "--pin", "tp=3", "--pin", "pp=5"], capsys)
    message = json.loads(out)["error"]["message"]
    assert code == 1 and "pin tp=3" in message and "pin pp=5" in message
