"""Exporters: a plan in the form a runtime reads.

Consumes a validated plan document (:func:`planner.plan_io.load_plan`); produces an
:class:`ExportResult` (the file's text and the warnings naming each way it differs from the
plan). One module per runtime; :data:`FORMATS` is the registry the CLI offers.

    export_plan(doc, "megatron") -> ExportResult
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from planner.errors import invalid
from planner.export import deepspeed, json, megatron, sglang, torchtitan, trtllm, vllm
from planner.export.base import ExportResult


@dataclass(frozen=True)
class Format:
    name: str
    description: str
    run: Callable[[dict[str, Any]], ExportResult]


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("megatron", "Megatron-LM arguments (bash array)", megatron.export),
    Format("torchtitan", "torchtitan job tables (TOML) + CLI overrides", torchtitan.export),
    Format("deepspeed", "DeepSpeed config JSON", deepspeed.export),
    Format("vllm", "vLLM engine arguments (one line)", vllm.export),
    Format("json", "the plan itself, pretty-printed", json.export),
    Format("sglang", "SGLang launch_server arguments (serving plans)", sglang.export),
    Format("trtllm", "trtllm-serve commands + extra_llm_api_options YAML (serving plans)",
           trtllm.export),
)}


def export_plan(doc: dict[str, Any], fmt: str) -> ExportResult:
    """Translate a validated plan document into ``fmt`` (a key of :data:`FORMATS`)."""
    entry = FORMATS.get(fmt)
    if entry is None:
        raise invalid(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")
    if doc.get("workload") != "serve":  # serving plans have no stages to check
        _refuse_malformed(doc)
    return entry.run(doc)


def _refuse_malformed(doc: dict[str, Any]) -> None:
    """A plan that ``check`` finds malformed (degrees, placement, batch split) would export
    as something no runtime runs as planned: refuse it (exit code 2)."""
    from planner.check import embedded_cluster, embedded_model, structure_problems

    problems = structure_problems(doc, embedded_model(doc), embedded_cluster(doc))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise invalid(f"the plan is malformed, not exporting it: {problems[0].message}{more}",
                      "`shardplan check PLAN` lists every problem")


__all__ = ["FORMATS", "ExportResult", "export_plan"]
