"""The step-time table of ``evaluate`` / ``plan`` / ``show``: the step's parts in the order a
step runs them, the bubble printed as part of the pipeline's time (the step is pipeline +
dp_exposed + optimizer + embedding_sync, planner.cost.terms.StepBreakdown). Before, ``show``
printed the parts in the plan file's sorted key order (bubble, dp_exposed, embedding_sync,
optimizer, pipeline) where ``plan`` had printed pipeline first, and both printed the bubble as
one more row of what reads as a sum (qwen3-30b-a3b on 16 H100: pipeline 6.5726 + bubble
0.3784 + optimizer 0.0222 for a step of 6.5948 s).
"""
from __future__ import annotations

import json
import re

from conftest import build_plan, run_cli


def _rows(err: str) -> list[tuple[str, float]]:
    table = err[err.index("Step time"):]
    table = table[:table.index("└")]
    return [(m.group(1).strip(), float(m.group(2)))
            for m in re.finditer(r"│ ([^│]+?) +│ +([0-9.]+) │", table)]


def test_show_prints_the_parts_in_the_step_order_as_plan_did(tmp_path, capsys):
    doc = build_plan(tp=1, pp=2, global_batch=16)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))  # as plan files are written
    code, _, err = run_cli(["show", path], capsys)
    assert code == 0
    rows = _rows(err)
    assert [name for name, _ in rows] == ["pipeline", "of it bubble", "dp_exposed", "optimizer",
                                          "embedding_sync", "step"]
    values = dict(rows)
    addends = values["pipeline"] + values["dp_exposed"] + values["optimizer"] \
        + values["embedding_sync"]
    assert abs(addends - values["step"]) < 2e-4
    assert values["of it bubble"] > 0 and values["of it bubble"] <= values["pipeline"]


def test_evaluate_prints_the_same_order(capsys):
    code, _, err = run_cli(["evaluate", "-m", "tiny", "-c", "tiny", "--global-batch", "16",
                            "--tp", "1", "--pp", "2"], capsys)
    assert code == 0
    assert [name for name, _ in _rows(err)][:2] == ["pipeline", "of it bubble"]
