"""Offload in exports: the layers whose optimizer states (LayerOption.offload) or saved
activations (LayerOption.act_offload) the plan keeps in host memory, and the warning for a file
that keeps them on the GPUs instead, with the memory the cost model then predicts.

DeepSpeed's ``offload_optimizer`` and FSDP2's ``CPUOffloadPolicy`` take all parameters and
Megatron-Core's ``--optimizer-cpu-offload`` a fraction of them in parameter-group order, so no
runtime file names a per-layer subset; Megatron-Core is the one runtime with activation offload
(planner/export/megatron.py writes it where its TransformerConfig accepts the plan's).
"""
from __future__ import annotations

from planner.export.base import memory_note
from planner.export.layouts import block_runs
from planner.plan_types import Plan


def offloaded(plan: Plan, key: str) -> list[str]:
    """Names of the layers with ``key`` ("offload" or "act_offload") set, in layer order."""
    return [layer["name"] for layer in plan.layers if layer.get(key)]


def optimizer_offload_warning(plan: Plan, fmt: str, why: str = "") -> str | None:
    host = offloaded(plan, "offload")
    if not host:
        return None
    why = why or (f"{fmt} has no per-layer optimizer offload (DeepSpeed's offload_optimizer and "
                  f"FSDP2's CPUOffloadPolicy take all parameters, Megatron-Core's "
                  f"--optimizer-cpu-offload a fraction of them in parameter order)")
    return (f"offload: the plan keeps the optimizer states of {block_runs(host)} in host "
            f"memory; {why}, so this file keeps them on the GPUs"
            + memory_note(plan, option_offload=False))


def activation_offload_warning(plan: Plan, fmt: str, why: str = "") -> str | None:
    saved = offloaded(plan, "act_offload")
    if not saved:
        return None
    why = why or f"{fmt} has no per-block activation offload"
    return (f"activation offload: the plan keeps the saved activations of {block_runs(saved)} "
            f"in host memory; {why}, so this file keeps them on the GPUs"
            + memory_note(plan, option_act_offload=False))


__all__ = ["activation_offload_warning", "offloaded", "optimizer_offload_warning"]
