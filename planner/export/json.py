"""The plan itself, pretty-printed (sorted keys, 2-space indent): the format every other
exporter reads, for tools that consume the plan file directly. Nothing is lost, so no warnings.
"""
from __future__ import annotations

from typing import Any

from planner.export.base import ExportResult
from planner.export.quoting import check_strings
from planner.plan import dumps


def export(doc: dict[str, Any]) -> ExportResult:
    check_strings(doc)  # a lone surrogate would come back as another character
    return ExportResult("json", dumps(doc), (), ".json")
