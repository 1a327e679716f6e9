"""The plan itself, pretty-printed (sorted keys, 2-space indent): the format every other
exporter reads, for tools that consume the plan file directly. Nothing is lost, so no warnings.
"""
from __future__ import annotations

from planner.plan_types import Plan
from planner.export.base import ExportResult
from planner.export.quoting import check_strings
from planner.plan import dumps


def export(plan: Plan) -> ExportResult:
    doc = plan.to_dict()
    check_strings(doc)  # a lone surrogate would come back as another character
    return ExportResult("json", dumps(doc), (), ".json")
