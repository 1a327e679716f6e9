"""The plan builders of conftest.py make valid plans of the shapes asked for."""
from __future__ import annotations

from conftest import build_plan


def test_builder_makes_valid_plans():
    doc = build_plan(pp=2, stage_blocks=[1, 3], block_recompute=["full", "none", "none", "none"])
    assert [x["stage"] for x in doc["layers"]] == [0, 0, 1, 1, 1, 1]
    assert doc["parallelism"]["recompute"] == "per-layer"
