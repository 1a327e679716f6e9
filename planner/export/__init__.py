"""Exporters: a plan in the form a runtime reads.

Consumes a :class:`~planner.plan_types.Plan` (``Plan.load(path)``); produces an
:class:`ExportResult` (the file's text and the warnings naming each way it differs from the
plan). One module per runtime; :data:`FORMATS` is the registry the CLI offers.

    export_plan(plan, "megatron") -> ExportResult
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from planner.errors import invalid
from planner.export import deepspeed, json, megatron, torchtitan, vllm
from planner.export.base import ExportResult
from planner.plan_types import Plan


@dataclass(frozen=True)
class Format:
    name: str
    description: str
    run: Callable[[Plan], ExportResult]


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("megatron", "Megatron-LM arguments (bash array)", megatron.export),
    Format("torchtitan", "torchtitan job tables (TOML) + CLI overrides", torchtitan.export),
    Format("deepspeed", "DeepSpeed config JSON", deepspeed.export),
    Format("vllm", "vLLM engine arguments (one line)", vllm.export),
    Format("json", "the plan itself, pretty-printed", json.export),
)}


def export_plan(plan: Plan, fmt: str) -> ExportResult:
    """Translate a plan into ``fmt`` (a key of :data:`FORMATS`)."""
    entry = FORMATS.get(fmt)
    if entry is None:
        raise invalid(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")
    _refuse_malformed(plan)
    return entry.run(plan)


def _refuse_malformed(plan: Plan) -> None:
    """A plan that ``check`` finds malformed (degrees, placement, batch split) would export
    as something no runtime runs as planned: refuse it (exit code 2)."""
    from planner.plan_validate import plan_problems

    problems = plan_problems(plan)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise invalid(f"the plan is malformed, not exporting it: {problems[0].message}{more}",
                      "`shardplan check PLAN` lists every problem")


__all__ = ["FORMATS", "ExportResult", "export_plan"]
