"""Exporters: a plan in the form a runtime reads.

Consumes a :class:`~planner.plan_types.Plan` (``Plan.load(path)``); produces an
:class:`ExportResult` (the file's text and the warnings naming each way it differs from the
plan). One module per runtime; :data:`FORMATS` is the registry the CLI offers.

    export_plan(plan, "megatron") -> ExportResult
    export_plan(plan, "torchtitan", target_version="0.2.2") -> ExportResult

Formats whose file changed between runtime versions take ``target_version`` (default: the
newest supported); the others have one form and accept only their own version label.
Every string an exporter writes goes through :mod:`planner.export.quoting`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from planner.errors import invalid
from planner.export import deepspeed, json, megatron, sglang, torchtitan, trtllm, vllm
from planner.export.base import ExportResult
from planner.export.layouts import layouts_warning
from planner.export.offload import activation_offload_warning, optimizer_offload_warning
from planner.plan_types import Plan


@dataclass(frozen=True)
class Format:
    name: str
    description: str
    run: Callable[..., ExportResult]
    versions: tuple[str, ...] = ()  # supported target versions, newest first; () = one form
    resolve: Callable[[str | None], str] | None = None  # version label -> supported version


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("megatron", "Megatron-LM arguments (bash array)", megatron.export),
    Format("torchtitan", "torchtitan command line (0.3) or job tables (TOML, <= 0.2.2)",
           torchtitan.export, torchtitan.VERSIONS, torchtitan.resolve_version),
    Format("deepspeed", "DeepSpeed config JSON", deepspeed.export),
    Format("vllm", "vLLM engine arguments (one line)", vllm.export),
    Format("json", "the plan itself, pretty-printed", json.export),
    Format("sglang", "SGLang launch_server arguments (serving plans)", sglang.export_training),
    Format("trtllm", "trtllm-serve commands + extra_llm_api_options YAML (serving plans)",
           trtllm.export_training),
)}


def export_plan(plan: Plan | Mapping[str, Any], fmt: str,
                target_version: str | None = None) -> ExportResult:
    """Translate a plan into ``fmt`` (a key of :data:`FORMATS`), for
    ``target_version`` of the runtime where its format changed between versions."""
    entry = FORMATS.get(fmt)
    if entry is None:
        raise invalid(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")
    if not isinstance(plan, Plan):  # a serving plan document (planner/export/serve_formats.py)
        from planner.export.serve_formats import export_serving

        return export_serving(plan, fmt, target_version)
    _refuse_malformed(plan)
    if entry.resolve is not None:
        return _pools(plan, _per_layer_warnings(plan, entry.run(plan, entry.resolve(target_version))))
    if target_version is not None:
        raise invalid(f"the {fmt} export has one form and takes no --target-version",
                      "formats with versions: " + ", ".join(
                          f"{f.name} ({', '.join(f.versions)})" for f in FORMATS.values()
                          if f.versions))
    return _pools(plan, _per_layer_warnings(plan, entry.run(plan)))


def _pools(plan: Plan, result: ExportResult) -> ExportResult:
    """A plan across pools: the node order that runs each stage on its pool
    (planner/hetero/launch.py)."""
    if not plan.across_pools or result.format == "json":
        return result
    from planner.hetero.launch import launch_notes

    notes, warnings = launch_notes(dict(plan.document))
    return replace(result, notes=result.notes + tuple(notes),
                   warnings=result.warnings + tuple(warnings))


# the offloads an exporter writes, or refuses with its runtime's reason, itself
OWN_OFFLOADS = {"megatron": ("offload", "act_offload"), "deepspeed": ("offload",)}


def _per_layer_warnings(plan: Plan, result: ExportResult) -> ExportResult:
    """Per-layer decisions a runtime's file cannot express: optimizer and activation offload
    (where the exporter does not handle them itself, OWN_OFFLOADS) and layouts
    (planner.strategy.Layout; each runtime takes one tensor-parallel degree). Say which layers
    the file runs differently, and what the plan then needs."""
    if result.format == "json":
        return result
    own = OWN_OFFLOADS.get(result.format, ())
    extra = (None if "offload" in own else optimizer_offload_warning(plan, result.format),
             None if "act_offload" in own else activation_offload_warning(plan, result.format),
             layouts_warning(plan, result.format), _fp8_attention_warning(plan, result.format))
    warnings = tuple(warning for warning in extra if warning)
    return replace(result, warnings=result.warnings + warnings) if warnings else result


def _fp8_attention_warning(plan: Plan, fmt: str) -> str | None:
    """The plan's FP8 attention core (planner.config.RuntimeOptions.fp8_attention), which only
    the Megatron exporter writes (--fp8-dot-product-attention)."""
    if not plan.runtime.fp8_attention or fmt == "megatron":
        return None
    return (f"FP8 attention: the plan runs the attention core in FP8; {fmt} has no such "
            "option, so this file runs it in 16 bits (slower than planned)")


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
