"""Export a serving plan document (``workload: serve``) in one of the serving formats.

Consumes a validated serving plan document; produces an :class:`ExportResult` (``vllm``,
``sglang``, ``trtllm`` or ``json``); training-only formats refuse it (exit code 2).
"""
from __future__ import annotations

from typing import Any

from planner.errors import invalid
from planner.export import sglang, trtllm, vllm_serve
from planner.export.base import ExportResult


def export_serving(doc: dict[str, Any], fmt: str, target_version: str | None = None):
    """Export a serving plan document: ``vllm``, ``sglang``, ``trtllm`` or ``json``."""
    if target_version is not None:
        raise invalid(f"the {fmt} serving export has one form and takes no --target-version")
    if fmt == "json":
        from planner.export.quoting import check_strings
        from planner.plan import dumps

        check_strings(doc)
        return ExportResult("json", dumps(doc), (), ".json")
    runs = {"vllm": vllm_serve.export, "sglang": sglang.export, "trtllm": trtllm.export}
    if fmt not in runs:
        raise invalid(f"the {fmt} export is for training plans; this is a serving plan",
                      "serving plans export to vllm, sglang, trtllm or json")
    return runs[fmt](doc)
