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


def test_a_plan_whose_memory_band_crosses_the_gpu_is_warned_of(tmp_path, capsys):
    """check's verdict 'fits only at the optimistic end' (the 80 % band's high end over the GPU
    memory) was said by check only; plan / evaluate / show printed the band and 'fits'
    (qwen3-30b-a3b on 16 H100: peak 75.14 GiB, band 66.31-85.68 GiB of 80, no word)."""
    doc = build_plan(tp=1, pp=2, global_batch=16)
    capacity = doc["cluster"]["gpu_memory_gib"]
    peak = doc["predicted"]["peak_memory_gib"]
    assert doc["predicted"]["fits"] and peak < capacity
    path = tmp_path / "plan.json"
    step = doc["predicted"]["step_time_s"]
    doc["predicted"]["step_time_s_interval"] = [0.9 * step, 1.1 * step]
    doc["predicted"]["peak_memory_gib_interval"] = [0.9 * peak, 1.01 * capacity]
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))
    code, _, err = run_cli(["show", path], capsys)
    assert code == 0
    assert "fits only at the optimistic end" in " ".join(err.split())
    doc["predicted"]["peak_memory_gib_interval"] = [0.9 * peak, 0.99 * capacity]
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))
    code, _, err = run_cli(["show", path], capsys)
    assert code == 0 and "optimistic end" not in err
